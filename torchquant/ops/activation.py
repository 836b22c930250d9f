"""Elementwise quantized activations on plain per-tensor quantized integers, torch's numerics.

* ``clamp`` (hardtanh, relu6, torch.clamp) clamps the integers between the bounds quantized
  onto the input's grid; ``threshold`` and the integers of the clamps keep the input's qparams.
* ``sigmoid``, ``tanh``, ``hardsigmoid``, ``hardswish``, ``elu``, ``celu``, ``leaky_relu`` and
  ``threshold`` dequantize, apply the float function and requantize to the output qparams;
  torch's SIMD body and scalar tail round differently, and :mod:`._lanes` reproduces which
  elements take which path (the math is :mod:`torchquant.kernels.elementwise`).  Which path an
  element takes depends on the layout, so the layout torch's op gives its operands is part of
  the op: ``elu`` / ``celu`` write a contiguous output; ``leaky_relu`` takes it as an argument
  (``layout``, see :data:`LAYOUTS`).

Each is a registered ``torch.ops.torchquant`` op of the same name (plain integer tensor,
per-tensor qparams as Python numbers, the qdtype by name; integer tensor out); the functions
here run the kernels directly in eager mode and emit the op while traced.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import dtypes as _dt
from ..kernels import elementwise as _k
from ..kernels.elementwise import fixed_qparams
from ._library import traced
from . import _lanes

__all__ = ["LAYOUTS", "fixed_qparams", "sigmoid", "tanh", "hardsigmoid", "hardswish", "elu",
           "celu", "leaky_relu", "threshold", "clamp"]

# How torch's op lays out operand and result, which decides the elements of the scalar tail:
#   "suggested"   -- the input as it lies, the output in the input's suggested memory format;
#   "dense_input" -- the input first made dense in its suggested format (torch's leaky_relu);
#   "contiguous"  -- the output allocated contiguous (an ``out=`` tensor; torch's elu / celu).
LAYOUTS = ("suggested", "dense_input", "contiguous")


def _check_layout(layout: str) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def _operand(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, Optional[torch.memory_format]]:
    """The input as the kernel walks it and the output's memory format (None: suggested)."""
    if layout == "dense_input":
        return x.contiguous(memory_format=_lanes.suggested_format(x)), None
    if layout == "contiguous":
        return x, torch.contiguous_format
    return x, None


# 8-bit lookup tables per (activation, parameters, qparams, dtype, device): a model calls each
# activation module with the same qparams every time, and building the two 256-entry tables
# costs about 40 small tensor ops.
_VALUE_TABLES: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _value_tables(name: str, params: Sequence[float], scale: float, zero_point: int,
                  vector_fn, tail_fn, out_scale: float, out_zero_point: int, qd: _dt.QDType,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`torchquant.kernels.elementwise.value_tables`, kept per call signature when
    built from plain numbers in eager mode (never modified: the lookups only read them)."""
    key = None
    if not torch.compiler.is_compiling():
        key = (name, tuple(float(p) for p in params), scale, zero_point, out_scale,
               out_zero_point, qd, device)
        try:
            tables = _VALUE_TABLES.get(key)
        except TypeError:  # (symbolic or tensor qparams: not kept)
            key = tables = None
        if tables is not None:
            return tables
    tables = _k.value_tables(scale, zero_point, vector_fn, tail_fn, out_scale, out_zero_point,
                             qd, device)
    if key is not None and all(type(t) is torch.Tensor for t in tables):
        if len(_VALUE_TABLES) >= 256:
            _VALUE_TABLES.clear()
        _VALUE_TABLES[key] = tables
    return tables


def _map(x: torch.Tensor, scale: float, zero_point: int, name: str, params: Sequence[float],
         out_scale: float, out_zero_point: int, qd: _dt.QDType,
         layout: str = "suggested") -> torch.Tensor:
    """``quantize(f(dequantize(x)))`` with the rounding path of each element as torch's."""
    vector_fn, tail_fn = _k.float_functions(name, params)
    values, output_format = _operand(x, layout)
    lanes = _lanes.lane_count(qd.storage_dtype)
    if qd.bits == 8:
        vector_table, tail_table = _value_tables(name, params, scale, zero_point, vector_fn,
                                                 tail_fn, out_scale, out_zero_point, qd,
                                                 x.device)
        return _lanes.apply([values], lambda v: _k.lookup(vector_table, v, qd.qmin),
                            lambda v: _k.lookup(tail_table, v, qd.qmin), lanes, output_format)
    return _lanes.apply(
        [values],
        lambda v: _k.vector_requantize(v, scale, zero_point, vector_fn, out_scale,
                                       out_zero_point, qd),
        lambda v: _k.tail_requantize(v, scale, zero_point, tail_fn, out_scale, out_zero_point,
                                     qd),
        lanes, output_format)


def _map_fake(x: torch.Tensor, qdtype: str, layout: str = "suggested") -> torch.Tensor:
    """The eager result's dtype and layout: dense in the output format :func:`_lanes.apply`
    allocates (contiguous off the CPU, where it takes one path)."""
    storage = _dt.qdtype_of(qdtype).storage_dtype
    values, output_format = _operand(x, layout)
    if x.device.type != "cpu":
        output_format = torch.contiguous_format
    elif output_format is None:
        output_format = _lanes.suggested_format(values)
    return torch.empty(x.shape, dtype=storage, device=x.device, memory_format=output_format)


# ---- fixed-function activations and the ELU family -------------------------------------------
# One registered op each, ``(x, scale, zero_point, *params, out_scale, out_zero_point, qdtype)``;
# :func:`_run_mapped` is the eager / traced switch they share.

_MAPPED = {  # name: (float parameters, layout of torch's op)
    "sigmoid": ((), "suggested"),
    "tanh": ((), "suggested"),
    "hardsigmoid": ((), "suggested"),
    "hardswish": ((), "suggested"),
    "elu": (("alpha",), "contiguous"),
    "celu": (("alpha",), "contiguous"),
}


def _define_mapped_op(name: str, params: tuple[str, ...], layout: str) -> None:
    floats = "".join(f"float {p}, " for p in params)
    schema = (f"(Tensor x, float scale, int zero_point, {floats}float out_scale, "
              f"int out_zero_point, str qdtype) -> Tensor")

    def kernel(x, scale, zero_point, *rest):
        *values, out_scale, out_zero_point, qdtype = rest
        return _map(x, scale, zero_point, name, tuple(values), out_scale, out_zero_point,
                    _dt.qdtype_of(qdtype), layout)

    op = torch.library.custom_op(f"torchquant::{name}", kernel, mutates_args=(), schema=schema)
    op.register_fake(lambda x, *rest: _map_fake(x, rest[-1], layout))


for _name, (_params, _layout) in _MAPPED.items():
    _define_mapped_op(_name, _params, _layout)
del _name, _params, _layout


def _run_mapped(name: str, x: torch.Tensor, scale: float, zero_point: int,
                params: tuple[float, ...], out_scale: float, out_zero_point: int,
                qdtype: _dt.QDType) -> torch.Tensor:
    params = tuple(float(p) for p in params)
    if traced(x):
        return getattr(torch.ops.torchquant, name)(x, scale, zero_point, *params, out_scale,
                                                   out_zero_point, qdtype.name)
    return _map(x, scale, zero_point, name, params, out_scale, out_zero_point, qdtype,
                _MAPPED[name][1])


def sigmoid(x: torch.Tensor, scale: float, zero_point: int, out_scale: float,
            out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``sigmoid(x_hat)`` on the output grid (torch's fixed one:
    :func:`fixed_qparams`)."""
    return _run_mapped("sigmoid", x, scale, zero_point, (), out_scale, out_zero_point, qdtype)


def tanh(x: torch.Tensor, scale: float, zero_point: int, out_scale: float,
         out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``tanh(x_hat)`` on the output grid."""
    return _run_mapped("tanh", x, scale, zero_point, (), out_scale, out_zero_point, qdtype)


def hardsigmoid(x: torch.Tensor, scale: float, zero_point: int, out_scale: float,
                out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``relu6(x_hat + 3) / 6`` on the output grid."""
    return _run_mapped("hardsigmoid", x, scale, zero_point, (), out_scale, out_zero_point,
                       qdtype)


def hardswish(x: torch.Tensor, scale: float, zero_point: int, out_scale: float,
              out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``x_hat * relu6(x_hat + 3) / 6`` on the output grid."""
    return _run_mapped("hardswish", x, scale, zero_point, (), out_scale, out_zero_point,
                       qdtype)


def elu(x: torch.Tensor, scale: float, zero_point: int, alpha: float, out_scale: float,
        out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ELU(``x_hat``) (``alpha * (exp(x) - 1)`` below zero) on the output
    grid; the result is contiguous, as torch writes it."""
    return _run_mapped("elu", x, scale, zero_point, (alpha,), out_scale, out_zero_point, qdtype)


def celu(x: torch.Tensor, scale: float, zero_point: int, alpha: float, out_scale: float,
         out_zero_point: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of CELU(``x_hat``) (``alpha * (exp(x / alpha) - 1)`` below zero) on the
    output grid; the result is contiguous, as torch writes it."""
    return _run_mapped("celu", x, scale, zero_point, (alpha,), out_scale, out_zero_point,
                       qdtype)


# ---- leaky_relu --------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::leaky_relu", mutates_args=())
def _leaky_relu_op(x: torch.Tensor, scale: float, zero_point: int, negative_slope: float,
                   out_scale: float, out_zero_point: int, qdtype: str,
                   layout: str) -> torch.Tensor:
    _check_layout(layout)
    return _map(x, scale, zero_point, "leaky_relu", (negative_slope,), out_scale,
                out_zero_point, _dt.qdtype_of(qdtype), layout)


@_leaky_relu_op.register_fake
def _(x, scale, zero_point, negative_slope, out_scale, out_zero_point, qdtype, layout):
    _check_layout(layout)
    return _map_fake(x, qdtype, layout)


def leaky_relu(x: torch.Tensor, scale: float, zero_point: int, negative_slope: float,
               out_scale: float, out_zero_point: int, qdtype: _dt.QDType,
               layout: str = "dense_input") -> torch.Tensor:
    """The integers of ``x_hat`` (positive) or ``negative_slope * x_hat`` on the output grid.

    ``layout`` (:data:`LAYOUTS`) says how torch's caller lays out the operands:
    ``dense_input`` for ``F.leaky_relu`` and ``quantized::leaky_relu`` (the module), which
    make the input dense first; ``contiguous`` for the functional form with output qparams,
    which writes into a fresh contiguous output."""
    _check_layout(layout)
    if traced(x):
        return torch.ops.torchquant.leaky_relu(x, scale, zero_point, float(negative_slope),
                                               out_scale, out_zero_point, qdtype.name, layout)
    return _map(x, scale, zero_point, "leaky_relu", (negative_slope,), out_scale,
                out_zero_point, qdtype, layout)


# ---- threshold ---------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::threshold", mutates_args=())
def _threshold_op(x: torch.Tensor, scale: float, zero_point: int, threshold: float,
                  value: float, qdtype: str) -> torch.Tensor:
    return _map(x, scale, zero_point, "threshold", (threshold, value), scale, zero_point,
                _dt.qdtype_of(qdtype))


@_threshold_op.register_fake
def _(x, scale, zero_point, threshold, value, qdtype):
    return _map_fake(x, qdtype)


def threshold(x: torch.Tensor, scale: float, zero_point: int, threshold: float, value: float,
              qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``value`` where ``x_hat <= threshold``, else of ``x_hat``, requantized
    to the input's own qparams."""
    if traced(x):
        return torch.ops.torchquant.threshold(x, scale, zero_point, float(threshold),
                                              float(value), qdtype.name)
    return _map(x, scale, zero_point, "threshold", (threshold, value), scale, zero_point,
                qdtype)


# ---- clamp -------------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::clamp", mutates_args=())
def _clamp_op(x: torch.Tensor, scale: float, zero_point: int, min: Optional[float],
              max: Optional[float], qdtype: str) -> torch.Tensor:
    return _k.clamp(x, scale, zero_point, _dt.qdtype_of(qdtype), min, max)


@_clamp_op.register_fake
def _(x, scale, zero_point, min, max, qdtype):
    return _k.clamp(x, scale, zero_point, _dt.qdtype_of(qdtype), min, max)  # valid on fakes


def clamp(x: torch.Tensor, scale: float, zero_point: int, min_val: Optional[float],
          max_val: Optional[float], qdtype: _dt.QDType) -> torch.Tensor:
    """The integers clamped between ``min_val`` and ``max_val`` (either may be None) quantized
    onto the input's grid; the qparams stay the input's (hardtanh, relu6, torch.clamp)."""
    if traced(x):
        return torch.ops.torchquant.clamp(
            x, scale, zero_point, None if min_val is None else float(min_val),
            None if max_val is None else float(max_val), qdtype.name)
    if not (type(min_val) in _NUMBERS and type(max_val) in _NUMBERS
            and type(scale) is float and type(zero_point) is int):
        return _k.clamp(x, scale, zero_point, qdtype, min_val, max_val)
    key = (scale, zero_point, qdtype, min_val, max_val)
    bounds = _CLAMP_BOUNDS.get(key)
    if bounds is None:
        bounds = _k.clamp_bounds(scale, zero_point, qdtype, min_val, max_val)
        if len(_CLAMP_BOUNDS) >= 256:
            _CLAMP_BOUNDS.clear()
        _CLAMP_BOUNDS[key] = bounds
    return torch.clamp(x, *bounds)  # (_k.clamp, its bounds kept)


# eager clamp bounds on the integer grid per (qparams, dtype, real bounds): scalar arithmetic
# that costs more than the clamp of a small tensor
_CLAMP_BOUNDS: dict[tuple, tuple] = {}
_NUMBERS = (float, int, type(None))
