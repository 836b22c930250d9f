"""Quantized BNReLU2d / BNReLU3d: batch norm and ReLU fused into one requantization."""
from __future__ import annotations

import torch

from .....tensor.qtensor import QTensor
from ....quantized.modules.batchnorm import BatchNorm2d, BatchNorm3d

__all__ = ["BNReLU2d", "BNReLU3d"]


class _BNReLU:
    """``relu(batch_norm(x))``: the output is clamped at its zero point by the same rounding.

    ``from_float`` takes the fused float (BatchNorm, ReLU) container with its output observer
    (inherited from the quantized batch norm); ``from_reference`` the reference container."""

    _FUSED_RELU = True

    def forward(self, input: QTensor) -> QTensor:
        self._check_input_dim(input)
        return super().forward(input)

    @classmethod
    def from_reference(cls, bn_relu: torch.nn.Module, output_scale: float,
                       output_zero_point: int):
        return super().from_reference(bn_relu[0], output_scale, output_zero_point)


class BNReLU2d(_BNReLU, BatchNorm2d):
    """Fused batch norm + ReLU over the channels of a 4-D QTensor."""

    def _get_name(self) -> str:
        return "QuantizedBNReLU2d"


class BNReLU3d(_BNReLU, BatchNorm3d):
    """Fused batch norm + ReLU over the channels of a 5-D QTensor."""

    def _get_name(self) -> str:
        return "QuantizedBNReLU3d"
