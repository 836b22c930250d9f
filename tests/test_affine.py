"""The affine core against torch 2.13 (the oracle), bit for bit.

The borderline inputs sit within a few ulps of rounding ties: that is where torch's three
rounding formulas (see torchquant/affine.py) differ, so these tests pin which one applies where.
"""
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

import torchquant as tq
from torchquant import affine, kernels

from conftest import torch_oracle_exact_u8

DTYPES = [(tq.quint8, torch.quint8, 0, 255), (tq.qint8, torch.qint8, -128, 127),
          (tq.qint32, torch.qint32, -(2**31), 2**31 - 1)]


def borderline(scale: float, n: int = 20000, lo: int = -150, hi: int = 300) -> torch.Tensor:
    """Values at and a few ulps around (k + 0.5) * scale, plus ordinary ones and outliers."""
    k = torch.randint(lo, hi, (n,)).float()
    base = (k + 0.5) * scale
    x = base
    for steps in range(1, 4):
        up = base.clone()
        down = base.clone()
        for _ in range(steps):
            up = torch.nextafter(up, torch.tensor(float("inf")))
            down = torch.nextafter(down, torch.tensor(float("-inf")))
        x = torch.cat([x, up, down])
    return torch.cat([x, torch.randn(5000) * 50 * scale, torch.tensor([1e30, -1e30, 0.0, -0.0])])


@pytest.mark.parametrize("ours,theirs,qmin,qmax", DTYPES)
@pytest.mark.parametrize("scale,zp", [(0.02, 10), (0.1, 3), (0.37, -5), (1e-3, 0), (0.5, 127)])
def test_quantize_per_tensor_bit_exact(ours, theirs, qmin, qmax, scale, zp):
    if ours is tq.quint8 and zp < 0:
        zp = 200
    x = borderline(scale)
    expected = torch.quantize_per_tensor(x, scale, zp, theirs)
    got = tq.quantize_per_tensor(x, scale, zp, ours)
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert got.q_scale() == expected.q_scale() and got.q_zero_point() == expected.q_zero_point()
    # torch computes q - zp in int32 and wraps at the boundary (e.g. -2**31 - zp becomes positive);
    # torchquant subtracts in int64, so the qint32 extremes are compared against exact values.
    diff = expected.int_repr().to(torch.int64) - zp
    ok = (diff >= -(2**31)) & (diff < 2**31)
    assert torch.equal(got.dequantize()[ok], expected.dequantize()[ok])
    exact = (got.int_repr()[~ok].to(torch.int64) - zp).float() * torch.tensor(scale)
    assert torch.equal(got.dequantize()[~ok], exact)


@pytest.mark.parametrize("ours,theirs,qmin,qmax", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_quantize_per_channel_bit_exact(ours, theirs, qmin, qmax, axis):
    x = borderline(0.05, n=3000).reshape(-1)[: 4 * 6000].reshape(4, 6000)
    if axis == 1:
        x = x.reshape(6000, 4)
    n = x.size(axis)
    scales = torch.rand(n, dtype=torch.float64) * 0.1 + 0.01
    zps = torch.randint(max(qmin, -20), min(qmax, 20), (n,))
    expected = torch.quantize_per_channel(x, scales, zps, axis, theirs)
    got = tq.quantize_per_channel(x, scales, zps, axis, ours)
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert torch.equal(got.q_per_channel_scales(), expected.q_per_channel_scales())
    assert torch.equal(got.q_per_channel_zero_points(), expected.q_per_channel_zero_points())
    assert got.q_per_channel_axis() == expected.q_per_channel_axis() == axis
    assert got.qscheme() == expected.qscheme()
    assert torch.equal(got.dequantize(), expected.dequantize())


def test_per_channel_float_qparams_bit_exact():
    x = torch.randn(8, 64)
    scales = torch.rand(8) * 0.02 + 0.005
    zps = torch.rand(8) * 100
    expected = torch.quantize_per_channel(x, scales, zps, 0, torch.quint8)
    got = tq.quantize_per_channel(x, scales, zps, 0, tq.quint8)
    assert got.qscheme() == tq.per_channel_affine_float_qparams == expected.qscheme()
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert torch.equal(got.dequantize(), expected.dequantize())


@pytest.mark.parametrize("shape", [(3, 4), (3, 3), (7,), (2, 3, 5)])
@pytest.mark.parametrize("scale,zp", [(0.37, 3), (0.1, 0), (0.05, 8)])
def test_quint4x2_bit_exact_and_packed(shape, scale, zp):
    x = borderline(scale, n=200, lo=-4, hi=16)[: torch.Size(shape).numel()].reshape(shape)
    expected = torch.quantize_per_tensor(x, scale, zp, torch.quint4x2)
    got = tq.quantize_per_tensor(x, scale, zp, tq.quint4x2)
    assert got.int_repr().dim() == 1
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert torch.equal(got.dequantize(), expected.dequantize())
    assert got.shape == expected.shape


def test_quint2x4_packing():
    x = torch.tensor([0.0, 0.1, 0.2, 0.3, 0.2])
    expected = torch.quantize_per_tensor(x, 0.1, 0, torch.quint2x4)
    got = tq.quantize_per_tensor(x, 0.1, 0, tq.quint2x4)
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert got.dequantize().tolist() == pytest.approx([0.0, 0.1, 0.2, 0.3, 0.2])


def test_spec_worked_examples():
    q = tq.quantize_per_tensor(torch.tensor([-1.0, 0.0, 0.5, 1.23456, 300.0]), 0.1, 10, tq.quint8)
    assert q.int_repr().tolist() == [0, 10, 15, 22, 255]
    assert q.dequantize().tolist() == pytest.approx([-1.0, 0.0, 0.5, 1.2, 24.5])
    q = tq.quantize_per_tensor(torch.tensor([0.05, 0.15, 0.25, -0.05]), 0.1, 0, tq.qint8)
    assert q.int_repr().tolist() == [0, 2, 2, 0]
    q4 = tq.quantize_per_tensor(torch.tensor([0.0, 0.2, 0.4]), 0.1, 0, tq.quint4x2)
    assert q4.int_repr().tolist() == [32, 4]


@pytest.mark.parametrize("scale,zp,qmin,qmax", [(0.01, 100, 0, 255), (0.37, 3, -128, 127),
                                                (0.02, 0, 0, 15)])
def test_fake_quantize_matches_torch_values_and_grads(scale, zp, qmin, qmax):
    x = borderline(scale, n=2000, lo=-300, hi=300).requires_grad_(True)
    x2 = x.detach().clone().requires_grad_(True)
    ours = tq.fake_quantize_per_tensor_affine(x, scale, zp, qmin, qmax)
    theirs = torch.fake_quantize_per_tensor_affine(x2, scale, zp, qmin, qmax)
    assert torch.equal(ours, theirs)
    g = torch.randn_like(ours)
    ours.backward(g)
    theirs.backward(g)
    assert torch.equal(x.grad, x2.grad)


def test_fake_quantize_per_channel_matches_torch():
    x = torch.randn(4, 3, 5, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    scale = torch.tensor([0.01, 0.02, 0.05])
    zp = torch.tensor([0, 10, -3], dtype=torch.int32)
    ours = tq.fake_quantize_per_channel_affine(x, scale, zp, 1, -128, 127)
    theirs = torch.fake_quantize_per_channel_affine(x2, scale, zp, 1, -128, 127)
    assert torch.equal(ours, theirs)
    ours.sum().backward()
    theirs.sum().backward()
    assert torch.equal(x.grad, x2.grad)


def test_fake_quantize_spec_example():
    x = torch.tensor([-2.0, -1.0, 0.0, 1.0, 1.55, 1.56, 2.0], requires_grad=True)
    out = tq.fake_quantize_per_tensor_affine(x, 0.01, 100, 0, 255)
    out.sum().backward()
    assert out.tolist() == pytest.approx([-1, -1, 0, 1, 1.55, 1.55, 1.55], abs=1e-6)
    assert x.grad.tolist() == [0, 1, 1, 1, 1, 0, 0]


@pytest.mark.parametrize("ours,theirs,qmin,qmax", DTYPES[:2])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_quantize_per_tensor_dynamic_matches_torch(ours, theirs, qmin, qmax, reduce_range):
    for x in [torch.randn(100) * 3, torch.rand(50) + 1, -torch.rand(50), torch.zeros(10),
              torch.full((4,), 1e-7)]:
        expected = torch.quantize_per_tensor_dynamic(x, theirs, reduce_range)
        got = tq.quantize_per_tensor_dynamic(x, ours, reduce_range)
        assert got.q_scale() == pytest.approx(expected.q_scale(), rel=1e-6)
        assert got.q_zero_point() == expected.q_zero_point()
        assert torch.equal(got.int_repr(), expected.int_repr())


# NaN / +-inf / huge values, in and out of a vector block (torch's vector body and scalar tail)
SPECIAL = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 0.5, 1e19, -2.0]
                       * 5)
SPECIAL[17] = float("nan")


@pytest.mark.parametrize("qdtype,zero_point", [("quint8", 7), ("qint8", -3), ("qint32", 2)])
def test_nan_and_inf_quantize_as_torch(qdtype, zero_point):
    """torch 2.13's codes for NaN (:func:`affine.nan_code`): per tensor 255 / 127 (8-bit) and
    INT32_MIN (qint32); per channel 0 (8-bit) and INT32_MIN; infinities saturate.  Measured the
    same under ATEN_CPU_CAPABILITY=avx512 / avx2 / default."""
    theirs_dtype, ours_dtype = getattr(torch, qdtype), getattr(tq, qdtype)
    expected = torch.quantize_per_tensor(SPECIAL, 0.1, zero_point, theirs_dtype).int_repr()
    assert torch.equal(tq.quantize_per_tensor(SPECIAL, 0.1, zero_point, ours_dtype).int_repr(),
                       expected)
    x = SPECIAL.view(5, 8)
    scales = torch.tensor([0.1, 0.2, 0.05, 1.0, 0.3], dtype=torch.float64)
    zps = torch.full((5,), zero_point)
    expected = torch.quantize_per_channel(x, scales, zps, 0, theirs_dtype).int_repr()
    got = tq.quantize_per_channel(x, scales, zps, 0, ours_dtype).int_repr()
    assert torch.equal(got, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_nan_and_inf_fake_quantize_as_torch(dtype):
    """NaN fake-quantizes to qmin; per channel, anything whose ``round(x / scale)`` overflows
    int64 (+-inf, 1e30) does too (torch's per-channel kernel converts before clamping); the
    gradient mask is False there."""
    x = SPECIAL.to(dtype).view(5, 8)
    for ours, theirs in ((x.clone().requires_grad_(), x.clone().requires_grad_()),):
        got = tq.fake_quantize_per_tensor_affine(ours, 0.1, 3, 0, 255)
        expected = torch.fake_quantize_per_tensor_affine(theirs, 0.1, 3, 0, 255)
        assert torch.equal(got, expected)
        got.sum().backward()
        expected.sum().backward()
        assert torch.equal(ours.grad, theirs.grad)
    scales, zps = torch.tensor([0.1, 0.2, 0.05, 1.0, 0.3]), torch.tensor([3, 0, 9, 1, 200],
                                                                            dtype=torch.int32)
    got = tq.fake_quantize_per_channel_affine(x, scales, zps, 0, 0, 255)
    assert torch.equal(got, torch.fake_quantize_per_channel_affine(x, scales, zps, 0, 0, 255))


def test_nan_fake_quantize_module_with_observer_off_as_torch():
    import torch.ao.quantization as aoq
    from torchquant import quantization as tqq
    ours, theirs = tqq.FakeQuantize(), aoq.FakeQuantize()
    ours.disable_observer()
    theirs.disable_observer()
    assert torch.equal(ours(SPECIAL.clone()), theirs(SPECIAL.clone()))  # NaN -> 0.0 (qmin)


def test_nan_through_a_converted_conv_as_torch():
    """A NaN input quantizes to 255 as torch's, so the converted conv's output matches
    torch.ao's -- where torch.ao's conv is exact on activations above 127 (VNNI / AMX CPUs;
    without VNNI its u8 x s8 pairs saturate on that 255, tests/conftest.py): elsewhere the
    same model on torchquant's reference kernels is the oracle."""
    import torch.ao.quantization as aoq
    from torchquant import quantization as tqq
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3)).eval()
    x = torch.randn(1, 3, 6, 6)
    x[0, 1, 2, 3] = float("nan")
    calibration = torch.randn(4, 3, 6, 6)
    outs = []
    for q in (tqq, aoq):
        m = torch.nn.Sequential(q.QuantStub(), *model, q.DeQuantStub())
        m.qconfig = q.get_default_qconfig("x86")
        prepared = q.prepare(m)
        prepared(calibration)
        converted = q.convert(prepared)
        outs.append(converted(x))
        if q is tqq:
            assert int(converted[0](x).int_repr().max()) == 255  # the NaN's code
            with kernels.reference_only():
                reference = converted(x)
    assert torch.equal(outs[0], outs[1] if torch_oracle_exact_u8() else reference)


def test_sub_byte_pack_roundtrip():
    v = torch.randint(0, 16, (11,), dtype=torch.uint8)
    assert torch.equal(affine.unpack_sub_byte(affine.pack_sub_byte(v, 4), 4, 11), v)
    v = torch.randint(0, 4, (9,), dtype=torch.uint8)
    assert torch.equal(affine.unpack_sub_byte(affine.pack_sub_byte(v, 2), 2, 9), v)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=1, max_size=64),
       st.floats(1e-3, 10.0), st.integers(0, 255))
@example([0.99999], 2.00001, 129)
def test_roundtrip_error_within_half_scale(values, scale, zp):
    x = torch.tensor(values, dtype=torch.float32)
    q = tq.quantize_per_tensor(x, scale, zp, tq.quint8)
    s = torch.tensor(scale, dtype=torch.float32)
    lo, hi = (0 - zp) * s, (255 - zp) * s
    inside = (x >= lo) & (x <= hi)
    err = (q.dequantize() - x).abs()[inside]
    # scale/2 plus float32 slack for the reciprocal and product roundings, and for the
    # rounding of x / scale + zero_point (|.| < 512: one ulp <= 2**-15) before round-half-even,
    # as torch's kernels do (0.99999 at scale 2.00001, zp 129 -> 129.5 -> 130)
    slack = s * 2.0 ** -15 + 1e-6 * x.abs()[inside]
    assert bool((err <= s / 2 * (1 + 1e-5) + slack).all())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-100, 100, width=32), min_size=1, max_size=32),
       st.floats(1e-3, 1.0), st.integers(-128, 127))
def test_hypothesis_matches_torch_qint8(values, scale, zp):
    x = torch.tensor(values, dtype=torch.float32)
    assert torch.equal(tq.quantize_per_tensor(x, scale, zp, tq.qint8).int_repr(),
                       torch.quantize_per_tensor(x, scale, zp, torch.qint8).int_repr())


def test_quantize_finite_per_tensor_equals_quantize_int():
    """The dynamic path's short quantize must give quantize_int's integers exactly."""
    from torchquant import affine
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(64, 257, generator=gen) * 7
    for scale, zp in ((0.05, 128), (0.0123, 0), (1.0 / 3, 255), (0.2, 37)):
        ties = torch.round(x / scale) * scale  # values on the grid's half steps
        for data in (x, ties + scale / 2):
            ref = affine.quantize_int(data, torch.tensor(scale, dtype=torch.float64),
                                      torch.tensor(zp), 0, 255, torch.uint8)
            fast = affine.quantize_finite_per_tensor(data, scale, zp, 0, 255, torch.uint8)
            assert torch.equal(fast, ref)


@given(st.floats(allow_nan=False) | st.sampled_from([3.4028235677973366e38, 3.4028235e38 * 2,
                                                      -1e39, 2.0**-150, 1 + 2.0**-24,
                                                      1 + 3 * 2.0**-24, 0.1, 6.1e-5]))
def test_round_to_float32_is_torchs_float32(value):
    """The one float32 rounding of a Python number: what a float32 tensor stores (ties to
    even, +-inf past float32's range)."""
    assert affine.round_to_float32(value) == torch.tensor(value, dtype=torch.float32).item()


def test_round_to_float32_keeps_nan():
    assert affine.round_to_float32(float("nan")) != affine.round_to_float32(float("nan"))
