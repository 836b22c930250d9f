"""Reference quantized convolutions: the float conv on the quantize-dequantized weight."""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .utils import ReferenceQuantizedModule

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]


class _ConvMixin(ReferenceQuantizedModule):
    _FLOAT: type = nn.Module

    def _get_name(self) -> str:
        return f"Quantized{self._FLOAT.__name__}(Reference)"

    @classmethod
    def from_float(cls, float_conv: nn.Module, weight_qparams: dict):
        kwargs = dict(stride=float_conv.stride, padding=float_conv.padding,
                      dilation=float_conv.dilation, groups=float_conv.groups,
                      bias=float_conv.bias is not None, padding_mode=float_conv.padding_mode,
                      device=float_conv.weight.device, dtype=float_conv.weight.dtype,
                      weight_qparams=weight_qparams)
        if float_conv.transposed:
            kwargs["output_padding"] = float_conv.output_padding
        ref = cls(float_conv.in_channels, float_conv.out_channels, float_conv.kernel_size,
                  **kwargs)
        ref.weight = nn.Parameter(float_conv.weight.detach())
        if float_conv.bias is not None:
            ref.bias = nn.Parameter(float_conv.bias.detach())
        return ref


def _conv(float_cls: type) -> type:
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, padding_mode="zeros", device=None, dtype=None,
                 weight_qparams: Optional[dict] = None):
        float_cls.__init__(self, in_channels, out_channels, kernel_size, stride, padding,
                           dilation, groups, bias, padding_mode, device, dtype)
        self._init_weight_qparams(weight_qparams, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # ``_conv_forward`` honours ``padding_mode`` like the float conv does; torch's
        # reference conv calls F.convNd directly and so treats every mode as 'zeros'.
        return self._conv_forward(x, self.get_weight(), self.bias)

    return type(float_cls.__name__, (float_cls, _ConvMixin),
                {"__init__": __init__, "forward": forward, "_FLOAT": float_cls,
                 "__module__": __name__,
                 "__doc__": f"Reference quantized {float_cls.__name__}."})


def _conv_transpose(float_cls: type) -> type:
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0,
                 output_padding=0, groups=1, bias=True, dilation=1, padding_mode="zeros",
                 device=None, dtype=None, weight_qparams: Optional[dict] = None):
        float_cls.__init__(self, in_channels, out_channels, kernel_size, stride, padding,
                           output_padding, groups, bias, dilation, padding_mode, device, dtype)
        self._init_weight_qparams(weight_qparams, device)

    def forward(self, x: torch.Tensor, output_size=None) -> torch.Tensor:
        n = len(self.kernel_size)
        output_padding = self._output_padding(x, output_size, self.stride, self.padding,
                                              self.kernel_size, n, self.dilation)
        fn = {1: nn.functional.conv_transpose1d, 2: nn.functional.conv_transpose2d,
              3: nn.functional.conv_transpose3d}[n]
        return fn(x, self.get_weight(), self.bias, self.stride, self.padding, output_padding,
                  self.groups, self.dilation)

    return type(float_cls.__name__, (float_cls, _ConvMixin),
                {"__init__": __init__, "forward": forward, "_FLOAT": float_cls,
                 "__module__": __name__,
                 "__doc__": f"Reference quantized {float_cls.__name__}."})


Conv1d = _conv(nn.Conv1d)
Conv2d = _conv(nn.Conv2d)
Conv3d = _conv(nn.Conv3d)
ConvTranspose1d = _conv_transpose(nn.ConvTranspose1d)
ConvTranspose2d = _conv_transpose(nn.ConvTranspose2d)
ConvTranspose3d = _conv_transpose(nn.ConvTranspose3d)
