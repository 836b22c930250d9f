"""Int8 Linear kernels against torch.ao's quantized Linear (engine x86) and against each other.

Tolerances (why they exist):
* static (u8 out): every kernel folds dequantize -> linear -> quantize differently in float
  (torch's oneDNN / fbgemm, our oneDNN call, our ``_int_mm`` epilogue, our float reference),
  so an output can land one step apart where it sits within float rounding of a tie.  We ask
  for |diff| <= 1 everywhere and exact agreement on >= 99 % of the elements.
* dynamic (float out): the quantized activations and the int32 accumulators are exact, only the
  float rescale epilogue rounds differently -> relative 1e-5 of the output's magnitude.

On CPUs without VNNI / AMX (AVX2 only) torch's x86 oracle saturates int16 pairs of u8 x s8
products for activations above 128 and is wrong there (see tests/conftest.py): the static
oracle comparisons draw their activations with ``oracle_u8`` (0..127 on such CPUs, the full
range elsewhere), and the full range is checked against the exact integer truth and the
reference instead (test_no_int16_saturation, test_static_fast_vs_reference_large).
"""
import copy
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import torchquant as tq
from torchquant import affine, kernels
from torchquant.kernels.linear import (ONEDNN_MIN_ROWS, dynamic_linear,
                                       per_token_dynamic_linear, quantized_linear)
from torchquant.kernels.packed_linear import PackedLinearWeight, pack_linear_weight
from torchquant.kernels.post_ops import PostOp

nnq = torch.ao.nn.quantized
nnqd = torch.ao.nn.quantized.dynamic
nniq = torch.ao.nn.intrinsic.quantized
nniqd = torch.ao.nn.intrinsic.quantized.dynamic


@pytest.fixture(autouse=True)
def _x86_engine():
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    yield
    torch.backends.quantized.engine = old


def random_weight(n, k, per_channel, zero_point=0):
    """int8 weights with their qparams, and the same as a torch quantized tensor."""
    w_int = torch.randint(-128, 128, (n, k), dtype=torch.int8)
    if per_channel:
        scale = torch.rand(n, dtype=torch.float64) * 0.02 + 0.001
        zp = torch.full((n,), zero_point, dtype=torch.int64)
        torch_w = torch._make_per_channel_quantized_tensor(w_int, scale, zp, 0)
        return w_int, scale, zp, 0, torch_w
    scale, zp = torch.tensor(0.0123, dtype=torch.float64), torch.tensor(zero_point)
    return w_int, scale, zp, None, torch._make_per_tensor_quantized_tensor(w_int, 0.0123, zero_point)


def assert_within_one_step(got, expected, min_exact=0.99):
    diff = (got.to(torch.int32) - expected.to(torch.int32)).abs()
    assert diff.max().item() <= 1, f"max difference {diff.max().item()} steps"
    assert (diff == 0).float().mean().item() >= min_exact


def static_impls():
    return kernels.implementations("quantized_linear")


# --------------------------------------------------------------------------------------------
# Known values (SPEC §24)
# --------------------------------------------------------------------------------------------

X24 = torch.tensor([[0.5, -1.0, 2.0, 0.25], [1.0, 1.5, -0.5, 0.0]])
W24 = torch.tensor([[0.1, -0.2, 0.3, 0.4], [-0.5, 0.25, 0.05, -0.1], [0.9, 0.0, -0.3, 0.2]])
B24 = torch.tensor([0.1, -0.2, 0.05])


def packed24():
    w_int = tq.quantize_per_tensor(W24, 0.01, 0, tq.qint8).int_repr()
    return pack_linear_weight(w_int, torch.tensor(0.01), torch.tensor(0), None, B24)


@pytest.mark.parametrize("impl", ["reference", "int_mm", "onednn"])
def test_static_known_values(impl):
    kernel = static_impls().get(impl)
    if kernel is None or not kernel.available():
        pytest.skip(f"{impl} unavailable")
    x_int = tq.quantize_per_tensor(X24, 0.02, 64, tq.quint8).int_repr()
    got = kernel.fn(x_int, 0.02, 64, packed24(), 0.05, 10, tq.quint8, PostOp(), None)
    assert got.tolist() == [[31, 0, 9], [5, 3, 32]]


@pytest.mark.parametrize("impl", ["reference", "int_mm", "onednn"])
@pytest.mark.parametrize("reduce_range,expected", [
    (True, [[1.0543307, -0.6216536, -0.0539370], [-0.2519685, -0.3429134, 1.0917323]]),
    (False, [[1.0494118, -0.6276470, -0.0452941], [-0.2505882, -0.3517647, 1.1017647]]),
])
def test_dynamic_known_values(impl, reduce_range, expected):
    kernel = kernels.implementations("dynamic_linear").get(impl)
    if kernel is None or not kernel.available():
        pytest.skip(f"{impl} unavailable")
    s, z = affine.choose_qparams_aten_scalar(X24.min().item(), X24.max().item(), 0, 255, False,
                                             reduce_range)
    x_q = affine.quantize_int(X24, torch.tensor(s), torch.tensor(z), 0, 255, torch.uint8)
    got = kernel.fn(x_q, torch.tensor(s), torch.tensor(z), packed24(), False)
    torch.testing.assert_close(got, torch.tensor(expected), rtol=0, atol=1e-6)
    torch.testing.assert_close(dynamic_linear(X24, packed24(), reduce_range),
                               torch.tensor(expected), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------
# Static Linear vs torch.ao (x86)
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("x_zp", [0, 77])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows", [1, 2, 33])
def test_static_matches_torch(per_channel, x_zp, relu, with_bias, rows, oracle_u8):
    k, n = 40, 24
    w_int, w_scale, w_zp, axis, torch_w = random_weight(n, k, per_channel)
    bias = torch.randn(n) if with_bias else None
    x_int = oracle_u8((rows, k))  # activations torch's oracle computes exactly on this CPU
    x_scale, out_scale, out_zp = 0.04, 0.5, 90
    module = (nniq.LinearReLU if relu else nnq.Linear)(k, n)
    module.set_weight_bias(torch_w, bias)
    module.scale, module.zero_point = out_scale, out_zp
    expected = module(torch._make_per_tensor_quantized_tensor(x_int, x_scale, x_zp)).int_repr()

    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, bias)
    post_op = "relu" if relu else "none"
    got = quantized_linear(x_int, x_scale, x_zp, packed, out_scale, out_zp, tq.quint8, post_op)
    assert_within_one_step(got, expected)
    for name, kernel in static_impls().items():
        if kernel.available():
            one = kernel.fn(x_int, x_scale, x_zp, packed, out_scale, out_zp, tq.quint8,
                            PostOp(post_op), None)
            assert_within_one_step(one, expected), name


def test_static_fast_vs_reference_large():
    """Many outputs: the fast kernels agree with the reference on >= 99 % exactly."""
    k, n = 256, 96
    w_int, w_scale, w_zp, axis, _ = random_weight(n, k, True)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, torch.randn(n))
    x_int = torch.randint(0, 256, (64, k), dtype=torch.uint8)
    args = (x_int, 0.02, 100, packed, 0.3, 120, tq.quint8, PostOp(), None)
    reference = static_impls()["reference"].fn(*args)
    for name, kernel in static_impls().items():
        if name != "reference" and kernel.available():
            assert_within_one_step(kernel.fn(*args), reference)


@pytest.mark.parametrize("rows", [1, 8])
def test_no_int16_saturation(rows):
    """Activations 200..255 against weights of one sign per output: every pair
    ``u8*s8 + u8*s8`` leaves int16, which ``vpmaddubsw`` (x86 without VNNI / AMX) saturates.
    Every kernel, static and dynamic, must still give the exact integer result -- on such CPUs
    the oneDNN kernels hand these inputs to ``_int_mm`` (the torch oracle is wrong here, so the
    truth is computed in float64)."""
    k, n = 64, 8
    w_int = torch.randint(100, 128, (n, k), dtype=torch.int8)
    w_int[n // 2:] *= -1
    packed = pack_linear_weight(w_int, torch.tensor(0.01), torch.tensor(0), None, None)
    x_int = torch.randint(200, 256, (rows, k), dtype=torch.uint8)
    y = ((x_int.double() - 3) @ w_int.double().t()) * (0.05 * 0.01)
    for name, kernel in kernels.implementations("dynamic_linear").items():
        if kernel.available():
            got = kernel.fn(x_int, 0.05, 3, packed, False)
            torch.testing.assert_close(got.double(), y, rtol=1e-6, atol=0, msg=name)
    expected = torch.clamp(torch.round(y / 8.0) + 128, 0, 255)
    for name, kernel in static_impls().items():
        if kernel.available():
            got = kernel.fn(x_int, 0.05, 3, packed, 8.0, 128, tq.quint8, PostOp(), None)
            assert_within_one_step(got, expected, min_exact=0.9)


def test_saturation_guard_splits_large_inputs(monkeypatch):
    """Where oneDNN saturates int16 pairs (forced here; the real state on AVX2-only CPUs) its
    Linear kernels keep one oneDNN call for inputs <= 128 and split larger inputs into two
    exact halves (x & 127, x >> 7): results as the exact int32 GEMM's (one float rounding
    apart at most), never the unvectorised ``_int_mm``; the per-token fast path splits too."""
    from torchquant.kernels import linear as klinear
    from torchquant.kernels import onednn_exactness as exactness
    if not static_impls()["onednn"].available():
        pytest.skip("oneDNN not available")
    monkeypatch.setattr(exactness, "onednn_u8_exact_max", lambda: exactness.ONEDNN_SAFE_U8_MAX)
    calls = []
    for op in ("_quantized_linear_int_mm", "_dynamic_linear_int_mm", "onednn_split_linear"):
        real = getattr(klinear, op)
        monkeypatch.setattr(klinear, op, lambda *a, _real=real, _op=op, **k: calls.append(_op)
                            or _real(*a, **k))
    w_int, w_scale, w_zp, axis, _ = random_weight(16, 32, True)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, torch.randn(16))
    small = torch.randint(0, 129, (4, 32), dtype=torch.uint8)
    small[0, 0] = 128
    big = torch.randint(0, 256, (4, 32), dtype=torch.uint8)
    big[1, 1] = 255
    static_args = (0.05, 7, packed, 0.5, 100, tq.quint8, PostOp(), None)
    onednn_static = static_impls()["onednn"].fn
    onednn_dynamic = kernels.implementations("dynamic_linear")["onednn"].fn
    reference = static_impls()["reference"].fn
    assert_within_one_step(onednn_static(small, *static_args), reference(small, *static_args))
    onednn_dynamic(small, 0.05, 7, packed, False)
    assert calls == []  # both on one oneDNN call
    # the exact int32 GEMM: _int_mm where it is exact on this CPU (not under
    # ONEDNN_MAX_CPU_ISA=AVX2 on a VNNI CPU, where ATen still sends it to oneDNN), else the
    # reference kernels
    exact_static = (klinear._quantized_linear_int_mm if exactness.int_mm_exact_on_cpu()
                    else reference)
    exact_dynamic = (klinear._dynamic_linear_int_mm if exactness.int_mm_exact_on_cpu()
                     else kernels.implementations("dynamic_linear")["reference"].fn)
    assert_within_one_step(onednn_static(big, *static_args), exact_static(big, *static_args))
    torch.testing.assert_close(onednn_dynamic(big, 0.05, 7, packed, False),
                               exact_dynamic(big, 0.05, 7, packed, False).float(),
                               rtol=1e-5, atol=1e-5)
    assert calls.count("onednn_split_linear") == 2
    calls.clear()
    assert klinear._per_token_fast(torch.randn(4, 32), packed, False) is not None
    assert calls == ["onednn_split_linear"]


def test_static_batched_input_and_qtensor_scalars():
    """Leading dimensions are kept; 0-d tensor qparams (as QTensor holds them) work."""
    w_int, w_scale, w_zp, axis, torch_w = random_weight(16, 8, True)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, None)
    x_int = torch.randint(0, 256, (2, 3, 8), dtype=torch.uint8)
    got = quantized_linear(x_int, torch.tensor(0.05, dtype=torch.float64), torch.tensor(3),
                           packed, torch.tensor(0.1), torch.tensor(5))
    assert got.shape == (2, 3, 16) and got.dtype == torch.uint8
    flat = quantized_linear(x_int.reshape(6, 8), 0.05, 3, packed, 0.1, 5)
    assert torch.equal(got.reshape(6, 16), flat)


def test_static_qint8_output_and_int8_input():
    """qint8 in / out take the int_mm or reference kernels (oneDNN is u8 only)."""
    w_int, w_scale, w_zp, axis, _ = random_weight(8, 16, False)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, torch.randn(8))
    x_int = torch.randint(-128, 128, (5, 16), dtype=torch.int8)
    got = quantized_linear(x_int, 0.05, -3, packed, 0.2, 4, tq.qint8)
    with kernels.reference_only():
        expected = quantized_linear(x_int, 0.05, -3, packed, 0.2, 4, tq.qint8)
    assert got.dtype == torch.int8
    assert_within_one_step(got, expected)


def test_asymmetric_weights_use_reference():
    w_int, w_scale, w_zp, axis, _ = random_weight(8, 16, True, zero_point=5)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, None)
    assert not packed.symmetric and packed.onednn_weight is None
    x_int = torch.randint(0, 256, (6, 16), dtype=torch.uint8)
    w_hat = (w_int.double() - 5) * w_scale[:, None]
    y = ((x_int.double() - 10) * 0.05) @ w_hat.t()
    expected = torch.clamp(torch.round(y / 0.3) + 50, 0, 255)
    got = quantized_linear(x_int, 0.05, 10, packed, 0.3, 50)
    assert_within_one_step(got, expected)


def test_dispatch_by_rows():
    w_int, w_scale, w_zp, axis, _ = random_weight(8, 16, True)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, None)
    impls = static_impls()
    one_row = torch.zeros(1, 16, dtype=torch.uint8)
    if ONEDNN_MIN_ROWS > 1:
        assert kernels.get("quantized_linear", one_row, packed=packed,
                           out_qdtype=tq.quint8) is impls["int_mm"].fn
    # int8 activations (qint8) are _int_mm's whatever the rows (oneDNN takes uint8 only),
    # where _int_mm is exact on this CPU (see exactness.int_mm_exact_on_cpu), else the
    # reference's
    from torchquant.kernels import onednn_exactness as exactness
    assert kernels.get("quantized_linear", one_row.to(torch.int8), packed=packed,
                       out_qdtype=tq.quint8) is \
        impls["int_mm" if exactness.int_mm_exact_on_cpu() else "reference"].fn
    if impls["onednn"].available():
        many = torch.zeros(ONEDNN_MIN_ROWS, 16, dtype=torch.uint8)
        assert kernels.get("quantized_linear", many, packed=packed,
                           out_qdtype=tq.quint8) is impls["onednn"].fn
    with kernels.reference_only():
        assert kernels.get("quantized_linear", one_row, packed=packed,
                           out_qdtype=tq.quint8) is impls["reference"].fn


def test_empty_batch():
    w_int, w_scale, w_zp, axis, _ = random_weight(8, 16, True)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, torch.randn(8))
    assert quantized_linear(torch.zeros(0, 16, dtype=torch.uint8), 0.1, 0, packed, 0.1,
                            0).shape == (0, 8)
    assert dynamic_linear(torch.zeros(0, 16), packed).shape == (0, 8)
    assert per_token_dynamic_linear(torch.zeros(2, 0, 16), packed).shape == (2, 0, 8)


# --------------------------------------------------------------------------------------------
# Dynamic Linear vs torch.ao (x86 = fbgemm semantics, reduce_range)
# --------------------------------------------------------------------------------------------

def torch_dynamic(torch_w, bias, relu):
    module = (nniqd.LinearReLU if relu else nnqd.Linear)(torch_w.shape[1], torch_w.shape[0])
    module.set_weight_bias(torch_w, bias)
    return module


def assert_dynamic_close(got, expected):
    torch.testing.assert_close(got, expected, rtol=1e-5,
                               atol=1e-5 * max(expected.abs().max().item(), 1e-3))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 40), (2, 40), (3, 7, 40), (40, 40)])
def test_dynamic_matches_torch(per_channel, relu, with_bias, shape):
    n = 24
    w_int, w_scale, w_zp, axis, torch_w = random_weight(n, shape[-1], per_channel)
    bias = torch.randn(n) if with_bias else None
    x = torch.randn(shape) * 3 + 0.5
    expected = torch_dynamic(torch_w, bias, relu)(x)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, bias)
    assert_dynamic_close(dynamic_linear(x, packed, relu=relu), expected)
    x_q_args = None
    for name, kernel in kernels.implementations("dynamic_linear").items():
        if not kernel.available():
            continue
        if x_q_args is None:
            x2d = x.reshape(-1, shape[-1])
            s, z = affine.choose_qparams_aten_scalar(x2d.min().item(), x2d.max().item(), 0, 255,
                                                     False, True)
            x_q_args = (affine.quantize_int(x2d, torch.tensor(s), torch.tensor(z), 0, 255,
                                            torch.uint8), torch.tensor(s), torch.tensor(z))
        got = kernel.fn(*x_q_args, packed, relu)
        assert_dynamic_close(got.reshape(expected.shape), expected)


def test_dynamic_top_of_reduced_range_lands_on_128():
    """fbgemm clamps reduce_range activations to 0..255, not 0..127: [-1, 1] quantizes with
    scale 2/127, zp 64, and 1.0 -> 127.5 -> 128 (half to even)."""
    w_int = torch.tensor([[127, 0], [0, 127]], dtype=torch.int8)
    torch_w = torch._make_per_tensor_quantized_tensor(w_int, 1 / 127, 0)
    x = torch.tensor([[-1.0, 1.0]])
    expected = torch_dynamic(torch_w, None, False)(x)
    packed = pack_linear_weight(w_int, torch.tensor(1 / 127), torch.tensor(0), None, None)
    for name, kernel in kernels.implementations("dynamic_linear").items():
        if kernel.available():
            s, z = affine.choose_qparams_aten_scalar(-1.0, 1.0, 0, 255, False, True)
            x_q = affine.quantize_int(x, torch.tensor(s), torch.tensor(z), 0, 255, torch.uint8)
            assert x_q.tolist() == [[0, 128]]
            assert_dynamic_close(kernel.fn(x_q, torch.tensor(s), torch.tensor(z), packed, False),
                                 expected)


def test_dynamic_large_fast_vs_reference():
    w_int, w_scale, w_zp, axis, torch_w = random_weight(96, 256, True)
    bias = torch.randn(96)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, bias)
    x = torch.randn(64, 256)
    expected = torch_dynamic(torch_w, bias, False)(x)
    assert_dynamic_close(dynamic_linear(x, packed), expected)
    with kernels.reference_only():
        assert_dynamic_close(dynamic_linear(x, packed), expected)


def test_dynamic_errors():
    packed = packed24()
    with pytest.raises(TypeError, match="float input"):
        dynamic_linear(torch.ones(2, 4, dtype=torch.int32), packed)
    with pytest.raises(ValueError, match="in_features=4"):
        dynamic_linear(torch.ones(2, 5), packed)
    with pytest.raises(ValueError, match="finite"):
        dynamic_linear(torch.tensor([[1.0, float("nan"), 0.0, 0.0]]), packed)
    with pytest.raises(ValueError, match="NaN or Inf"):
        per_token_dynamic_linear(torch.tensor([[1.0, float("inf"), 0.0, 0.0]]), packed)


# --------------------------------------------------------------------------------------------
# Per-token dynamic Linear
# --------------------------------------------------------------------------------------------

def test_per_token_matches_its_definition():
    """torchao's per-token rule: rows symmetric int8 -127..127, scale max(max|row| / 127, 1e-5),
    ``round(x * (1 / scale))``; then the exact int GEMM and the rescale."""
    w_int, w_scale, w_zp, axis, _ = random_weight(24, 40, True)
    bias = torch.randn(24)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, bias)
    x = torch.randn(6, 40) * torch.tensor([0.01, 1.0, 10.0, 100.0, 3.0, 0.0])[:, None]
    row_scale = torch.clamp(x.abs().amax(1) / 127, min=1e-5)
    x_q = torch.clamp(torch.round(x * (1.0 / row_scale[:, None])), -127, 127)
    expected = (x_q.double() @ w_int.double().t()) * row_scale[:, None].double() \
        * w_scale.double() + bias.double()
    for relu in (False, True):
        want = torch.relu(expected) if relu else expected
        got = per_token_dynamic_linear(x, packed, relu=relu)
        assert_dynamic_close(got, want.float())
        with kernels.reference_only():
            assert_dynamic_close(per_token_dynamic_linear(x, packed, relu=relu), want.float())


def test_per_token_fast_path_matches_reference_and_definition(monkeypatch):
    """On CPU the per-token Linear quantizes the rows in one compiled kernel (hot, large
    shapes) and runs oneDNN's u8 GEMM with zero point 128 for the int8 integers shifted by
    128: the integers equal the definition's; the float rescale rounds in another order than
    the exact double reference, hence the small tolerance.  Where oneDNN saturates int16 pairs
    (AVX2-only CPUs: the shifted rows reach 255) that path is off and the rows go through
    ``_int_mm``; the compiled row kernel is then checked on its own."""
    from torchquant.kernels import cpu_compiled, linear as klinear, onednn_exactness
    monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 1)
    w_int, w_scale, w_zp, axis, _ = random_weight(48, 384, True)
    bias = torch.randn(48)
    packed = pack_linear_weight(w_int, w_scale, w_zp, axis, bias)
    if packed.onednn_weight is None:
        pytest.skip("oneDNN not available")
    x = torch.randn(64, 384) * torch.linspace(0.01, 20, 64)[:, None]
    assert x.numel() >= klinear.FUSED_DYNAMIC_MIN_NUMEL
    row_scale = torch.clamp(x.abs().amax(1) / 127, min=1e-5)
    x_q = torch.clamp(torch.round(x * (1.0 / row_scale[:, None])), -127, 127)
    compiled_u8, compiled_scale = klinear._per_token_rows_u8(x)  # eager formula ...
    assert torch.equal(compiled_u8.to(torch.int16) - 128, x_q.to(torch.int16))
    expected = (x_q.double() @ w_int.double().t()) * row_scale[:, None].double() \
        * w_scale.double() + bias.double()
    # the fast path runs wherever oneDNN is usable (split in two exact halves where its
    # products saturate int16 pairs above 128)
    fast_path = onednn_exactness.onednn_usable()
    assert (klinear._per_token_fast(x, packed, False) is None) == (not fast_path)
    for relu in (False, True):
        want = (torch.relu(expected) if relu else expected).float()
        fast = per_token_dynamic_linear(x, packed, relu=relu)
        assert_dynamic_close(fast, want)
        with kernels.reference_only():
            assert_dynamic_close(per_token_dynamic_linear(x, packed, relu=relu), want)
    # ... and the compiled kernel, which served the calls above where the fast path runs,
    # gives the same integers
    signature = cpu_compiled._signature("per_token_rows_u8", (x,))
    if fast_path:
        kernel = cpu_compiled._kernels[signature]
    else:
        kernel = cpu_compiled.compiled("per_token_rows_u8", (x,), klinear._per_token_rows_u8)
        if kernel is None:
            pytest.skip("no compiled per-token kernel on this machine")
    got_u8, got_scale = kernel([x])
    assert torch.equal(got_u8, compiled_u8) and torch.equal(got_scale, compiled_scale)
    bad = x.clone()
    bad[3, 5] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        per_token_dynamic_linear(bad, packed)


def test_per_token_is_closer_to_float():
    """Rows of very different magnitude: per-tensor activations lose the small rows."""
    w = torch.randn(64, 128) * 0.05
    scale = w.abs().amax(1).double() / 127.5
    w_int = torch.clamp(torch.round(w / scale[:, None]), -128, 127).to(torch.int8)
    packed = pack_linear_weight(w_int, scale, torch.zeros(64, dtype=torch.int64), 0, None)
    x = torch.randn(16, 128) * torch.logspace(-2, 1, 16)[:, None]
    ref = x @ w.t()

    def rel_err(y):
        return ((y - ref).norm(dim=1) / ref.norm(dim=1)).max().item()
    assert rel_err(per_token_dynamic_linear(x, packed)) < 0.05
    assert rel_err(dynamic_linear(x, packed)) > 4 * rel_err(per_token_dynamic_linear(x, packed))


# --------------------------------------------------------------------------------------------
# Packing, argument checks, helpers
# --------------------------------------------------------------------------------------------

def test_pack_copy_and_pickle_repack():
    packed = packed24()
    x_int = tq.quantize_per_tensor(X24, 0.02, 64, tq.quint8).int_repr()
    for clone in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        assert isinstance(clone, PackedLinearWeight)
        assert torch.equal(clone.weight, packed.weight)
        assert quantized_linear(x_int, 0.02, 64, clone, 0.05, 10).tolist() == [[31, 0, 9],
                                                                              [5, 3, 32]]


def test_pack_errors():
    w = torch.zeros(3, 4, dtype=torch.int8)
    one, zero = torch.tensor(1.0), torch.tensor(0)
    with pytest.raises(TypeError, match="int8"):
        pack_linear_weight(w.float(), one, zero)
    with pytest.raises(TypeError, match="plain int8"):
        pack_linear_weight(tq.quantize_per_tensor(torch.zeros(3, 4), 1.0, 0, tq.qint8), one, zero)
    with pytest.raises(ValueError, match="2-D"):
        pack_linear_weight(w[None], one, zero)
    with pytest.raises(ValueError, match="axis 0"):
        pack_linear_weight(w, torch.ones(4), torch.zeros(4), axis=1)
    with pytest.raises(ValueError, match="3 scale"):
        pack_linear_weight(w, torch.ones(2), torch.zeros(2), axis=0)
    with pytest.raises(ValueError, match="positive"):
        pack_linear_weight(w, torch.tensor(0.0), zero)
    with pytest.raises(ValueError, match="zero_point"):
        pack_linear_weight(w, one, torch.tensor(300))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        pack_linear_weight(w, one, zero, bias=torch.zeros(4))


def test_static_argument_errors():
    packed = packed24()
    x_int = torch.zeros(2, 4, dtype=torch.uint8)
    with pytest.raises(TypeError, match="uint8 / int8"):
        quantized_linear(x_int.float(), 0.1, 0, packed, 0.1, 0)
    with pytest.raises(ValueError, match="in_features=4"):
        quantized_linear(torch.zeros(2, 5, dtype=torch.uint8), 0.1, 0, packed, 0.1, 0)
    with pytest.raises(ValueError, match="x_scale"):
        quantized_linear(x_int, float("nan"), 0, packed, 0.1, 0)
    with pytest.raises(ValueError, match="out_scale"):
        quantized_linear(x_int, 0.1, 0, packed, 0.0, 0)
    with pytest.raises(ValueError, match="x_zero_point"):
        quantized_linear(x_int, 0.1, -1, packed, 0.1, 0)
    with pytest.raises(ValueError, match="out_zero_point"):
        quantized_linear(x_int, 0.1, 0, packed, 0.1, 256)
    with pytest.raises(ValueError, match="quint8 or qint8"):
        quantized_linear(x_int, 0.1, 0, packed, 0.1, 0, tq.qint32)


def test_requantize_rounds_half_to_even_and_clamps():
    acc = torch.tensor([[1, 3, 5, 1000, -1000]], dtype=torch.int32)
    got = affine.requantize(acc, torch.tensor(0.5), torch.tensor(0.0), 0, 255, torch.uint8)
    assert got.tolist() == [[0, 2, 2, 255, 0]]


finite_f32 = (st.floats(-2.0**20, 2.0**20, width=32) | st.floats(-2.0**-10, 2.0**-10, width=32)
              | st.floats(-2.0**-20, 2.0**-20, width=32))


@settings(max_examples=300, deadline=None)
@given(a=finite_f32, b=finite_f32, preserve_sparsity=st.booleans(), reduce_range=st.booleans(),
       qrange=st.sampled_from([(0, 255), (-128, 127), (0, 15)]))
def test_choose_qparams_aten_scalar_matches_tensor_version(a, b, preserve_sparsity, reduce_range,
                                                            qrange):
    lo, hi = min(a, b), max(a, b)
    scale, zp = affine.choose_qparams_aten(torch.tensor(lo), torch.tensor(hi), *qrange,
                                           preserve_sparsity, reduce_range)
    assert affine.choose_qparams_aten_scalar(lo, hi, *qrange, preserve_sparsity,
                                             reduce_range) == (scale.item(), zp.item())


@pytest.mark.parametrize("lo,hi", [(0.0, 0.0), (0.0, 1e-30), (-1e-30, 0.0), (-1e-6, 2e-6),
                                   (3.0, 5.0), (-5.0, -3.0), (-1.0, 1.0), (0.0, 1e-45)])
def test_choose_qparams_aten_scalar_edge_cases(lo, hi):
    for reduce_range in (False, True):
        scale, zp = affine.choose_qparams_aten(torch.tensor(lo), torch.tensor(hi), 0, 255,
                                               False, reduce_range)
        assert affine.choose_qparams_aten_scalar(lo, hi, 0, 255, False,
                                                 reduce_range) == (scale.item(), zp.item())
    with pytest.raises(ValueError, match="exceed"):
        affine.choose_qparams_aten_scalar(1.0, 0.0, 0, 255)
