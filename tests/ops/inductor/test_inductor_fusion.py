"""Plain torch.compile with inductor freezing (the PT2E tutorial's settings) turns a torchquant
``convert_pt2e`` model's dequantize -> conv / linear -> quantize into oneDNN int8 calls with
prepacked weights; no Python-implemented torchquant op is left in the generated code.
(ops/inductor/fusion.py)"""
import copy
import re

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

import torchquant
import torchquant.kernels.onednn_exactness as exactness
from torchquant.kernels import native
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)


class ConvNet(nn.Module):
    """conv+relu; a residual add onto the conv's own input (not fused: oneDNN would sum into
    the input it reads); a two-conv residual block (the add+relu fused as oneDNN's in-place
    sum); conv+ReLU6 (hardtanh); max pool, whose quantized output ends the graph (the compiled
    model returns a dequantize of integers); a Linear head (float out)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 16, 3, padding=1)
        self.conv_a = nn.Conv2d(16, 16, 3, padding=1)
        self.conv_b = nn.Conv2d(16, 16, 3, padding=1)
        self.conv3 = nn.Conv2d(16, 16, 1)
        self.relu1, self.relu2, self.relu_a, self.relu_b = (nn.ReLU() for _ in range(4))
        self.relu6 = nn.ReLU6()
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        y = self.relu1(self.conv1(x))
        y = self.relu2(self.conv2(y) + y)
        y = self.relu_b(self.conv_b(self.relu_a(self.conv_a(y))) + y)
        y = self.pool(self.relu6(self.conv3(y)))
        return y, self.fc(torch.flatten(y, 1))


@pytest.fixture(scope="module")
def converted():
    torch.manual_seed(0)
    model = ConvNet().eval()
    example = (torch.randn(2, 3, 8, 8),)
    batch = ({0: torch.export.Dim("batch", max=64)},)
    exported = torch.export.export(model, example, dynamic_shapes=batch).module()
    prepared = prepare_pt2e(exported, X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config()))
    for _ in range(3):
        prepared(torch.randn(4, 3, 8, 8))
    return convert_pt2e(prepared)


def _compile_frozen(model, x):
    torch._dynamo.reset()
    with inductor_config.patch(freezing=True, fx_graph_cache=False), torch.no_grad():
        out, code = run_and_get_code(torch.compile(copy.deepcopy(model)), x)
    return out, "".join(code)


def _steps(a, b, scale):
    return ((a - b).abs() / scale).round()


@pytest.fixture
def onednn_convs(monkeypatch):
    """Every conv to oneDNN: these small test convs would otherwise take the native conv
    (test_small_convs_take_the_native_conv)."""
    monkeypatch.setattr(native, "conv_preferred", lambda *args: False)


@pytest.mark.skipif(not exactness.onednn_u8s8_exact(), reason="oneDNN u8 x s8 inexact here")
def test_tutorial_flow_fuses_into_onednn_with_eager_integers(converted, onednn_convs):
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        reference = converted(x)                                   # float conv on dequantized
        fused_eager = torchquant.compile(converted, use_torch_compile=False)(x)  # oneDNN, eager
    (pooled, logits), code = _compile_frozen(converted, x)
    assert code.count("onednn.qconv_pointwise") == 4 and "onednn.qlinear_pointwise" in code
    assert "onednn.qconv2d_pointwise.binary" in code and "'hardtanh'" in code
    # the ReLU6 (decomposed to clamp_min / clamp_max before freezing) and the quantize after
    # it ride in the conv's call: oneDNN writes the uint8 integers, no float conv output
    assert "torch.float32, 'hardtanh'" not in code and "torch.uint8, 'hardtanh'" in code
    assert "torch.ops.torchquant" not in code
    assert "mkldnn._convolution_pointwise" not in code              # no conv left in float
    # the same oneDNN kernels as torchquant's fused eager ops: the same integers
    assert torch.equal(pooled, fused_eager[0])
    torch.testing.assert_close(logits, fused_eager[1], rtol=1e-5, atol=1e-5)
    # against the float-conv reference oneDNN's requantization rounds a value within float
    # rounding of a half-integer the other way: at most one step, on few elements
    scale = (reference[0][reference[0] > 0].min()).item()
    steps = _steps(pooled, reference[0], scale)
    assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01
    # torchquant.compile takes the same path (freezing for that compile only).  Its weights
    # must reach inductor frozen: options={"freezing": True} alone leaves Dynamo tracing them
    # as graph inputs, and the convs ran in float on weights dequantized every call (3x slower
    # than the tutorial flow, the same integers here, so only the code tells)
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        again, code = run_and_get_code(torchquant.compile(copy.deepcopy(converted), aot=False), x)
    code = "".join(code)
    # (its forward is C++: oneDNN's ops appear as their C shims)
    assert code.count("aoti_torch_cpu__qconv_pointwise_tensor(") == 4
    assert "aoti_torch_cpu__qconv2d_pointwise_binary_tensor(" in code
    assert not re.search(r"aoti_torch_cpu_\w*convolution", code)  # no float conv
    assert "torch.ops.torchquant" not in code
    assert torch.equal(again[0], pooled)
    assert not inductor_config.freezing


@pytest.mark.skipif(not (native.available() and native.exact_u8()),
                    reason="the native conv runs where fbgemm's u8 x s8 is exact")
def test_small_convs_take_the_native_conv(converted):
    """Static-shape convs small enough that oneDNN's per-call set-up dominates become
    ``torchquant_native::qconv2d`` calls (C++ through the dispatcher, no Python), the residual
    add read from the other addend rather than summed into a copy of it.  Same integers as the
    oneDNN-fused eager model, up to oneDNN's one-step rounding differences
    (tests/kernels/test_native_conv.py)."""
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        fused_eager = torchquant.compile(converted, use_torch_compile=False)(x)
    (pooled, logits), code = _compile_frozen(converted, x)
    assert code.count("torchquant_native.qconv2d.default(") == 5
    assert "qconv_pointwise" not in code and "aten.clone" not in code
    assert "torch.ops.torchquant." not in code and "mkldnn._convolution_pointwise" not in code
    scale = (fused_eager[0][fused_eager[0] > 0].min()).item()
    steps = _steps(pooled, fused_eager[0], scale)
    assert steps.max() <= 1 and (steps > 0).float().mean() < 0.001
    torch.testing.assert_close(logits, fused_eager[1], rtol=1e-3, atol=1e-3)
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        again, code = run_and_get_code(torchquant.compile(copy.deepcopy(converted), aot=False), x)
    code = "".join(code)
    assert code.count('findSchemaOrThrow("torchquant_native::qconv2d"') == 5  # the C++ wrapper
    assert torch.equal(again[0], pooled)


@pytest.mark.skipif(not native.amx(), reason="the native conv serves a symbolic batch on AMX")
def test_symbolic_batch_convs_take_the_native_conv_on_amx(converted):
    """A graph compiled for any batch (the batch dimension marked dynamic) calls the native conv
    on AMX CPUs too (``conv_preferred_any_batch``): the same integers as the static graph."""
    x = torch.randn(3, 3, 8, 8)
    (static_pooled, _), _ = _compile_frozen(converted, x)
    torch._dynamo.reset()
    first = torch.randn(5, 3, 8, 8)
    torch._dynamo.mark_dynamic(first, 0)
    compiled = torch.compile(copy.deepcopy(converted))
    with inductor_config.patch(freezing=True, fx_graph_cache=False), torch.no_grad():
        _, code = run_and_get_code(compiled, first)
        with torch._dynamo.config.patch(error_on_recompile=True):   # one graph, any batch
            pooled, _ = compiled(x)
    code = "".join(code)
    assert code.count("torchquant_native.qconv2d.default(") == 5
    assert "qconv_pointwise" not in code
    assert torch.equal(pooled, static_pooled)


@pytest.mark.skipif(not (native.available() and native.exact_u8()),
                    reason="the native conv runs where fbgemm's u8 x s8 is exact")
def test_symbolic_batch_convs_choose_per_call_without_amx(converted):
    """Without AMX a graph compiled for any batch calls ``qconv2d_or_onednn``: the native conv
    up to the batch where ``conv_preferred`` stops taking it (8 images of 8x8 here, 16 for the
    first conv, whose input zero point is not 0), the oneDNN call on its prepacked weight
    beyond.  Both sides give the oneDNN-fused eager model's integers up to oneDNN's one-step
    rounding differences.  torch's fake conv guards the batch at 16, so batches 2..15 and
    16..64 are two graphs; in the second only the first conv can still be native, the others
    call oneDNN directly."""
    from torchquant.kernels import cpu_isa
    with cpu_isa.forced_cpu_isa("avx512_vnni"):
        # (graph's first batch, batch run, convs left choosing, batch up to which all are native)
        for first, batch, choosing, native_up_to in ((5, 3, 5, 8), (5, 12, 5, 8),
                                                     (24, 40, 1, 0)):
            torch._dynamo.reset()
            x0 = torch.randn(first, 3, 8, 8)
            torch._dynamo.mark_dynamic(x0, 0)
            compiled = torch.compile(copy.deepcopy(converted))
            with inductor_config.patch(freezing=True, fx_graph_cache=False), torch.no_grad():
                _, code = run_and_get_code(compiled, x0)
                code = "".join(code)
                assert code.count("torchquant_native.qconv2d_or_onednn.default(") == choosing
                assert code.count("onednn.qconv") == 5 - choosing
                assert "torch.ops.torchquant." not in code
                x = torch.randn(batch, 3, 8, 8)
                with torch._dynamo.config.patch(error_on_recompile=True), \
                        torch.profiler.profile() as prof:
                    pooled, logits = compiled(x)
                fused_eager = torchquant.compile(converted, use_torch_compile=False)(x)
            called = {event.name for event in prof.events()}
            assert ("onednn::qconv_pointwise" in called) == (batch > native_up_to)
            scale = (fused_eager[0][fused_eager[0] > 0].min()).item()
            steps = _steps(pooled, fused_eager[0], scale)
            assert steps.max() <= 1 and (steps > 0).float().mean() < 0.001
            torch.testing.assert_close(logits, fused_eager[1], rtol=1e-3, atol=1e-3)


def test_saturating_cpu_convs(converted, monkeypatch):
    """Where oneDNN's u8 x s8 products saturate (AVX2 without VNNI) no oneDNN int8 call is
    made: the conv of the 3-channel image stays the graph's float conv on dequantized values
    (what the eager model computes), the others call torchquant's native conv, exact there by
    its high-bit split (tests/kernels/test_native_conv.py); the Linear stays float.  Still no
    Python op."""
    monkeypatch.setattr(exactness, "onednn_u8s8_exact", lambda: False)
    x = torch.randn(3, 3, 8, 8)
    with torch.no_grad():
        reference = converted(x)
    (pooled, logits), code = _compile_frozen(converted, x)
    assert "qconv_pointwise" not in code and "qlinear_pointwise" not in code
    assert "torch.ops.torchquant." not in code
    if native.available():
        assert code.count("torchquant_native.qconv2d.default(") == 4
    scale = (reference[0][reference[0] > 0].min()).item()
    steps = _steps(pooled, reference[0], scale)   # float conv kernels may differ in the last bit
    assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01
    torch.testing.assert_close(logits, reference[1], rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not exactness.onednn_u8s8_exact(), reason="oneDNN u8 x s8 inexact here")
def test_torchquant_compile_fuses_fx_and_eager_converted_convs(onednn_convs):
    """An FX-converted (and so an eager-converted: the same torchquant::conv modules) model under
    torchquant.compile takes the frozen compile too: its convs, whose weights freezing makes
    constants, become oneDNN calls; the integers are eager's (the same oneDNN kernels)."""
    from torchquant.quantization import get_default_qconfig_mapping
    from torchquant.quantization.quantize_fx import convert_fx, prepare_fx

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(3, 16, 3), nn.Conv2d(16, 16, 3)
            self.relu = nn.ReLU()

        def forward(self, x):
            return self.conv2(self.relu(self.conv1(x)))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 12, 12)
    prepared = prepare_fx(Net().eval(), get_default_qconfig_mapping("x86"), (x,))
    prepared(x)
    converted = convert_fx(prepared)
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        expected = converted(x)
        out, code = run_and_get_code(torchquant.compile(copy.deepcopy(converted), aot=False), x)
    code = "".join(code)
    assert code.count("aoti_torch_cpu__qconv_pointwise_tensor(") + \
        code.count("aoti_torch_cpu__qconv_pointwise(") == 2
    assert not re.search(r"aoti_torch_cpu_\w*convolution", code)
    assert torch.equal(out, expected)
    assert not inductor_config.freezing


def _frozen_graph_nodes(fn, *args):
    """Compile ``fn`` with freezing; return its output, the call_function nodes of the graph
    inductor lowers (after every pass) as (target, input dtypes) pairs, and the shapes of the
    conv weights the fusion pass made constants of."""
    nodes, conv_weights = [], []

    def capture(graph):
        for node in graph.nodes:
            if node.op == "call_function":
                vals = [a.meta.get("val") for a in node.args if isinstance(a, torch.fx.Node)]
                nodes.append((node.target, [getattr(v, "dtype", None) for v in vals]))
            elif node.op == "get_attr" and "conv_weight" in node.target:
                conv_weights.append(tuple(getattr(graph.owning_module, node.target).shape))

    torch._dynamo.reset()
    with inductor_config.patch(freezing=True, fx_graph_cache=False,
                               post_grad_custom_post_pass=capture), torch.no_grad():
        out = torch.compile(fn)(*args)
    return out, nodes, conv_weights


def _pools(nodes):
    """The input dtype of each max pool computing values (not the offsets -> indices op)."""
    pools = ("max_pool2d_with_indices", "_low_memory_max_pool_with_offsets")
    return [dtypes[0] for target, dtypes in nodes if any(p in str(target) for p in pools)]


@pytest.mark.parametrize("storage, out_qparams", [
    (torch.uint8, (0.05, 10)),     # the same qparams after the pool: no dequantize / quantize
    (torch.uint8, (0.07, 3)),      # requantized after the pool: dequantize -> quantize kept
    (torch.int8, (0.05, 10)),
])
def test_max_pool_of_dequantized_integers_pools_the_integers(storage, out_qparams):
    """dequantize -> max pool -> quantize pools the 8-bit integers (a positive scale keeps
    their order), bit for bit the eager result; with the same qparams on both sides nothing
    but the integer pool is left."""
    tq = torch.ops.torchquant
    name = "quint8" if storage == torch.uint8 else "qint8"

    def fn(q):
        pooled = torch.nn.functional.max_pool2d(tq.dequantize_per_tensor(q, 0.05, 10), 3, 2, 1)
        return tq.quantize_per_tensor(pooled, *out_qparams, name)

    info = torch.iinfo(storage)
    torch.manual_seed(0)
    q = torch.randint(info.min, info.max + 1, (2, 16, 9, 9), dtype=storage)
    q = q.contiguous(memory_format=torch.channels_last)
    out, nodes, _ = _frozen_graph_nodes(fn, q)
    assert torch.equal(out, fn(q))
    assert _pools(nodes) == [storage]
    targets = {target for target, _ in nodes}
    requantized = out_qparams != (0.05, 10)
    assert (tq.dequantize_per_tensor.default in targets) == requantized
    assert (tq.quantize_per_tensor.default in targets) == requantized


def test_max_pool_with_indices_used_stays_float():
    """The indices of a max pool of dequantized values are used: the pool is left alone."""
    tq = torch.ops.torchquant

    def fn(q):
        values, indices = torch.nn.functional.max_pool2d(
            tq.dequantize_per_tensor(q, 0.05, 10), 2, return_indices=True)
        return tq.quantize_per_tensor(values, 0.05, 10, "quint8"), indices

    q = torch.randint(0, 256, (1, 4, 6, 6), dtype=torch.uint8)
    (out, indices), nodes, _ = _frozen_graph_nodes(fn, q)
    expected, expected_indices = fn(q)
    assert torch.equal(out, expected) and torch.equal(indices, expected_indices)
    assert _pools(nodes) == [torch.float32]


def test_integer_pool_rule_is_inductors_lowering_rule():
    """fusion.integer_max_pool_lowered follows inductor's own choice between its loop and
    ATen's kernel (a torch upgrade that moves the threshold fails here, not in a model)."""
    from torch._inductor.lowering import should_fallback_max_pool_with_indices
    from torchquant.ops.inductor import fusion
    for kernel in ([2, 2], [3, 3], [5, 5], [5, 6], [6, 6], [1, 25], [2, 13], [7, 7], 3, [4]):
        assert fusion.integer_max_pool_lowered(kernel) == (
            not should_fallback_max_pool_with_indices(kernel, n_dim=2)), kernel


def test_max_pool_inductor_hands_to_aten_stays_float():
    """A window of more than 25 elements inductor hands to ATen's kernel, whose 8-bit
    channels-last max pool rejects this shape (a torch bug): the pool stays in float."""
    tq = torch.ops.torchquant

    def fn(q):
        pooled = torch.nn.functional.max_pool2d(tq.dequantize_per_tensor(q, 0.05, 10), 6, 2, 3)
        return tq.quantize_per_tensor(pooled, 0.05, 10, "quint8")

    q = torch.randint(0, 256, (4, 32, 16, 16), dtype=torch.uint8)
    q = q.contiguous(memory_format=torch.channels_last)
    out, nodes, _ = _frozen_graph_nodes(fn, q)
    assert torch.equal(out, fn(q))
    assert _pools(nodes) == [torch.float32]


def test_trimmed_padding_taps_give_the_same_accumulator():
    """Kernel taps that only ever read padding are dropped (a 3x3 conv over a 1x1 image is its
    centre tap); the conv left gives the same integer accumulator (exact in float64) for every
    geometry, and keeps the conv where trimming would change its padding's symmetry."""
    from torchquant.ops.inductor.fusion import _trim_padding_taps
    torch.manual_seed(0)
    trimmed = 0
    for size in (1, 2, 3, 5):
        for kernel in (1, 2, 3, 5):
            for stride in (1, 2, 3):
                for dilation in (1, 2):
                    for padding in range(kernel // 2 + 1):
                        if size + 2 * padding < dilation * (kernel - 1) + 1:
                            continue
                        x = torch.randint(-128, 128, (2, 3, size, size)).double()
                        w = torch.randint(-128, 128, (4, 3, kernel, kernel), dtype=torch.int8)
                        geometry = ([stride] * 2, [padding] * 2, [dilation] * 2, 1)
                        w2, (s2, p2, d2, _) = _trim_padding_taps([size, size], w, geometry)
                        expected = torch.nn.functional.conv2d(x, w.double(), None, stride,
                                                              padding, dilation)
                        got = torch.nn.functional.conv2d(x, w2.double(), None, s2, p2, d2)
                        assert torch.equal(got, expected), (size, kernel, stride, dilation)
                        trimmed += w2.shape != w.shape
    assert trimmed > 10
    w = torch.ones(8, 8, 3, 3, dtype=torch.int8)
    w2, (_, padding, _, _) = _trim_padding_taps([1, 1], w, ([1, 1], [1, 1], [1, 1], 1))
    assert w2.shape == (8, 8, 1, 1) and padding == [0, 0]


@pytest.mark.skipif(not exactness.onednn_u8s8_exact(), reason="oneDNN u8 x s8 inexact here")
@pytest.mark.parametrize("native_convs", [False, True])
def test_convs_over_one_pixel_images_run_their_centre_tap(native_convs, monkeypatch):
    """A 3x3 conv over the 1x1 images a ResNet's last stage sees on small inputs compiles to a
    1x1 conv (oneDNN's or the native one): the integers of the untrimmed oneDNN-fused eager
    model."""
    if native_convs and not (native.available() and native.exact_u8()):
        pytest.skip("the native conv runs where fbgemm's u8 x s8 is exact")
    if not native_convs:
        monkeypatch.setattr(native, "conv_preferred", lambda *args: False)

    class Tail(nn.Module):
        def __init__(self):
            super().__init__()
            self.down = nn.Conv2d(16, 32, 3, stride=2, padding=1)
            self.conv = nn.Conv2d(32, 32, 3, padding=1)
            self.relu1, self.relu2 = nn.ReLU(), nn.ReLU()

        def forward(self, x):
            return self.relu2(self.conv(self.relu1(self.down(x))))

    torch.manual_seed(0)
    example = torch.randn(4, 16, 2, 2)
    prepared = prepare_pt2e(torch.export.export(Tail().eval(), (example,)).module(),
                            X86InductorQuantizer().set_global(
                                get_default_x86_inductor_quantization_config()))
    prepared(example)
    converted = convert_pt2e(prepared)
    with torch.no_grad():
        fused_eager = torchquant.compile(converted, use_torch_compile=False)(example)
    out, _, conv_weights = _frozen_graph_nodes(copy.deepcopy(converted), example)
    # the stride-2 conv over 2x2 images reads its taps 1..2 only; the 3x3 over 1x1 its centre
    assert sorted(conv_weights) == [(32, 16, 2, 2), (32, 32, 1, 1)]
    scale = (fused_eager[fused_eager > 0].min()).item()
    steps = _steps(out, fused_eager, scale)
    assert steps.max() <= 1 and (steps > 0).float().mean() < 0.01
