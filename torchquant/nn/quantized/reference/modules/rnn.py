"""Reference quantized RNN cells and LSTM / GRU: torch's float recurrences run on
quantize-dequantized weights.

``weight_qparams_dict`` maps each weight name (``weight_ih`` / ``weight_hh`` for the cells,
``weight_ih_l0``, ``weight_hh_l0_reverse`` ... for LSTM / GRU) to its qparams, plus
``"is_decomposed"``; a weight without an entry is used unquantized (as torch).  A single qparams
dict (one with a ``"qscheme"`` key) is also accepted and applies to every weight.  Unlike
Linear / Conv, torch keeps no ``*_qscheme`` / ``*_dtype`` entries in these state dicts: a
module must be rebuilt with the same ``weight_qparams_dict`` before loading one.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..... import dtypes as _dt
from .....tensor.qtensor import QTensor
from .utils import ReferenceQuantizedModule, default_weight_qparams

__all__ = ["RNNCell", "LSTMCell", "GRUCell", "LSTM", "GRU"]


class _RNNQParams(ReferenceQuantizedModule):
    """Per-weight qparams for the recurrent modules (shared by the cells and LSTM / GRU)."""

    _QPARAMS_IN_STATE_DICT = False
    _SUPPORTED_QSCHEMES = (None, _dt.per_tensor_affine, _dt.per_channel_affine)

    def _all_weight_names(self) -> list[str]:
        raise NotImplementedError

    def _init_weight_qparams_dict(self, weight_qparams_dict: Optional[dict],
                                  device: Any) -> None:
        names = self._all_weight_names()
        if weight_qparams_dict is None:
            weight_qparams_dict = {n: default_weight_qparams() for n in names}
        elif "qscheme" in weight_qparams_dict:
            weight_qparams_dict = {n: weight_qparams_dict for n in names}
        self.is_decomposed = bool(weight_qparams_dict.get("is_decomposed", False))
        registered = []
        for key, qparams in weight_qparams_dict.items():
            if key == "is_decomposed":
                continue
            if key not in names:
                raise ValueError(f"{self._get_name()}: weight_qparams_dict has {key!r}, which "
                                 f"is not one of its weights {names}")
            self._register_qparams(key, qparams, device, default_buffers=False)
            registered.append(key)
        self._registered_weight_names = registered

    def _quantized_weight_names(self) -> list[str]:
        return list(self._registered_weight_names)

    def _weight_by_name(self, name: str, quantized: bool) -> Union[Tensor, QTensor, None]:
        weight = getattr(self, name, None)
        if weight is None:
            return None
        if quantized:
            return self._quantize_named(weight, name)
        return self._fake_quantize_named(weight, name)


# ---- cells ------------------------------------------------------------------------------------

class _CellBase(_RNNQParams):
    _CELL_NAME = ""

    def _all_weight_names(self) -> list[str]:
        return ["weight_ih", "weight_hh"]

    def _get_name(self) -> str:
        return f"Quantized{self._CELL_NAME}(Reference)"

    def get_weight_ih(self) -> Tensor:
        return self._weight_by_name("weight_ih", quantized=False)

    def get_weight_hh(self) -> Tensor:
        return self._weight_by_name("weight_hh", quantized=False)

    def get_quantized_weight_ih(self):
        return self._weight_by_name("weight_ih", quantized=True)

    def get_quantized_weight_hh(self):
        return self._weight_by_name("weight_hh", quantized=True)

    def _batch(self, input: Tensor) -> tuple[Tensor, bool]:
        if input.dim() not in (1, 2):
            raise AssertionError(f"{self._CELL_NAME}: Expected input to be 1-D or 2-D but "
                                 f"received {input.dim()}-D tensor")
        batched = input.dim() == 2
        return (input if batched else input.unsqueeze(0)), batched

    def _zeros(self, input: Tensor) -> Tensor:
        return torch.zeros(input.size(0), self.hidden_size, dtype=input.dtype,
                           device=input.device)

    def _share_float_parameters(self, mod: nn.Module) -> None:
        # as torch: the reference cell holds the float cell's own Parameters
        for name in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            setattr(self, name, getattr(mod, name))


class RNNCell(nn.RNNCell, _CellBase):
    """Reference quantized ``nn.RNNCell``."""

    _CELL_NAME = "RNNCell"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", device=None, dtype=None,
                 weight_qparams_dict: Optional[dict[str, Any]] = None) -> None:
        super().__init__(input_size, hidden_size, bias, nonlinearity, device, dtype)
        self._init_weight_qparams_dict(weight_qparams_dict, device)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x, batched = self._batch(input)
        h = self._zeros(x) if hx is None else (hx if batched else hx.unsqueeze(0))
        if self.nonlinearity == "tanh":
            step = torch.rnn_tanh_cell
        elif self.nonlinearity == "relu":
            step = torch.rnn_relu_cell
        else:
            raise RuntimeError(f"Unknown nonlinearity: {self.nonlinearity}")
        out = step(x, h, self.get_weight_ih(), self.get_weight_hh(), self.bias_ih, self.bias_hh)
        return out if batched else out.squeeze(0)

    @classmethod
    def from_float(cls, mod: nn.RNNCell, weight_qparams_dict: Optional[dict]) -> "RNNCell":
        ref = cls(mod.input_size, mod.hidden_size, mod.bias, mod.nonlinearity,
                  mod.weight_ih.device, mod.weight_ih.dtype, weight_qparams_dict)
        ref._share_float_parameters(mod)
        return ref


class LSTMCell(nn.LSTMCell, _CellBase):
    """Reference quantized ``nn.LSTMCell``; ``forward(input, (h, c)) -> (h', c')``."""

    _CELL_NAME = "LSTMCell"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None, weight_qparams_dict: Optional[dict[str, Any]] = None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self._init_weight_qparams_dict(weight_qparams_dict, device)

    def forward(self, input: Tensor,
                hx: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor]:
        x, batched = self._batch(input)
        if hx is None:
            zeros = self._zeros(x)
            hx = (zeros, zeros)
        elif not batched:
            hx = (hx[0].unsqueeze(0), hx[1].unsqueeze(0))
        h, c = torch.lstm_cell(x, hx, self.get_weight_ih(), self.get_weight_hh(), self.bias_ih,
                               self.bias_hh)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))

    @classmethod
    def from_float(cls, mod: nn.LSTMCell, weight_qparams_dict: Optional[dict],
                   use_precomputed_fake_quant: bool = False) -> "LSTMCell":
        ref = cls(mod.input_size, mod.hidden_size, mod.bias, mod.weight_ih.device,
                  mod.weight_ih.dtype, weight_qparams_dict)
        ref._share_float_parameters(mod)
        return ref


class GRUCell(nn.GRUCell, _CellBase):
    """Reference quantized ``nn.GRUCell``."""

    _CELL_NAME = "GRUCell"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None,
                 dtype=None, weight_qparams_dict: Optional[dict[str, Any]] = None) -> None:
        super().__init__(input_size, hidden_size, bias, device, dtype)
        self._init_weight_qparams_dict(weight_qparams_dict, device)

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x, batched = self._batch(input)
        h = self._zeros(x) if hx is None else (hx if batched else hx.unsqueeze(0))
        out = torch.gru_cell(x, h, self.get_weight_ih(), self.get_weight_hh(), self.bias_ih,
                             self.bias_hh)
        return out if batched else out.squeeze(0)

    @classmethod
    def from_float(cls, mod: nn.GRUCell, weight_qparams_dict: Optional[dict]) -> "GRUCell":
        ref = cls(mod.input_size, mod.hidden_size, mod.bias, mod.weight_ih.device,
                  mod.weight_ih.dtype, weight_qparams_dict)
        ref._share_float_parameters(mod)
        return ref


# ---- multi-layer --------------------------------------------------------------------------

class _MultiLayer(_RNNQParams):
    """LSTM / GRU: every ``weight*`` in ``_flat_weights_names`` is quantize-dequantized.

    torch's LSTM / GRU re-type tensor qparams to float32 / int32 buffers."""

    _KEEP_TENSOR_DTYPE = False
    _MODE = ""

    def _all_weight_names(self) -> list[str]:
        return [n for n in self._flat_weights_names if n.startswith("weight")]

    def _get_name(self) -> str:
        return f"Quantized{self._MODE}(Reference)"

    def get_flat_weights(self) -> list[Optional[Tensor]]:
        """``_flat_weights`` with every weight quantize-dequantized (biases as they are)."""
        return [self._weight_by_name(n, quantized=False) if n.startswith("weight")
                else getattr(self, n, None) for n in self._flat_weights_names]

    def get_quantized_weight_bias_dict(self) -> dict[str, Any]:
        """``{flat weight name: quantized weight (QTensor) or float bias}``, what the dynamic
        quantized LSTM / GRU ``from_reference`` consumes."""
        return {n: self._weight_by_name(n, quantized=True) if n.startswith("weight")
                else getattr(self, n, None) for n in self._flat_weights_names}

    @classmethod
    def from_float(cls, mod: nn.Module, weight_qparams_dict: Optional[dict]):
        ref = cls(mod.input_size, mod.hidden_size, mod.num_layers, mod.bias, mod.batch_first,
                  mod.dropout, mod.bidirectional, weight_qparams_dict=weight_qparams_dict)
        for name in mod._flat_weights_names:  # as torch: share the float Parameters
            setattr(ref, name, getattr(mod, name))
        return ref

    def _run(self, input: Union[Tensor, PackedSequence], hx: Any, cells: int):
        """Shared driver of torch's LSTM / GRU forward with ``get_flat_weights()``.  ``cells``
        is 2 for LSTM ((h, c) state) and 1 for GRU."""
        packed = isinstance(input, PackedSequence)
        sorted_indices = unsorted_indices = None
        batched = True
        batch_dim = 0 if self.batch_first else 1
        if packed:
            input, batch_sizes, sorted_indices, unsorted_indices = input
            max_batch = int(batch_sizes[0])
        else:
            batch_sizes = None
            if input.dim() not in (2, 3):
                raise AssertionError(f"{self._MODE}: Expected input to be 2-D or 3-D but "
                                     f"received {input.dim()}-D tensor")
            batched = input.dim() == 3
            if not batched:
                input = input.unsqueeze(batch_dim)
            max_batch = input.size(batch_dim)
        directions = 2 if self.bidirectional else 1
        if hx is None:
            h_size = self.proj_size if self.proj_size > 0 else self.hidden_size
            h0 = torch.zeros(self.num_layers * directions, max_batch, h_size,
                             dtype=input.dtype, device=input.device)
            if cells == 2:
                hx = (h0, torch.zeros(self.num_layers * directions, max_batch,
                                      self.hidden_size, dtype=input.dtype, device=input.device))
            else:
                hx = h0
        else:
            states = hx if cells == 2 else (hx,)
            if not packed:
                want = 3 if batched else 2
                if any(s.dim() != want for s in states):
                    kind = "batched 3-D" if batched else "unbatched 2-D"
                    dims = ", ".join(f"{s.dim()}-D" for s in states)
                    raise RuntimeError(f"For {kind} input, the hidden state should also be "
                                       f"{want}-D but got ({dims}) tensors")
                if not batched:
                    states = tuple(s.unsqueeze(1) for s in states)
            hx = self.permute_hidden(states if cells == 2 else states[0], sorted_indices)
        self.check_forward_args(input, hx, batch_sizes)
        op = torch.lstm if cells == 2 else torch.gru
        weights = self.get_flat_weights()
        if batch_sizes is None:
            result = op(input, hx, weights, self.bias, self.num_layers, float(self.dropout),
                        self.training, self.bidirectional, self.batch_first)
        else:
            result = op(input, batch_sizes, hx, weights, self.bias, self.num_layers,
                        float(self.dropout), self.training, self.bidirectional)
        output = result[0]
        hidden = tuple(result[1:]) if cells == 2 else result[1]
        if packed:
            output = PackedSequence(output, batch_sizes, sorted_indices, unsorted_indices)
            return output, self.permute_hidden(hidden, unsorted_indices)
        if not batched:
            output = output.squeeze(batch_dim)
            hidden = tuple(h.squeeze(1) for h in hidden) if cells == 2 else hidden.squeeze(1)
        return output, hidden


class LSTM(nn.LSTM, _MultiLayer):
    """Reference quantized ``nn.LSTM`` (same constructor, plus ``weight_qparams_dict``)."""

    _MODE = "LSTM"

    def __init__(self, *args: Any, weight_qparams_dict: Optional[dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._init_weight_qparams_dict(weight_qparams_dict, kwargs.get("device"))

    def forward(self, input, hx: Optional[tuple[Tensor, Tensor]] = None):
        return self._run(input, hx, 2)


class GRU(nn.GRU, _MultiLayer):
    """Reference quantized ``nn.GRU`` (same constructor, plus ``weight_qparams_dict``)."""

    _MODE = "GRU"

    def __init__(self, *args: Any, weight_qparams_dict: Optional[dict[str, Any]] = None,
                 **kwargs: Any) -> None:
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__(*args, **kwargs)
        self._init_weight_qparams_dict(weight_qparams_dict, kwargs.get("device"))

    def forward(self, input, hx: Optional[Tensor] = None):
        return self._run(input, hx, 1)
