"""Plain-torch reference kernels for the affine elementwise ops (the numerics contract).

The formulas are written once, parameterised by the fused multiply-add to use, so the compiled
fast path (:mod:`.cpu_compiled`) runs exactly this code with a fusing ``fma``.
"""
from __future__ import annotations

from typing import Callable

import torch

from .registry import register
from ..affine import FMA, MUL_ADD, ROUND_ADD


def eager_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` with one rounding: torch's CPU ``addcmul`` kernel fuses it (tested)."""
    return torch.addcmul(c, a, b)


def quantize_formula(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor, qmin: int, qmax: int,
                     storage_dtype: torch.dtype, mode: str, fma: Callable = eager_fma,
                     narrow_via_int32: bool = False) -> torch.Tensor:
    if mode == FMA:
        y = torch.round(fma(x, inv, zp))
    elif mode == MUL_ADD:
        y = torch.round(x * inv + zp)
    elif mode == ROUND_ADD:
        y = torch.round(x * inv) + zp
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    # NaN has no integer image; torchquant maps it to the zero point (a documented safe value).
    # ``y == y`` rather than ``isnan``: inductor vectorises the comparison but not isnan.
    y = torch.where(y == y, y, zp)
    if storage_dtype == torch.int32:
        y = y.to(torch.float64)  # 2**31 - 1 is not a float32: clamp where it is representable
    y = torch.clamp(y, qmin, qmax)
    if narrow_via_int32 and storage_dtype != torch.int32:
        # Exact (y is already in range); inductor's float->int32->8-bit path is ~2x faster
        # than its direct float->8-bit conversion.
        y = y.to(torch.int32)
    return y.to(storage_dtype)


def dequantize_formula(q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor,
                       per_channel: bool) -> torch.Tensor:
    if per_channel and not zp.dtype.is_floating_point:
        # torch's per-channel kernel keeps double scales and computes in double.
        return ((q.to(torch.float64) - zp.to(torch.float64)) * scale.to(torch.float64)).to(torch.float32)
    if q.dtype == torch.int32 and not zp.dtype.is_floating_point:
        # Subtract exactly in integers, then round once (torch subtracts in int32 and wraps at
        # the int32 boundary; int64 keeps those values right).
        return (q.to(torch.int64) - zp.to(torch.int64)).to(torch.float32) * scale.to(torch.float32)
    return (q.to(torch.float32) - zp.to(torch.float32)) * scale.to(torch.float32)


def fake_quantize_formula(x: torch.Tensor, inv: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor,
                          qmin: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.round(x * inv) + zp
    mask = (q >= qmin) & (q <= qmax)
    out = (torch.clamp(q, qmin, qmax) - zp) * scale
    return out.to(x.dtype), mask


register("quantize", "reference")(quantize_formula)
register("dequantize", "reference")(dequantize_formula)
register("fake_quantize", "reference")(fake_quantize_formula)
register("add", "reference")(lambda *args: add_formula(*args))


def add_formula(x: torch.Tensor, y: torch.Tensor, x_scale: torch.Tensor, x_premul: torch.Tensor,
                y_scale: torch.Tensor, y_premul: torch.Tensor, inv_out: torch.Tensor,
                zp_out: torch.Tensor, qmin: int, qmax: int, storage_dtype: torch.dtype,
                relu: bool, fma: Callable = eager_fma) -> torch.Tensor:
    """torch's vectorised quantized add: both operands dequantized as
    ``fma(q, scale, -zp * scale)``, summed, (ReLU), requantized ``round(t * inv) + zp``.
    Integer inputs make every intermediate finite, so no NaN mask is needed."""
    total = fma(x.to(torch.float32), x_scale, x_premul) + fma(y.to(torch.float32), y_scale,
                                                              y_premul)
    if relu:
        total = torch.clamp(total, min=0.0)
    q = torch.round(total * inv_out) + zp_out
    return torch.clamp(q, qmin, qmax).to(torch.int32).to(storage_dtype)
