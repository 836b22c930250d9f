"""Quantized normalization and softmax on QTensors: thin wrappers over
:mod:`torchquant.ops.normalization` (numerics described there), which take the integers and
qparams of a per-tensor quantized input; the output shares the input's quantized dtype."""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from ...ops import normalization as _ops_norm
from ...tensor.qtensor import QTensor
from ...tensor.validation import require_quantized

__all__ = ["batch_norm", "layer_norm", "group_norm", "instance_norm", "softmax"]


def _input(q: QTensor, op: str) -> tuple[torch.Tensor, float, int]:
    q = require_quantized(q, op)
    return (q._values(), *q._scale_zp())


def _wrap(q: QTensor, out: torch.Tensor, scale: float, zero_point: int) -> QTensor:
    return QTensor.from_int_per_tensor(out, float(scale), int(zero_point), q.qdtype)


def batch_norm(q: QTensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
               mean: torch.Tensor, var: torch.Tensor, eps: float, scale: float, zero_point: int,
               relu: bool = False) -> QTensor:
    """Eval-mode batch norm over dim 1 with output qparams (scale, zero_point)."""
    x, x_scale, x_zp = _input(q, "batch_norm")
    out = _ops_norm.batch_norm(x, x_scale, x_zp, weight, bias, mean, var, eps, float(scale),
                               int(zero_point), q.qdtype, relu)
    return _wrap(q, out, scale, zero_point)


def layer_norm(q: QTensor, normalized_shape: Sequence[int], weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float, scale: float, zero_point: int) -> QTensor:
    x, x_scale, x_zp = _input(q, "layer_norm")
    out = _ops_norm.layer_norm(x, x_scale, x_zp, normalized_shape, weight, bias, eps,
                               float(scale), int(zero_point), q.qdtype)
    return _wrap(q, out, scale, zero_point)


def group_norm(q: QTensor, num_groups: int, weight: Optional[torch.Tensor],
               bias: Optional[torch.Tensor], eps: float, scale: float, zero_point: int) -> QTensor:
    x, x_scale, x_zp = _input(q, "group_norm")
    out = _ops_norm.group_norm(x, x_scale, x_zp, num_groups, weight, bias, eps, float(scale),
                               int(zero_point), q.qdtype)
    return _wrap(q, out, scale, zero_point)


def instance_norm(q: QTensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                  eps: float, scale: float, zero_point: int) -> QTensor:
    x, x_scale, x_zp = _input(q, "instance_norm")
    out = _ops_norm.instance_norm(x, x_scale, x_zp, weight, bias, eps, float(scale),
                                  int(zero_point), q.qdtype)
    return _wrap(q, out, scale, zero_point)


def softmax(q: QTensor, dim: int, scale: float, zero_point: int) -> QTensor:
    x, x_scale, x_zp = _input(q, "softmax")
    out = _ops_norm.softmax(x, x_scale, x_zp, dim, float(scale), int(zero_point), q.qdtype)
    return _wrap(q, out, scale, zero_point)
