"""Quantized add / mul / cat / matmul / prelu with the numerics of torch's ``quantized::`` ops.

QTensor wrappers: each validates its inputs, calls :mod:`torchquant.ops.binary` on the integers
and qparams (numerics described there) and wraps the result.
"""
from __future__ import annotations

from typing import Sequence

from ...tensor.qtensor import QTensor
from ...ops import binary as _ops_binary
from ...tensor.validation import require_per_tensor, require_quantized

__all__ = ["add", "mul", "add_scalar", "mul_scalar", "cat", "matmul", "prelu"]


def _same_dtype(a: QTensor, b: QTensor, op: str) -> None:
    require_quantized(a, op)
    require_quantized(b, op)
    if a.qdtype is not b.qdtype:
        raise RuntimeError(f"quantized.{op}: both inputs must have the same quantized dtype, got "
                           f"{a.qdtype!r} and {b.qdtype!r}")


def add(a: QTensor, b: QTensor, scale: float, zero_point: int, relu: bool = False) -> QTensor:
    """``quantize(a + b)`` with output qparams (scale, zero_point); ``relu`` clamps at 0 first."""
    if type(a) is not QTensor or type(b) is not QTensor or a.qdtype is not b.qdtype:
        _same_dtype(a, b, "add_relu" if relu else "add")
    if a.axis is not None or b.axis is not None:  # (a RuntimeError subclass, as torch's)
        require_per_tensor(a, "add_relu" if relu else "add")
        require_per_tensor(b, "add_relu" if relu else "add")
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


def cat(tensors: Sequence[QTensor], dim: int, scale: float | None,
        zero_point: int | None) -> QTensor:
    """Concatenate, requantizing every input to (scale, zero_point); ``None`` takes the first
    input's (torch's quantized ``torch.cat``, which FX-converted models call)."""
    tensors = list(tensors)
    if not tensors:
        raise ValueError("quantized.cat needs at least one tensor")
    for t in tensors:
        require_quantized(t, "cat")
        if t.qdtype is not tensors[0].qdtype:
            raise RuntimeError(f"quantized.cat: all inputs must have one quantized dtype, got "
                               f"{tensors[0].qdtype!r} and {t.qdtype!r}")
    qparams = [t._scale_zp() for t in tensors]
    if scale is None or zero_point is None:
        scale, zero_point = qparams[0]
    qd = tensors[0].qdtype
    out = _ops_binary.cat([t._values() for t in tensors], [s for s, _ in qparams],
                          [z for _, z in qparams], dim, float(scale), int(zero_point), qd)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


def matmul(a: QTensor, b: QTensor, scale: float, zero_point: int) -> QTensor:
    """``quantize(dequantize(a) @ dequantize(b))`` with output qparams (scale, zero_point)."""
    _same_dtype(a, b, "matmul")
    a_s, a_z = a._scale_zp()
    b_s, b_z = b._scale_zp()
    qd = a.qdtype
    out = _ops_binary.matmul(a._values(), a_s, a_z, b._values(), b_s, b_z, float(scale),
                             int(zero_point), qd)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


def prelu(q: QTensor, weight: QTensor, scale: float, zero_point: int) -> QTensor:
    """``max(x, 0) + w * min(x, 0)`` with the weight along dim 1 (or one shared weight)."""
    _same_dtype(q, weight, "prelu")
    if q.dim() == 0:
        raise RuntimeError("qprelu: zero-dim input tensor is not allowed.")
    x_s, x_z = q._scale_zp()
    w_s, w_z = weight._scale_zp()
    qd = q.qdtype
    out = _ops_binary.prelu(q._values(), x_s, x_z, weight._values(), w_s, w_z, float(scale),
                            int(zero_point), qd)
    return QTensor.from_int_per_tensor(out, scale, zero_point, qd)
