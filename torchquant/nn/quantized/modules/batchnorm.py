"""Quantized BatchNorm2d / BatchNorm3d (eval-mode batch norm on QTensors).

State: the float module's ``weight``, ``bias``, ``running_mean``, ``running_var``,
``num_batches_tracked`` plus the output qparams ``scale`` (float32 0-d) and ``zero_point``
(int64 0-d).  As in torch those are buffers (reading them gives the tensors); unlike torch they
also take plain numbers on assignment (:class:`~.utils.OutputQParams`).
"""
from __future__ import annotations

import torch

from ....tensor.qtensor import QTensor
from .. import _normalization
from ....tensor.validation import require_quantized
from .utils import OutputQParams

__all__ = ["BatchNorm2d", "BatchNorm3d"]


class _BatchNorm(OutputQParams, torch.nn.modules.batchnorm._BatchNorm):
    _NDIM = 4
    _SHAPE_NAME = "(N, C, H, W)"
    _FUSED_RELU = False
    _QPARAM_STORAGE = "buffer"  # torch's BatchNorm keeps buffers: m.scale reads a 0-d tensor

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, True, True, device=device, dtype=dtype)
        self._init_output_qparams(1.0, 0, device=device, dtype=dtype)

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() != self._NDIM:
            raise ValueError(f"Input shape must be `{self._SHAPE_NAME}`!")

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "batch_norm")
        scale, zero_point = self._output_qparams()
        return _normalization.batch_norm(q, self.weight, self.bias, self.running_mean,
                                         self.running_var, self.eps, scale, zero_point,
                                         relu=self._FUSED_RELU)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    def _copy_from(self, bn: torch.nn.Module, scale, zero_point) -> None:
        self.weight = bn.weight
        self.bias = bn.bias
        self.running_mean = bn.running_mean
        self.running_var = bn.running_var
        self.scale, self.zero_point = scale, zero_point

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False):
        """From an observed float BatchNorm, or a fused (BatchNorm, ReLU) container whose
        observer sits on the container."""
        scale, zero_point = mod.activation_post_process.calculate_qparams()
        bn = mod[0] if isinstance(mod, torch.nn.Sequential) else mod
        new_mod = cls(bn.num_features, bn.eps)
        new_mod._copy_from(bn, scale, zero_point)
        return new_mod

    @classmethod
    def from_reference(cls, bn: torch.nn.Module, output_scale: float, output_zero_point: int):
        new_mod = cls(bn.num_features, bn.eps, bn.momentum, device=bn.weight.device,
                      dtype=bn.weight.dtype)
        new_mod._copy_from(bn, output_scale, output_zero_point)
        return new_mod


class BatchNorm2d(_BatchNorm):
    """Batch norm over the channels of a 4-D QTensor."""

    def _get_name(self) -> str:
        return "QuantizedBatchNorm2d"


class BatchNorm3d(_BatchNorm):
    """Batch norm over the channels of a 5-D QTensor."""

    _NDIM = 5
    _SHAPE_NAME = "(N, C, D, H, W)"

    def _get_name(self) -> str:
        return "QuantizedBatchNorm3d"
