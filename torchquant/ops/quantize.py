"""Quantize / dequantize ops on plain tensors: per tensor (Python-number qparams, which a graph
holds as constants) and per channel (qparams as tensors).

8- and 32-bit dtypes only: sub-byte values are packed by the tensor layer, not here.  The
rounding formula of each dtype / granularity is :func:`torchquant.affine.quantize_mode`'s.
"""
from __future__ import annotations

import torch

from .. import affine
from .. import dtypes as _dt
from ._library import traced

__all__ = ["quantize_per_tensor", "dequantize_per_tensor", "quantize_per_channel",
           "dequantize_per_channel"]


def _byte_qdtype(name: str) -> _dt.QDType:
    qdtype = _dt.qdtype_of(name)
    if qdtype.is_sub_byte:
        raise ValueError(f"torchquant ops quantize to 8- or 32-bit dtypes, got {qdtype!r}")
    return qdtype


@torch.library.custom_op("torchquant::quantize_per_tensor", mutates_args=())
def _quantize_per_tensor_op(x: torch.Tensor, scale: float, zero_point: int,
                            qdtype: str) -> torch.Tensor:
    return affine.quantize_per_tensor_int(x, scale, zero_point, _byte_qdtype(qdtype))


@_quantize_per_tensor_op.register_fake
def _(x, scale, zero_point, qdtype):
    return torch.empty_like(x, dtype=_byte_qdtype(qdtype).storage_dtype)


def quantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int,
                        qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``x`` quantized with one (scale, zero_point) (validated by the caller)."""
    if traced(x):
        return torch.ops.torchquant.quantize_per_tensor(x, scale, zero_point, qdtype.name)
    return affine.quantize_per_tensor_int(x, scale, zero_point, qdtype)


@torch.library.custom_op("torchquant::dequantize_per_tensor", mutates_args=())
def _dequantize_per_tensor_op(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    return affine.dequantize_per_tensor_int(x, scale, zero_point)


@_dequantize_per_tensor_op.register_fake
def _(x, scale, zero_point):
    return torch.empty_like(x, dtype=torch.float32)


def dequantize_per_tensor(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``(x - zero_point) * scale`` in float32."""
    if traced(x):
        return torch.ops.torchquant.dequantize_per_tensor(x, scale, zero_point)
    return affine.dequantize_per_tensor_int(x, scale, zero_point)


def _quantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                          axis: int, qdtype: _dt.QDType) -> torch.Tensor:
    return affine.quantize_int(x, scales, zero_points, qdtype.qmin, qdtype.qmax,
                               qdtype.storage_dtype, axis,
                               affine.quantize_mode(qdtype, per_channel=True))


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
    return affine.dequantize_int(x, scales, zero_points, axis)


@_dequantize_per_channel_op.register_fake
def _(x, scales, zero_points, axis):
    return torch.empty_like(x, dtype=torch.float32)


def dequantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                           axis: int) -> torch.Tensor:
    """``(x - zero_points) * scales`` along ``axis``, float32."""
    if traced(x, scales, zero_points):
        return torch.ops.torchquant.dequantize_per_channel(x, scales, zero_points, axis)
    return affine.dequantize_int(x, scales, zero_points, axis)
