"""Plain-torch reference math of the elementwise quantized activations (torch's numerics).

Two families, as in torch's kernels:

* Clamps (relu6, hardtanh, clamp) work on the integers: the bounds are quantized once with
  torch's scalar rounding (``mul_add``) and the values clamped (:func:`clamp`).
* Everything else dequantizes, applies a float32 function and requantizes.  torch's SIMD body
  and its scalar tail round that differently (:func:`vector_requantize`, :func:`tail_requantize`;
  which elements take which path is the lane model of :mod:`torchquant.ops._lanes`).  An 8-bit
  input has at most 256 distinct values, so :func:`value_tables` evaluates both paths once per
  possible value and the op becomes a table lookup: exact and cheap whatever the tensor size.

The float functions are named by :data:`FLOAT_FUNCTIONS` (one entry per activation, built
from its float parameters), so an op schema can carry the choice as a string.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .. import affine
from .. import dtypes as _dt

__all__ = ["FloatFn", "FLOAT_FUNCTIONS", "float_functions", "fixed_qparams", "clamp",
           "clamp_bounds", "vector_requantize", "tail_requantize", "value_tables", "lookup"]

FloatFn = Callable[[torch.Tensor], torch.Tensor]

# Output qparams torch fixes for bounded activations: sigmoid / hardsigmoid cover [0, 1],
# tanh [-1, 1] (qint32 spreads the same ranges over 2**32 steps).
_FIXED_QPARAMS = {
    "sigmoid": {_dt.quint8: (1.0 / 256, 0), _dt.qint8: (1.0 / 256, -128),
                _dt.qint32: (2.0**-32, 0)},
    "tanh": {_dt.quint8: (2.0 / 256, 128), _dt.qint8: (2.0 / 256, 0),
             _dt.qint32: (2.0**-31, 0)},
}
_FIXED_QPARAMS["hardsigmoid"] = _FIXED_QPARAMS["sigmoid"]


def fixed_qparams(name: str, qdtype: _dt.QDType) -> tuple[float, int]:
    """(scale, zero_point) torch gives the output of ``name`` ('sigmoid', 'hardsigmoid' or
    'tanh') when the caller names none."""
    return _FIXED_QPARAMS[name][qdtype]


def _f32(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


def _scalar_loop(fn: FloatFn) -> FloatFn:
    """``fn`` run through torch's one-element-at-a-time loop (a strided view is never
    vectorised), so transcendental functions use the scalar libm routines of a kernel's tail."""
    def run(x: torch.Tensor) -> torch.Tensor:
        spread = torch.empty(x.numel(), 2, dtype=x.dtype, device=x.device)
        spread[:, 0] = x.reshape(-1)
        return fn(spread[:, 0]).reshape(x.shape)
    return run


def _hardsigmoid(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def _hardswish(x: torch.Tensor) -> torch.Tensor:
    return x * torch.clamp(x + 3.0, 0.0, 6.0) / 6.0


def _elu(alpha: float, input_scale: float) -> FloatFn:
    """torch's quantized ELU family: ``x`` for x > 0, else ``(exp(x * input_scale) - 1) *
    alpha`` (ELU: input_scale 1; CELU: 1 / alpha), in float32."""
    def fn(x: torch.Tensor) -> torch.Tensor:
        negative = (torch.exp(x * _f32(input_scale, x.device)) - 1) * _f32(alpha, x.device)
        return torch.where(x <= 0, negative, x)
    return fn


def _leaky_relu(negative_slope: float) -> FloatFn:
    def fn(x: torch.Tensor) -> torch.Tensor:
        slope = _f32(negative_slope, x.device)
        return x * torch.where(x > 0, torch.ones_like(slope), slope)
    return fn


def _threshold(threshold: float, value: float) -> FloatFn:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.where(x <= _f32(threshold, x.device), _f32(value, x.device), x)
    return fn


def _sigmoid_pair(params: Sequence[float]) -> tuple[FloatFn, FloatFn]:
    return torch.sigmoid, _scalar_loop(torch.sigmoid)


def _tanh_pair(params: Sequence[float]) -> tuple[FloatFn, FloatFn]:
    return torch.tanh, _scalar_loop(torch.tanh)


def _elu_pair(params: Sequence[float]) -> tuple[FloatFn, FloatFn]:
    fn = _elu(params[0], 1.0)
    return fn, _scalar_loop(fn)


def _celu_pair(params: Sequence[float]) -> tuple[FloatFn, FloatFn]:
    fn = _elu(params[0], 1.0 / params[0])
    return fn, _scalar_loop(fn)


def _same(fn: FloatFn) -> Callable[[Sequence[float]], tuple[FloatFn, FloatFn]]:
    return lambda params: (fn, fn)


# name -> params -> (SIMD-body function, scalar-tail function).  The params are the float
# arguments of the activation, in its op's order: elu / celu (alpha,), leaky_relu
# (negative_slope,), threshold (threshold, value).
FLOAT_FUNCTIONS: dict[str, Callable[[Sequence[float]], tuple[FloatFn, FloatFn]]] = {
    "sigmoid": _sigmoid_pair,
    "tanh": _tanh_pair,
    "hardsigmoid": _same(_hardsigmoid),
    "hardswish": _same(_hardswish),
    "elu": _elu_pair,
    "celu": _celu_pair,
    "leaky_relu": lambda params: (_leaky_relu(params[0]),) * 2,
    "threshold": lambda params: (_threshold(params[0], params[1]),) * 2,
}


def float_functions(name: str, params: Sequence[float] = ()) -> tuple[FloatFn, FloatFn]:
    """The float32 functions of activation ``name`` in torch's SIMD body and scalar tail."""
    return FLOAT_FUNCTIONS[name](tuple(float(p) for p in params))


def vector_requantize(values: torch.Tensor, scale: float, zero_point: int, fn: FloatFn,
                      out_scale: float, out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """torch's SIMD body: dequantize as ``fma(q, scale, -zp * scale)``, apply ``fn``,
    requantize as ``round(y * inv) + zp``."""
    inv_out = affine.inv_scale_f32(torch.tensor(out_scale, device=values.device))
    y = fn(affine.dequantize_int_premul(values, scale, zero_point))
    return affine.quantize_with_multiplier(y, inv_out, out_zero_point, qdtype.qmin, qdtype.qmax,
                                           qdtype.storage_dtype, affine.ROUND_ADD)


def tail_requantize(values: torch.Tensor, scale: float, zero_point: int, fn: FloatFn,
                    out_scale: float, out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """torch's scalar tail: dequantize as ``(q - zp) * scale``, apply ``fn``, requantize as
    ``round(y * inv + zp)``."""
    inv_out = affine.inv_scale_f32(torch.tensor(out_scale, device=values.device))
    y = fn(affine.dequantize_per_tensor_int(values, scale, zero_point))
    return affine.quantize_with_multiplier(y, inv_out, out_zero_point, qdtype.qmin, qdtype.qmax,
                                           qdtype.storage_dtype, affine.MUL_ADD)


def value_tables(scale: float, zero_point: int, vector_fn: FloatFn, tail_fn: FloatFn,
                 out_scale: float, out_zero_point: int, qdtype: _dt.QDType,
                 device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Both paths over every value of an 8-bit ``qdtype``: (vector table, tail table), indexed
    by ``value - qmin``."""
    domain = torch.arange(qdtype.qmin, qdtype.qmax + 1, device=device)
    return (vector_requantize(domain, scale, zero_point, vector_fn, out_scale, out_zero_point,
                              qdtype),
            tail_requantize(domain, scale, zero_point, tail_fn, out_scale, out_zero_point,
                            qdtype))


def lookup(table: torch.Tensor, values: torch.Tensor, qmin: int) -> torch.Tensor:
    """``table[values - qmin]`` for flat integer ``values``."""
    index = values.to(torch.int32)
    return table.index_select(0, index if qmin == 0 else index - qmin)


def clamp_bounds(scale: float, zero_point: int, qdtype: _dt.QDType, min_val: Optional[float],
                 max_val: Optional[float]) -> tuple[Optional[int], Optional[int]]:
    """The real bounds on the integer grid, rounded as torch's scalar quantize (``mul_add``)."""
    def bound(value: Optional[float]) -> Optional[int]:
        if value is None:
            return None
        return affine.quantize_scalar(float(value), scale, zero_point, qdtype.qmin, qdtype.qmax,
                                      affine.MUL_ADD)
    return bound(min_val), bound(max_val)


def clamp(values: torch.Tensor, scale: float, zero_point: int, qdtype: _dt.QDType,
          min_val: Optional[float], max_val: Optional[float]) -> torch.Tensor:
    """Clamp to [min_val, max_val] in the integer domain (the qparams stay the input's);
    min > max gives max everywhere, as in torch."""
    low, high = clamp_bounds(scale, zero_point, qdtype, min_val, max_val)
    return torch.clamp(values, low, high)
