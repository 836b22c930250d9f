"""Dynamically quantized convolutions (as ``torch.ao.nn.quantized.dynamic.Conv*``): float in,
float out, the qint8 weight packed once, the input quantized per call.

Per call, as torch's ``conv*_dynamic`` ops: quint8 qparams are chosen from the input's min /
max (ATen's rule, ``reduce_range`` -- a ``forward`` argument, default True -- halving the
range), the quantized conv runs and is requantized *to the input's own qparams*, and that
result is dequantized.  That last requantization is what torch does (and why its docstrings
warn of poor accuracy): the output is clamped to the input's float range.  The modules are
the static quantized convs with a float forward, so ``from_float``, the state dict (``weight``,
``bias``, ``scale``, ``zero_point``, torch's keys) and ``set_weight_bias`` are shared with them.
"""
from __future__ import annotations

import warnings
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from ..... import affine
from .....ops import conv as ops_conv
from .....ops import quantize_dynamic as ops_quantize_dynamic
from ...modules import conv as _static
from ...modules.conv import IntOrTuple

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]

_INPUT_LAYOUT = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}
_TRANSPOSED_INPUT_LAYOUT = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, T, H, W)"}


def _warn_accuracy(name: str) -> None:
    warnings.warn(f"The current implementation of the {name} module has poor numerical "
                  f"accuracy and its use is not recommended", stacklevel=3)


class _DynamicConvMixin:
    """The float forward shared by the six modules (mixed in before the static class)."""

    _SPATIAL: ClassVar[int]
    _TRANSPOSED: ClassVar[bool]

    def forward(self, input: torch.Tensor, reduce_range: bool = True) -> torch.Tensor:
        n = self._SPATIAL
        if len(input.shape) != n + 2:
            layout = (_TRANSPOSED_INPUT_LAYOUT if self._TRANSPOSED else _INPUT_LAYOUT)[n]
            raise ValueError(f"Input shape must be `{layout}`!")
        if input.size(1) != self.in_channels:
            raise ValueError(f"{self._get_name()}: expected {self.in_channels} input channels, "
                             f"got input of shape {tuple(input.shape)}")
        codes, scale, zero_point = ops_quantize_dynamic.quantize_dynamic_per_tensor(
            input, "quint8", reduce_range)
        scale, zero_point = float(scale), int(zero_point)
        if self.padding_mode != "zeros":  # reflection moves values only: exact on the codes
            codes = F.pad(codes, _static._reflect_pad_amounts(self.padding),
                          mode=self.padding_mode)
        run = ops_conv.conv_transpose if self._TRANSPOSED else ops_conv.conv
        out = run(codes, scale, zero_point, self._packed_params, scale, zero_point, "none")
        return affine.dequantize_per_tensor_int(out, scale, zero_point)


class Conv1d(_DynamicConvMixin, _static.Conv1d):
    """Dynamically quantized 1-D convolution (float in / out)."""

    _NAME = "DynamicQuantizedConv1d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv1d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None, reduce_range: bool = True) -> None:
        _warn_accuracy(self._NAME)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


class Conv2d(_DynamicConvMixin, _static.Conv2d):
    """Dynamically quantized 2-D convolution (float in / out)."""

    _NAME = "DynamicQuantizedConv2d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        _warn_accuracy(self._NAME)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


class Conv3d(_DynamicConvMixin, _static.Conv3d):
    """Dynamically quantized 3-D convolution (float in / out); no reflect padding, as torch."""

    _NAME = "DynamicQuantizedConv3d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv3d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        _warn_accuracy(self._NAME)
        if padding_mode == "reflect":
            raise AssertionError("Conv3d does not support reflection padding")
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation,
                         groups, bias, padding_mode, device, dtype)


class _DynamicConvTransposeNd(_DynamicConvMixin):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0,
                 output_padding: IntOrTuple = 0, groups: int = 1, bias: bool = True,
                 dilation: IntOrTuple = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None) -> None:
        _warn_accuracy(self._NAME)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding,
                         output_padding, groups, bias, dilation, padding_mode, device, dtype)


class ConvTranspose1d(_DynamicConvTransposeNd, _static.ConvTranspose1d):
    """Dynamically quantized 1-D transposed convolution (float in / out)."""

    _NAME = "DynamicQuantizedConvTranspose1d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose1d


class ConvTranspose2d(_DynamicConvTransposeNd, _static.ConvTranspose2d):
    """Dynamically quantized 2-D transposed convolution (float in / out)."""

    _NAME = "DynamicQuantizedConvTranspose2d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose2d


class ConvTranspose3d(_DynamicConvTransposeNd, _static.ConvTranspose3d):
    """Dynamically quantized 3-D transposed convolution (float in / out)."""

    _NAME = "DynamicQuantizedConvTranspose3d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose3d
