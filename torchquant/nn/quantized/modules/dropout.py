"""Quantized Dropout: the identity on QTensors (a placeholder so float models convert)."""
from __future__ import annotations

import torch

__all__ = ["Dropout"]


class Dropout(torch.nn.Dropout):
    """Passes its input through unchanged, in training and in eval mode."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return input

    def _get_name(self) -> str:
        return "QuantizedDropout"

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "Dropout":
        return cls(mod.p, mod.inplace)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "Dropout":
        return cls(mod.p, mod.inplace)
