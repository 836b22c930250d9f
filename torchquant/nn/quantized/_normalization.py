"""Quantized normalization with torch's numerics.

* Batch norm (eval) folds the statistics into a per-channel float32 multiplier and offset in
  the output's units, ``alpha = w / sqrt(var + eps) * in_scale / out_scale`` and
  ``beta = (b - mean * w / sqrt(var + eps)) / out_scale``, and rounds
  ``fma(alpha, q - in_zp, beta)`` (torch's fused kernel; this reproduces it exactly).
* Layer, group and instance norm follow the reference definition: dequantize, normalize in
  float, quantize.  torch's kernels compute the statistics on the integers, so the two can
  differ by one step where a value sits within float rounding of a tie.
* Softmax is dequantize, softmax, quantize, exactly as torch does it.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from ... import affine
from ...qtensor import QTensor

__all__ = ["batch_norm", "layer_norm", "group_norm", "instance_norm", "softmax"]


def _quantize(q: QTensor, y: torch.Tensor, scale: float, zero_point: int) -> QTensor:
    qd = q.qdtype
    out = affine.quantize_int(y, torch.tensor(float(scale), dtype=torch.float64, device=y.device),
                              torch.tensor(int(zero_point), device=y.device), qd.qmin, qd.qmax,
                              qd.storage_dtype, mode=affine.quantize_mode(qd, False))
    return QTensor.from_int(out, float(scale), int(zero_point), qd)


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


def batch_norm(q: QTensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               mean: torch.Tensor, var: torch.Tensor, eps: float, scale: float, zero_point: int,
               relu: bool = False) -> QTensor:
    """Eval-mode batch norm over dim 1 with output qparams (scale, zero_point)."""
    alpha, beta = _channel_params(weight, bias, mean, var, eps, float(q.scale), float(scale))
    shape = [1, -1] + [1] * (q.dim() - 2)
    alpha = alpha.to(q.device).reshape(shape).double()
    beta = beta.to(q.device).reshape(shape).double()
    shifted = (q._values().to(torch.int64) - int(q.zero_point)).double()
    y = (alpha * shifted + beta).to(torch.float32)  # float64 holds the fma exactly here
    qd = q.qdtype
    out = affine.quantize_with_multiplier(y, 1.0, int(zero_point),
                                          int(zero_point) if relu else qd.qmin, qd.qmax,
                                          qd.storage_dtype, affine.ROUND_ADD)
    return QTensor.from_int(out, float(scale), int(zero_point), qd)


def layer_norm(q: QTensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float, scale: float, zero_point: int) -> QTensor:
    y = F.layer_norm(q.dequantize(), list(normalized_shape), weight, bias, eps)
    return _quantize(q, y, scale, zero_point)


def group_norm(q: QTensor, num_groups: int, weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float, scale: float, zero_point: int) -> QTensor:
    y = F.group_norm(q.dequantize(), num_groups, weight, bias, eps)
    return _quantize(q, y, scale, zero_point)


def instance_norm(q: QTensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  eps: float, scale: float, zero_point: int) -> QTensor:
    y = F.instance_norm(q.dequantize(), weight=weight, bias=bias, eps=eps)
    return _quantize(q, y, scale, zero_point)


def softmax(q: QTensor, dim: int, scale: float, zero_point: int) -> QTensor:
    return _quantize(q, torch.softmax(q.dequantize(), dim), scale, zero_point)
