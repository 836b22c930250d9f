"""Quantized add / mul / cat / matmul / prelu with the numerics of torch's ``quantized::`` ops.

* ``add`` / ``mul`` (+ReLU), ``add_scalar`` / ``mul_scalar`` and ``cat`` are QTensor wrappers:
  they validate the inputs, call :mod:`torchquant.ops.binary` on the integers and qparams
  (numerics described there) and wrap the result.
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
    a_s, a_z = a._scale_zp()
    b_s, b_z = b._scale_zp()
    qd = a.qdtype
    out = _ops_binary.mul(a._values(), a_s, a_z, b._values(), b_s, b_z, float(scale),
                          int(zero_point), qd, relu)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


def add_scalar(q: QTensor, other: float, relu: bool = False) -> QTensor:
    """``q + other`` by moving the zero point by ``round(other / scale)`` steps (see
    :func:`torchquant.ops.binary.add_scalar_qparams`)."""
    require_quantized(q, "add_scalar")
    qd = q.qdtype
    scale, zero_point = q._scale_zp()
    out_scale, out_zp = _ops_binary.add_scalar_qparams(scale, zero_point, other, qd)
    out = _ops_binary.add_scalar(q._values(), scale, zero_point, other, out_scale, out_zp, qd,
                                 relu)
    return QTensor.from_int_per_tensor(out, out_scale, out_zp, qd)


def mul_scalar(q: QTensor, other: float) -> QTensor:
    """``q * other`` by scaling the scale by ``|other|``; a negative factor mirrors the
    integers within the range, zero gives zeros with scale 1 and zero point 0."""
    require_quantized(q, "mul_scalar")
    qd = q.qdtype
    scale, zero_point = q._scale_zp()
    out_scale, out_zp = _ops_binary.mul_scalar_qparams(scale, zero_point, other, qd)
    out = _ops_binary.mul_scalar(q._values(), other, qd)
    return QTensor.from_int_per_tensor(out, out_scale, out_zp, qd)


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
    qparams = [t._scale_zp() for t in tensors]
    qd = tensors[0].qdtype
    out = _ops_binary.cat([t._values() for t in tensors], [s for s, _ in qparams],
                          [z for _, z in qparams], dim, float(scale), int(zero_point), qd)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


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
