"""Fake-quantize of float16 / bfloat16 / float64 input (and float32) against torch, bit for bit.

torch's CPU kernels widen reduced-precision input to float32 (float64 input stays float64) for
``x * inv``, its rounding and the clamp mask, multiply back in float32 per tensor (in double per
channel) and cast to the input dtype.  Each case: 5000+ random elements, a quarter of them
exact rounding ties, forward values and straight-through gradients compared with ``torch.equal``
-- through the torchquant functions, the registered ops, the compiled kernel (large inputs,
called until hot) and the FakeQuantize modules."""
import pytest
import torch
import torch.ao.quantization as tq

import torchquant
from torchquant import kernels
from torchquant.ops import fake_quantize as ops_fq
from torchquant.quantization import fake_quantize as fq

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
QRANGES = [(-128, 127), (0, 255), (0, 15)]


def _inputs(dtype: torch.dtype, scale: float, n: int = 6000, seed: int = 0) -> torch.Tensor:
    """Values spread over and beyond the quantization range; a quarter exact ties (k + 1/2)
    steps in ``dtype`` (where ``dtype`` can represent them), a few exactly on a step."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen) * 4
    ties = torch.randint(-300, 300, (n // 4,), generator=gen).float() + 0.5
    x[: n // 4] = ties * scale
    x[n // 4: n // 4 + 100] = torch.arange(-50, 50).float() * scale
    return x.to(dtype)


def _grads(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    x = x.clone().requires_grad_(True)
    out = fn(x)
    upstream = torch.linspace(-2, 3, out.numel(), dtype=out.dtype).reshape(out.shape)
    out.backward(upstream)
    return out.detach(), x.grad


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("qrange", QRANGES)
def test_per_tensor_matches_torch(dtype, qrange):
    scale, zp = 0.0371, qrange[0] + (qrange[1] - qrange[0]) // 3
    x = _inputs(dtype, scale)
    want, want_grad = _grads(lambda t: torch.fake_quantize_per_tensor_affine(t, scale, zp, *qrange), x)
    for fn in (lambda t: torchquant.fake_quantize_per_tensor_affine(t, scale, zp, *qrange),
               lambda t: torch.ops.torchquant.fake_quantize_per_tensor(
                   t, torch.tensor(scale), torch.tensor(zp), *qrange)):
        got, got_grad = _grads(fn, x)
        assert got.dtype == dtype
        assert torch.equal(got, want), (got != want).sum()
        assert torch.equal(got_grad, want_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_tensor_tensor_qparams_match_torch(dtype):
    """torch's tensor-qparams overload (what the FakeQuantize module calls)."""
    scale, zp = torch.tensor([0.0213]), torch.tensor([7], dtype=torch.int32)
    x = _inputs(dtype, 0.0213, seed=1).reshape(60, 100)
    want, want_grad = _grads(lambda t: torch.fake_quantize_per_tensor_affine(t, scale, zp, 0, 255), x)
    got, got_grad = _grads(lambda t: torchquant.fake_quantize_per_tensor_affine(t, scale, zp, 0, 255), x)
    assert torch.equal(got, want) and torch.equal(got_grad, want_grad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_matches_torch(dtype, axis):
    gen = torch.Generator().manual_seed(2)
    x = _inputs(dtype, 0.03, seed=3).reshape(60, 100)
    channels = x.shape[axis]
    scale = (torch.rand(channels, generator=gen) * 0.05 + 0.01).float()
    # ties against each channel's own scale along the first rows / columns
    ties = (torch.randint(-100, 100, x.shape, generator=gen).float() + 0.5)
    ties = ties * scale.reshape([-1, 1] if axis == 0 else [1, -1])
    x = torch.where(torch.rand(x.shape, generator=gen) < 0.3, ties.to(dtype), x)
    zp = torch.randint(-20, 20, (channels,), generator=gen, dtype=torch.int32)
    want, want_grad = _grads(
        lambda t: torch.fake_quantize_per_channel_affine(t, scale, zp, axis, -128, 127), x)
    for fn in (lambda t: torchquant.fake_quantize_per_channel_affine(t, scale, zp, axis, -128, 127),
               lambda t: torch.ops.torchquant.fake_quantize_per_channel(t, scale, zp, axis, -128, 127)):
        got, got_grad = _grads(fn, x)
        assert torch.equal(got, want), (got != want).sum()
        assert torch.equal(got_grad, want_grad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_per_channel_float_zero_points_match_torch(dtype):
    """The float-qparams (embedding) scheme: ``lrintf(zp + x * inv)``."""
    gen = torch.Generator().manual_seed(4)
    x = _inputs(dtype, 0.02, seed=5).reshape(50, 120)
    scale = (torch.rand(50, generator=gen) * 0.05 + 0.01).float()
    zp = (torch.rand(50, generator=gen) * 10 - 5).float()
    want, want_grad = _grads(lambda t: torch.fake_quantize_per_channel_affine(t, scale, zp, 0, 0, 255), x)
    got, got_grad = _grads(lambda t: torchquant.fake_quantize_per_channel_affine(t, scale, zp, 0, 0, 255), x)
    assert torch.equal(got, want), (got != want).sum()
    assert torch.equal(got_grad, want_grad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_compiled_kernel_matches_reference(dtype):
    """The compiled fake-quantize kernel (large inputs, once hot) rounds as the reference does."""
    x = _inputs(dtype, 0.0371, n=1 << 16, seed=6).reshape(256, 256)
    want = torch.fake_quantize_per_tensor_affine(x, 0.0371, 3, -128, 127)
    for _ in range(4):
        got = ops_fq.fake_quantize(x, torch.tensor(0.0371), torch.tensor(3), -128, 127)
        assert torch.equal(got, want)
    with kernels.reference_only():
        assert torch.equal(ops_fq.fake_quantize(x, torch.tensor(0.0371), torch.tensor(3), -128, 127),
                           want)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_fake_quantize_module_matches_torch(dtype, per_channel):
    """FakeQuantize modules on reduced / double precision input: same qparams, outputs and
    gradients as torch.ao's over a few batches."""
    if per_channel:
        ours = fq.default_per_channel_weight_fake_quant()
        theirs = tq.default_per_channel_weight_fake_quant()
    else:
        ours, theirs = fq.default_fake_quant(), tq.default_fake_quant()
    for step in range(3):
        x = _inputs(dtype, 0.05, n=6000, seed=10 + step).reshape(20, 300)
        got, got_grad = _grads(ours, x)
        want, want_grad = _grads(theirs, x)
        assert torch.equal(ours.scale, theirs.scale) and torch.equal(ours.zero_point, theirs.zero_point)
        assert torch.equal(got, want), (got != want).sum()
        assert torch.equal(got_grad, want_grad)
