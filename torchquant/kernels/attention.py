"""Float32 scaled dot-product attention: the plain-torch reference of the native kernel
(``torchquant_native::attention``, csrc/attention.cpp) that torchquant.compile's graphs call for
the short sequences of quantized encoders, and the choice of when it runs."""
from __future__ import annotations

import math
from typing import Optional

import torch

from . import native as _native

__all__ = ["reference_attention", "native_attention", "native_attention_preferred",
           "default_scale"]


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        attn_mask: Optional[torch.Tensor], scale: float) -> torch.Tensor:
    """softmax(q k^T * scale + attn_mask) v per (batch, head), zeros for rows every key of
    which is masked out (-inf), as ATen's CPU flash attention gives; NaN rows where a score is
    NaN."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if attn_mask is not None:
        scores = scores + attn_mask
    all_masked = torch.isneginf(scores).all(dim=-1, keepdim=True)
    probs = torch.softmax(scores.masked_fill(all_masked, 0.0), dim=-1).masked_fill(all_masked, 0.0)
    return probs @ v


def native_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     attn_mask: Optional[torch.Tensor], scale: float,
                     lanes: Optional[int] = None) -> torch.Tensor:
    """The native kernel (``lanes`` 16 / 8 / 1 forces its AVX-512, AVX2 or scalar loops;
    default: the widest this CPU and torchquant's ISA cap allow)."""
    return torch.ops.torchquant_native.attention.default(
        q, k, v, attn_mask, float(scale), _native.attention_lanes() if lanes is None else lanes)


def native_attention_preferred(q_len: int, kv_len: int, head_size: int,
                               value_head_size: int) -> bool:
    """Whether the native kernel beats ATen's flash attention for these sizes (measured:
    BENCHMARKS.md, 2026-12-07 eleventh session): with AVX-512, head sizes that are whole
    vectors up to 1024 keys; with AVX2 only, head sizes of 8 to 32 up to 512 keys."""
    if not (_native.available() and q_len > 0 and kv_len > 0):
        return False
    lanes = _native.attention_lanes()
    if lanes == 16:
        return head_size % 16 == 0 and value_head_size % 16 == 0 and kv_len <= 1024
    if lanes == 8:
        return (head_size % 8 == 0 and value_head_size % 8 == 0 and head_size <= 32
                and value_head_size <= 32 and kv_len <= 512)
    return False


def default_scale(head_size: int) -> float:
    """The scale ATen's attention uses when none is given."""
    return 1.0 / math.sqrt(head_size)
