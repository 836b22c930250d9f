"""Quantized add / mul / cat / matmul / prelu with the numerics of torch's ``quantized::`` ops.

* ``add`` (and ``add_relu``) dequantizes both operands, adds in float and requantizes, with the
  two rounding paths of :mod:`torchquant.ops._lanes`.
* ``mul`` multiplies the zero-point-shifted integers exactly and requantizes the product with
  the float32 multiplier ``in_scale_a * in_scale_b * (1 / out_scale)``.
* ``add_scalar`` / ``mul_scalar`` choose the output qparams so that the integers barely
  change (a zero-point shift, a scale change, a flip for negative factors).
* ``cat`` requantizes to the output qparams: dequantize then ``quantize_per_tensor``, except on
  torch's channels-last fast path (4-D, dim 1), which vectorises over 8 channels at a time.
* ``matmul`` is dequantize, float matmul, quantize.
* ``prelu`` works on integers: ``(q - zp)`` times the weight's integer above its zero point for
  negative inputs, times the weight grid's integer for 1.0 for positive ones (so positive
  inputs shrink when 1.0 clamps on that grid, as in torch), requantized like ``mul``.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ... import affine
from ...qtensor import QTensor
from ...ops import binary as _ops_binary
from ..._validation import require_quantized

__all__ = ["add", "mul", "add_scalar", "mul_scalar", "cat", "matmul", "prelu"]

_CAT_NHWC_LANES = 8  # channels per vector in torch's channels-last cat kernel (measured)


def _same_dtype(a: QTensor, b: QTensor, op: str) -> None:
    require_quantized(a, op)
    require_quantized(b, op)
    if a.qdtype is not b.qdtype:
        raise RuntimeError(f"quantized.{op}: both inputs must have the same quantized dtype, got "
                           f"{a.qdtype!r} and {b.qdtype!r}")


def _f32(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def add(a: QTensor, b: QTensor, scale: float, zero_point: int, relu: bool = False) -> QTensor:
    """``quantize(a + b)`` with output qparams (scale, zero_point); ``relu`` clamps at 0 first."""
    if type(a) is not QTensor or type(b) is not QTensor or a.qdtype is not b.qdtype:
        _same_dtype(a, b, "add_relu" if relu else "add")
    a_s, a_z = a._scale_zp()
    b_s, b_z = b._scale_zp()
    qd = a.qdtype
    out = _ops_binary.add(a._values(), a_s, a_z, b._values(), b_s, b_z, float(scale),
                          int(zero_point), qd, relu)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


def mul(a: QTensor, b: QTensor, scale: float, zero_point: int, relu: bool = False) -> QTensor:
    """``quantize(a * b)`` with output qparams (scale, zero_point); ``relu`` clamps at 0."""
    _same_dtype(a, b, "mul_relu" if relu else "mul")
    qd = a.qdtype
    device = a.device
    multiplier = (_f32(float(a.scale), device) * _f32(float(b.scale), device)
                  * affine.inv_scale_f32(torch.tensor(scale, device=device)))
    wide = torch.int64 if qd.bits > 16 else torch.int32  # 8-bit products fit in int32
    product = ((a._values().to(wide) - int(a.zero_point))
               * (b._values().to(wide) - int(b.zero_point)))
    qmin = zero_point if relu else qd.qmin
    out = affine.quantize_with_multiplier(product, multiplier, zero_point, qmin, qd.qmax,
                                          qd.storage_dtype, affine.ROUND_ADD)
    return QTensor.from_int(out, scale, zero_point, qd)


def add_scalar(q: QTensor, other: float, relu: bool = False) -> QTensor:
    """``q + other`` by moving the zero point by ``round(other / scale)`` steps.

    Where the shifted zero point would leave the integer range, the output zero point is
    pinned at that end and the scale widened just enough to keep every value representable
    (the integers are then requantized)."""
    require_quantized(q, "add_scalar")
    qd = q.qdtype
    scale, zero_point = float(q.scale), int(q.zero_point)
    steps = round(float(other) / scale)
    shifted = zero_point - steps
    if qd.qmin <= shifted <= qd.qmax:
        out_scale, out_zp = scale, shifted
    elif shifted < qd.qmin:
        out_scale, out_zp = (qd.qmax - shifted) / (qd.qmax - qd.qmin) * scale, qd.qmin
    else:
        out_scale, out_zp = (shifted - qd.qmin) / (qd.qmax - qd.qmin) * scale, qd.qmax
    device = q.device
    multiplier = _f32(scale, device) * affine.inv_scale_f32(torch.tensor(out_scale, device=device))
    moved = q._values().to(torch.int64) - zero_point + steps
    out = affine.quantize_with_multiplier(moved, multiplier, out_zp,
                                          out_zp if relu else qd.qmin, qd.qmax, qd.storage_dtype,
                                          affine.ROUND_ADD)
    return QTensor.from_int(out, out_scale, out_zp, qd)


def mul_scalar(q: QTensor, other: float) -> QTensor:
    """``q * other`` by scaling the scale by ``|other|``; a negative factor mirrors the
    integers within the range, zero gives zeros with scale 1 and zero point 0."""
    require_quantized(q, "mul_scalar")
    qd = q.qdtype
    factor = float(other)
    values = q._values()
    if factor == 0:
        return QTensor.from_int(torch.zeros_like(values), 1.0, 0, qd)
    out_scale = float(q.scale) * abs(factor)
    if factor > 0:
        return QTensor.from_int(values.clone(), out_scale, int(q.zero_point), qd)
    mirrored = (qd.qmax + qd.qmin) - values.to(torch.int64)
    return QTensor.from_int(mirrored.to(qd.storage_dtype), out_scale,
                            qd.qmax + qd.qmin - int(q.zero_point), qd)


def _requantize_float(q: QTensor, scale: float, zero_point: int) -> torch.Tensor:
    qd = q.qdtype
    out_scale = torch.tensor(scale, dtype=torch.float64, device=q.device)
    out_zp = torch.tensor(zero_point, dtype=torch.int64, device=q.device)
    return affine.quantize_int(q.dequantize(), out_scale, out_zp, qd.qmin, qd.qmax,
                               qd.storage_dtype, mode=affine.quantize_mode(qd, False))


def _is_cat_nhwc_fast_path(tensors: Sequence[QTensor], dim: int) -> bool:
    return dim == 1 and all(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
                            for t in tensors)


def _cat_nhwc_part(q: QTensor, scale: float, zero_point: int) -> torch.Tensor:
    """One input of the channels-last cat kernel: vectors of 8 channels, scalar remainder."""
    qd = q.qdtype
    values = q._values()
    if float(q.scale) == scale and int(q.zero_point) == zero_point:
        return values
    inv_out = affine.inv_scale_f32(torch.tensor(scale, device=q.device))
    vector = affine.quantize_with_multiplier(
        affine.dequantize_int_premul(values, float(q.scale), int(q.zero_point)), inv_out,
        zero_point, qd.qmin, qd.qmax, qd.storage_dtype, affine.ROUND_ADD)
    split = q.shape[1] // _CAT_NHWC_LANES * _CAT_NHWC_LANES
    if split < q.shape[1]:
        rest = values[:, split:]
        vector[:, split:] = affine.quantize_with_multiplier(
            affine.dequantize_int(rest, q.scale, q.zero_point), inv_out, zero_point, qd.qmin,
            qd.qmax, qd.storage_dtype, affine.MUL_ADD)
    return vector


def cat(tensors: Sequence[QTensor], dim: int, scale: float, zero_point: int) -> QTensor:
    """Concatenate, requantizing every input to (scale, zero_point)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("quantized.cat needs at least one tensor")
    for t in tensors:
        require_quantized(t, "cat")
        if t.qdtype is not tensors[0].qdtype:
            raise RuntimeError(f"quantized.cat: all inputs must have one quantized dtype, got "
                               f"{tensors[0].qdtype!r} and {t.qdtype!r}")
    if _is_cat_nhwc_fast_path(tensors, dim):
        parts = [_cat_nhwc_part(t, scale, zero_point) for t in tensors]
        out = torch.cat(parts, 1).contiguous(memory_format=torch.channels_last)
    else:
        out = torch.cat([_requantize_float(t, scale, zero_point) for t in tensors], dim)
    return QTensor.from_int(out, scale, zero_point, tensors[0].qdtype)


def matmul(a: QTensor, b: QTensor, scale: float, zero_point: int) -> QTensor:
    """``quantize(dequantize(a) @ dequantize(b))`` with output qparams (scale, zero_point)."""
    _same_dtype(a, b, "matmul")
    product = torch.matmul(a.dequantize(), b.dequantize())
    qd = a.qdtype
    out = affine.quantize_int(product, torch.tensor(scale, dtype=torch.float64, device=a.device),
                              torch.tensor(zero_point, device=a.device), qd.qmin, qd.qmax,
                              qd.storage_dtype, mode=affine.quantize_mode(qd, False))
    return QTensor.from_int(out, scale, zero_point, qd)


def prelu(q: QTensor, weight: QTensor, scale: float, zero_point: int) -> QTensor:
    """``max(x, 0) + w * min(x, 0)`` with the weight along dim 1 (or one shared weight)."""
    _same_dtype(q, weight, "prelu")
    qd = q.qdtype
    if q.dim() == 0:
        raise RuntimeError("qprelu: zero-dim input tensor is not allowed.")
    shape = [1] * q.dim()
    if q.dim() > 1:
        shape[1] = weight.numel()
    w_zp = int(weight.zero_point)
    w_values = weight._values().reshape(shape).to(torch.int64) - w_zp
    one = affine.quantize_scalar(1.0, float(weight.scale), w_zp, qd.qmin, qd.qmax,
                                 affine.MUL_ADD) - w_zp
    values, zp = q._values().to(torch.int64), int(q.zero_point)
    acc = (torch.clamp(values, min=zp) - zp) * one + (torch.clamp(values, max=zp) - zp) * w_values
    device = q.device
    multiplier = (_f32(float(q.scale), device) * _f32(float(weight.scale), device)
                  * affine.inv_scale_f32(torch.tensor(scale, device=device)))
    out = affine.quantize_with_multiplier(acc, multiplier, zero_point, qd.qmin, qd.qmax,
                                          qd.storage_dtype, affine.ROUND_ADD)
    return QTensor.from_int(out, scale, zero_point, qd)
