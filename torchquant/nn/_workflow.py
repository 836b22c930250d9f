"""What nn's modules need from the eager workflow above them, handed down when it loads.

A few nn classmethods take a workflow step on their insides, as torch's do: the quantizable
LSTM and MultiheadAttention ``prepare`` (or ``prepare_qat``) what ``from_float`` builds and
their quantized versions ``convert`` an observed one; dynamic Linear and Embedding fall back
on a predefined qconfig for a module whose ``qconfig`` is None; the dynamic QAT Linear checks
its qconfig's activation.  That workflow, :mod:`torchquant.quantization`, sits above nn and
imports it (DESIGN.md), so nn cannot import it back: :mod:`torchquant.quantization.quantize`
installs its functions and qconfigs here when it is imported.  These calls run on qconfigs or
observed modules, which torchquant.quantization makes, so it is loaded by then; where it is
not (a ``qconfig`` set to None by hand), the call says to import it.
"""
from __future__ import annotations

from typing import Any

from torch import nn

__all__ = ["install", "prepare", "prepare_qat", "convert", "default_dynamic_qconfig",
           "float_qparams_weight_only_qconfig", "activation_is_memoryless"]

_installed: dict[str, Any] = {}


def install(**parts: Any) -> None:
    """Called by :mod:`torchquant.quantization.quantize` with the parts named below."""
    _installed.update(parts)


def _part(name: str) -> Any:
    try:
        return _installed[name]
    except KeyError:
        raise RuntimeError(f"{name} comes from torchquant.quantization, which is not loaded: "
                           "import torchquant.quantization first") from None


def prepare(model: nn.Module, **kwargs: Any) -> nn.Module:
    return _part("prepare")(model, **kwargs)


def prepare_qat(model: nn.Module, **kwargs: Any) -> nn.Module:
    return _part("prepare_qat")(model, **kwargs)


def convert(module: nn.Module, **kwargs: Any) -> nn.Module:
    return _part("convert")(module, **kwargs)


def default_dynamic_qconfig() -> Any:
    return _part("default_dynamic_qconfig")


def float_qparams_weight_only_qconfig() -> Any:
    return _part("float_qparams_weight_only_qconfig")


def activation_is_memoryless(qconfig: Any) -> bool:
    return _part("activation_is_memoryless")(qconfig)
