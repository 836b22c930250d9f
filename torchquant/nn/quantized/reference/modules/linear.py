"""Reference quantized Linear: ``F.linear`` on the quantize-dequantized weight."""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F

from .utils import ReferenceQuantizedModule

__all__ = ["Linear"]


class Linear(torch.nn.Linear, ReferenceQuantizedModule):
    """Reference quantized ``nn.Linear`` (note torch's ``bias_`` constructor argument)."""

    def __init__(self, in_features: int, out_features: int, bias_: bool = True, device=None,
                 dtype=None, weight_qparams: Optional[dict] = None) -> None:
        super().__init__(in_features, out_features, bias_, device, dtype)
        self._init_weight_qparams(weight_qparams, device)

    def _get_name(self) -> str:
        return "QuantizedLinear(Reference)"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.get_weight(), self.bias)

    @classmethod
    def from_float(cls, float_linear: torch.nn.Module, weight_qparams: dict) -> "Linear":
        ref = cls(float_linear.in_features, float_linear.out_features,
                  float_linear.bias is not None, device=float_linear.weight.device,
                  dtype=float_linear.weight.dtype, weight_qparams=weight_qparams)
        ref.weight = torch.nn.Parameter(float_linear.weight.detach())
        if float_linear.bias is not None:
            ref.bias = torch.nn.Parameter(float_linear.bias.detach())
        return ref
