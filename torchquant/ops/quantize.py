"""Quantize / dequantize on plain tensors.

Two kinds of function live here:

* the fast forms of :mod:`torchquant.affine`'s quantize functions (:func:`quantize_int`,
  :func:`dequantize_int`, :func:`quantize_per_tensor_int`, :func:`dequantize_per_tensor_int`,
  :func:`quantize_finite_per_tensor`, :func:`quantize_with_multiplier`): same signatures, same
  integers, run on the fastest registered kernel that applies.  Other ops and the tensor layer
  call these inside their own implementations;
* the registered ops ``torch.ops.torchquant.quantize_per_tensor`` / ``dequantize_per_tensor`` /
  ``quantize_per_channel`` / ``dequantize_per_channel``: per tensor (Python-number qparams,
  which a graph holds as constants) and per channel (qparams as tensors), with Python functions
  that call the kernels directly in eager mode and emit the op when traced.

8- and 32-bit dtypes only: sub-byte values are packed by the tensor layer, not here.  The
rounding formula of each dtype / granularity is :func:`torchquant.affine.quantize_mode`'s.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import affine, kernels
from .. import dtypes as _dt
from ._library import cached, plain_eager, traced

__all__ = ["quantize_int", "dequantize_int", "quantize_per_tensor_int", "dequantize_per_tensor_int",
           "quantize_finite_per_tensor", "quantize_with_multiplier",
           "quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
           "dequantize_per_channel", "DECOMPOSED"]


# --------------------------------------------------------------------------------------------
# Fast forms of affine's functions (eager; the kernel registry picks the implementation)
# --------------------------------------------------------------------------------------------

def quantize_int(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int,
                 qmax: int, storage_dtype: torch.dtype, axis: Optional[int] = None,
                 mode: str = affine.FMA) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_int` on the fastest kernel that applies."""
    x32, inv, zp, mode = affine.quantize_operands(x, scale, zero_point, axis, mode)
    fn = kernels.get("quantize", x, mode=mode, per_channel=axis is not None)
    return fn(x32, inv, zp, qmin, qmax, storage_dtype, mode)


def dequantize_int(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                   axis: Optional[int] = None) -> torch.Tensor:
    """:func:`torchquant.affine.dequantize_int` on the fastest kernel that applies."""
    fn = kernels.get("dequantize", q, per_channel=axis is not None)
    return fn(*affine.dequantize_operands(q, scale, zero_point, axis))


def dequantize_per_tensor_tensors(q: torch.Tensor, scale: torch.Tensor,
                                  zero_point: torch.Tensor,
                                  numbers: Optional[tuple[float, int]] = None) -> torch.Tensor:
    """:func:`dequantize_int` with 0-d per-tensor qparams (``axis=None``), in one step;
    ``numbers``, the same qparams as Python numbers, lets 8-bit values take
    :func:`dequantize_8bit_eager` where the registry chooses the eager formula."""
    fn = kernels.get("dequantize", q, per_channel=False)
    if numbers is not None and fn is affine.dequantize_formula and q.element_size() == 1:
        return dequantize_8bit_eager(q, *numbers)
    return fn(q, scale, zero_point, False)


def quantize_8bit_fma_eager(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor,
                            zero_point: int, qmin: int, qmax: int,
                            storage_dtype: torch.dtype) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_formula` (FMA mode, 8-bit storage, float32 ``x``)
    in five kernels instead of seven, in place on its one temporary: the same fused
    multiply-add and rounding; NaN to ``qmax`` (torch's code for NaN in this mode,
    :func:`torchquant.affine.nan_code`) and infinities to the range ends (where the formula's
    clamp puts them) with ``nan_to_num_``; the same clamp and cast.  ``zero_point`` is unused
    (kept for callers)."""
    y = torch.addcmul(zp, x, inv).round_()
    y.nan_to_num_(nan=float(qmax), posinf=float(qmax), neginf=float(qmin))
    return y.clamp_(qmin, qmax).to(storage_dtype)


def quantize_per_tensor_eager(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor,
                              zero_point: int, qdtype: _dt.QDType, mode: str) -> torch.Tensor:
    """The integer codes of ``x`` quantized per tensor, from the operands
    :func:`torchquant.affine.quantize_operands` makes (kept by the caller per qparams): the
    registry's quantize kernel, or :func:`quantize_8bit_fma_eager` where that kernel is the
    reference formula in FMA mode on 8-bit storage.  Plain eager only (no tracing, no
    validation): the converted QuantStub's per-call path."""
    fn = kernels.get("quantize", x, mode=mode, per_channel=False)
    if fn is affine.quantize_formula and mode == affine.FMA and qdtype.bits == 8:
        return quantize_8bit_fma_eager(x, inv, zp, zero_point, qdtype.qmin, qdtype.qmax,
                                       qdtype.storage_dtype)
    return fn(x, inv, zp, qdtype.qmin, qdtype.qmax, qdtype.storage_dtype, mode)


def note_model_call() -> None:
    """A converted model's forward began (the amortised compiled kernels count model calls
    to tell a hot shape from a layer-repeated one; :mod:`torchquant.kernels.cpu_compiled`)."""
    kernels.cpu_compiled.note_model_call()


_DEQUANTIZE_OPERANDS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def dequantize_8bit_eager(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """:func:`torchquant.affine.dequantize_formula` for uint8 / int8 ``q`` per tensor in two
    kernels instead of five: ``float32(q) - zp`` (exact: small integers) through type
    promotion, then one float32 multiply -- the same operations on the same float32 values,
    with the float32 zero point and scale made once per qparams."""
    key = (scale, zero_point, q.device)
    operands = _DEQUANTIZE_OPERANDS.get(key)
    if operands is None:
        zp_t, scale_t = (torch.tensor(zero_point, dtype=torch.int64, device=q.device),
                         torch.tensor(scale, dtype=torch.float64, device=q.device))
        operands = (zp_t.to(torch.float32), scale_t.to(torch.float32))
        if len(_DEQUANTIZE_OPERANDS) >= 256:
            _DEQUANTIZE_OPERANDS.clear()
        _DEQUANTIZE_OPERANDS[key] = operands
    return torch.sub(q, operands[0]).mul_(operands[1])


# The rounding of torchao's PT2E quantize (``quantized_decomposed.quantize_per_tensor``):
# ``round(float32(x * inv)) + zero_point``, rounded before the zero point is added (torch's own
# ``quantize_per_tensor`` adds it first, in one fused multiply-add: the two differ where
# ``x * inv`` lies within float32 rounding of a .5 tie, which an average pool's exact means make
# common); NaN gives the code 0 (NaN cast to the integer type), infinities the range ends.
DECOMPOSED = "decomposed"


_QUANTIZE_OPERANDS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _per_tensor_operands(scale: float, zero_point: int, device: torch.device,
                         mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The float32 (1/scale, zero point) :func:`affine.quantize_operands` makes for these
    Python-number qparams, made once per qparams (eager calls of small tensors were mostly
    this arithmetic).  The quantize kernels only read them."""
    def build() -> tuple[torch.Tensor, torch.Tensor]:
        _, inv, zp, _ = affine.quantize_operands(
            torch.empty((), device=device), *affine.per_tensor_qparams(scale, zero_point, device),
            None, mode)
        return inv, zp
    return cached(_QUANTIZE_OPERANDS, 256, (float(scale), int(zero_point), device, mode), build)


def quantize_per_tensor_int(x: torch.Tensor, scale: float, zero_point: int,
                            qdtype: _dt.QDType, rounding: Optional[str] = None) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_per_tensor_int` on the fastest kernel that applies;
    ``rounding=DECOMPOSED`` rounds as torchao's PT2E quantize does (see :data:`DECOMPOSED`),
    ``None`` as torch's ``quantize_per_tensor``."""
    if rounding is not None and rounding != DECOMPOSED:
        raise ValueError(f"quantize_per_tensor: rounding must be None or {DECOMPOSED!r}, got "
                         f"{rounding!r}")
    mode = affine.ROUND_ADD if rounding == DECOMPOSED else affine.quantize_mode(
        qdtype, per_channel=False)
    if x.dtype == torch.float32 and plain_eager(x):
        inv, zp = _per_tensor_operands(scale, zero_point, x.device, mode)
        fn = kernels.get("quantize", x, mode=mode, per_channel=False)
        codes = fn(x, inv, zp, qdtype.qmin, qdtype.qmax, qdtype.storage_dtype, mode)
    else:
        codes = quantize_int(x, *affine.per_tensor_qparams(scale, zero_point, x.device),
                             qdtype.qmin, qdtype.qmax, qdtype.storage_dtype, None, mode)
    nan = affine.nan_code(qdtype.qmin, qdtype.qmax, qdtype.storage_dtype, mode)
    if rounding == DECOMPOSED and nan != 0 and x.is_floating_point():
        codes = codes.masked_fill(torch.isnan(x), 0)
    return codes


def dequantize_per_tensor_int(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """:func:`torchquant.affine.dequantize_per_tensor_int` on the fastest kernel that applies."""
    return dequantize_int(q, *affine.per_tensor_qparams(scale, zero_point, q.device))


def quantize_finite_per_tensor(x: torch.Tensor, scale: float, zero_point: int, qmin: int,
                               qmax: int, storage_dtype: torch.dtype) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_finite_per_tensor` on the fastest kernel that applies
    (one fused pass for large inputs, four eager ops for small ones)."""
    inv, zp = affine.finite_per_tensor_operands(x, scale, zero_point)
    return kernels.get("quantize_finite", x)(x, inv, zp, qmin, qmax, storage_dtype)


def quantize_with_multiplier(x: torch.Tensor, multiplier: Any, zero_point: Any, qmin: int,
                             qmax: int, storage_dtype: torch.dtype,
                             mode: str = affine.ROUND_ADD) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_with_multiplier` on the fastest kernel that applies."""
    fn = kernels.get("quantize", x, mode=mode, per_channel=False)
    return fn(*affine.quantize_with_multiplier_operands(x, multiplier, zero_point), qmin, qmax,
              storage_dtype, mode)


# --------------------------------------------------------------------------------------------
# Registered ops: per tensor, per channel
# --------------------------------------------------------------------------------------------


def _byte_qdtype(name: str) -> _dt.QDType:
    qdtype = _dt.qdtype_of(name)
    if qdtype.is_sub_byte:
        raise ValueError(f"torchquant ops quantize to 8- or 32-bit dtypes, got {qdtype!r}")
    return qdtype


@torch.library.custom_op("torchquant::quantize_per_tensor", mutates_args=())
def _quantize_per_tensor_op(x: torch.Tensor, scale: float, zero_point: int,
                            qdtype: str, rounding: Optional[str] = None) -> torch.Tensor:
    return quantize_per_tensor_int(x, scale, zero_point, _byte_qdtype(qdtype), rounding)


@_quantize_per_tensor_op.register_fake
def _(x, scale, zero_point, qdtype, rounding=None):
    return torch.empty_like(x, dtype=_byte_qdtype(qdtype).storage_dtype)


def quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int,
                        qdtype: _dt.QDType, rounding: Optional[str] = None) -> torch.Tensor:
    """The integers of ``x`` quantized with one (scale, zero_point) (validated by the caller);
    ``rounding``: see :func:`quantize_per_tensor_int`."""
    if traced(x):
        if rounding is None:
            return torch.ops.torchquant.quantize_per_tensor(x, scale, zero_point, qdtype.name)
        return torch.ops.torchquant.quantize_per_tensor(x, scale, zero_point, qdtype.name,
                                                        rounding)
    return quantize_per_tensor_int(x, scale, zero_point, qdtype, rounding)


@torch.library.custom_op("torchquant::dequantize_per_tensor", mutates_args=())
def _dequantize_per_tensor_op(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return dequantize_per_tensor_int(x, scale, zero_point)


@_dequantize_per_tensor_op.register_fake
def _(x, scale, zero_point):
    return torch.empty_like(x, dtype=torch.float32)


def dequantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``(x - zero_point) * scale`` in float32."""
    if traced(x):
        return torch.ops.torchquant.dequantize_per_tensor(x, scale, zero_point)
    return dequantize_per_tensor_int(x, scale, zero_point)


def _quantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                          axis: int, qdtype: _dt.QDType) -> torch.Tensor:
    return quantize_int(x, scales, zero_points, qdtype.qmin, qdtype.qmax, qdtype.storage_dtype,
                        axis, affine.quantize_mode(qdtype, per_channel=True))


@torch.library.custom_op("torchquant::quantize_per_channel", mutates_args=())
def _quantize_per_channel_op(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                             axis: int, qdtype: str) -> torch.Tensor:
    return _quantize_per_channel(x, scales, zero_points, axis, _byte_qdtype(qdtype))


@_quantize_per_channel_op.register_fake
def _(x, scales, zero_points, axis, qdtype):
    return torch.empty_like(x, dtype=_byte_qdtype(qdtype).storage_dtype)


def quantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                         axis: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``x`` quantized with one (scale, zero_point) per slice along ``axis``."""
    if traced(x, scales, zero_points):
        return torch.ops.torchquant.quantize_per_channel(x, scales, zero_points, axis,
                                                         qdtype.name)
    return _quantize_per_channel(x, scales, zero_points, axis, qdtype)


@torch.library.custom_op("torchquant::dequantize_per_channel", mutates_args=())
def _dequantize_per_channel_op(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                               axis: int) -> torch.Tensor:
    return dequantize_int(x, scales, zero_points, axis)


@_dequantize_per_channel_op.register_fake
def _(x, scales, zero_points, axis):
    return torch.empty_like(x, dtype=torch.float32)


def dequantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                           axis: int) -> torch.Tensor:
    """``(x - zero_points) * scales`` along ``axis``, float32."""
    if traced(x, scales, zero_points):
        return torch.ops.torchquant.dequantize_per_channel(x, scales, zero_points, axis)
    return dequantize_int(x, scales, zero_points, axis)
