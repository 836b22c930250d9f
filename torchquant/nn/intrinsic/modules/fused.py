"""Fused float containers: ``nn.Sequential`` subclasses marking modules to quantize as one.

Children keep the names ``0``, ``1`` (``2``) so state_dict keys equal the unfused modules'.
Constructors check child types and raise ``AssertionError`` naming them, as torch does.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

__all__ = ["_FusedModule", "ConvReLU1d", "ConvReLU2d", "ConvReLU3d", "LinearReLU",
           "ConvBn1d", "ConvBn2d", "ConvBn3d", "ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d",
           "BNReLU2d", "BNReLU3d", "LinearBn1d", "LinearLeakyReLU", "LinearTanh",
           "ConvAdd2d", "ConvAddReLU2d"]


class _FusedModule(nn.Sequential):
    """Base of every fused container; ``_CHILD_TYPES`` lists the expected type of each child."""

    _CHILD_TYPES: tuple[tuple[type, ...], ...] = ()

    def __init__(self, *modules: nn.Module) -> None:
        expected = self._CHILD_TYPES
        ok = len(modules) == len(expected) and all(
            isinstance(m, t) for m, t in zip(modules, expected))
        assert ok, (f"Incorrect types for input modules{tuple(type(m).__name__ for m in modules)}"
                    f" for {type(self).__name__}: expected "
                    f"{tuple('|'.join(t.__name__ for t in ts) for ts in expected)}")
        super().__init__(*modules)


def _fused(name: str, *child_types: type | tuple[type, ...]) -> type:
    types = tuple(t if isinstance(t, tuple) else (t,) for t in child_types)
    doc = f"Fused {' + '.join('|'.join(t.__name__ for t in ts) for ts in types)} (float forward)."
    return type(name, (_FusedModule,), {"_CHILD_TYPES": types, "__doc__": doc,
                                       "__module__": __name__})


ConvReLU1d = _fused("ConvReLU1d", nn.Conv1d, nn.ReLU)
ConvReLU2d = _fused("ConvReLU2d", nn.Conv2d, nn.ReLU)
ConvReLU3d = _fused("ConvReLU3d", nn.Conv3d, nn.ReLU)
LinearReLU = _fused("LinearReLU", nn.Linear, nn.ReLU)
ConvBn1d = _fused("ConvBn1d", nn.Conv1d, nn.BatchNorm1d)
ConvBn2d = _fused("ConvBn2d", nn.Conv2d, nn.BatchNorm2d)
ConvBn3d = _fused("ConvBn3d", nn.Conv3d, nn.BatchNorm3d)
ConvBnReLU1d = _fused("ConvBnReLU1d", nn.Conv1d, nn.BatchNorm1d, nn.ReLU)
ConvBnReLU2d = _fused("ConvBnReLU2d", nn.Conv2d, nn.BatchNorm2d, nn.ReLU)
ConvBnReLU3d = _fused("ConvBnReLU3d", nn.Conv3d, nn.BatchNorm3d, nn.ReLU)
BNReLU2d = _fused("BNReLU2d", nn.BatchNorm2d, nn.ReLU)
BNReLU3d = _fused("BNReLU3d", nn.BatchNorm3d, nn.ReLU)
LinearBn1d = _fused("LinearBn1d", nn.Linear, nn.BatchNorm1d)
LinearLeakyReLU = _fused("LinearLeakyReLU", nn.Linear, nn.LeakyReLU)
LinearTanh = _fused("LinearTanh", nn.Linear, nn.Tanh)


class ConvAdd2d(_FusedModule):
    """``add(conv(x1), x2)``; ``add`` is any callable (kept as an attribute, not a child)."""

    _CHILD_TYPES = ((nn.Conv2d,),)

    def __init__(self, conv: nn.Conv2d, add: Callable) -> None:
        super().__init__(conv)
        self.add = add

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.add(self[0](x1), x2)


class ConvAddReLU2d(_FusedModule):
    """``relu(add(conv(x1), x2))``."""

    _CHILD_TYPES = ((nn.Conv2d,),)

    def __init__(self, conv: nn.Conv2d, add: Callable, relu: nn.ReLU) -> None:
        assert isinstance(relu, nn.ReLU), f"ConvAddReLU2d expects a ReLU, got {type(relu).__name__}"
        super().__init__(conv)
        self.add = add
        self.relu = relu

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return self.relu(self.add(self[0](x1), x2))
