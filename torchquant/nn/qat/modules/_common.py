"""Checks shared by the QAT constructors and ``from_float``."""
from __future__ import annotations

from typing import Any

from torch import nn


def require_qconfig(qconfig: Any) -> None:
    if not qconfig:
        raise AssertionError("qconfig must be provided for QAT module")


def check_float_module(cls: type, mod: nn.Module, float_type: type, got: type,
                       config_word: str = "qconfig") -> None:
    """``from_float`` preconditions: exact float type, and a usable ``mod.qconfig``."""
    if got is not float_type:
        raise AssertionError(f"qat.{cls.__name__}.from_float only works for "
                             f"{float_type.__name__}, got {got.__name__}")
    if not hasattr(mod, "qconfig"):
        raise AssertionError("Input float module must have qconfig defined")
    if not mod.qconfig:
        raise AssertionError(f"Input float module must have a valid {config_word}")
