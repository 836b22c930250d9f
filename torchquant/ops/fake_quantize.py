"""Fake-quantize (quantize, then dequantize, in float) as registered ops with autograd.

``torch.ops.torchquant.fake_quantize_per_tensor`` / ``fake_quantize_per_channel`` take the
qparams as tensors (a QAT model's scale and zero point are buffers its observers update), give
torch's ``fake_quantize_per_tensor_affine`` / ``fake_quantize_per_channel_affine`` results
bit for bit, and carry torch's straight-through gradient: ``grad`` where the value was not
clamped, 0 where it was; none for the qparams.  :func:`fake_quantize` is what the
``FakeQuantize`` modules call: the kernels directly in eager mode (an autograd function, no
dispatcher), the op when traced, so an exported QAT model holds these nodes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .. import affine, kernels
from ._library import traced

__all__ = ["fake_quantize", "fake_quantize_learnable"]


def _fake_quantize_forward(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                           quant_min: int, quant_max: int, axis: Optional[int]) -> torch.Tensor:
    scale, zero_point, axis = affine.fake_quantize_args(x, scale, zero_point, quant_min,
                                                        quant_max, axis)
    out, _ = affine.fake_quantize_with_mask(x, scale, zero_point, quant_min, quant_max, axis,
                                            kernels.get("fake_quantize", x))
    return out


def _unclamped_mask(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                    quant_min: int, quant_max: int, axis: Optional[int]) -> torch.Tensor:
    """Where the forward did not clamp: the forward's own formula, recomputed (plain torch, so
    it traces into a backward graph)."""
    scale, zero_point, axis = affine.fake_quantize_args(x, scale, zero_point, quant_min,
                                                        quant_max, axis)
    return affine.fake_quantize_with_mask(x, scale, zero_point, quant_min, quant_max, axis)[1]


@torch.library.custom_op("torchquant::fake_quantize_per_tensor", mutates_args=())
def _fake_quantize_per_tensor_op(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                                 quant_min: int, quant_max: int) -> torch.Tensor:
    return _fake_quantize_forward(x, scale.reshape(()), zero_point.reshape(()), quant_min,
                                  quant_max, None)


@_fake_quantize_per_tensor_op.register_fake
def _(x, scale, zero_point, quant_min, quant_max):
    return torch.empty_like(x)


def _per_tensor_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, scale, zero_point, quant_min, quant_max = inputs
    ctx.save_for_backward(x, scale, zero_point)
    ctx.qrange = (quant_min, quant_max)


def _per_tensor_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    x, scale, zero_point = ctx.saved_tensors
    mask = _unclamped_mask(x, scale.reshape(()), zero_point.reshape(()), *ctx.qrange, None)
    return grad * mask, None, None, None, None


_fake_quantize_per_tensor_op.register_autograd(_per_tensor_backward,
                                               setup_context=_per_tensor_setup)


@torch.library.custom_op("torchquant::fake_quantize_per_channel", mutates_args=())
def _fake_quantize_per_channel_op(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                                  axis: int, quant_min: int, quant_max: int) -> torch.Tensor:
    return _fake_quantize_forward(x, scale, zero_point, quant_min, quant_max, axis)


@_fake_quantize_per_channel_op.register_fake
def _(x, scale, zero_point, axis, quant_min, quant_max):
    return torch.empty_like(x)


def _per_channel_setup(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
    x, scale, zero_point, axis, quant_min, quant_max = inputs
    ctx.save_for_backward(x, scale, zero_point)
    ctx.axis, ctx.qrange = axis, (quant_min, quant_max)


def _per_channel_backward(ctx: Any, grad: torch.Tensor) -> tuple:
    x, scale, zero_point = ctx.saved_tensors
    mask = _unclamped_mask(x, scale, zero_point, *ctx.qrange, ctx.axis)
    return grad * mask, None, None, None, None, None


_fake_quantize_per_channel_op.register_autograd(_per_channel_backward,
                                                setup_context=_per_channel_setup)


def fake_quantize(x: torch.Tensor, scale: Any, zero_point: Any, quant_min: int, quant_max: int,
                  axis: Optional[int] = None) -> torch.Tensor:
    """:func:`torchquant.affine.fake_quantize` (per tensor with ``axis=None``, else per channel
    along ``axis``) on the fastest kernel in eager mode; the registered op when traced."""
    scale, zero_point, axis = affine.fake_quantize_args(x, scale, zero_point, quant_min,
                                                        quant_max, axis)
    if traced(x, scale, zero_point):
        if axis is None:
            return torch.ops.torchquant.fake_quantize_per_tensor(x, scale, zero_point, quant_min,
                                                                 quant_max)
        return torch.ops.torchquant.fake_quantize_per_channel(x, scale, zero_point, axis,
                                                              quant_min, quant_max)
    return affine.fake_quantize_ste(x, scale, zero_point, quant_min, quant_max, axis,
                                    kernels.get("fake_quantize", x))


def fake_quantize_learnable(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                            quant_min: int, quant_max: int, axis: Optional[int] = None,
                            grad_factor: float = 1.0) -> torch.Tensor:
    """:func:`torchquant.affine.fake_quantize_learnable` with its forward on the fastest kernel
    (eager only: not a registered op)."""
    return affine.fake_quantize_learnable(x, scale, zero_point, quant_min, quant_max, axis,
                                          grad_factor, kernels.get("fake_quantize", x))
