"""Elementwise quantized activations with torch's numerics.

Two families, as in torch's kernels:

* Clamps (relu6, hardtanh, clamp) work on the integers: the bounds are quantized once with
  torch's scalar rounding (``mul_add``) and the values clamped.
* Everything else dequantizes, applies a float function and requantizes, with the two
  rounding paths described in :mod:`._lanes`.  An 8-bit input has at most 256 distinct values,
  so the function is evaluated once per possible value (two tables, one per path) and the
  output is a table lookup: exact and cheap whatever the tensor size.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from . import affine
from .ops import quantize as ops_quantize
from . import dtypes as _dt
from .qtensor import QTensor
from .ops import _lanes

__all__ = ["store_inplace", "map_dequantized", "clamp", "sigmoid", "tanh", "hardsigmoid",
           "hardswish", "elu", "celu", "leaky_relu", "threshold", "fixed_qparams"]

FloatFn = Callable[[torch.Tensor], torch.Tensor]

# Output qparams torch fixes for bounded activations: sigmoid / hardsigmoid cover [0, 1],
# tanh [-1, 1] (qint32 spreads the same ranges over 2**32 steps).
_FIXED_QPARAMS = {
    "sigmoid": {_dt.quint8: (1.0 / 256, 0), _dt.qint8: (1.0 / 256, -128),
                _dt.qint32: (2.0**-32, 0)},
    "tanh": {_dt.quint8: (2.0 / 256, 128), _dt.qint8: (2.0 / 256, 0),
             _dt.qint32: (2.0**-31, 0)},
}


def fixed_qparams(op: str, qdtype: _dt.QDType) -> tuple[float, int]:
    """(scale, zero_point) torch gives the output of ``op`` ('sigmoid' or 'tanh')."""
    return _FIXED_QPARAMS[op][qdtype]


def _f32(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32)


def _scalar_loop(fn: FloatFn) -> FloatFn:
    """``fn`` run through torch's one-element-at-a-time loop (a strided view is never
    vectorised), so transcendental functions use the scalar libm routines of a kernel's tail."""
    def run(x: torch.Tensor) -> torch.Tensor:
        spread = torch.empty(x.numel(), 2, dtype=x.dtype, device=x.device)
        spread[:, 0] = x.reshape(-1)
        return fn(spread[:, 0]).reshape(x.shape)
    return run


def store_inplace(target: QTensor, result: QTensor) -> QTensor:
    """Write ``result`` (values and qparams) into ``target``, as torch's in-place variants do."""
    target.int_data.copy_(result.int_data)
    target._replace_qparams(result.scale, result.zero_point, result.axis)
    return target


def map_dequantized(q: QTensor, fn: FloatFn, out_scale: float, out_zero_point: int,
                    tail_fn: Optional[FloatFn] = None, contiguous_input: bool = False,
                    output_format: Optional[torch.memory_format] = None) -> QTensor:
    """``quantize(fn(dequantize(q)), out_scale, out_zero_point)`` as torch's kernels round it.

    ``tail_fn`` is the float function of the scalar tail where it is computed differently
    (default ``fn``).  ``contiguous_input`` / ``output_format`` state how the torch op lays out
    its operands (see :func:`._lanes.apply`): whether it first makes the input contiguous in
    its suggested memory format, and the format it allocates the output in."""
    tail_fn = tail_fn or fn
    qd = q.qdtype
    scale, zero_point = float(q.scale), int(q.zero_point)
    inv_out = affine.inv_scale_f32(torch.tensor(out_scale, device=q.device))

    def vector_path(values: torch.Tensor) -> torch.Tensor:
        y = fn(affine.dequantize_int_premul(values, scale, zero_point))
        return ops_quantize.quantize_with_multiplier(y, inv_out, out_zero_point, qd.qmin, qd.qmax,
                                                     qd.storage_dtype, affine.ROUND_ADD)

    def tail_path(values: torch.Tensor) -> torch.Tensor:
        y = tail_fn(ops_quantize.dequantize_int(values, q.scale, q.zero_point))
        return ops_quantize.quantize_with_multiplier(y, inv_out, out_zero_point, qd.qmin, qd.qmax,
                                                     qd.storage_dtype, affine.MUL_ADD)

    values = q._values()
    if contiguous_input:
        values = values.contiguous(memory_format=_lanes.suggested_format(values))
    lanes = _lanes.lane_count(qd.storage_dtype)
    if qd.bits == 8:
        domain = torch.arange(qd.qmin, qd.qmax + 1, device=q.device)
        vector_table, tail_table = vector_path(domain), tail_path(domain)

        def lookup(table: torch.Tensor) -> FloatFn:
            if qd.qmin == 0:
                return lambda v: table.index_select(0, v.to(torch.int32))
            return lambda v: table.index_select(0, v.to(torch.int32) - qd.qmin)

        out = _lanes.apply([values], lookup(vector_table), lookup(tail_table), lanes,
                           output_format)
    else:
        out = _lanes.apply([values], vector_path, tail_path, lanes, output_format)
    return QTensor.from_int(out, out_scale, out_zero_point, qd)


def clamp(q: QTensor, min_val: Optional[float], max_val: Optional[float]) -> QTensor:
    """Clamp in the integer domain; keeps q's qparams (hardtanh, relu6 and clamp in torch)."""
    qd = q.qdtype
    scale, zero_point = float(q.scale), int(q.zero_point)

    def bound(value: Optional[float]) -> Optional[int]:
        if value is None:
            return None
        return affine.quantize_scalar(float(value), scale, zero_point, qd.qmin, qd.qmax,
                                      affine.MUL_ADD)

    # min > max gives max everywhere, as in torch
    return q._with(torch.clamp(q._values(), bound(min_val), bound(max_val)))


def sigmoid(q: QTensor) -> QTensor:
    out_scale, out_zp = fixed_qparams("sigmoid", q.qdtype)
    return map_dequantized(q, torch.sigmoid, out_scale, out_zp, _scalar_loop(torch.sigmoid))


def tanh(q: QTensor) -> QTensor:
    out_scale, out_zp = fixed_qparams("tanh", q.qdtype)
    return map_dequantized(q, torch.tanh, out_scale, out_zp, _scalar_loop(torch.tanh))


def _hardsigmoid_float(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def hardsigmoid(q: QTensor) -> QTensor:
    out_scale, out_zp = fixed_qparams("sigmoid", q.qdtype)
    return map_dequantized(q, _hardsigmoid_float, out_scale, out_zp)


def hardswish(q: QTensor, scale: float, zero_point: int) -> QTensor:
    return map_dequantized(q, lambda x: x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0, scale,
                           zero_point)


def _elu_float(alpha: float, input_scale: float) -> FloatFn:
    """torch's quantized ELU family: ``x`` for x > 0, else
    ``(exp(x * input_scale) - 1) * alpha``."""
    alpha_f, input_scale_f = _f32(alpha), _f32(input_scale)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x <= 0, (torch.exp(x * input_scale_f.to(x.device)) - 1)
                           * alpha_f.to(x.device), x)
    return fn


def elu(q: QTensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    fn = _elu_float(alpha, 1.0)
    return map_dequantized(q, fn, scale, zero_point, _scalar_loop(fn),
                           output_format=torch.contiguous_format)


def celu(q: QTensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    fn = _elu_float(alpha, 1.0 / alpha)
    return map_dequantized(q, fn, scale, zero_point, _scalar_loop(fn),
                           output_format=torch.contiguous_format)


def leaky_relu(q: QTensor, negative_slope: float, scale: Optional[float] = None,
               zero_point: Optional[int] = None,
               output_format: Optional[torch.memory_format] = None) -> QTensor:
    """Output qparams (scale, zero_point) when both are given, else the input's.

    ``output_format``: where the caller's torch counterpart allocates the output (the
    functional form with qparams writes into a contiguous ``out=`` tensor)."""
    slope = _f32(negative_slope).to(q.device)
    fn = lambda x: x * torch.where(x > 0, torch.ones_like(slope), slope)  # noqa: E731
    if scale is None or zero_point is None:
        return map_dequantized(q, fn, float(q.scale), int(q.zero_point), contiguous_input=True)
    return map_dequantized(q, fn, scale, zero_point, output_format=output_format)


def threshold(q: QTensor, threshold: float, value: float) -> QTensor:
    """``value`` where the real value is <= ``threshold``; keeps q's qparams."""
    threshold_f, value_f = _f32(threshold).to(q.device), _f32(value).to(q.device)
    return map_dequantized(q, lambda x: torch.where(x <= threshold_f, value_f, x),
                           float(q.scale), int(q.zero_point))
