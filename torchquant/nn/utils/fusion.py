"""Fold an eval-mode BatchNorm into the preceding conv / linear layer.

BN computes ``gamma * (y - mean) / sqrt(var + eps) + beta`` per output channel, which is an
affine map of ``y``; folding multiplies each output channel's weights by
``gamma / sqrt(var + eps)`` and rewrites the bias.  The arithmetic order is the one
``torch.nn.utils.fusion`` uses, so folded weights are bit-identical to torch's.
"""
from __future__ import annotations

import copy
from typing import Optional, TypeVar

import torch
from torch import nn

__all__ = ["fuse_conv_bn_weights", "fuse_linear_bn_weights", "fuse_conv_bn_eval",
           "fuse_linear_bn_eval"]

_ConvT = TypeVar("_ConvT", bound=nn.modules.conv._ConvNd)
_LinearT = TypeVar("_LinearT", bound=nn.Linear)


def fuse_conv_bn_weights(conv_w: torch.Tensor, conv_b: Optional[torch.Tensor],
                         bn_rm: torch.Tensor, bn_rv: torch.Tensor, bn_eps: float,
                         bn_w: Optional[torch.Tensor], bn_b: Optional[torch.Tensor],
                         transpose: bool = False) -> tuple[nn.Parameter, nn.Parameter]:
    """Folded ``(weight, bias)`` Parameters; a missing conv bias / BN affine counts as 0 / 1.

    Output channels are dim 0 of a conv weight and dim 1 of a transposed conv weight.
    Results keep the dtypes of the conv weight / bias.
    """
    w_dtype = conv_w.dtype
    b_dtype = conv_b.dtype if conv_b is not None else w_dtype
    bias = conv_b if conv_b is not None else torch.zeros_like(bn_rm)
    gamma = bn_w if bn_w is not None else torch.ones_like(bn_rm)
    beta = bn_b if bn_b is not None else torch.zeros_like(bn_rm)
    inv_std = torch.rsqrt(bn_rv + bn_eps)
    channel_dim = 1 if transpose else 0
    shape = [1] * conv_w.dim()
    shape[channel_dim] = -1
    new_w = (conv_w * (gamma * inv_std).reshape(shape)).to(dtype=w_dtype)
    new_b = ((bias - bn_rm) * inv_std * gamma + beta).to(dtype=b_dtype)
    return nn.Parameter(new_w, conv_w.requires_grad), nn.Parameter(new_b, bias.requires_grad)


def fuse_linear_bn_weights(linear_w: torch.Tensor, linear_b: Optional[torch.Tensor],
                           bn_rm: torch.Tensor, bn_rv: torch.Tensor, bn_eps: float,
                           bn_w: torch.Tensor, bn_b: torch.Tensor
                           ) -> tuple[nn.Parameter, nn.Parameter]:
    """Folded linear ``(weight, bias)``; BN features may be ``out_features`` or 1 (broadcast)."""
    w_dtype = linear_w.dtype
    b_dtype = linear_b.dtype if linear_b is not None else w_dtype
    bias = linear_b if linear_b is not None else torch.zeros_like(bn_rm)
    channel_scale = bn_w * torch.rsqrt(bn_rv + bn_eps)
    new_w = linear_w * channel_scale.unsqueeze(-1).to(dtype=w_dtype)
    new_b = ((bias - bn_rm) * channel_scale + bn_b).to(dtype=b_dtype)
    return nn.Parameter(new_w, linear_w.requires_grad), nn.Parameter(new_b, bias.requires_grad)


def _check_foldable(layer: nn.Module, bn: nn.Module) -> None:
    if layer.training or bn.training:
        raise AssertionError("Fusion only for eval!")
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError("bn.running_mean and bn.running_var must not be None")


def fuse_conv_bn_eval(conv: _ConvT, bn: nn.modules.batchnorm._BatchNorm,
                      transpose: bool = False) -> _ConvT:
    """A new conv (deep copy of ``conv``) with ``bn`` folded in; both must be in eval mode."""
    _check_foldable(conv, bn)
    fused = copy.deepcopy(conv)
    fused.weight, fused.bias = fuse_conv_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias,
        transpose)
    return fused


def fuse_linear_bn_eval(linear: _LinearT, bn: nn.modules.batchnorm._BatchNorm) -> _LinearT:
    """A new linear (deep copy) with ``bn`` folded in; both must be in eval mode."""
    _check_foldable(linear, bn)
    if linear.out_features != bn.num_features and bn.num_features != 1:
        raise AssertionError("To fuse, linear.out_features == bn.num_features or "
                             f"bn.num_features == 1, got linear.out_features="
                             f"{linear.out_features} and bn.num_features={bn.num_features}")
    fused = copy.deepcopy(linear)
    fused.weight, fused.bias = fuse_linear_bn_weights(
        fused.weight, fused.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    return fused
