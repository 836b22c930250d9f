"""Marks where a float model's tensors enter and leave the quantized region (eager mode).

``QuantStub`` / ``DeQuantStub`` are defined in :mod:`torchquant.nn.stubs` (nn's quantizable
modules use them) and re-exported here under their torch path; ``QuantWrapper`` brackets a
whole module with them."""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..nn.stubs import DeQuantStub, QuantStub

__all__ = ["QuantStub", "DeQuantStub", "QuantWrapper"]


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
