"""Fused QAT convs: ConvBn{1,2,3}d, ConvBnReLU{1,2,3}d (BN folding simulated) and
ConvReLU{1,2,3}d (conv on the fake-quantized weight, then relu)."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn import init
from torch.nn.modules.utils import _pair, _single, _triple

from ....qat.modules import conv as nnqat_conv
from ....qat.modules._common import check_float_module
from ....utils.fusion import fuse_conv_bn_weights
from ...modules import fused as nni
from ._bn_folding import _BnFoldingMixin

__all__ = ["ConvBn1d", "ConvBnReLU1d", "ConvReLU1d", "ConvBn2d", "ConvBnReLU2d", "ConvReLU2d",
           "ConvBn3d", "ConvBnReLU3d", "ConvReLU3d", "update_bn_stats", "freeze_bn_stats"]

_BN_BY_DIM = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
# Pre-v2 checkpoints stored the BN state at the top level under these names.
_V1_BN_NAMES = {"bn.weight": "gamma", "bn.bias": "beta", "bn.running_mean": "running_mean",
                "bn.running_var": "running_var", "bn.num_batches_tracked": "num_batches_tracked"}


class _ConvBnNd(_BnFoldingMixin, nn.modules.conv._ConvNd, nni._FusedModule):
    """Conv parameters plus a child ``bn``.  Class attributes: ``_FLOAT_MODULE`` (the fused
    float container accepted by ``from_float``), ``_FLOAT_CONV_MODULE``, ``_FLOAT_BN_MODULE``,
    ``_FLOAT_RELU_MODULE`` (None without relu) and ``_FUSED_FLOAT_MODULE`` (conv+relu result
    of ``to_float``).

    ``_enable_slow_path_for_better_numerical_stability = True`` selects a two-pass forward
    that is exact for ``bn.weight == 0`` (the one-pass one divides by it).
    """

    _version = 2
    _FLOAT_MODULE: type
    _FLOAT_CONV_MODULE: type
    _FLOAT_BN_MODULE: Optional[type] = None
    _FLOAT_RELU_MODULE: Optional[type] = None
    _FUSED_FLOAT_MODULE: Optional[type] = None

    def __init__(self, in_channels: int, out_channels: int, kernel_size: tuple[int, ...],
                 stride: tuple[int, ...], padding: Any, dilation: tuple[int, ...],
                 transposed: bool, output_padding: tuple[int, ...], groups: int, bias: Any,
                 padding_mode: str, eps: float = 1e-05, momentum: float = 0.1,
                 freeze_bn: bool = False, qconfig: Any = None, dim: int = 2) -> None:
        # The conv is built without bias; a bias (if any) is created and initialised after
        # the BN parameters, in the same RNG order as torch's.
        nn.modules.conv._ConvNd.__init__(self, in_channels, out_channels, kernel_size, stride,
                                         padding, dilation, transposed, output_padding, groups,
                                         False, padding_mode)
        self._init_bn(_BN_BY_DIM[dim], out_channels, eps, momentum, freeze_bn, qconfig)
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self._finish_init(freeze_bn)
        self._enable_slow_path_for_better_numerical_stability = False

    def reset_bn_parameters(self) -> None:
        """BN as in the mixin; the conv bias ``~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))``."""
        super().reset_bn_parameters()
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            bound = 1 / math.sqrt(fan_in)
            init.uniform_(self.bias, -bound, bound)

    def _zero_bias(self, input: torch.Tensor) -> torch.Tensor:
        return torch.zeros(self.out_channels, device=self.weight.device, dtype=input.dtype)

    def _forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._enable_slow_path_for_better_numerical_stability:
            return self._forward_slow(input)
        return self._folded_forward(input, self._conv_forward, self._zero_bias(input))

    def _forward_slow(self, input: torch.Tensor) -> torch.Tensor:
        """Two passes: a float conv gives the batch statistics (and updates BN's running ones);
        the fake-quantized folded conv is then rescaled from running to batch std and given
        the folded bias ``beta - gamma * mean / std``."""
        bn = self.bn
        if bn.running_var is None or bn.running_mean is None:
            raise AssertionError("self.bn.running_var and self.bn.running_mean must not be None")
        zero_bias = self._zero_bias(input)
        weight_shape, out_shape = self._channel_shapes()
        if bn.training:
            plain = self._conv_forward(input, self.weight, zero_bias)
            with torch.no_grad():
                bn(plain if self.bias is None else plain + self.bias.reshape(out_shape))
        running_std = torch.sqrt(bn.running_var + bn.eps)
        scale = bn.weight / running_std
        w_q = self.weight_fake_quant(self.weight * scale.reshape(weight_shape))
        out = self._conv_forward(input, w_q, zero_bias)
        if bn.training:
            dims = [0] + list(range(2, self.weight.dim()))
            mean = plain.mean(dims)
            var = torch.square(plain - mean.reshape(out_shape)).mean(dims)
            std = torch.sqrt(var + bn.eps)
            out = out * (running_std / std).reshape(out_shape)
        else:
            mean = bn.running_mean - (self.bias if self.bias is not None else 0)
            std = running_std
        out = out + (bn.bias - bn.weight * mean / std).reshape(out_shape)
        if self.bias is not None:
            # Keep the conv bias in the autograd graph (DDP complains about unused params).
            out = out + (self.bias - self.bias).reshape(out_shape)
        return out

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return self._forward(input)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if local_metadata.get("version", None) in (None, 1):
            for new, old in _V1_BN_NAMES.items():
                if prefix + old in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
                elif prefix + new not in state_dict and strict:
                    missing_keys.append(prefix + new)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "_ConvBnNd":
        """From the fused float container (children ``0`` conv, ``1`` bn[, ``2`` relu]) with a
        ``qconfig``; parameters and BN buffers are shared, not copied."""
        check_float_module(cls, mod, cls._FLOAT_MODULE, type(mod))
        conv, bn = mod[0], mod[1]
        qat = cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                  conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                  conv.padding_mode, bn.eps, bn.momentum, False, mod.qconfig)
        qat.weight = conv.weight
        qat.bias = conv.bias
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(qat.bn, name, getattr(bn, name))
        return qat

    def to_float(self) -> nn.Module:
        """The float conv with BN (running statistics) folded in, wrapped with a ReLU in the
        ``_FUSED_FLOAT_MODULE`` container for the ConvBnReLU classes."""
        cls = type(self)
        conv = cls._FLOAT_CONV_MODULE(self.in_channels, self.out_channels, self.kernel_size,
                                      self.stride, self.padding, self.dilation, self.groups,
                                      self.bias is not None, self.padding_mode)
        conv.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            conv.bias = nn.Parameter(self.bias.detach())
        if cls._FLOAT_BN_MODULE is not None:
            if self.bn.running_var is None or self.bn.running_mean is None:
                raise AssertionError(
                    "self.bn.running_var and self.bn.running_mean must not be None")
            conv.weight, conv.bias = fuse_conv_bn_weights(
                conv.weight, conv.bias, self.bn.running_mean, self.bn.running_var, self.bn.eps,
                self.bn.weight, self.bn.bias)
        if cls._FLOAT_RELU_MODULE is not None:
            fused = cls._FUSED_FLOAT_MODULE(conv, cls._FLOAT_RELU_MODULE())
            fused.train(self.training)
            return fused
        conv.train(self.training)
        return conv


_CONV_BN_DOC = """Conv{n}d + BatchNorm{n}d{relu} for QAT: the conv weight is fake-quantized after
    scaling by ``bn.weight / sqrt(bn.running_var + bn.eps)``; the output is unscaled, given the
    conv bias and normalized by the real ``bn``{relu_tail}.  ⚠ ``bias=None`` by default."""


def _make_conv_bn(n: int, to_tuple: Any) -> type:
    conv_cls = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}[n]
    name = f"ConvBn{n}d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: Any = None,
                 padding_mode: str = "zeros", eps: float = 1e-05, momentum: float = 0.1,
                 freeze_bn: bool = False, qconfig: Any = None) -> None:
        # [TQ] string paddings ('same', 'valid') pass through; torch splits them into letters.
        _ConvBnNd.__init__(self, in_channels, out_channels, to_tuple(kernel_size),
                           to_tuple(stride),
                           padding if isinstance(padding, str) else to_tuple(padding),
                           to_tuple(dilation), False, to_tuple(0), groups, bias, padding_mode,
                           eps, momentum, freeze_bn, qconfig, dim=n)

    __init__.__qualname__ = f"{name}.__init__"
    return type(name, (_ConvBnNd, conv_cls), {
        "__init__": __init__, "__module__": __name__, "__qualname__": name,
        "__doc__": _CONV_BN_DOC.format(n=n, relu="", relu_tail=""),
        "_FLOAT_MODULE": getattr(nni, name), "_FLOAT_CONV_MODULE": conv_cls,
        "_FLOAT_BN_MODULE": _BN_BY_DIM[n]})


def _make_conv_bn_relu(conv_bn: type, n: int) -> type:
    """Subclass of ``ConvBn{n}d`` (as in torch) adding the relu."""
    name = f"ConvBnReLU{n}d"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(self._forward(input))

    forward.__qualname__ = f"{name}.forward"
    return type(name, (conv_bn,), {
        "forward": forward, "__module__": __name__, "__qualname__": name,
        "__doc__": _CONV_BN_DOC.format(n=n, relu=" + ReLU", relu_tail=", then relu"),
        "_FLOAT_MODULE": getattr(nni, name), "_FLOAT_RELU_MODULE": nn.ReLU,
        "_FUSED_FLOAT_MODULE": getattr(nni, f"ConvReLU{n}d")})


ConvBn1d = _make_conv_bn(1, _single)
ConvBn2d = _make_conv_bn(2, _pair)
ConvBn3d = _make_conv_bn(3, _triple)
ConvBnReLU1d = _make_conv_bn_relu(ConvBn1d, 1)
ConvBnReLU2d = _make_conv_bn_relu(ConvBn2d, 2)
ConvBnReLU3d = _make_conv_bn_relu(ConvBn3d, 3)


class _ConvReLUMixin:
    """``relu(conv(x, weight_fake_quant(weight), bias))``; ``from_float`` takes nni.ConvReLU."""

    _FLOAT_RELU_MODULE: type = nn.ReLU

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(self._conv_forward(input, self.weight_fake_quant(self.weight), self.bias))


class ConvReLU1d(_ConvReLUMixin, nnqat_conv.Conv1d, nni._FusedModule):
    """Fused Conv1d + ReLU for QAT."""

    _FLOAT_MODULE: type = nni.ConvReLU1d


class ConvReLU2d(_ConvReLUMixin, nnqat_conv.Conv2d, nni._FusedModule):
    """Fused Conv2d + ReLU for QAT."""

    _FLOAT_MODULE: type = nni.ConvReLU2d


class ConvReLU3d(_ConvReLUMixin, nnqat_conv.Conv3d, nni._FusedModule):
    """Fused Conv3d + ReLU for QAT."""

    _FLOAT_MODULE: type = nni.ConvReLU3d


_CONV_BN_TYPES = frozenset({ConvBn1d, ConvBn2d, ConvBn3d, ConvBnReLU1d, ConvBnReLU2d,
                            ConvBnReLU3d})


def update_bn_stats(mod: nn.Module) -> None:
    """For ``model.apply``: let the BN of every QAT ConvBn* module use batch statistics again."""
    if type(mod) in _CONV_BN_TYPES:
        mod.update_bn_stats()


def freeze_bn_stats(mod: nn.Module) -> None:
    """For ``model.apply``: make every QAT ConvBn* module's BN use its running statistics."""
    if type(mod) in _CONV_BN_TYPES:
        mod.freeze_bn_stats()
