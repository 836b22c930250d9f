"""Plain-torch reference kernels for the affine elementwise ops (the numerics contract).

The quantize / dequantize / fake-quantize formulas are :mod:`torchquant.affine`'s (the pure
math, written once, parameterised by the fused multiply-add to use); this module registers
them, so the compiled fast path (:mod:`.cpu_compiled`) runs exactly that code with a fusing
``fma``.
"""
from __future__ import annotations

from typing import Callable

import torch

from .registry import register
from ..affine import (dequantize_formula, eager_fma, fake_quantize_formula, quantize_finite_formula,
                      quantize_formula)

__all__ = ["eager_fma", "quantize_formula", "quantize_finite_formula", "dequantize_formula",
           "fake_quantize_formula", "add_formula"]

register("quantize", "reference")(quantize_formula)
register("quantize_finite", "reference")(quantize_finite_formula)
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
