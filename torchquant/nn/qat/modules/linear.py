"""QAT ``Linear``: ``F.linear`` on the fake-quantized weight."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrize import (is_parametrized, transfer_parametrizations_and_params,
                                        type_before_parametrizations)

from ._common import check_float_module, require_qconfig

__all__ = ["Linear"]


class Linear(nn.Linear):
    """``nn.Linear`` whose forward uses ``weight_fake_quant(weight)``.

    ``from_float`` shares (does not copy) the float module's parameters, and carries weight /
    bias parametrizations over (e.g. pruning masks) instead of flattening them.
    """

    _FLOAT_MODULE: type = nn.Linear

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 qconfig: Any = None, device: Any = None, dtype: Any = None) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__(in_features, out_features, bias, **factory_kwargs)
        require_qconfig(qconfig)
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight(factory_kwargs=factory_kwargs)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.linear(input, self.weight_fake_quant(self.weight), self.bias)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "Linear":
        """QAT module from ``cls._FLOAT_MODULE`` (``nn.Linear``; fused subclasses: the fused
        container, whose first child is the linear)."""
        float_type = type_before_parametrizations(mod)
        check_float_module(cls, mod, cls._FLOAT_MODULE, float_type)
        qconfig = mod.qconfig
        # [TQ] the qconfig is read from the module given, not from its child (torch reads
        # the child's, which only exists after propagate_qconfig_).
        if isinstance(mod, nn.Sequential):
            mod = mod[0]
        qat = cls(mod.in_features, mod.out_features, bias=mod.bias is not None, qconfig=qconfig)
        for name in ("weight", "bias"):
            if is_parametrized(mod, name):
                transfer_parametrizations_and_params(mod, qat, name)
            else:
                setattr(qat, name, getattr(mod, name))
        return qat

    def to_float(self) -> nn.Module:
        linear = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        linear.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach())
        linear.train(self.training)
        return linear
