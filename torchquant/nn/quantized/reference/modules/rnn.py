"""Reference quantized RNN cells and LSTM / GRU: torch's float recurrences on
quantize-dequantized weights.  ``weight_qparams_dict`` maps each weight name (``weight_ih``,
``weight_hh``; ``weight_ih_l0`` ... for the multi-layer modules) to its qparams; a single
qparams dict applies to every weight."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .utils import ReferenceQuantizedModule

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "LSTM", "GRU"]


def _qparams_for(weight_qparams_dict: Optional[dict], name: str) -> Optional[dict]:
    if weight_qparams_dict is None:
        return None
    if "qscheme" in weight_qparams_dict:
        return weight_qparams_dict
    return weight_qparams_dict.get(name)


class _RNNMixin(ReferenceQuantizedModule):
    _QPARAMS_IN_STATE_DICT = False  # torch keeps only scale / zero_point / axis for RNNs

    def _weight_names(self) -> list[str]:
        raise NotImplementedError

    def _init_all(self, weight_qparams_dict: Optional[dict], device: Any) -> None:
        for name in self._weight_names():
            self._init_weight_qparams(_qparams_for(weight_qparams_dict, name), device, name)

    def _qparam_names(self) -> list[str]:
        return self._weight_names()

    def get_quantized_weight_by_name(self, name: str):
        return self._quantized(getattr(self, name), name)

    def _get_name(self) -> str:
        return f"Quantized{type(self).__mro__[1].__name__}(Reference)"


class _CellMixin(_RNNMixin):
    def _weight_names(self) -> list[str]:
        return ["weight_ih", "weight_hh"]

    def get_weight_ih(self) -> torch.Tensor:
        return self._weight_dequantized(self.weight_ih, "weight_ih")

    def get_weight_hh(self) -> torch.Tensor:
        return self._weight_dequantized(self.weight_hh, "weight_hh")

    def get_quantized_weight_ih(self):
        return self.get_quantized_weight_by_name("weight_ih")

    def get_quantized_weight_hh(self):
        return self.get_quantized_weight_by_name("weight_hh")

    @classmethod
    def from_float(cls, mod: nn.Module, weight_qparams_dict: dict,
                   use_precomputed_fake_quant: bool = False):
        kwargs = {"nonlinearity": mod.nonlinearity} if isinstance(mod, nn.RNNCell) else {}
        ref = cls(mod.input_size, mod.hidden_size, mod.bias, device=mod.weight_ih.device,
                  dtype=mod.weight_ih.dtype, weight_qparams_dict=weight_qparams_dict, **kwargs)
        ref.load_state_dict(mod.state_dict(), strict=False)
        return ref

    def _hidden(self, input: torch.Tensor, hx: Optional[torch.Tensor]) -> tuple:
        if input.dim() not in (1, 2):
            raise ValueError(f"{self._get_name()}: expected a 1-D or 2-D input, got "
                             f"{input.dim()}-D")
        batched = input.dim() == 2
        if not batched:
            input = input.unsqueeze(0)
        if hx is None:
            hx = torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype,
                             device=input.device)
        elif not batched:
            hx = hx.unsqueeze(0)
        return input, hx, batched


class RNNCell(nn.RNNCell, _CellMixin):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None,
                 weight_qparams_dict: Optional[dict] = None) -> None:
        super().__init__(input_size, hidden_size, bias, nonlinearity, device, dtype)
        self._init_all(weight_qparams_dict, device)

    def forward(self, input: torch.Tensor, hx: Optional[torch.Tensor] = None) -> torch.Tensor:
        x, h, batched = self._hidden(input, hx)
        cell = torch.rnn_tanh_cell if self.nonlinearity == "tanh" else torch.rnn_relu_cell
        out = cell(x, h, self.get_weight_ih(), self.get_weight_hh(), self.bias_ih, self.bias_hh)
        return out if batched else out.squeeze(0)


class LSTMCell(nn.LSTMCell, _CellMixin):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None, weight_qparams_dict: Optional[dict] = None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self._init_all(weight_qparams_dict, device)

    def forward(self, input: torch.Tensor, hx: Optional[tuple] = None) -> tuple:
        x, h, batched = self._hidden(input, None if hx is None else hx[0])
        c = torch.zeros_like(h) if hx is None else (hx[1] if batched else hx[1].unsqueeze(0))
        h1, c1 = torch.lstm_cell(x, (h, c), self.get_weight_ih(), self.get_weight_hh(),
                                 self.bias_ih, self.bias_hh)
        return (h1, c1) if batched else (h1.squeeze(0), c1.squeeze(0))


class GRUCell(nn.GRUCell, _CellMixin):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None, weight_qparams_dict: Optional[dict] = None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self._init_all(weight_qparams_dict, device)

    def forward(self, input: torch.Tensor, hx: Optional[torch.Tensor] = None) -> torch.Tensor:
        x, h, batched = self._hidden(input, hx)
        out = torch.gru_cell(x, h, self.get_weight_ih(), self.get_weight_hh(), self.bias_ih,
                             self.bias_hh)
        return out if batched else out.squeeze(0)


class _MultiLayerMixin(_RNNMixin):
    def _weight_names(self) -> list[str]:
        return [n for n in self._flat_weights_names if n.startswith("weight")]

    def _dequantized_flat_weights(self) -> list[torch.Tensor]:
        return [self._weight_dequantized(getattr(self, n), n) if n.startswith("weight")
                else getattr(self, n) for n in self._flat_weights_names]

    @classmethod
    def from_float(cls, mod: nn.Module, weight_qparams_dict: dict,
                   use_precomputed_fake_quant: bool = False):
        ref = cls(mod.input_size, mod.hidden_size, mod.num_layers, mod.bias, mod.batch_first,
                  mod.dropout, mod.bidirectional, weight_qparams_dict=weight_qparams_dict)
        ref.load_state_dict(mod.state_dict(), strict=False)
        return ref

    def _prepare(self, input: torch.Tensor, hx: Any, cells: int) -> tuple:
        if isinstance(input, nn.utils.rnn.PackedSequence):
            raise NotImplementedError(f"{self._get_name()}: packed sequences are not supported")
        if input.dim() not in (2, 3):
            raise ValueError(f"{self._get_name()}: expected a 2-D or 3-D input, got "
                             f"{input.dim()}-D")
        batched = input.dim() == 3
        if not batched:
            input = input.unsqueeze(1 if self.batch_first else 1)
        batch = input.size(0 if self.batch_first else 1)
        directions = 2 if self.bidirectional else 1
        if hx is None:
            zeros = torch.zeros(self.num_layers * directions, batch, self.hidden_size,
                                dtype=input.dtype, device=input.device)
            hx = tuple(zeros for _ in range(cells)) if cells > 1 else zeros
        elif not batched:
            hx = tuple(h.unsqueeze(1) for h in hx) if cells > 1 else hx.unsqueeze(1)
        return input, hx, batched


class LSTM(nn.LSTM, _MultiLayerMixin):
    def __init__(self, *args: Any, weight_qparams_dict: Optional[dict] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_all(weight_qparams_dict, None)

    def forward(self, input: torch.Tensor, hx: Optional[tuple] = None):
        x, hx, batched = self._prepare(input, hx, 2)
        out, h, c = torch.lstm(x, hx, self._dequantized_flat_weights(), self.bias,
                               self.num_layers, float(self.dropout), self.training,
                               self.bidirectional, self.batch_first)
        if not batched:
            return out.squeeze(1), (h.squeeze(1), c.squeeze(1))
        return out, (h, c)


class GRU(nn.GRU, _MultiLayerMixin):
    def __init__(self, *args: Any, weight_qparams_dict: Optional[dict] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_all(weight_qparams_dict, None)

    def forward(self, input: torch.Tensor, hx: Optional[torch.Tensor] = None):
        x, hx, batched = self._prepare(input, hx, 1)
        out, h = torch.gru(x, hx, self._dequantized_flat_weights(), self.bias, self.num_layers,
                           float(self.dropout), self.training, self.bidirectional,
                           self.batch_first)
        if not batched:
            return out.squeeze(1), h.squeeze(1)
        return out, h
