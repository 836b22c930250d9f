"""Block-wise (group-wise) quantize / dequantize as registered ops.

One (scale, integer zero point) per block of the input: ``block_size`` has one entry per dim
(torchao's ``quantize_affine`` layout, :func:`torchquant.affine.block_layout`), and
``group_size`` is the common case of groups along the last dim.  The integers are torchao's
``clamp(round(x * (1 / scale)) + zero_point)`` (its INT zero-point domain), so int8 and int4
(stored in int8, range -8..7) codes match ``torchao.quantization.quant_primitives`` bit for
bit.  ``scale`` / ``zero_point`` may have any shape with one element per block.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .. import affine, kernels
from ._library import traced

__all__ = ["quantize_per_block", "dequantize_per_block", "block_size_of"]

_STORAGE_DTYPES = (torch.int8, torch.uint8, torch.int16, torch.int32)


def block_size_of(shape: Sequence[int], block_size: Optional[Sequence[int]] = None,
                  group_size: Optional[int] = None) -> list[int]:
    """The block size of a call: ``block_size`` as given, or groups of ``group_size`` along the
    last dim (exactly one of the two)."""
    if (block_size is None) == (group_size is None):
        raise ValueError("give exactly one of block_size and group_size")
    if group_size is not None:
        return list(affine.group_block_size(shape, group_size))
    return [int(b) for b in block_size]


def _check_range(dtype: torch.dtype, quant_min: int, quant_max: int) -> None:
    if dtype not in _STORAGE_DTYPES:
        raise ValueError(f"quantize_per_block stores codes as one of {_STORAGE_DTYPES}, "
                         f"got {dtype}")
    info = torch.iinfo(dtype)
    if not info.min <= quant_min <= quant_max <= info.max:
        raise ValueError(f"quant range [{quant_min}, {quant_max}] does not fit {dtype}")


def _quantize_per_block(x: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                        zero_point: torch.Tensor, quant_min: int, quant_max: int,
                        dtype: torch.dtype) -> torch.Tensor:
    x32, inv, zp, mode = affine.quantize_block_operands(x, block_size, scale, zero_point)
    fn = kernels.get("quantize", x32, mode=mode, per_channel=False)
    return fn(x32, inv, zp, quant_min, quant_max, dtype, mode).reshape(x.shape)


@torch.library.custom_op("torchquant::quantize_per_block", mutates_args=())
def _quantize_per_block_op(x: torch.Tensor, block_size: list[int], scale: torch.Tensor,
                           zero_point: torch.Tensor, quant_min: int, quant_max: int,
                           dtype: torch.dtype) -> torch.Tensor:
    return _quantize_per_block(x, block_size, scale, zero_point, quant_min, quant_max, dtype)


@_quantize_per_block_op.register_fake
def _(x, block_size, scale, zero_point, quant_min, quant_max, dtype):
    affine.block_layout(block_size, x.shape)
    return torch.empty_like(x, dtype=dtype)


def quantize_per_block(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                       quant_min: int, quant_max: int, dtype: torch.dtype = torch.int8,
                       block_size: Optional[Sequence[int]] = None,
                       group_size: Optional[int] = None) -> torch.Tensor:
    """Codes of float ``x`` (``dtype``, same shape) with one qparam pair per block."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"quantize_per_block expects a floating-point input, got {x.dtype}")
    _check_range(dtype, quant_min, quant_max)
    blocks = block_size_of(x.shape, block_size, group_size)
    if traced(x, scale, zero_point):
        return torch.ops.torchquant.quantize_per_block(x, blocks, scale, zero_point, quant_min,
                                                       quant_max, dtype)
    return _quantize_per_block(x, blocks, scale, zero_point, quant_min, quant_max, dtype)


def _dequantize_per_block(q: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                          zero_point: torch.Tensor) -> torch.Tensor:
    operands = affine.dequantize_block_operands(q, block_size, scale, zero_point)
    return kernels.get("dequantize", q, per_channel=False)(*operands).reshape(q.shape)


@torch.library.custom_op("torchquant::dequantize_per_block", mutates_args=())
def _dequantize_per_block_op(q: torch.Tensor, block_size: list[int], scale: torch.Tensor,
                             zero_point: torch.Tensor) -> torch.Tensor:
    return _dequantize_per_block(q, block_size, scale, zero_point)


@_dequantize_per_block_op.register_fake
def _(q, block_size, scale, zero_point):
    affine.block_layout(block_size, q.shape)
    return torch.empty_like(q, dtype=torch.float32)


def dequantize_per_block(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                         block_size: Optional[Sequence[int]] = None,
                         group_size: Optional[int] = None) -> torch.Tensor:
    """float32 ``(q - zero_point) * scale`` with one qparam pair per block."""
    if q.dtype.is_floating_point:
        raise TypeError(f"dequantize_per_block expects integer codes, got {q.dtype}")
    blocks = block_size_of(q.shape, block_size, group_size)
    if traced(q, scale, zero_point):
        return torch.ops.torchquant.dequantize_per_block(q, blocks, scale, zero_point)
    return _dequantize_per_block(q, blocks, scale, zero_point)
