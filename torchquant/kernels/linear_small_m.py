"""The dynamic int8 Linear of a few rows as an exact float32 GEMM on integer-valued floats.

A recurrent step multiplies a handful of rows (the batch) by the hidden weight.  On CPUs
whose u8 x s8 dot products saturate int16 pairs (AVX2, AVX-512 without VNNI) oneDNN's int8
GEMM is slow at such shapes, slower than a float32 GEMM of the same shape (oneDNN-packed, or
MKL's GEMV at one row; BENCHMARKS.md, 2026-12-04, has the measurements).

The integers can go through a float32 GEMM unchanged: the activation codes minus their zero
point lie in [-255, 255] and the weights in [-128, 127], so every product is an integer below
2^15 and every partial sum of a row is bounded by ``255 * sum_k |w[n, k]|``.  Where that bound
is below 2^24 (checked once per weight: any hidden size up to ~500 qualifies whatever the
weights, real weights far beyond) every partial sum is an exactly representable float32
integer, in any summation order, blocking or vector width -- also under oneDNN's bf16 / tf32
"fpmath" modes, which represent these integers exactly -- so the float32 GEMM returns the
exact int32 accumulator.  The epilogue is fbgemm's: ``fma(acc, x_scale * w_scale, bias)``
(``torch.addcmul`` is a fused multiply-add on CPU), which matches torch.ao's dynamic Linear
bit for bit where oneDNN's float epilogue (multiply, then add) rounds an ulp apart at places.

Cost: a float32 copy of the weight, 4x the int8 bytes (built on first use, kept beside the
pack; two layouts if both one-row and multi-row calls happen: up to 8x).  So it is used only
where it pays: a few rows, and CPUs where oneDNN's int8 GEMM is not exact for all uint8 inputs
(:func:`~torchquant.kernels.onednn_exactness.onednn_u8s8_exact` false -- with VNNI / AMX
oneDNN's int8 GEMM is the faster one).  :func:`dynamic_linear_codes_reference` is the integer
reference (``torch._int_mm``-free int64 matmul) the tests compare against.
"""
from __future__ import annotations

import weakref
from typing import Optional

import torch

from .. import _config
from ..affine import round_to_float32
from .onednn_exactness import onednn_exact_for, onednn_u8s8_exact
from .packed_linear import PackedLinearWeight
from .registry import mode

__all__ = ["SMALL_M_MAX_ROWS", "exact_float_gemm_applies", "quantized_codes",
           "dynamic_linear_codes", "dynamic_linear_codes_reference",
           "dynamic_linear_fused_epilogue"]

# Up to this many rows the float32 GEMM replaces oneDNN's int8 one (where it applies).
SMALL_M_MAX_ROWS = _config.small_m_max_rows()
_FLOAT32_EXACT_INTEGERS = 1 << 24
_MAX_CODE = 255  # |code - zero_point| for uint8 activations

# packed weight -> {"exact": bool, "mm": [K, N] float32, "mkldnn": oneDNN-packed float32}
_FLOAT_WEIGHTS: "weakref.WeakKeyDictionary[PackedLinearWeight, dict]" = \
    weakref.WeakKeyDictionary()


def _mkldnn_float_packing() -> bool:
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _entry(packed: PackedLinearWeight) -> dict:
    entry = _FLOAT_WEIGHTS.get(packed)
    if entry is None:
        bound = int(packed.weight.abs().sum(1, dtype=torch.int64).max()) if packed.weight.numel() \
            else 0
        entry = {"exact": packed.symmetric and _MAX_CODE * bound < _FLOAT32_EXACT_INTEGERS,
                 # per-tensor weights: the one float32 scale, so the epilogue's multiplier is
                 # a Python number (a float32 product of two float32 values, as torch's)
                 "scale": (float(packed.channel_scale[0])
                           if packed.axis is None and packed.weight.numel() else None)}
        _FLOAT_WEIGHTS[packed] = entry
    return entry


def _epilogue(acc: torch.Tensor, x_scale: float, packed: PackedLinearWeight,
              entry: dict) -> torch.Tensor:
    """fbgemm's ``fma(acc, x_scale * w_scale, bias)`` (``torch.add(b, a, alpha=m)`` and
    ``torch.addcmul`` are fused multiply-adds on CPU), in place on ``acc``'s buffer where
    possible."""
    scale = entry["scale"]
    if scale is not None:
        # exact in double, then rounded once
        multiplier = round_to_float32(scale * round_to_float32(x_scale))
        if packed.bias is None:
            return acc.mul_(multiplier)
        return torch.add(packed.bias, acc, alpha=multiplier)
    multiplier = packed.channel_scale * x_scale
    if packed.bias is None:
        return acc.mul_(multiplier)
    return torch.addcmul(packed.bias, acc, multiplier)


def exact_float_gemm_applies(x: torch.Tensor, packed: PackedLinearWeight) -> bool:
    """Whether :func:`dynamic_linear_codes` runs ``x``'s (float32, 2-D) dynamic Linear here:
    CPU, at most :data:`SMALL_M_MAX_ROWS` rows, symmetric weights within the exactness bound,
    kernels in ``auto`` mode, and oneDNN's int8 GEMM not exact for all inputs on this CPU."""
    return (x.device.type == "cpu" and 0 < x.size(0) <= SMALL_M_MAX_ROWS
            and packed.weight.device.type == "cpu" and mode() == "auto"
            and not onednn_u8s8_exact() and _entry(packed)["exact"])


def quantized_codes(x: torch.Tensor, inv_scale: torch.Tensor, zero_point: int,
                    zero_point_f: torch.Tensor) -> torch.Tensor:
    """``clamp(nearbyint(fma(x, inv_scale, zp)), 0, 255) - zp`` as float32: the uint8
    activation integers of the dynamic Linear (fbgemm's quantize, clamped to 0..255 as it does
    also under reduce_range) minus their zero point.  ``inv_scale`` / ``zero_point_f`` are 0-d
    float32 tensors."""
    codes = torch.addcmul(zero_point_f, x, inv_scale).round_().clamp_(0, _MAX_CODE)
    return codes.sub_(zero_point) if zero_point else codes


def _float_weight(packed: PackedLinearWeight, rows: int) -> tuple[str, torch.Tensor]:
    entry = _entry(packed)
    kind = "mm" if rows == 1 or not _mkldnn_float_packing() else "mkldnn"
    weight = entry.get(kind)
    if weight is None:
        w32 = packed.weight.to(torch.float32)
        # one row: MKL's GEMV on the [K, N] copy was fastest; more rows: oneDNN's packed GEMM
        weight = (w32.t().contiguous() if kind == "mm"
                  else torch.ops.mkldnn._reorder_linear_weight(w32, rows))
        entry[kind] = weight
    return kind, weight


def dynamic_linear_codes(codes: torch.Tensor, x_scale: float,
                         packed: PackedLinearWeight) -> torch.Tensor:
    """``linear(x_hat, w_hat, bias)`` from :func:`quantized_codes` (2-D float32, at most
    :data:`SMALL_M_MAX_ROWS` rows, :func:`exact_float_gemm_applies`): the exact integer
    accumulator from a float32 GEMM, then ``fma(acc, x_scale * w_scale, bias)``."""
    kind, weight = _float_weight(packed, codes.size(0))
    if kind == "mm":
        acc = torch.mm(codes, weight)
    else:
        acc = torch.ops.mkldnn._linear_pointwise(codes, weight, None, "none", [], "")
    return _epilogue(acc, x_scale, packed, _entry(packed))


def dynamic_linear_codes_reference(codes: torch.Tensor, x_scale: float,
                                   packed: PackedLinearWeight) -> torch.Tensor:
    """:func:`dynamic_linear_codes` with the accumulator from an int64 matmul (the reference
    the exactness argument is tested against)."""
    acc = (codes.to(torch.int64) @ packed.weight.to(torch.int64).t()).to(torch.float32)
    multiplier = packed.channel_scale * x_scale
    if packed.bias is None:
        return acc * multiplier
    return torch.addcmul(packed.bias, acc, multiplier)


def _unit_channel_qparams(packed: PackedLinearWeight) -> tuple[torch.Tensor, torch.Tensor]:
    entry = _entry(packed)
    unit = entry.get("unit")
    if unit is None:
        n = packed.out_features
        unit = entry["unit"] = (torch.ones(n), torch.zeros(n, dtype=torch.int64))
    return unit


def dynamic_linear_fused_epilogue(x_q: torch.Tensor, x_scale: float, x_zero_point: int,
                                  packed: PackedLinearWeight) -> Optional[torch.Tensor]:
    """The dynamic Linear of uint8 activations ``x_q`` (2-D, any rows) with fbgemm's fused
    epilogue ``fma(acc, x_scale * w_scale, bias)``: the accumulator from oneDNN's int8 GEMM run
    with unit scales (where it is exact for ``x_q`` on this CPU), else from the exact float32
    GEMM (where the weight's bound allows); None where neither applies (CPU only)."""
    if x_q.device.type != "cpu" or mode() != "auto" or not packed.symmetric:
        return None
    if packed.onednn_weight is not None and onednn_exact_for(x_q):
        ones, zeros = _unit_channel_qparams(packed)
        acc = torch.ops.onednn.qlinear_pointwise(
            x_q, 1.0, int(x_zero_point), packed.onednn_weight, ones, zeros, None, 1.0, 0,
            torch.float32, "none", [], "")
    elif _entry(packed)["exact"]:
        codes = x_q.to(torch.float32)
        if x_zero_point:
            codes.sub_(x_zero_point)
        kind, weight = _float_weight(packed, min(codes.size(0), SMALL_M_MAX_ROWS))
        acc = (torch.mm(codes, weight) if kind == "mm" else
               torch.ops.mkldnn._linear_pointwise(codes, weight, None, "none", [], ""))
    else:
        return None
    return _epilogue(acc, x_scale, packed, _entry(packed))
