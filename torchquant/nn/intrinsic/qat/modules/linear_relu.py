"""QAT ``LinearReLU``: ``relu(linear(x, fake_quant(w), b))``."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ....qat.modules.linear import Linear as _QATLinear
from ...modules import fused as nni

__all__ = ["LinearReLU"]


class LinearReLU(_QATLinear, nni._FusedModule):
    """Fused Linear + ReLU for QAT; built from ``nni.LinearReLU`` (its child ``0``)."""

    _FLOAT_MODULE: type = nni.LinearReLU

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 qconfig: Any = None) -> None:
        super().__init__(in_features, out_features, bias, qconfig)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.relu(F.linear(input, self.weight_fake_quant(self.weight), self.bias))

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "LinearReLU":
        return super().from_float(mod, use_precomputed_fake_quant)  # type: ignore[return-value]

    def to_float(self) -> nni.LinearReLU:
        linear = nn.Linear(self.in_features, self.out_features, self.bias is not None)
        linear.weight = nn.Parameter(self.weight.detach())
        if self.bias is not None:
            linear.bias = nn.Parameter(self.bias.detach())
        return nni.LinearReLU(linear, nn.ReLU())
