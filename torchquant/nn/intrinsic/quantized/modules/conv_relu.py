"""Quantized conv fused with ReLU: the ReLU is the conv op's post-op (a clamp at the output
zero point), so there is one requantization, as in torch."""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from ...modules import fused as nni
from ....quantized.modules.conv import Conv1d, Conv2d, Conv3d

__all__ = ["ConvReLU1d", "ConvReLU2d", "ConvReLU3d"]

_CONV_BN_RELU = (nni.ConvBnReLU1d, nni.ConvBnReLU2d, nni.ConvBnReLU3d)


class _ConvReLUMixin:
    _POST_OP: ClassVar[str] = "relu"

    @classmethod
    def from_reference(cls, ref_qconv: torch.nn.Module, output_scale: float,
                       output_zero_point: int):
        if isinstance(ref_qconv, _CONV_BN_RELU):
            raise AssertionError("BatchNorm should be fused into the conv before converting to "
                                 "a reference module")
        return super().from_reference(ref_qconv, output_scale, output_zero_point)


class ConvReLU1d(_ConvReLUMixin, Conv1d):
    """``quantize(relu(conv1d(x)))``; from_float takes an ``nni.ConvReLU1d`` (or a QAT one)."""

    _NAME = "QuantizedConvReLU1d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvReLU1d


class ConvReLU2d(_ConvReLUMixin, Conv2d):
    """``quantize(relu(conv2d(x)))``."""

    _NAME = "QuantizedConvReLU2d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvReLU2d


class ConvReLU3d(_ConvReLUMixin, Conv3d):
    """``quantize(relu(conv3d(x)))``."""

    _NAME = "QuantizedConvReLU3d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvReLU3d
