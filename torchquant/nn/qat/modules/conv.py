"""QAT ``Conv1d`` / ``Conv2d`` / ``Conv3d``: the float conv on the fake-quantized weight."""
from __future__ import annotations

from typing import Any, Union

import torch
from torch import nn
from torch.nn.modules.utils import _pair, _single, _triple

from ...intrinsic.modules.fused import _FusedModule
from ._common import check_float_module, require_qconfig

__all__ = ["Conv1d", "Conv2d", "Conv3d"]


class _ConvNd(nn.modules.conv._ConvNd):
    """Shared body; subclasses set ``_FLOAT_MODULE`` (what from_float accepts) and
    ``_FLOAT_CONV_MODULE`` (the plain float conv class), and fused ones ``_FLOAT_RELU_MODULE``."""

    _FLOAT_MODULE: type
    _FLOAT_CONV_MODULE: type

    def __init__(self, in_channels: int, out_channels: int, kernel_size: tuple[int, ...],
                 stride: tuple[int, ...], padding: Union[str, tuple[int, ...]],
                 dilation: tuple[int, ...], transposed: bool, output_padding: tuple[int, ...],
                 groups: int, bias: bool, padding_mode: str, qconfig: Any = None,
                 device: Any = None, dtype: Any = None) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        nn.modules.conv._ConvNd.__init__(self, in_channels, out_channels, kernel_size, stride,
                                         padding, dilation, transposed, output_padding, groups,
                                         bias, padding_mode, **factory_kwargs)
        require_qconfig(qconfig)
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight(factory_kwargs=factory_kwargs)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(input, self.weight_fake_quant(self.weight), self.bias)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "_ConvNd":
        """QAT conv sharing ``mod``'s parameters; a fused container contributes its conv."""
        check_float_module(cls, mod, cls._FLOAT_MODULE, type(mod))
        qconfig = mod.qconfig
        if isinstance(mod, _FusedModule):
            mod = mod[0]
        qat = cls(mod.in_channels, mod.out_channels, mod.kernel_size, stride=mod.stride,
                  padding=mod.padding, dilation=mod.dilation, groups=mod.groups,
                  bias=mod.bias is not None, padding_mode=mod.padding_mode, qconfig=qconfig)
        qat.weight = mod.weight
        qat.bias = mod.bias
        return qat

    def to_float(self) -> nn.Module:
        """The float conv (a fused conv + relu container for the fused QAT classes)."""
        cls = type(self)
        conv = cls._FLOAT_CONV_MODULE(self.in_channels, self.out_channels, self.kernel_size,
                                      self.stride, self.padding, self.dilation, self.groups,
                                      self.bias is not None, self.padding_mode)
        conv.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            conv.bias = nn.Parameter(self.bias.detach())
        if not issubclass(cls, _FusedModule):
            return conv  # left in training mode, as torch does
        if not hasattr(cls, "_FLOAT_RELU_MODULE"):
            raise AssertionError(f"{cls.__name__} must have _FLOAT_RELU_MODULE attribute")
        fused = cls._FLOAT_MODULE(conv, cls._FLOAT_RELU_MODULE())
        fused.train(self.training)
        return fused


class Conv1d(_ConvNd, nn.Conv1d):
    """``nn.Conv1d`` whose forward uses ``weight_fake_quant(weight)``."""

    _FLOAT_MODULE: type = nn.Conv1d
    _FLOAT_CONV_MODULE: type = nn.Conv1d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", qconfig: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        _ConvNd.__init__(self, in_channels, out_channels, _single(kernel_size), _single(stride),
                         padding if isinstance(padding, str) else _single(padding),
                         _single(dilation), False, _single(0), groups, bias, padding_mode,
                         qconfig=qconfig, device=device, dtype=dtype)


class Conv2d(_ConvNd, nn.Conv2d):
    """``nn.Conv2d`` whose forward uses ``weight_fake_quant(weight)``."""

    _FLOAT_MODULE: type = nn.Conv2d
    _FLOAT_CONV_MODULE: type = nn.Conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", qconfig: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        _ConvNd.__init__(self, in_channels, out_channels, _pair(kernel_size), _pair(stride),
                         padding if isinstance(padding, str) else _pair(padding),
                         _pair(dilation), False, _pair(0), groups, bias, padding_mode,
                         qconfig=qconfig, device=device, dtype=dtype)


class Conv3d(_ConvNd, nn.Conv3d):
    """``nn.Conv3d`` whose forward uses ``weight_fake_quant(weight)``."""

    _FLOAT_MODULE: type = nn.Conv3d
    _FLOAT_CONV_MODULE: type = nn.Conv3d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", qconfig: Any = None, device: Any = None,
                 dtype: Any = None) -> None:
        _ConvNd.__init__(self, in_channels, out_channels, _triple(kernel_size), _triple(stride),
                         padding if isinstance(padding, str) else _triple(padding),
                         _triple(dilation), False, _triple(0), groups, bias, padding_mode,
                         qconfig=qconfig, device=device, dtype=dtype)
