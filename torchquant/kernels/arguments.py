"""Argument checks shared by the Linear and conv kernels (:mod:`.linear`, :mod:`.conv`).

Scales, zero points and quantized dtypes become checked Python values once per call
(:func:`validated_qparams`), weight qparams and biases are checked when a weight is packed, and
:func:`call_key` describes a call under which its checked, bound plan is kept (at most
:data:`PLAN_CACHE_SIZE` plans per packed weight).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Union

import torch

from . import cpu_isa
from .registry import mode
from .. import affine
from .. import dtypes as _dt

__all__ = ["Scalar", "as_float", "as_zero_point", "validated_qparams", "activation_qdtype",
           "output_qdtype", "per_channel_view", "check_weight_qparams", "check_bias",
           "call_key", "PLAN_CACHE_SIZE"]

Scalar = Union[float, int, torch.Tensor]


def as_float(value: Scalar, what: str) -> float:
    """A positive finite scale as a Python float (0-d / 1-element tensors accepted)."""
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{what} must be positive and finite, got {v}")
    return v


def as_zero_point(value: Scalar, qdtype: _dt.QDType, what: str) -> int:
    """An integer zero point inside ``qdtype``'s range as a Python int."""
    v = float(value)
    if v != int(v) or not qdtype.qmin <= v <= qdtype.qmax:
        raise ValueError(f"{what} must be an integer in [{qdtype.qmin}, {qdtype.qmax}] for "
                         f"{qdtype!r}, got {value}")
    return int(v)


def validated_qparams(x_scale: Scalar, x_zero_point: Scalar, x_qdtype: _dt.QDType,
                      out_scale: Scalar, out_zero_point: Scalar,
                      out_qdtype: _dt.QDType) -> tuple[Scalar, Scalar, Scalar, Scalar]:
    """The per-tensor input and output qparams as checked Python numbers (converted once per
    call).  Under tracing they pass through unchanged: the checks would be data-dependent."""
    if torch.compiler.is_compiling():
        return x_scale, x_zero_point, out_scale, out_zero_point
    return (as_float(x_scale, "x_scale"), as_zero_point(x_zero_point, x_qdtype, "x_zero_point"),
            as_float(out_scale, "out_scale"),
            as_zero_point(out_zero_point, out_qdtype, "out_zero_point"))


def activation_qdtype(x: torch.Tensor, op: str) -> _dt.QDType:
    """quint8 for uint8 storage, qint8 for int8; anything else is not a quantized activation."""
    if x.dtype == torch.uint8:
        return _dt.quint8
    if x.dtype == torch.int8:
        return _dt.qint8
    raise TypeError(f"{op}: expected the integer (uint8 / int8) values of a quantized input, "
                    f"got dtype {x.dtype}")


def output_qdtype(out_dtype: Any, op: str) -> _dt.QDType:
    qdtype = _dt.to_qdtype(out_dtype)
    if qdtype not in (_dt.quint8, _dt.qint8):
        raise ValueError(f"{op}: out_dtype must be quint8 or qint8, got {qdtype!r}")
    return qdtype


def per_channel_view(scale: torch.Tensor, zero_point: torch.Tensor, channels: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 scales, int64 zero points) with one entry per output channel."""
    scales = scale.to(device=device, dtype=torch.float32).reshape(-1)
    zero_points = zero_point.to(device=device, dtype=torch.int64).reshape(-1)
    return scales.expand(channels).contiguous(), zero_points.expand(channels).contiguous()


def check_weight_qparams(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                         axis: Optional[int], op: str) -> None:
    """Per-tensor (0-d / 1-element) or per-channel qparams, valid for qint8."""
    if weight.dtype != torch.int8:
        raise TypeError(f"{op}: weight must be an int8 tensor (qint8 values), got {weight.dtype}")
    expected = 1 if axis is None else weight.size(axis)
    if scale.numel() != expected or zero_point.numel() != expected:
        kind = "per-tensor" if axis is None else f"per-channel (axis {axis})"
        raise ValueError(f"{op}: {kind} weight needs {expected} scale(s) and zero point(s), got "
                         f"{scale.numel()} and {zero_point.numel()}")
    affine.check_scale(scale, "weight scale")
    affine.check_zero_point(zero_point, _dt.qint8, "weight zero_point")


def check_bias(bias: Optional[torch.Tensor], channels: int, op: str) -> Optional[torch.Tensor]:
    """None, or a float32 vector with one entry per output channel."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"{op}: bias must be a float tensor or None, got "
                        f"{getattr(bias, 'dtype', type(bias).__name__)}")
    if bias.shape != (channels,):
        raise ValueError(f"{op}: bias must have shape ({channels},), got {tuple(bias.shape)}")
    return bias.detach().to(torch.float32).contiguous()


def call_key(x: torch.Tensor, *call: Any) -> Optional[tuple]:
    """A hashable description of a kernel call on ``x`` (its shape, strides, dtype, device,
    the kernel mode and CPU cap, and the call's other arguments) under which a checked, bound
    plan may be kept; None where calls are not cached (tracing, tensor qparams, lists)."""
    if torch.compiler.is_compiling():
        return None
    key = (tuple(x.shape), x.stride(), x.dtype, x.device, mode(), cpu_isa.cpu_isa_cap(), *call)
    try:
        hash(key)
    except TypeError:
        return None
    if any(isinstance(v, torch.Tensor) for v in call):
        return None
    return key


# How many bound plans a packed weight keeps (its ``plans`` dict is cleared when full).
PLAN_CACHE_SIZE = 16
