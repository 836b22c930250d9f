"""Fused float containers: ``nn.Sequential`` subclasses marking modules to quantize as one.

Children keep the names ``0``, ``1`` (``2``) so state_dict keys equal the unfused modules'.
Constructors take torch's named arguments and check the children's exact types (before
parametrizations) as torch 2.13 does, raising its ``AssertionError``; ConvAdd2d / ConvAddReLU2d
are unchecked, as torch's.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn
from torch.nn.utils.parametrize import type_before_parametrizations

__all__ = ["_FusedModule", "ConvReLU1d", "ConvReLU2d", "ConvReLU3d", "LinearReLU",
           "ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d",
           "BNReLU2d", "BNReLU3d", "LinearBn1d", "LinearLeakyReLU", "LinearTanh",
           "ConvAdd2d", "ConvAddReLU2d"]


class _FusedModule(nn.Sequential):
    """Base of every fused container: an ``nn.Sequential`` (built from modules or an
    OrderedDict, as torch's base).  The typed subclasses take torch's named arguments."""


def _check_types(modules: tuple[nn.Module, ...], expected: tuple[type, ...]) -> None:
    """torch's check: each child's type *before parametrizations* is exactly the expected
    one (a subclass, e.g. a QAT conv, is rejected); AssertionError naming the types."""
    actual = [type_before_parametrizations(m) for m in modules]
    if all(a is e for a, e in zip(actual, expected)):
        return
    names = [a.__name__ for a in actual]
    listed = " and ".join(names) if len(names) == 2 else ", ".join(names[:-1]) + ", and " + \
        names[-1]
    raise AssertionError(f"Incorrect types for input modules: {listed}")


class ConvReLU1d(_FusedModule):
    """Fused Conv1d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, relu), (nn.Conv1d, nn.ReLU))
        super().__init__(conv, relu)


class ConvReLU2d(_FusedModule):
    """Fused Conv2d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, relu), (nn.Conv2d, nn.ReLU))
        super().__init__(conv, relu)


class ConvReLU3d(_FusedModule):
    """Fused Conv3d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, relu), (nn.Conv3d, nn.ReLU))
        super().__init__(conv, relu)


class LinearReLU(_FusedModule):
    """Fused Linear + ReLU (float forward)."""

    def __init__(self, linear: nn.Module, relu: nn.Module) -> None:
        _check_types((linear, relu), (nn.Linear, nn.ReLU))
        super().__init__(linear, relu)


class ConvBn1d(_FusedModule):
    """Fused Conv1d + BatchNorm1d (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module) -> None:
        _check_types((conv, bn), (nn.Conv1d, nn.BatchNorm1d))
        super().__init__(conv, bn)


class ConvBn2d(_FusedModule):
    """Fused Conv2d + BatchNorm2d (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module) -> None:
        _check_types((conv, bn), (nn.Conv2d, nn.BatchNorm2d))
        super().__init__(conv, bn)


class ConvBn3d(_FusedModule):
    """Fused Conv3d + BatchNorm3d (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module) -> None:
        _check_types((conv, bn), (nn.Conv3d, nn.BatchNorm3d))
        super().__init__(conv, bn)


class ConvBnReLU1d(_FusedModule):
    """Fused Conv1d + BatchNorm1d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, bn, relu), (nn.Conv1d, nn.BatchNorm1d, nn.ReLU))
        super().__init__(conv, bn, relu)


class ConvBnReLU2d(_FusedModule):
    """Fused Conv2d + BatchNorm2d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, bn, relu), (nn.Conv2d, nn.BatchNorm2d, nn.ReLU))
        super().__init__(conv, bn, relu)


class ConvBnReLU3d(_FusedModule):
    """Fused Conv3d + BatchNorm3d + ReLU (float forward)."""

    def __init__(self, conv: nn.Module, bn: nn.Module, relu: nn.Module) -> None:
        _check_types((conv, bn, relu), (nn.Conv3d, nn.BatchNorm3d, nn.ReLU))
        super().__init__(conv, bn, relu)


class BNReLU2d(_FusedModule):
    """Fused BatchNorm2d + ReLU (float forward)."""

    def __init__(self, batch_norm: nn.Module, relu: nn.Module) -> None:
        _check_types((batch_norm, relu), (nn.BatchNorm2d, nn.ReLU))
        super().__init__(batch_norm, relu)


class BNReLU3d(_FusedModule):
    """Fused BatchNorm3d + ReLU (float forward)."""

    def __init__(self, batch_norm: nn.Module, relu: nn.Module) -> None:
        _check_types((batch_norm, relu), (nn.BatchNorm3d, nn.ReLU))
        super().__init__(batch_norm, relu)


class LinearBn1d(_FusedModule):
    """Fused Linear + BatchNorm1d (float forward)."""

    def __init__(self, linear: nn.Module, bn: nn.Module) -> None:
        _check_types((linear, bn), (nn.Linear, nn.BatchNorm1d))
        super().__init__(linear, bn)


class LinearLeakyReLU(_FusedModule):
    """Fused Linear + LeakyReLU (float forward); torch checks the plain type here."""

    def __init__(self, linear: nn.Module, leaky_relu: nn.Module) -> None:
        if not (type(linear) is nn.Linear and type(leaky_relu) is nn.LeakyReLU):
            raise AssertionError(f"Incorrect types for input modules: {type(linear).__name__} "
                                 f"and {type(leaky_relu).__name__}")
        super().__init__(linear, leaky_relu)


class LinearTanh(_FusedModule):
    """Fused Linear + Tanh (float forward); torch checks the plain type here."""

    def __init__(self, linear: nn.Module, tanh: nn.Module) -> None:
        if not (type(linear) is nn.Linear and type(tanh) is nn.Tanh):
            raise AssertionError(f"Incorrect types for input modules: {type(linear).__name__} "
                                 f"and {type(tanh).__name__}")
        super().__init__(linear, tanh)


class ConvAdd2d(_FusedModule):
    """``add(conv(x1), x2)``: one child; ``add`` is any callable (an attribute, not a child).
    Unchecked, as torch's."""

    def __init__(self, conv: nn.Conv2d, add: Callable) -> None:
        super().__init__(conv)
        self.add = add

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.add(self[0](x1), x2)


class ConvAddReLU2d(_FusedModule):
    """``relu(add(conv(x1), x2))``; unchecked, as torch's."""

    def __init__(self, conv: nn.Conv2d, add: Callable, relu: nn.Module) -> None:
        super().__init__(conv)
        self.add = add
        self.relu = relu

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.relu(self.add(self[0](x1), x2))
