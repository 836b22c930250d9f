"""Quantized normalization and softmax ops on plain per-tensor quantized integers, with
torch's numerics.

* Batch norm (eval) folds the statistics into a per-channel float32 multiplier and offset in
  the output's units, ``alpha = w / sqrt(var + eps) * in_scale / out_scale`` and
  ``beta = (b - mean * w / sqrt(var + eps)) / out_scale``, and rounds
  ``fma(alpha, q - in_zp, beta)`` (torch's fused kernel; this reproduces it exactly).
* Layer, group and instance norm follow the reference definition: dequantize, normalize in
  float, quantize.  torch's kernels compute the statistics on the integers, so the two can
  differ by one step where a value sits within float rounding of a tie.
* Softmax is dequantize, softmax, quantize, exactly as torch does it.

The float parameters (weight, bias, running statistics) enter as tensors; the input's and the
output's qparams as Python numbers, the qdtype by name (input and output share it).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from .. import affine
from . import quantize as ops_quantize
from .. import dtypes as _dt
from ._library import traced

__all__ = ["batch_norm", "layer_norm", "group_norm", "instance_norm", "softmax"]


def _detached(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    # the ops have no autograd formula: float parameters enter the graph as plain values
    return None if t is None else t.detach()


def _fake_like(y: torch.Tensor, qdtype: str) -> torch.Tensor:
    return torch.empty_like(y, dtype=_dt.qdtype_of(qdtype).storage_dtype)


def _float_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, dtype=torch.float32)


# ---- batch norm ------------------------------------------------------------------------------

def _channel_params(weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                    mean: torch.Tensor, var: torch.Tensor, eps: float, in_scale: float,
                    out_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(alpha, beta) per channel, with torch's float32 / float64 steps."""
    f32 = torch.float32
    mean, var = mean.detach().to(f32), var.detach().to(f32)
    weight = torch.ones_like(mean) if weight is None else weight.detach().to(f32)
    bias = torch.zeros_like(mean) if bias is None else bias.detach().to(f32)
    inv_sigma = (1.0 / torch.sqrt(var + torch.tensor(eps, dtype=f32)).double()).to(f32)
    scaled_weight = inv_sigma * weight
    alpha = (scaled_weight.double() * (in_scale / out_scale)).to(f32)
    beta = ((bias - mean * inv_sigma * weight).double() / out_scale).to(f32)
    return alpha, beta


def _batch_norm(x: torch.Tensor, x_scale: float, x_zp: int, weight: Optional[torch.Tensor],
                bias: Optional[torch.Tensor], mean: torch.Tensor, var: torch.Tensor, eps: float,
                out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> torch.Tensor:
    alpha, beta = _channel_params(weight, bias, mean, var, eps, x_scale, out_scale)
    shape = [1, -1] + [1] * (x.dim() - 2)
    alpha = alpha.to(x.device).reshape(shape).double()
    beta = beta.to(x.device).reshape(shape).double()
    shifted = (x.to(torch.int64) - x_zp).double()
    y = (alpha * shifted + beta).to(torch.float32)  # float64 holds the fma exactly here
    return ops_quantize.quantize_with_multiplier(y, 1.0, out_zp, out_zp if relu else qd.qmin,
                                                 qd.qmax, qd.storage_dtype, affine.ROUND_ADD)


@torch.library.custom_op("torchquant::batch_norm", mutates_args=())
def _batch_norm_op(x: torch.Tensor, x_scale: float, x_zero_point: int,
                   weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                   mean: torch.Tensor, var: torch.Tensor, eps: float, out_scale: float,
                   out_zero_point: int, qdtype: str, post_op: str) -> torch.Tensor:
    return _batch_norm(x, x_scale, x_zero_point, weight, bias, mean, var, eps, out_scale,
                       out_zero_point, _dt.qdtype_of(qdtype), post_op == "relu")


@_batch_norm_op.register_fake
def _(x, x_scale, x_zero_point, weight, bias, mean, var, eps, out_scale, out_zero_point, qdtype,
      post_op):
    shape = [1, -1] + [1] * (x.dim() - 2)
    return _fake_like(_float_like(x) * mean.reshape(shape), qdtype)


def batch_norm(x: torch.Tensor, x_scale: float, x_zp: int, weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], mean: torch.Tensor, var: torch.Tensor, eps: float,
               out_scale: float, out_zp: int, qdtype: _dt.QDType,
               relu: bool = False) -> torch.Tensor:
    """The integers of eval-mode ``relu?(batch_norm(x_hat))`` over dim 1 on the output grid."""
    if traced(x, weight, bias, mean, var):
        return torch.ops.torchquant.batch_norm(
            x, x_scale, x_zp, _detached(weight), _detached(bias), mean.detach(), var.detach(),
            float(eps), out_scale, out_zp, qdtype.name, "relu" if relu else "none")
    return _batch_norm(x, x_scale, x_zp, weight, bias, mean, var, eps, out_scale, out_zp, qdtype,
                       relu)


# ---- layer / group / instance norm -----------------------------------------------------------

def _layer_norm(x, x_scale, x_zp, normalized_shape, weight, bias, eps, out_scale, out_zp, qd):
    y = F.layer_norm(ops_quantize.dequantize_per_tensor_int(x, x_scale, x_zp), list(normalized_shape), weight, bias, eps)
    return ops_quantize.quantize_per_tensor_int(y, out_scale, out_zp, qd)


@torch.library.custom_op("torchquant::layer_norm", mutates_args=())
def _layer_norm_op(x: torch.Tensor, x_scale: float, x_zero_point: int,
                   normalized_shape: list[int], weight: Optional[torch.Tensor],
                   bias: Optional[torch.Tensor], eps: float, out_scale: float,
                   out_zero_point: int, qdtype: str) -> torch.Tensor:
    return _layer_norm(x, x_scale, x_zero_point, normalized_shape, weight, bias, eps, out_scale,
                       out_zero_point, _dt.qdtype_of(qdtype))


@_layer_norm_op.register_fake
def _(x, x_scale, x_zero_point, normalized_shape, weight, bias, eps, out_scale, out_zero_point,
      qdtype):
    return _fake_like(F.layer_norm(_float_like(x), list(normalized_shape), weight, bias, eps),
                      qdtype)


def layer_norm(x: torch.Tensor, x_scale: float, x_zp: int, normalized_shape: Sequence[int],
               weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
               out_scale: float, out_zp: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(layer_norm(x_hat))``."""
    if traced(x, weight, bias):
        return torch.ops.torchquant.layer_norm(x, x_scale, x_zp, [int(n) for n in normalized_shape],
                                               _detached(weight), _detached(bias), float(eps),
                                               out_scale, out_zp, qdtype.name)
    return _layer_norm(x, x_scale, x_zp, normalized_shape, weight, bias, eps, out_scale, out_zp,
                       qdtype)


def _group_norm(x, x_scale, x_zp, num_groups, weight, bias, eps, out_scale, out_zp, qd):
    y = F.group_norm(ops_quantize.dequantize_per_tensor_int(x, x_scale, x_zp), num_groups, weight, bias, eps)
    return ops_quantize.quantize_per_tensor_int(y, out_scale, out_zp, qd)


@torch.library.custom_op("torchquant::group_norm", mutates_args=())
def _group_norm_op(x: torch.Tensor, x_scale: float, x_zero_point: int, num_groups: int,
                   weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                   out_scale: float, out_zero_point: int, qdtype: str) -> torch.Tensor:
    return _group_norm(x, x_scale, x_zero_point, num_groups, weight, bias, eps, out_scale,
                       out_zero_point, _dt.qdtype_of(qdtype))


@_group_norm_op.register_fake
def _(x, x_scale, x_zero_point, num_groups, weight, bias, eps, out_scale, out_zero_point,
      qdtype):
    return _fake_like(F.group_norm(_float_like(x), num_groups, weight, bias, eps), qdtype)


def group_norm(x: torch.Tensor, x_scale: float, x_zp: int, num_groups: int,
               weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
               out_scale: float, out_zp: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(group_norm(x_hat))``."""
    if traced(x, weight, bias):
        return torch.ops.torchquant.group_norm(x, x_scale, x_zp, int(num_groups),
                                               _detached(weight), _detached(bias), float(eps),
                                               out_scale, out_zp, qdtype.name)
    return _group_norm(x, x_scale, x_zp, num_groups, weight, bias, eps, out_scale, out_zp,
                       qdtype)


def _instance_norm(x, x_scale, x_zp, weight, bias, eps, out_scale, out_zp, qd):
    y = F.instance_norm(ops_quantize.dequantize_per_tensor_int(x, x_scale, x_zp), weight=weight, bias=bias, eps=eps)
    return ops_quantize.quantize_per_tensor_int(y, out_scale, out_zp, qd)


@torch.library.custom_op("torchquant::instance_norm", mutates_args=())
def _instance_norm_op(x: torch.Tensor, x_scale: float, x_zero_point: int,
                      weight: Optional[torch.Tensor], bias: Optional[torch.Tensor], eps: float,
                      out_scale: float, out_zero_point: int, qdtype: str) -> torch.Tensor:
    return _instance_norm(x, x_scale, x_zero_point, weight, bias, eps, out_scale,
                          out_zero_point, _dt.qdtype_of(qdtype))


@_instance_norm_op.register_fake
def _(x, x_scale, x_zero_point, weight, bias, eps, out_scale, out_zero_point, qdtype):
    return _fake_like(F.instance_norm(_float_like(x), weight=weight, bias=bias, eps=eps), qdtype)


def instance_norm(x: torch.Tensor, x_scale: float, x_zp: int, weight: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], eps: float, out_scale: float, out_zp: int,
                  qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(instance_norm(x_hat))`` (per-sample statistics)."""
    if traced(x, weight, bias):
        return torch.ops.torchquant.instance_norm(x, x_scale, x_zp, _detached(weight),
                                                  _detached(bias), float(eps), out_scale, out_zp,
                                                  qdtype.name)
    return _instance_norm(x, x_scale, x_zp, weight, bias, eps, out_scale, out_zp, qdtype)


# ---- softmax ---------------------------------------------------------------------------------

def _softmax(x, x_scale, x_zp, dim, out_scale, out_zp, qd):
    return ops_quantize.quantize_per_tensor_int(torch.softmax(ops_quantize.dequantize_per_tensor_int(x, x_scale, x_zp), dim), out_scale, out_zp, qd)


@torch.library.custom_op("torchquant::softmax", mutates_args=())
def _softmax_op(x: torch.Tensor, x_scale: float, x_zero_point: int, dim: int, out_scale: float,
                out_zero_point: int, qdtype: str) -> torch.Tensor:
    return _softmax(x, x_scale, x_zero_point, dim, out_scale, out_zero_point,
                    _dt.qdtype_of(qdtype))


@_softmax_op.register_fake
def _(x, x_scale, x_zero_point, dim, out_scale, out_zero_point, qdtype):
    return _fake_like(torch.softmax(_float_like(x), dim), qdtype)


def softmax(x: torch.Tensor, x_scale: float, x_zp: int, dim: int, out_scale: float, out_zp: int,
            qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(softmax(x_hat, dim))``."""
    if traced(x):
        return torch.ops.torchquant.softmax(x, x_scale, x_zp, int(dim), out_scale, out_zp,
                                            qdtype.name)
    return _softmax(x, x_scale, x_zp, dim, out_scale, out_zp, qdtype)
