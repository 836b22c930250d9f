"""Static quantized LSTM: the quantizable LSTM after convert (QTensor in, QTensor out).

Each cell's gate Linears are ``nnq.Linear`` and its adds/muls ``QFunctional`` with the
calibrated qparams; sigmoid / tanh run on QTensors with torch's fixed output qparams.  The only
way in is ``from_observed`` (float -> observed -> quantized); a freshly constructed module has
the quantized structure with placeholder weights, so a saved state dict loads into it.
"""
from __future__ import annotations

from typing import Any, Optional

from torch import Tensor, nn

from ... import _workflow
from ...quantizable.modules import rnn as _qa_rnn
from ....tensor.validation import require_quantized
from .functional_modules import FloatFunctional, QFunctional
from .linear import Linear

__all__ = ["LSTM"]


def _swap_to_quantized(module: nn.Module) -> None:
    """Replace float Linears / FloatFunctionals below ``module`` by placeholder quantized ones."""
    for name, child in list(module.named_children()):
        if type(child) is nn.Linear:
            module._modules[name] = Linear(child.in_features, child.out_features,
                                           child.bias is not None)
        elif type(child) is FloatFunctional:
            module._modules[name] = QFunctional()
        else:
            _swap_to_quantized(child)


class LSTM(_qa_rnn.LSTM):
    """Quantized ``nn.LSTM`` (see ``torchquant.nn.quantizable.LSTM`` for the structure)."""

    _FLOAT_MODULE = _qa_rnn.LSTM  # type: ignore[assignment]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _swap_to_quantized(self)

    def _get_name(self) -> str:
        return "QuantizedLSTM"

    def forward(self, x: Tensor, hidden: Optional[Any] = None) -> Any:  # type: ignore[override]
        require_quantized(x, "LSTM")
        return super().forward(x, hidden)

    @classmethod
    def from_float(cls, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("It looks like you are trying to convert a non-observed LSTM "
                                  "module. Please, see the examples on quantizable LSTMs.")

    @classmethod
    def from_observed(cls, other: _qa_rnn.LSTM) -> "LSTM":
        """Convert a prepared and calibrated quantizable LSTM (its cells' Linears and
        FloatFunctionals become quantized)."""
        if not isinstance(other, cls._FLOAT_MODULE) or isinstance(other, cls):
            raise AssertionError(f"{cls.__name__}.from_observed expects an observed "
                                 f"{cls._FLOAT_MODULE.__name__}, got {type(other)}")
        converted = _workflow.convert(other, inplace=False, remove_qconfig=True, _record=False)
        converted.__class__ = cls
        return converted
