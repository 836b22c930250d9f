"""kernels.native: the per-tensor quantize and the quantized add (+ReLU) in C++ (AVX-512, AVX2
and scalar loops) give the reference formulas' integers bit for bit (kernels/reference.py)."""
import pytest
import torch

from torchquant import affine
from torchquant.kernels import implementations, native

pytestmark = pytest.mark.skipif(not native.available(), reason=native.describe())

RANGES = [(torch.uint8, 0, 255), (torch.int8, -128, 127)]


@pytest.fixture(params=["widest", "avx2", "scalar"])
def loop(request, monkeypatch):
    """The loops the CPU's widest vectors run (AVX-512 where fbgemm runs it), the AVX2 loops
    (fbgemm forced to AVX2) and the scalar loops."""
    monkeypatch.setattr(native, "VECTOR_LOOPS", request.param != "scalar")
    if request.param == "avx2":
        native.force_isa("avx2")
        assert native.isa() == "avx2"  # (the AVX-512 loops follow fbgemm's instruction set)
        yield
        native.force_isa("auto")
    else:
        yield


def _f32(v):
    return torch.tensor(v, dtype=torch.float32)


@pytest.mark.parametrize("dtype,qmin,qmax", RANGES)
@pytest.mark.parametrize("n", [1, 7, 8, 9, 100, 40_003])
@pytest.mark.parametrize("relu", [False, True])
def test_add_equals_the_reference(loop, dtype, qmin, qmax, n, relu):
    g = torch.Generator().manual_seed(n)
    impls = implementations("add")
    for _ in range(4):
        x = torch.randint(qmin, qmax + 1, (n,), generator=g).to(dtype)
        y = torch.randint(qmin, qmax + 1, (n,), generator=g).to(dtype)
        xs, ys, out_s = (float(v) for v in torch.rand(3, generator=g) * 0.2 + 1e-3)
        xz, yz, oz = (int(v) for v in torch.randint(qmin, qmax + 1, (3,), generator=g))
        operands = (_f32(xs), _f32(xs) * _f32(-float(xz)), _f32(ys), _f32(ys) * _f32(-float(yz)),
                    torch.reciprocal(_f32(out_s)), _f32(float(oz)))
        ours = impls["native"].fn(x, y, *operands, qmin, qmax, dtype, relu)
        ref = impls["reference"].fn(x, y, *operands, qmin, qmax, dtype, relu)
        assert ours.dtype == dtype and torch.equal(ours, ref)


@pytest.mark.parametrize("dtype,qmin,qmax", RANGES)
@pytest.mark.parametrize("n", [1, 9, 64, 40_003])
def test_quantize_equals_the_reference_with_nan_and_inf(loop, dtype, qmin, qmax, n):
    g = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=g) * 10
    x[::7] = float("nan")
    x[1::11] = float("inf")
    x[2::13] = -float("inf")
    # values half a step either side of a rounding tie: the FMA rounds once
    x[3::5] = (torch.arange(len(x[3::5])) % 50).float() * 0.037 + 0.0185
    impls = implementations("quantize")
    for inv, zp in ((torch.reciprocal(_f32(0.037)), _f32(float(qmin + 5))),
                    (torch.reciprocal(_f32(1e-3)), _f32(0.0))):
        ours = impls["native"].fn(x, inv, zp, qmin, qmax, dtype, affine.FMA)
        ref = impls["reference"].fn(x, inv, zp, qmin, qmax, dtype, affine.FMA)
        assert torch.equal(ours, ref)


def test_quantize_keeps_channels_last_and_falls_back_elsewhere(loop):
    impls = implementations("quantize")
    inv, zp = torch.reciprocal(_f32(0.05)), _f32(3.0)
    x = torch.randn(2, 5, 6, 7).contiguous(memory_format=torch.channels_last)
    ours = impls["native"].fn(x, inv, zp, 0, 255, torch.uint8, affine.FMA)
    ref = impls["reference"].fn(x, inv, zp, 0, 255, torch.uint8, affine.FMA)
    assert torch.equal(ours, ref) and ours.stride() == ref.stride()
    # forms the native loop does not cover take the reference formula
    strided = torch.randn(6, 8)[:, ::2]
    per_channel = (torch.rand(6, 1) + 0.5, torch.zeros(6, 1))  # broadcast along dim 0
    for args in ((strided, inv, zp, 0, 255, torch.uint8, affine.FMA),
                 (torch.randn(6, 3), *per_channel, 0, 255, torch.uint8, affine.FMA),
                 (torch.randn(9), inv, zp, 0, 255, torch.uint8, affine.MUL_ADD)):
        assert torch.equal(impls["native"].fn(*args), impls["reference"].fn(*args))


@pytest.mark.parametrize("dtype,qmin,qmax", RANGES)
@pytest.mark.parametrize("relu", [False, True])
def test_add_plan_reads_channels_last_operands_in_place(loop, dtype, qmin, qmax, relu):
    """The bound form (operands as numbers) on channels-last operands of one layout: the
    reference's integers, the output channels-last (no contiguous copies)."""
    g = torch.Generator().manual_seed(3)
    x, y = (torch.randint(qmin, qmax + 1, (2, 24, 5, 7), generator=g).to(dtype)
            .contiguous(memory_format=torch.channels_last) for _ in range(2))
    operands = (_f32(0.02), _f32(0.02) * _f32(-3.0), _f32(0.05), _f32(0.05) * _f32(-9.0),
                torch.reciprocal(_f32(0.04)), _f32(11.0))
    ours = native.quantized_add_plan(operands, qmin, qmax, relu)(x, y)
    ref = implementations("add")["reference"].fn(x, y, *operands, qmin, qmax, dtype, relu)
    assert ours.is_contiguous(memory_format=torch.channels_last) and not ours.is_contiguous()
    assert torch.equal(ours, ref)
    # the tensor form takes mixed layouts through contiguous copies: the same integers
    mixed = implementations("add")["native"].fn(x, y.contiguous(), *operands, qmin, qmax, dtype,
                                                relu)
    assert torch.equal(mixed, ref)
