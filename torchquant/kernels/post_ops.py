"""The fused epilogues of the static Linear and conv kernels (:mod:`.linear`, :mod:`.conv`).

The post-op vocabulary (:data:`POST_OPS`, :class:`PostOp`, checked by :func:`post_op_of`: relu,
leaky_relu, tanh, add, add_relu), the epilogue on a float result (:func:`apply_post_op_`) and
its one requantization (:func:`quantize_post_op`, :func:`quantize_float_result`): what the
reference kernels do, and the fast ones where they cannot fuse the post-op.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from .arguments import Scalar, activation_qdtype, as_float, as_zero_point
from .registry import get
from .. import affine
from .. import dtypes as _dt

__all__ = ["POST_OPS", "DEFAULT_NEGATIVE_SLOPE", "PostOp", "post_op_of", "apply_post_op_",
           "quantize_post_op", "quantize_float_result"]

POST_OPS = ("none", "relu", "leaky_relu", "tanh", "add", "add_relu")
_ADDS = ("add", "add_relu")
DEFAULT_NEGATIVE_SLOPE = 0.01  # torch.nn.LeakyReLU's


class PostOp(NamedTuple):
    """What a static linear / conv does to its float result ``y = op(x_hat, w_hat, bias)``
    before its one requantization (torch's fused modules LinearReLU, LinearLeakyReLU,
    LinearTanh, ConvReLU1d-3d, ConvAdd2d, ConvAddReLU2d):

    ``none`` y, ``relu`` relu(y), ``leaky_relu`` leaky_relu(y, negative_slope), ``tanh``
    tanh(y), ``add`` y + other_hat, ``add_relu`` relu(y + other_hat), where other_hat is the
    dequantized second operand (``other_scale``, ``other_zero_point``), of the output's shape.

    A tuple of numbers, so plan and epilogue caches can key on it; the operand itself changes
    every call and travels beside it.
    """

    name: str = "none"
    negative_slope: float = DEFAULT_NEGATIVE_SLOPE
    other_scale: float = 1.0
    other_zero_point: int = 0

    @property
    def adds(self) -> bool:
        return self.name in _ADDS

    @property
    def relu(self) -> bool:
        """ReLU last (``relu``, ``add_relu``): a clamp at the output zero point."""
        return self.name == "relu" or self.name == "add_relu"


_PLAIN_POST_OPS = {name: PostOp(name) for name in ("none", "relu", "tanh")}


def post_op_of(name: str, negative_slope: float, other: Optional[torch.Tensor],
               other_scale: Scalar, other_zero_point: Scalar, out_shape: tuple,
               op: str) -> PostOp:
    """The checked :class:`PostOp` of a call whose result has shape ``out_shape``; ``other``
    (the integers of a per-tensor quantized tensor of that shape) only for the adds."""
    plain = _PLAIN_POST_OPS.get(name)
    if plain is not None and other is None:
        return plain
    if name not in POST_OPS:
        raise ValueError(f"{op}: post_op must be one of {POST_OPS}, got {name!r}")
    if name not in _ADDS:
        if other is not None:
            raise ValueError(f"{op}: post_op={name!r} takes no second operand (other is only "
                             "for 'add' / 'add_relu')")
        slope = float(negative_slope)
        if not math.isfinite(slope):
            raise ValueError(f"{op}: negative_slope must be finite, got {slope}")
        return PostOp(name, slope)
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"{op}: post_op={name!r} needs the integers of the added tensor as "
                        f"`other`, got {type(other).__name__}")
    other_qdtype = activation_qdtype(other, op)
    if tuple(other.shape) != tuple(out_shape):
        raise ValueError(f"{op}: the added tensor must have the output's shape "
                         f"{tuple(out_shape)}, got {tuple(other.shape)}")
    return PostOp(name, DEFAULT_NEGATIVE_SLOPE, as_float(other_scale, "other_scale"),
                  as_zero_point(other_zero_point, other_qdtype, "other_zero_point"))


def apply_post_op_(y: torch.Tensor, post_op: PostOp,
                   other: Optional[torch.Tensor]) -> torch.Tensor:
    """The epilogue on a float32 result, in place (``y`` is the kernel's own temporary)."""
    name = post_op.name
    if name == "none":
        return y
    if post_op.adds:
        y = y.add_(affine.dequantize_per_tensor_int(other, post_op.other_scale,
                                                    post_op.other_zero_point))
    if post_op.relu:
        return y.relu_()
    if name == "leaky_relu":
        return F.leaky_relu_(y, post_op.negative_slope)
    if name == "tanh":
        return y.tanh_()
    return y


def quantize_post_op(y: torch.Tensor, post_op: PostOp, other: Optional[torch.Tensor],
                     out_scale: Scalar, out_zero_point: Scalar,
                     out_qdtype: _dt.QDType) -> torch.Tensor:
    """``quantize(post_op(y))``: the epilogue and the requantization of a float result (the
    reference kernels, and the fast ones where they cannot fuse the post-op)."""
    y = apply_post_op_(y, post_op, other)
    scale, zero_point = affine.per_tensor_qparams(float(out_scale), int(out_zero_point), y.device)
    mode = affine.quantize_mode(out_qdtype, per_channel=False)
    if (mode == affine.FMA and out_qdtype.bits == 8 and y.dtype == torch.float32
            and 1.0 / float(out_scale) < _FINITE_INV_SCALE_LIMIT):
        # y is finite by construction (integer accumulators times finite scales, a finite
        # bias, post-ops of finite values) and so is 1 / out_scale: the general formula's NaN
        # mask is a no-op, and the finite form is the same integers in fewer passes.
        _, inv, zp, _ = affine.quantize_operands(y, scale, zero_point, None, mode)
        return get("quantize_finite", y)(y, inv, zp, out_qdtype.qmin, out_qdtype.qmax,
                                         out_qdtype.storage_dtype)
    return quantize_float_result(y, scale, zero_point, out_qdtype.qmin, out_qdtype.qmax,
                                 out_qdtype.storage_dtype, None, mode)


# 1 / out_scale below this (float32's largest finite value) keeps x * inv free of inf * 0.
_FINITE_INV_SCALE_LIMIT = 3.0e38


def quantize_float_result(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          qmin: int, qmax: int, storage_dtype: torch.dtype,
                          axis: Optional[int] = None, mode: str = affine.FMA) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_int` on the registered quantize kernel for this call
    (one fused pass where it applies): how the composite kernels of :mod:`.linear` and
    :mod:`.conv` quantize their float intermediates."""
    x32, inv, zp, mode = affine.quantize_operands(x, scale, zero_point, axis, mode)
    fn = get("quantize", x, mode=mode, per_channel=axis is not None)
    return fn(x32, inv, zp, qmin, qmax, storage_dtype, mode)
