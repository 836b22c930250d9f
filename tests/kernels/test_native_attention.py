"""torchquant_native::attention (csrc/attention.cpp) against its plain-torch reference and ATen's
CPU flash attention, every vector width it has (AVX-512, AVX2, scalar) forced in turn.

Tolerance: float32 attention summed in another order, with its own exp polynomial (within
2 ulp of exp): the kernel's error against a float64 evaluation is held to 4x ATen's flash
attention's own plus 1e-6 (both are float32 computations of the same formula; unit-normal inputs,
outputs of magnitude ~1).  Fully masked rows give zeros exactly, as ATen's flash attention."""
from __future__ import annotations

import pytest
import torch

from torchquant.kernels import attention, cpu_isa, native

pytestmark = pytest.mark.skipif(not native.available(), reason=native.describe())

FLAGS = cpu_isa.cpu_flags()
LANES = [pytest.param(16, marks=pytest.mark.skipif("avx512f" not in FLAGS, reason="no AVX-512")),
         8, 1]


def _flash(q, k, v, mask, scale):
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q, k, v, attn_mask=mask, scale=scale)[0]


def _inputs(b, heads, tq, tk, d, dv, seed=0, transposed=True):
    g = torch.Generator().manual_seed(seed)
    if transposed:  # a projection's output viewed as heads: [b, t, heads, d] in memory
        make = lambda t, size: torch.randn(b, t, heads, size, generator=g).transpose(1, 2)  # noqa: E731
    else:
        make = lambda t, size: torch.randn(b, heads, t, size, generator=g)  # noqa: E731
    return make(tq, d), make(tk, d), make(tk, dv)


def _check(q, k, v, mask, scale, lanes):
    out = attention.native_attention(q, k, v, mask, scale, lanes=lanes)
    expected = _flash(q, k, v, mask, scale) if q.size(-1) == v.size(-1) else None
    truth = attention.reference_attention(q.double(), k.double(), v.double(),
                                          None if mask is None else mask.double(), scale)
    ours_err = (out.double() - truth).abs().max().item()
    ref_err = (attention.reference_attention(q, k, v, mask, scale).double() - truth).abs().max()
    bound = 4 * max(ref_err.item(), 0.0) + 1e-6
    if expected is not None:
        assert out.stride() == expected.stride()  # ATen's layout: what the graph downstream reads
        bound = max(bound, 4 * (expected.double() - truth).abs().max().item() + 1e-6)
    assert ours_err <= bound, (ours_err, bound)
    return out


@pytest.mark.parametrize("lanes", LANES)
@pytest.mark.parametrize("shape", [
    (2, 3, 128, 128, 32, 32),   # MiniLM's heads
    (1, 2, 5, 37, 16, 16),      # rows not a multiple of 4, keys not of a vector
    (2, 2, 9, 70, 64, 64),
    (1, 1, 3, 17, 32, 48),      # a value head size of its own
    (1, 2, 4, 300, 16, 16),
])
def test_matches_the_reference_and_flash_attention(lanes, shape):
    b, heads, tq, tk, d, dv = shape
    q, k, v = _inputs(*shape)
    g = torch.Generator().manual_seed(1)
    padding = torch.zeros(b, 1, 1, tk)
    padding[0, ..., tk // 2:] = -1e4  # a padded sentence, as an encoder's extended mask
    for mask in (None, padding, torch.randn(b, heads, tq, tk, generator=g),
                 torch.randn(tq, tk, generator=g)):
        _check(q, k, v, mask, d ** -0.5, lanes)


@pytest.mark.parametrize("lanes", LANES)
def test_contiguous_heads_and_odd_head_sizes(lanes):
    """q laid out [batch, heads, tokens, size] keeps that layout out; a head size that is no
    whole vector takes the scalar loops whatever lanes asks."""
    _check(*_inputs(2, 3, 6, 20, 32, 32, transposed=False), None, 0.2, lanes)
    _check(*_inputs(1, 2, 6, 20, 20, 20), None, 20 ** -0.5, lanes)


@pytest.mark.parametrize("lanes", LANES)
def test_rows_with_every_key_masked_are_zero(lanes):
    q, k, v = _inputs(2, 2, 6, 24, 16, 16)
    mask = torch.zeros(2, 1, 6, 24)
    mask[1, :, 2] = float("-inf")
    mask[0, :, :, 5:] = float("-inf")
    out = _check(q, k, v, mask, 0.25, lanes)
    assert torch.equal(out[1, :, 2], torch.zeros(2, 16))
    assert torch.equal(_flash(q, k, v, mask, 0.25)[1, :, 2], out[1, :, 2])


@pytest.mark.parametrize("lanes", LANES)
def test_nan_inputs_give_nan_rows(lanes):
    """A NaN in q makes its row's output NaN, as the reference's softmax does, and nothing
    else (ATen's flash attention returns zeros there: a finite answer from NaN input, which
    this kernel does not copy)."""
    q, k, v = _inputs(1, 2, 5, 37, 16, 16)
    q = q.clone()
    q[0, 1, 3, 0] = float("nan")
    out = attention.native_attention(q, k, v, None, 0.25, lanes=lanes)
    expected = attention.reference_attention(q, k, v, None, 0.25)
    assert torch.equal(torch.isnan(out), torch.isnan(expected))
    assert torch.isnan(out[0, 1, 3]).all() and not torch.isnan(out[0, 0]).any()


def test_vector_widths_follow_the_isa_cap():
    capped = cpu_isa.cpu_isa_cap() == "avx2"
    wide = 16 if "avx512f" in FLAGS and not capped else 8 if "avx2" in FLAGS else 1
    assert native.attention_lanes() == wide
    with cpu_isa.forced_cpu_isa("avx2"):
        assert native.attention_lanes() == (8 if "avx2" in FLAGS else 1)


def test_preferred_sizes():
    """The kernel is chosen for the sizes measured faster than ATen's (BENCHMARKS.md): short
    sequences whose head sizes are whole vectors."""
    assert attention.native_attention_preferred(128, 128, 32, 32)
    assert not attention.native_attention_preferred(128, 128, 20, 20)
    assert not attention.native_attention_preferred(4096, 4096, 64, 64)
    with cpu_isa.forced_cpu_isa("avx2"):
        assert attention.native_attention_preferred(128, 128, 32, 32) == ("avx2" in FLAGS)
        assert not attention.native_attention_preferred(256, 256, 64, 64)


def test_bad_inputs_name_the_problem():
    q, k, v = _inputs(1, 2, 4, 8, 16, 16)
    with pytest.raises(ValueError, match="float32 mask"):
        attention.native_attention(q, k, v, torch.ones(4, 8, dtype=torch.bool), 0.25)
    with pytest.raises(ValueError, match="do not match"):
        attention.native_attention(q, k[:, :1], v, None, 0.25)
    with pytest.raises(ValueError, match="float32 q, k, v"):
        attention.native_attention(q.double(), k, v, None, 0.25)
