"""Quantized LayerNorm, GroupNorm and InstanceNorm1d/2d/3d on QTensors.

Each keeps its float affine parameters (``weight``/``bias`` must be ``nn.Parameter`` s, as the
float module registers them) and the output qparams as buffers ``scale`` (float32 0-d) and
``zero_point`` (int64 0-d), as torch: reading them gives the tensors; unlike torch they also take
plain numbers on assignment (:class:`~.utils.OutputQParams`).
"""
from __future__ import annotations

from typing import Optional

import torch

from ....tensor.qtensor import QTensor
from .. import _normalization
from ....tensor.validation import require_quantized
from .utils import OutputQParams

__all__ = ["LayerNorm", "GroupNorm", "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d"]


def _observed_qparams(mod: torch.nn.Module) -> tuple[float, int]:
    scale, zero_point = mod.activation_post_process.calculate_qparams()
    return float(scale), int(zero_point)


class _OutputQParams(OutputQParams):
    """torch keeps the norms' qparams as buffers: ``m.scale`` reads a 0-d tensor."""

    _QPARAM_STORAGE = "buffer"

    scale: torch.Tensor
    zero_point: torch.Tensor


class LayerNorm(_OutputQParams, torch.nn.LayerNorm):
    """Layer norm of a QTensor, quantized to (scale, zero_point)."""

    def __init__(self, normalized_shape, weight: Optional[torch.nn.Parameter],
                 bias: Optional[torch.nn.Parameter], scale: float, zero_point: int,
                 eps: float = 1e-5, elementwise_affine: bool = True, device=None,
                 dtype=None) -> None:
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine,
                         device=device, dtype=dtype)
        self.weight = weight
        self.bias = bias
        self._init_output_qparams(scale, zero_point, device, dtype)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "layer_norm")
        return _normalization.layer_norm(q, self.normalized_shape, self.weight, self.bias,
                                         self.eps, *self._output_qparams())

    def _get_name(self) -> str:
        return "QuantizedLayerNorm"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "LayerNorm":
        return cls(mod.normalized_shape, mod.weight, mod.bias, *_observed_qparams(mod), mod.eps,
                   mod.elementwise_affine)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "LayerNorm":
        return cls(mod.normalized_shape, mod.weight, mod.bias, float(scale), int(zero_point),
                   mod.eps, mod.elementwise_affine)


class GroupNorm(_OutputQParams, torch.nn.GroupNorm):
    """Group norm of a QTensor, quantized to (scale, zero_point)."""

    def __init__(self, num_groups: int, num_channels: int, weight: Optional[torch.nn.Parameter],
                 bias: Optional[torch.nn.Parameter], scale: float, zero_point: int,
                 eps: float = 1e-5, affine: bool = True, device=None, dtype=None) -> None:
        super().__init__(num_groups, num_channels, eps, affine, device=device, dtype=dtype)
        self.weight = weight
        self.bias = bias
        self._init_output_qparams(scale, zero_point, device, dtype)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "group_norm")
        return _normalization.group_norm(q, self.num_groups, self.weight, self.bias, self.eps,
                                         *self._output_qparams())

    def _get_name(self) -> str:
        return "QuantizedGroupNorm"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "GroupNorm":
        return cls(mod.num_groups, mod.num_channels, mod.weight, mod.bias,
                   *_observed_qparams(mod), mod.eps, mod.affine)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "GroupNorm":
        return cls(mod.num_groups, mod.num_channels, mod.weight, mod.bias, float(scale),
                   int(zero_point), mod.eps, mod.affine)


class _InstanceNorm(_OutputQParams):
    """Instance norm with the per-sample statistics (running statistics are never used)."""

    def __init__(self, num_features: int, weight: Optional[torch.nn.Parameter],
                 bias: Optional[torch.nn.Parameter], scale: float, zero_point: int,
                 eps: float = 1e-5, momentum: float = 0.1, affine: bool = False,
                 track_running_stats: bool = False, device=None, dtype=None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats,
                         device=device, dtype=dtype)
        self.weight = weight
        self.bias = bias
        self._init_output_qparams(scale, zero_point, device, dtype)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "instance_norm")
        return _normalization.instance_norm(q, self.weight, self.bias, self.eps,
                                            *self._output_qparams())

    def _get_name(self) -> str:
        return f"Quantized{type(self).__name__}"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False):
        return cls(mod.num_features, mod.weight, mod.bias, *_observed_qparams(mod), mod.eps,
                   mod.affine)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int):
        return cls(mod.num_features, mod.weight, mod.bias, float(scale), int(zero_point),
                   mod.eps, mod.affine)


class InstanceNorm1d(_InstanceNorm, torch.nn.InstanceNorm1d):
    pass


class InstanceNorm2d(_InstanceNorm, torch.nn.InstanceNorm2d):
    pass


class InstanceNorm3d(_InstanceNorm, torch.nn.InstanceNorm3d):
    pass
