"""Marks where a float model's tensors enter and leave the quantized region (eager mode).

Before ``convert`` they are identities (an observer gets attached to ``QuantStub``); ``convert``
swaps them for ``nnq.Quantize`` / ``nnq.DeQuantize``."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

__all__ = ["QuantStub", "DeQuantStub", "QuantWrapper"]


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


class QuantWrapper(nn.Module):
    """``dequant(module(quant(x)))``: the whole wrapped module runs quantized."""

    quant: QuantStub
    dequant: DeQuantStub
    module: nn.Module

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        qconfig = getattr(module, "qconfig", None)
        self.add_module("quant", QuantStub(qconfig))
        self.add_module("dequant", DeQuantStub(qconfig))
        self.add_module("module", module)
        self.train(module.training)

    def forward(self, X: torch.Tensor) -> Any:
        return self.dequant(self.module(self.quant(X)))
