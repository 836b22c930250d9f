"""The one upward edge of the package: nn calling the eager workflow above it, through a
registration point that :mod:`torchquant.quantization.quantize` fills when it is imported.

A few nn classmethods take a workflow step on their insides, as torch's do (torch imports
``torch.ao.quantization`` inside these functions):

* the quantizable LSTM and MultiheadAttention ``from_float`` ``prepare`` (or ``prepare_qat``)
  what they build (``nn/quantizable/modules/{rnn,activation}.py``);
* the quantized LSTM and MultiheadAttention ``from_observed`` ``convert`` an observed one
  (``nn/quantized/modules/{rnn,activation_mha}.py``);
* dynamic Linear and the Embedding(Bag) ``from_float`` fall back on a predefined qconfig's
  weight observer for a module whose ``qconfig`` is None
  (``nn/quantized/dynamic/modules/linear.py``, ``nn/quantized/modules/embedding_ops.py``);
* the dynamic QAT Linear checks its qconfig's activation (``nn/qat/dynamic/modules/linear.py``).

That workflow, :mod:`torchquant.quantization`, sits above nn and imports it (DESIGN.md), so nn
cannot import it back, not even inside a function (tests/test_import_graph.py).  Instead
``torchquant.quantization.quantize`` calls :func:`register` at the end of its import with
every part below; nothing else registers (the import test names this hook in
``UPWARD_HOOKS`` and checks who fills it and with what).  These calls run on qconfigs or
observed modules, which torchquant.quantization makes, so it is loaded by then; where it is
not (a ``qconfig`` set to None by hand), the call raises a RuntimeError that says to import
it.  :func:`registered` tells whether the hook is filled.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn

__all__ = ["register", "registered", "prepare", "prepare_qat", "convert",
           "default_dynamic_qconfig", "float_qparams_weight_only_qconfig",
           "activation_is_memoryless"]

# the parts, by name, once registered (None until then)
_parts: Optional[dict[str, Any]] = None


def register(*, prepare: Callable[..., nn.Module], prepare_qat: Callable[..., nn.Module],
             convert: Callable[..., nn.Module], default_dynamic_qconfig: Any,
             float_qparams_weight_only_qconfig: Any,
             activation_is_memoryless: Callable[[Any], bool]) -> None:
    """Fill the hook: called once, by :mod:`torchquant.quantization.quantize`, with its
    ``prepare`` / ``prepare_qat`` / ``convert``, the two predefined qconfigs and its
    qconfig's ``_activation_is_memoryless``.  Every part is required, so the hook is either
    empty or whole."""
    global _parts
    _parts = {"prepare": prepare, "prepare_qat": prepare_qat, "convert": convert,
              "default_dynamic_qconfig": default_dynamic_qconfig,
              "float_qparams_weight_only_qconfig": float_qparams_weight_only_qconfig,
              "activation_is_memoryless": activation_is_memoryless}


def registered() -> bool:
    """Whether :mod:`torchquant.quantization` has filled the hook (it has once imported)."""
    return _parts is not None


def _part(name: str) -> Any:
    if _parts is None:
        raise RuntimeError(f"{name} comes from torchquant.quantization, which is not loaded: "
                           "import torchquant.quantization first")
    return _parts[name]


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
