"""Elementwise quantized activations on QTensors: unwrap, call :mod:`torchquant.ops.activation`,
rewrap.

The numerics (torch's, bit for bit) live in the ops and their kernels; this module only reads
a per-tensor QTensor's integers and qparams, picks the output qparams (the input's, the
caller's, or torch's fixed ones for sigmoid / hardsigmoid / tanh) and wraps the result.
Callers check the input first (per tensor, 8/32-bit).
"""
from __future__ import annotations

from typing import Optional

from ..ops import activation
from ..ops.activation import fixed_qparams
from .qtensor import QTensor

__all__ = ["store_inplace", "clamp", "sigmoid", "tanh", "hardsigmoid", "hardswish", "elu",
           "celu", "leaky_relu", "threshold", "fixed_qparams"]


def store_inplace(target: QTensor, result: QTensor) -> QTensor:
    """Write ``result`` (values and qparams) into ``target``, as torch's in-place variants do."""
    target.int_data.copy_(result.int_data)
    target._replace_qparams(result.scale, result.zero_point, result.axis,
                            result.__dict__.get("_numbers"))
    return target


def _wrap(q: QTensor, values, out_scale: float, out_zero_point: int) -> QTensor:
    return QTensor.from_int_per_tensor(values, out_scale, out_zero_point, q.qdtype)


def _output_qparams(q: QTensor, name: str, out_scale: Optional[float],
                    out_zero_point: Optional[int]) -> tuple[float, int]:
    if out_scale is None or out_zero_point is None:
        return fixed_qparams(name, q.qdtype)
    return float(out_scale), int(out_zero_point)


def clamp(q: QTensor, min_val: Optional[float], max_val: Optional[float]) -> QTensor:
    """Clamp in the integer domain; keeps q's qparams (hardtanh, relu6 and clamp in torch)."""
    scale, zero_point = q._scale_zp()
    return q._with(activation.clamp(q._values(), scale, zero_point, min_val, max_val, q.qdtype))


def sigmoid(q: QTensor, out_scale: Optional[float] = None,
            out_zero_point: Optional[int] = None) -> QTensor:
    """Output qparams (out_scale, out_zero_point) when both are given, else torch's fixed ones."""
    out_scale, out_zero_point = _output_qparams(q, "sigmoid", out_scale, out_zero_point)
    return _wrap(q, activation.sigmoid(q._values(), *q._scale_zp(), out_scale, out_zero_point,
                                       q.qdtype), out_scale, out_zero_point)


def tanh(q: QTensor) -> QTensor:
    out_scale, out_zero_point = fixed_qparams("tanh", q.qdtype)
    return _wrap(q, activation.tanh(q._values(), *q._scale_zp(), out_scale, out_zero_point,
                                    q.qdtype), out_scale, out_zero_point)


def hardsigmoid(q: QTensor) -> QTensor:
    out_scale, out_zero_point = fixed_qparams("hardsigmoid", q.qdtype)
    return _wrap(q, activation.hardsigmoid(q._values(), *q._scale_zp(), out_scale,
                                           out_zero_point, q.qdtype), out_scale, out_zero_point)


def hardswish(q: QTensor, scale: float, zero_point: int) -> QTensor:
    return _wrap(q, activation.hardswish(q._values(), *q._scale_zp(), scale, zero_point,
                                         q.qdtype), scale, zero_point)


def elu(q: QTensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    return _wrap(q, activation.elu(q._values(), *q._scale_zp(), alpha, scale, zero_point,
                                   q.qdtype), scale, zero_point)


def celu(q: QTensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    return _wrap(q, activation.celu(q._values(), *q._scale_zp(), alpha, scale, zero_point,
                                    q.qdtype), scale, zero_point)


def leaky_relu(q: QTensor, negative_slope: float, scale: Optional[float] = None,
               zero_point: Optional[int] = None, layout: str = "dense_input") -> QTensor:
    """Output qparams (scale, zero_point) when both are given (laid out as ``layout`` says:
    :data:`torchquant.ops.activation.LAYOUTS`), else the input's -- then torch first makes
    the input dense, whatever ``layout``."""
    in_scale, in_zero_point = q._scale_zp()
    if scale is None or zero_point is None:
        values = activation.leaky_relu(q._values(), in_scale, in_zero_point, negative_slope,
                                       in_scale, in_zero_point, q.qdtype, "dense_input")
        return q._with(values)
    values = activation.leaky_relu(q._values(), in_scale, in_zero_point, negative_slope, scale,
                                   zero_point, q.qdtype, layout)
    return _wrap(q, values, scale, zero_point)


def threshold(q: QTensor, threshold: float, value: float) -> QTensor:
    """``value`` where the real value is <= ``threshold``; keeps q's qparams."""
    return q._with(activation.threshold(q._values(), *q._scale_zp(), threshold, value,
                                        q.qdtype))
