"""``QuantStub`` / ``DeQuantStub``: where a float model's tensors enter and leave the quantized
region (eager mode).

Before ``convert`` they are identities (an observer gets attached to ``QuantStub``); ``convert``
swaps them for ``nnq.Quantize`` / ``nnq.DeQuantize``.  They live in nn because nn's quantizable
modules are built from them; their public path is :mod:`torchquant.quantization` (and its
``stubs`` module), as in torch.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

__all__ = ["QuantStub", "DeQuantStub"]


class QuantStub(nn.Module):
    """Identity until converted; then quantizes with the qparams its observer calibrated."""

    def __init__(self, qconfig: Optional[Any] = None) -> None:
        super().__init__()
        if qconfig:
            self.qconfig = qconfig

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class DeQuantStub(nn.Module):
    """Identity until converted; then dequantizes back to float."""

    def __init__(self, qconfig: Optional[Any] = None) -> None:
        super().__init__()
        if qconfig:
            self.qconfig = qconfig

    def forward(self, x: Any) -> Any:
        return x
