"""kernels.native: fbgemm's dynamic Linear and the dynamic LSTM / GRU loops in C++.

Oracles, bit for bit: torch.ao's dynamic Linear / LSTM / GRU (engine x86, which runs the same
fbgemm routines), and the plain-torch integer reference (quantize with ATen's qparams, int64
matmul, fbgemm's epilogue ``fma(acc, x_scale * w_scale, bias)``).  Each is checked on this
CPU's fbgemm kernels and with fbgemm forced down to AVX2."""
import contextlib
import copy
import itertools

import pytest
import torch
from torch import nn

import torchquant.quantization as tq
from torchquant import affine
from torchquant import kernels
from torchquant.kernels import linear_small_m as S
from torchquant.kernels import native
from torchquant.kernels.packed_linear import pack_linear_weight
from torchquant.kernels.recurrent import gru_sequence_reference, lstm_sequence_reference
from conftest import run_python

pytestmark = pytest.mark.skipif(not native.available(), reason=native.describe())


@contextlib.contextmanager
def forced_isa(name):
    native.force_isa(name)
    try:
        yield
    finally:
        native.force_isa("auto")


def _packed(n, k, per_channel, bias, zero_point=0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    if per_channel:
        scale = torch.rand(n, generator=gen, dtype=torch.float64) * 0.01 + 1e-3
        zp, axis = torch.zeros(n, dtype=torch.int64), 0
    else:
        scale, zp, axis = torch.tensor(0.0123, dtype=torch.float64), torch.tensor(zero_point), None
    b = torch.randn(n, generator=gen) if bias else None
    return pack_linear_weight(w, scale, zp, axis, b)


def _torch_ao_linear(packed, relu):
    if packed.axis is None:
        wq = torch._make_per_tensor_quantized_tensor(packed.weight, float(packed.weight_scale),
                                                     int(packed.weight_zero_point))
    else:
        wq = torch._make_per_channel_quantized_tensor(packed.weight, packed.weight_scale,
                                                      packed.weight_zero_point, 0)
    assert torch.equal(wq.int_repr(), packed.weight)
    from torch.ao.nn.intrinsic.quantized.dynamic import LinearReLU
    from torch.ao.nn.quantized.dynamic import Linear
    mod = (LinearReLU if relu else Linear)(packed.in_features, packed.out_features)
    mod.set_weight_bias(wq, packed.bias)
    return mod


def _integer_reference(x, packed, reduce_range, relu):
    mn, mx = torch.aminmax(x)
    scale, zp = affine.choose_qparams_aten_scalar(float(mn), float(mx), 0, 255, False,
                                                  reduce_range)
    inv = torch.tensor(1.0 / scale, dtype=torch.float32)
    codes = S.quantized_codes(x, inv, zp, torch.tensor(float(zp)))
    y = S.dynamic_linear_codes_reference(codes, scale, packed)
    return y.relu() if relu else y


def _input(rows, k, seed):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, k, generator=gen) * 3 + 0.5


CASES = [(1, 96, 200), (7, 64, 33), (128, 384, 256)]


@pytest.mark.parametrize("rows,n,k", CASES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("isa", ["auto", "avx2"])
def test_dynamic_linear_matches_torch_ao_and_reference(rows, n, k, per_channel, relu, isa):
    with forced_isa(isa):
        packed = _packed(n, k, per_channel, bias=rows != 7, seed=rows)
        x = _input(rows, k, seed=n)
        got = native.dynamic_linear(x, packed, True, relu)
        assert torch.equal(got, _torch_ao_linear(packed, relu)(x))
        assert torch.equal(got, _integer_reference(x, packed, True, relu))


def test_asymmetric_per_tensor_weight_matches_torch_ao():
    packed = _packed(40, 72, False, bias=True, zero_point=-7)
    x = _input(9, 72, seed=3)
    assert torch.equal(native.dynamic_linear(x, packed, True, False),
                       _torch_ao_linear(packed, False)(x))


def test_full_range_activations_only_where_exact():
    """reduce_range=False codes reach 255: exact with VNNI, saturating on AVX2, where the
    registry must not pick the native kernel."""
    packed = _packed(48, 160, True, bias=True)
    x = _input(16, 160, seed=5)
    with forced_isa("avx2"):
        assert not native.exact_u8()
        fn = kernels.get("dynamic_linear_float", x, packed=packed, reduce_range=False)
        assert fn is not native.dynamic_linear
    if native.exact_u8():
        assert torch.equal(native.dynamic_linear(x, packed, False, False),
                           _integer_reference(x, packed, False, False))


def test_pack_of_another_instruction_set_is_refused():
    packed = _packed(16, 32, False, bias=False)
    stale = native.pack(packed)
    if stale.isa() == "avx2":
        pytest.skip("fbgemm runs AVX2 already")
    with forced_isa("avx2"):
        with pytest.raises(RuntimeError, match="pack it again"):
            torch.ops.torchquant_native.fbgemm_linear_dynamic(torch.ones(2, 32), stale, True,
                                                              False)
        assert native.pack(packed).isa() == "avx2"


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("rows", [3, 40_000])   # 40_000 x 16: the range is found in chunks
def test_non_finite_input_raises(bad, rows):
    packed = _packed(8, 16, False, bias=True)
    x = torch.ones(rows, 16)
    x[rows // 2 + 1, 5] = bad
    with pytest.raises(ValueError, match="must be finite"):
        native.dynamic_linear(x, packed, True, False)


def test_large_input_range_found_in_chunks_matches_torch_ao():
    """A large activation's min / max is found on every thread, chunk by chunk: the same
    qparams, so torch.ao's numbers."""
    packed = _packed(24, 64, True, bias=True)
    x = _input(9000, 64, seed=5)   # 576 000 values: three chunks
    x[8999, 63] = 40.0             # the maximum in the last chunk
    x[0, 0] = -35.0                # the minimum in the first
    assert torch.equal(native.dynamic_linear(x, packed, True, False),
                       _torch_ao_linear(packed, False)(x))


def test_module_uses_native_and_reference_mode_does_not():
    packed = _packed(8, 16, False, bias=True)
    x = torch.randn(4, 16)
    assert kernels.get("dynamic_linear_float", x, packed=packed) is native.dynamic_linear
    with kernels.reference_only():
        assert kernels.get("dynamic_linear_float", x, packed=packed) is not native.dynamic_linear


class _Wrap(nn.Module):
    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, *args):
        return self.rnn(*args)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("hidden", [40, 64])  # 64: the fused cell loops; 40: ATen's cell ops
def test_rnn_module_matches_torch_ao(mode, bidirectional, isa, hidden):
    import torch.ao.quantization as aoq
    float_rnn = getattr(nn, mode)(24, hidden, 2, bidirectional=bidirectional).eval()
    x = torch.randn(9, 3, 24) * 2
    with forced_isa(isa):
        ours = tq.quantize_dynamic(_Wrap(copy.deepcopy(float_rnn)), {nn.LSTM, nn.GRU})
        theirs = aoq.quantize_dynamic(_Wrap(copy.deepcopy(float_rnn)), {nn.LSTM, nn.GRU})
        got, want = ours(x), theirs(x)
    assert torch.equal(got[0], want[0])
    finals = zip(*((got[1], want[1]) if mode == "LSTM" else ([got[1]], [want[1]])))
    assert all(torch.equal(a, b) for a, b in finals)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("threads", [1, 2])
def test_rnn_cells_split_across_threads_match_torch_ao(mode, threads):
    """A step with at least 2048 hidden values (batch 9 x 256 here) runs its cells split by
    batch rows across ATen's threads (an uneven split at 2 threads): torch.ao's numbers."""
    import torch.ao.quantization as aoq
    torch.manual_seed(3)
    float_rnn = getattr(nn, mode)(48, 256, 1).eval()
    x = torch.randn(4, 9, 48) * 2
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        ours = tq.quantize_dynamic(_Wrap(copy.deepcopy(float_rnn)), {nn.LSTM, nn.GRU})
        theirs = aoq.quantize_dynamic(_Wrap(copy.deepcopy(float_rnn)), {nn.LSTM, nn.GRU})
        got, want = ours(x), theirs(x)
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(got[0], want[0])


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("hs", [32, 20])
def test_sequence_kernels_match_their_references(reverse, hs):
    batch, steps = 5, 6
    lstm_w = _packed(4 * hs, hs, True, bias=True, seed=1)
    gru_w = _packed(3 * hs, hs, False, bias=True, seed=2)
    h0, c0 = torch.randn(batch, hs), torch.randn(batch, hs)
    ih4, ih3 = torch.randn(steps, batch, 4 * hs), torch.randn(steps, batch, 3 * hs)
    got = native.lstm_sequence(ih4, h0, c0, lstm_w, True, reverse)
    want = lstm_sequence_reference(ih4, h0, c0, lstm_w, True, reverse)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    got = native.gru_sequence(ih3, h0, gru_w, True, reverse)
    want = gru_sequence_reference(ih3, h0, gru_w, True, reverse)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


def test_disabled_by_environment_variable():
    code = ("import torch, torchquant.kernels.native as n\n"
            "from torchquant.kernels.linear import dynamic_linear\n"
            "from torchquant.kernels.packed_linear import pack_linear_weight\n"
            "assert not n.available() and 'TORCHQUANT_NATIVE=0' in n.describe()\n"
            "p = pack_linear_weight(torch.ones(4, 8, dtype=torch.int8), torch.tensor(0.1),"
            " torch.tensor(0))\n"
            "print(dynamic_linear(torch.ones(2, 8), p).shape)\n")
    assert "torch.Size([2, 4])" in run_python(code, TORCHQUANT_NATIVE="0").stdout


@pytest.mark.parametrize("fn", ["sigmoid", "tanh"])
def test_fused_cell_activations_are_atens(fn):
    gen = torch.Generator().manual_seed(7)
    x = torch.cat([torch.randn(4096, generator=gen) * 6, torch.linspace(-90, 90, 1024),
                   torch.tensor([0.0, -0.0, 1e-30, -1e-30, 88.7, -88.7, 1e-8, -1e-8] * 2)])
    got = torch.ops.torchquant_native.fused_activation(x, fn)
    assert torch.equal(got, getattr(torch, fn)(x))


def test_fused_cells_follow_aten_cpu_capability():
    """With ATen's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2) the fused loops use AVX2's Sleef
    exp; and with them switched off (TORCHQUANT_FUSED_GATES=0) ATen's ops run: torch.ao's
    numbers either way."""
    code = ("import copy, torch, warnings\n"
            "warnings.simplefilter('ignore')\n"
            "from torch import nn\n"
            "import torch.ao.quantization as aoq, torchquant.quantization as tq\n"
            "torch.manual_seed(0)\n"
            "for mode in (nn.LSTM, nn.GRU):\n"
            "    m = nn.Sequential(mode(32, 64, 1)).eval()\n"
            "    x = torch.randn(5, 3, 32) * 2\n"
            "    a = tq.quantize_dynamic(copy.deepcopy(m), {mode})[0](x)[0]\n"
            "    b = aoq.quantize_dynamic(copy.deepcopy(m), {mode})[0](x)[0]\n"
            "    assert torch.equal(a, b), mode\n"
            "print('ok')\n")
    for env in ({"ATEN_CPU_CAPABILITY": "avx2"}, {"TORCHQUANT_FUSED_GATES": "0"}):
        assert "ok" in run_python(code, **env).stdout, env


@pytest.mark.parametrize("rows,n,k", [(1, 300, 768), (32, 300, 256), (128, 64, 100), (7, 33, 64)])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_static_linear_matches_torch_ao(rows, n, k, per_channel, relu):
    """uint8 x int8 -> uint8 through fbgemm's requantizing epilogue: torch.ao's integers (the
    plain-torch reference rounds a float64 result: within one step of them)."""
    import torch.ao.nn.quantized as ao_nnq
    from torch.ao.nn.intrinsic.quantized import LinearReLU
    from torchquant.kernels.post_ops import post_op_of
    if not native.exact_u8():
        pytest.skip("fbgemm saturates full-range uint8 activations on this CPU (no VNNI)")
    packed = _packed(n, k, per_channel, bias=rows != 128, seed=rows)
    ao_weight = _torch_ao_linear(packed, False).weight()
    ao = (LinearReLU if relu else ao_nnq.Linear)(k, n)
    ao.set_weight_bias(ao_weight, packed.bias)
    ao.scale, ao.zero_point = 0.05, 60
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(0, 256, (rows, k), dtype=torch.uint8, generator=gen)
    want = ao(torch._make_per_tensor_quantized_tensor(x, 0.03, 70)).int_repr()
    epilogue = post_op_of("relu" if relu else "none", 0.01, None, 1.0, 0, (rows, n), "test")
    args = (x, 0.03, 70, packed, 0.05, 60, tq_quint8(), epilogue, None)
    assert kernels.get("quantized_linear", x, packed=packed, out_qdtype=tq_quint8(),
                       post_op=epilogue.name) is native.static_linear
    got = native.static_linear(*args)
    assert torch.equal(got, want)
    reference = kernels.implementations("quantized_linear")["reference"].fn(*args)
    assert int((got.int() - reference.int()).abs().max()) <= 1


def tq_quint8():
    import torchquant
    return torchquant.quint8


def test_static_linear_not_chosen_where_fbgemm_saturates():
    packed = _packed(16, 32, False, bias=True)
    x = torch.randint(0, 256, (4, 32), dtype=torch.uint8)
    with forced_isa("avx2"):
        fn = kernels.get("quantized_linear", x, packed=packed, out_qdtype=tq_quint8(),
                         post_op="none")
        assert fn is not native.static_linear


@pytest.mark.skipif(not (native.available() and native.amx()), reason="needs AMX-INT8")
# (4 rows: the tiles' lower bound; 70 x 20 outputs: one 32-column block, rows split over the
# threads; 33 x 300: columns split; K = 100 / 65: the tiles read past a row, the last rows copied;
# 1-3 rows: the VNNI loop, with 64- and 32-column panel groups, K not a multiple of 4 and an odd
# number of 4-byte groups)
@pytest.mark.parametrize("rows,n,k", [(4, 70, 100), (70, 20, 100), (33, 300, 768), (100, 33, 65),
                                      (1, 70, 101), (2, 300, 768), (3, 33, 65), (1, 3072, 768),
                                      (3, 96, 12)])
def test_amx_linear_equals_the_fbgemm_linear_bit_for_bit(rows, n, k):
    """On AMX CPUs the static and dynamic Linear take the AMX packing's GEMMs (the tiles from
    four rows on, AVX-512 VNNI on the same packing below) with fbgemm's own output processing:
    the same numbers as fbgemm's GEMM (weights with zero points, ReLU, per tensor and per
    channel, full-range and reduce_range activations)."""
    from torchquant.kernels import cpu_isa
    ops = torch.ops.torchquant_native
    gen = torch.Generator().manual_seed(rows)
    for per_channel, zero_points, relu in itertools.product((False, True), (False, True),
                                                            (False, True)):
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
        scale = torch.rand(n if per_channel else 1, generator=gen) * 0.01 + 0.001
        zp = (torch.randint(-3, 4, scale.shape, generator=gen) if zero_points
              else torch.zeros(scale.shape, dtype=torch.long))
        pack = ops.fbgemm_pack_linear(w, scale, zp, torch.randn(n, generator=gen))
        x_u8 = torch.randint(0, 256, (rows, k), dtype=torch.uint8, generator=gen)
        x = torch.randn(rows, k, generator=gen) * 3

        def run():
            return [ops.fbgemm_linear_static(x_u8, 0.02, 7, pack, 0.5, 60, relu),
                    ops.fbgemm_linear_dynamic(x, pack, True, relu),
                    ops.fbgemm_linear_dynamic(x, pack, False, relu)]

        got = run()
        with cpu_isa.forced_cpu_isa("avx512_vnni"):
            assert not native.amx()
            want = run()
        for g, w_ in zip(got, want):
            assert torch.equal(g, w_), (per_channel, zero_points, relu)
