"""torch.compile lowers a converted model's add and (on saturating CPUs) conv into pieces
inductor fuses; the integers stay those of eager mode, bit for bit.  torch.export keeps the
opaque ops.  (ops/compile_lowering.py)"""
import random

import pytest
import torch
import torch.nn as nn
from torch._inductor.compile_fx import compile_fx

import torchquant.quantization as tq
import torchquant.nn.quantized as tqnnq
from torchquant.kernels import conv as kconv
from torchquant.kernels.onednn_exactness import onednn_u8_exact_max, onednn_u8s8_exact
from torchquant import dtypes
from torchquant.ops import _lanes, binary, compile_lowering

SPLIT_CPU = onednn_u8_exact_max() >= 0 and not onednn_u8s8_exact()


class ConvAddBlock(nn.Module):
    """stem conv+relu, then conv+relu, conv, residual add+relu: the pattern the lowering fuses
    between convs (both add operands come channels-last out of convs)."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.stem = nn.Conv2d(8, 8, 1)
        self.stem_relu = nn.ReLU()
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.skip = tqnnq.FloatFunctional()
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.stem_relu(self.stem(self.quant(x)))
        return self.dequant(self.skip.add_relu(x, self.conv2(self.relu1(self.conv1(x)))))


@pytest.fixture(scope="module")
def block():
    torch.manual_seed(0)
    model = ConvAddBlock().eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.fuse_modules(model, [["stem", "stem_relu"], ["conv1", "relu1"]], inplace=True)
    prepared = tq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(2, 8, 8, 8))
    return tq.convert(prepared)


def _compiled_with_graphs(model):
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)
    torch._dynamo.reset()
    return torch.compile(model, backend=backend, fullgraph=True), graphs


def _targets(graphs):
    """Names of the functions the graphs call, ``torchquant.conv`` style (overload dropped)."""
    return {str(n.target).removesuffix(".default") for g in graphs for n in g.graph.nodes
            if n.op == "call_function"}


def test_tail_free_matches_the_lane_model():
    random.seed(0)
    for _ in range(2000):
        n = random.choice([random.randrange(1, 400_000), 64 * random.randrange(1, 20_000)])
        expected = all(not _lanes.tail_ranges(n, 64, t) for t in range(1, 13))
        assert _lanes.tail_free(n, 64, 12) == expected, n


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_compiled_block_equals_eager_and_lowers(block, context):
    compiled, graphs = _compiled_with_graphs(block)
    # inputs quantize to values above 128 too (the split of eager mode) and below
    for scale in (0.5, 1.0, 3.0):
        x = torch.randn(2, 8, 8, 8) * scale
        with context():
            assert torch.equal(compiled(x), block(x))
    targets = _targets(graphs)
    assert "torchquant.add" not in targets  # 1024 elements: vector path only
    if SPLIT_CPU:
        assert "torchquant.conv_exact_float" in targets
        assert "torchquant.conv" not in targets
    else:
        assert "torchquant.conv" in targets


@pytest.mark.skipif(not SPLIT_CPU, reason="oneDNN accumulates exactly here: no split")
def test_compiled_block_with_sparse_high_halves_equals_eager(block, monkeypatch):
    """Inputs with a few values above 128 (the calibrated case): the opaque conv op and eager
    mode both take the sparse high half, and give eager's integers."""
    from torchquant.kernels import sparse_correction
    monkeypatch.setattr(sparse_correction, "SPARSE_MIN_MACS", 0)
    monkeypatch.setattr(sparse_correction, "SPARSE_MAX_DENSITY", 0.05)
    compiled, _ = _compiled_with_graphs(block)
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(2, 8, 8, 8) * 0.5
        x[0, 2, 3, 4] = 8.0  # far out: quantizes to the top of the range
        with torch.no_grad():
            assert torch.equal(compiled(x), block(x))


def test_export_keeps_the_opaque_ops(block):
    program = torch.export.export(block, (torch.randn(2, 8, 8, 8),))
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"torchquant.conv.default", "torchquant.add.default"} <= targets
    assert "torchquant.conv_exact_float.default" not in targets


def test_unsafe_inductor_math_turns_lowering_off(block):
    import torch._inductor.config as config
    try:
        with config.patch({"cpp.enable_unsafe_math_opt_flag": True}):
            compiled, graphs = _compiled_with_graphs(block)
            x = torch.randn(2, 8, 8, 8)
            with torch.no_grad():
                assert torch.equal(compiled(x), block(x))
        assert {"torchquant.conv", "torchquant.add"} <= _targets(graphs)
    finally:
        torch._dynamo.reset()
        # A -ffast-math kernel library sets flush-to-zero for the whole process when it
        # loads; later tests in this worker (hypothesis' subnormal floats) need it off.
        torch.set_flush_denormal(False)


def test_add_with_a_tail_keeps_the_opaque_op():
    """7 x 9 x 5 elements end in a scalar tail that rounds differently: not lowered."""
    a = torch.randint(0, 256, (7, 9, 5), dtype=torch.uint8)
    b = torch.randint(0, 256, (7, 9, 5), dtype=torch.uint8)
    def fn(x, y):
        return binary.add(x, 0.031, 3, y, 0.047, 130, 0.06, 77, dtypes.quint8, relu=False)
    compiled, graphs = _compiled_with_graphs(fn)
    assert torch.equal(compiled(a, b), fn(a, b))
    assert "torchquant.add" in _targets(graphs)


@pytest.mark.skipif(not SPLIT_CPU, reason="oneDNN accumulates exactly here: no split")
@pytest.mark.parametrize("high", ["none", "sparse", "dense"])
def test_conv_exact_float_matches_exact_arithmetic_and_opcheck(high, monkeypatch):
    """One oneDNN call below 128, the sparse or the dense high half above: exact sums, one
    float32 rounding per half, and the floats of always splitting."""
    from torchquant.kernels import sparse_correction
    monkeypatch.setattr(sparse_correction, "SPARSE_MIN_MACS", 0)
    torch.manual_seed(0)
    w = torch.randint(-128, 128, (16, 8, 3, 3), dtype=torch.int8)
    w_scale = torch.rand(16, dtype=torch.float64) * 0.01 + 1e-3
    packed = kconv.pack_conv_weight(w, w_scale, torch.zeros(16, dtype=torch.int64), 0,
                                    torch.randn(16), 1, 1, 1, 1)
    x = torch.randint(0, 128, (2, 8, 10, 10), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    if high == "sparse":
        x[1, 3, 4, 5] = 200
    elif high == "dense":
        x = (x * 2).contiguous(memory_format=torch.channels_last)
    y = kconv.conv_exact_float(x, 0.02, 5, packed)
    bits = sparse_correction.high_bits(x)
    assert (bits.flat is not None) == (high == "sparse")
    # exact reference in float64; oneDNN's float output rounds each half once to float32
    acc = nn.functional.conv2d(x.double() - 5, w.double(), padding=1)
    exact = acc * 0.02 * w_scale.view(1, -1, 1, 1) + packed.bias.double().view(1, -1, 1, 1)
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-4)
    always_split = kconv._halves_float(x, bits._replace(top=max(bits.top, 128), flat=None),
                                       0.02, 5, packed)
    assert torch.equal(y, always_split)
    torch.library.opcheck(torch.ops.torchquant.conv_exact_float.default,
                          (x, 0.02, 5, w, w_scale, torch.zeros(16, dtype=torch.int64),
                           packed.bias, 0, [1, 1], [1, 1], [1, 1], 1))


def test_lowering_is_off_outside_compile():
    assert not compile_lowering.active()
