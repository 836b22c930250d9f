"""``FloatFunctional`` / ``FXFloatFunctional``: float tensor arithmetic as modules.

Eager-mode quantization can only observe and swap modules, so models written for it route
``add``, ``mul``, ``cat``... through a FloatFunctional instance; convert swaps it for
:class:`torchquant.nn.quantized.QFunctional`.  Defined here, below nn.quantized and
nn.quantizable (whose LSTM and MultiheadAttention are built from them); their public path is
``torchquant.nn.quantized`` (its ``functional_modules`` module), as in torch.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["FloatFunctional", "FXFloatFunctional"]


def _no_forward(self, x: Any):
    raise RuntimeError("FloatFunctional is not intended to use the 'forward'. Please use the "
                       "underlying operation")


class _FloatOps(torch.nn.Module):
    """The float ops themselves; calling the module is an error."""

    forward = _no_forward

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.add(x, y)

    def add_scalar(self, x: Tensor, y: float) -> Tensor:
        return torch.add(x, y)

    def mul(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.mul(x, y)

    def mul_scalar(self, x: Tensor, y: float) -> Tensor:
        return torch.mul(x, y)

    def cat(self, x: list[Tensor], dim: int = 0) -> Tensor:
        return torch.cat(x, dim=dim)

    def add_relu(self, x: Tensor, y: Tensor) -> Tensor:
        return F.relu(torch.add(x, y))

    def matmul(self, x: Tensor, y: Tensor) -> Tensor:
        return torch.matmul(x, y)


class FXFloatFunctional(_FloatOps):
    """The float ops, unobserved: FX graph mode inserts its observers in the graph."""


class FloatFunctional(_FloatOps):
    """The float ops with an output hook: results of the binary ops and ``cat`` pass through
    ``activation_post_process`` (Identity until prepare attaches an observer).  The scalar
    ops are not observed: their quantized forms derive the output qparams from the input."""

    def __init__(self) -> None:
        super().__init__()
        self.activation_post_process = torch.nn.Identity()

    def add(self, x: Tensor, y: Tensor) -> Tensor:
        return self.activation_post_process(super().add(x, y))

    def mul(self, x: Tensor, y: Tensor) -> Tensor:
        return self.activation_post_process(super().mul(x, y))

    def cat(self, x: list[Tensor], dim: int = 0) -> Tensor:
        return self.activation_post_process(super().cat(x, dim))

    def add_relu(self, x: Tensor, y: Tensor) -> Tensor:
        return self.activation_post_process(super().add_relu(x, y))

    def matmul(self, x: Tensor, y: Tensor) -> Tensor:
        return self.activation_post_process(super().matmul(x, y))
