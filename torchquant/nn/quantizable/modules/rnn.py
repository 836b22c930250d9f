"""Observable LSTM: ``nn.LSTM`` rebuilt from modules that eager-mode quantization can see.

``nn.LSTM`` runs as one fused kernel, so prepare cannot put observers between its gates.  Here
every gate projection is an ``nn.Linear``, every elementwise add/mul goes through a
``FloatFunctional`` and the gate nonlinearities are ``nn.Sigmoid`` / ``nn.Tanh`` modules, so
``prepare`` observes each intermediate and ``convert`` swaps Linear -> ``nnq.Linear`` and
FloatFunctional -> ``QFunctional``.  The same code then runs on QTensors (sigmoid / tanh take
torch's fixed output qparams there).  Structure and attribute names follow
``torch.ao.nn.quantizable`` so state-dict keys match.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Optional, Union

import torch
from torch import Tensor, nn

from .... import dtypes as _dt
from ....tensor.qtensor import QTensor
from ....tensor.functions import quantize_per_tensor
from ... import _workflow
from ...float_functional import FloatFunctional

__all__ = ["LSTMCell", "LSTM"]

_GATE_NAMES = ("input", "forget", "cell", "output")
_Hidden = tuple[Tensor, Tensor]


def _zeros_like_state(shape: tuple[int, ...], like: Tensor, qparams: tuple[float, int],
                      qdtype: Any) -> Tensor:
    """Zeros for an initial state: float, or quantized when ``like`` is a QTensor."""
    zeros = torch.zeros(shape, device=like.device)
    if isinstance(like, QTensor):
        return quantize_per_tensor(zeros, float(qparams[0]), int(qparams[1]), qdtype)
    return zeros


def _flip_time(x: Tensor) -> Tensor:
    """``x`` reversed along dim 0; for QTensors the integers are reversed (exact)."""
    if isinstance(x, QTensor):
        if x.axis is not None or x.qdtype.is_sub_byte:
            raise NotImplementedError("quantized LSTM needs per-tensor 8-bit activations, got "
                                      f"{x.qscheme()!r} {x.qdtype!r}")
        return QTensor.from_int(x.int_data.flip(0), x.scale, x.zero_point, x.qdtype)
    return x.flip(0)


class LSTMCell(nn.Module):
    """One LSTM time step, ``(x, (h, c)) -> (h', c')``, decomposed into observable modules.

    Gate pre-activations are ``igates(x) + hgates(h)`` (``gates.add``); with
    ``split_gates=True`` each of the four gates has its own Linear pair and add instead of one
    ``4 * hidden`` projection that is chunked.
    """

    _FLOAT_MODULE = nn.LSTMCell
    __constants__ = ["split_gates"]

    def __init__(self, input_dim: int, hidden_dim: int, bias: bool = True, device: Any = None,
                 dtype: Any = None, *, split_gates: bool = False) -> None:
        super().__init__()
        fk = {"device": device, "dtype": dtype}
        self.input_size = input_dim
        self.hidden_size = hidden_dim
        self.bias = bias
        self.split_gates = split_gates
        if split_gates:
            self.igates: nn.Module = nn.ModuleDict(
                {g: nn.Linear(input_dim, hidden_dim, bias=bias, **fk) for g in _GATE_NAMES})
            self.hgates: nn.Module = nn.ModuleDict(
                {g: nn.Linear(hidden_dim, hidden_dim, bias=bias, **fk) for g in _GATE_NAMES})
            self.gates: nn.Module = nn.ModuleDict({g: FloatFunctional() for g in _GATE_NAMES})
        else:
            self.igates = nn.Linear(input_dim, 4 * hidden_dim, bias=bias, **fk)
            self.hgates = nn.Linear(hidden_dim, 4 * hidden_dim, bias=bias, **fk)
            self.gates = FloatFunctional()
        self.input_gate = nn.Sigmoid()
        self.forget_gate = nn.Sigmoid()
        self.cell_gate = nn.Tanh()
        self.output_gate = nn.Sigmoid()
        self.fgate_cx = FloatFunctional()
        self.igate_cgate = FloatFunctional()
        self.fgate_cx_igate_cgate = FloatFunctional()
        self.ogate_cy = FloatFunctional()
        # qparams / dtype of the zero states made when no hidden state is given (quantized run)
        self.initial_hidden_state_qparams: tuple[float, int] = (1.0, 0)
        self.initial_cell_state_qparams: tuple[float, int] = (1.0, 0)
        self.hidden_state_dtype: Any = _dt.quint8
        self.cell_state_dtype: Any = _dt.quint8

    def _get_name(self) -> str:
        return "QuantizableLSTMCell"

    def extra_repr(self) -> str:
        return (f"{self.input_size}, {self.hidden_size}, bias={self.bias}"
                + (", split_gates=True" if self.split_gates else ""))

    def initialize_hidden(self, batch_size: int, is_quantized: bool = False) -> _Hidden:
        """Zero (h, c) of shape (batch, hidden); quantized with the initial-state qparams."""
        shape = (batch_size, self.hidden_size)
        h, c = torch.zeros(shape), torch.zeros(shape)
        if is_quantized:
            h = quantize_per_tensor(h, float(self.initial_hidden_state_qparams[0]),
                                    int(self.initial_hidden_state_qparams[1]),
                                    self.hidden_state_dtype)
            c = quantize_per_tensor(c, float(self.initial_cell_state_qparams[0]),
                                    int(self.initial_cell_state_qparams[1]),
                                    self.cell_state_dtype)
        return h, c

    def _preactivations(self, x: Tensor, hx: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if self.split_gates:
            return tuple(self.gates[g].add(self.igates[g](x), self.hgates[g](hx))  # type: ignore
                         for g in _GATE_NAMES)
        return tuple(self.gates.add(self.igates(x), self.hgates(hx)).chunk(4, 1))  # type: ignore

    def forward(self, x: Tensor, hidden: Optional[_Hidden] = None) -> _Hidden:
        if x.dim() != 2:
            raise ValueError(f"{self._get_name()}: expected a 2-D (batch, input_size) input, "
                             f"got shape {tuple(x.shape)}")
        if x.shape[1] != self.input_size:
            raise ValueError(f"{self._get_name()}: input has {x.shape[1]} features, expected "
                             f"input_size={self.input_size}")
        if hidden is None or hidden[0] is None or hidden[1] is None:
            hidden = self.initialize_hidden(x.shape[0], isinstance(x, QTensor))
        hx, cx = hidden
        i, f, g, o = self._preactivations(x, hx)
        i = self.input_gate(i)
        f = self.forget_gate(f)
        g = self.cell_gate(g)
        o = self.output_gate(o)
        cy = self.fgate_cx_igate_cgate.add(self.fgate_cx.mul(f, cx), self.igate_cgate.mul(i, g))
        hy = self.ogate_cy.mul(o, torch.tanh(cy))
        return hy, cy

    @classmethod
    def from_params(cls, wi: Tensor, wh: Tensor, bi: Optional[Tensor] = None,
                    bh: Optional[Tensor] = None, split_gates: bool = False) -> "LSTMCell":
        """A cell with these gate weights, shaped as nn.LSTMCell's (``(4*hidden, in)`` ...)."""
        if (bi is None) != (bh is None):
            raise ValueError("LSTMCell.from_params: give both biases or neither")
        if wi.dim() != 2 or wh.dim() != 2 or wi.shape[0] != wh.shape[0] \
                or wh.shape[0] != 4 * wh.shape[1]:
            raise ValueError(f"LSTMCell.from_params: weights of shapes {tuple(wi.shape)} and "
                             f"{tuple(wh.shape)} are not (4*hidden, input) and (4*hidden, hidden)")
        cell = cls(wi.shape[1], wh.shape[1], bias=bi is not None, device=wi.device,
                   dtype=wi.dtype, split_gates=split_gates)

        def param(t: Tensor) -> nn.Parameter:
            return nn.Parameter(t.detach().clone())

        for linears, w, b in ((cell.igates, wi, bi), (cell.hgates, wh, bh)):
            if split_gates:
                w_parts = w.chunk(4, 0)
                b_parts = b.chunk(4, 0) if b is not None else (None,) * 4
                for g, wp, bp in zip(_GATE_NAMES, w_parts, b_parts):
                    linears[g].weight = param(wp)  # type: ignore[index]
                    if bp is not None:
                        linears[g].bias = param(bp)  # type: ignore[index]
            else:
                linears.weight = param(w)
                if b is not None:
                    linears.bias = param(b)
        return cell

    @classmethod
    def from_float(cls, other: nn.LSTMCell, use_precomputed_fake_quant: bool = False,
                   split_gates: bool = False) -> "LSTMCell":
        if type(other) is not cls._FLOAT_MODULE:
            raise AssertionError(f"{cls.__name__}.from_float expects {cls._FLOAT_MODULE}, got "
                                 f"{type(other)}")
        if not hasattr(other, "qconfig"):
            raise AssertionError("The float module must have 'qconfig'")
        cell = cls.from_params(other.weight_ih, other.weight_hh, other.bias_ih, other.bias_hh,
                               split_gates=split_gates)
        cell.qconfig = other.qconfig
        for linears in (cell.igates, cell.hgates):
            linears.qconfig = other.qconfig
            if split_gates:
                for lin in linears.values():  # type: ignore[union-attr]
                    lin.qconfig = other.qconfig
        return cell


class _LSTMSingleLayer(nn.Module):
    """One direction of one layer: the cell unrolled over a (seq, batch, feature) input."""

    def __init__(self, input_dim: int, hidden_dim: int, bias: bool = True, device: Any = None,
                 dtype: Any = None, *, split_gates: bool = False) -> None:
        super().__init__()
        self.cell = LSTMCell(input_dim, hidden_dim, bias=bias, device=device, dtype=dtype,
                             split_gates=split_gates)

    def forward(self, x: Tensor, hidden: Optional[_Hidden] = None) -> tuple[Tensor, _Hidden]:
        outputs = []
        for t in range(x.shape[0]):
            hidden = self.cell(x[t], hidden)
            outputs.append(hidden[0])
        return torch.stack(outputs, 0), hidden  # type: ignore[return-value]

    @classmethod
    def from_params(cls, *args: Any, **kwargs: Any) -> "_LSTMSingleLayer":
        cell = LSTMCell.from_params(*args, **kwargs)
        layer = cls(cell.input_size, cell.hidden_size, cell.bias, split_gates=cell.split_gates)
        layer.cell = cell
        return layer


class _LSTMLayer(nn.Module):
    """One layer, forward and (when bidirectional) backward direction."""

    def __init__(self, input_dim: int, hidden_dim: int, bias: bool = True,
                 batch_first: bool = False, bidirectional: bool = False, device: Any = None,
                 dtype: Any = None, *, split_gates: bool = False) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.bidirectional = bidirectional
        kw = {"bias": bias, "device": device, "dtype": dtype, "split_gates": split_gates}
        self.layer_fw = _LSTMSingleLayer(input_dim, hidden_dim, **kw)
        if bidirectional:
            self.layer_bw = _LSTMSingleLayer(input_dim, hidden_dim, **kw)

    def forward(self, x: Tensor, hidden: Optional[tuple[Optional[Tensor], Optional[Tensor]]]
                = None) -> tuple[Tensor, _Hidden]:
        if self.batch_first:
            x = x.transpose(0, 1)
        hx, cx = (None, None) if hidden is None else hidden
        have_state = hx is not None and cx is not None
        if self.bidirectional:
            state_fw = (hx[0], cx[0]) if have_state else None  # type: ignore[index]
            state_bw = (hx[1], cx[1]) if have_state else None  # type: ignore[index]
        else:
            state_fw = (hx, cx) if have_state else None
        out, (h, c) = self.layer_fw(x, state_fw)
        if self.bidirectional:
            out_bw, (h_bw, c_bw) = self.layer_bw(_flip_time(x), state_bw)
            out = torch.cat([out, _flip_time(out_bw)], out.dim() - 1)
            h = torch.stack([h, h_bw], 0)
            c = torch.stack([c, c_bw], 0)
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, (h, c)

    @classmethod
    def from_float(cls, other: nn.Module, layer_idx: int = 0, qconfig: Any = None,
                   **kwargs: Any) -> "_LSTMLayer":
        """Layer ``layer_idx`` of a float ``nn.LSTM`` (``kwargs`` override its settings)."""
        if not hasattr(other, "qconfig") and qconfig is None:
            raise AssertionError("other must have a qconfig or qconfig must be given")
        get = lambda name: kwargs.get(name, getattr(other, name))  # noqa: E731
        split_gates = kwargs.get("split_gates", False)
        layer = cls(get("input_size"), get("hidden_size"), get("bias"), get("batch_first"),
                    get("bidirectional"), split_gates=split_gates)
        layer.qconfig = getattr(other, "qconfig", qconfig)
        for suffix, attr in (("", "layer_fw"), ("_reverse", "layer_bw")):
            if suffix and not other.bidirectional:
                continue
            params = [getattr(other, f"{kind}_l{layer_idx}{suffix}", None)
                      for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh")]
            setattr(layer, attr, _LSTMSingleLayer.from_params(*params, split_gates=split_gates))
        return layer


class LSTM(nn.Module):
    """Observable ``nn.LSTM`` (same constructor and forward; no ``proj_size``; dropout is
    ignored, with a warning, as in torch).

    Layers live in ``layers`` (``_LSTMLayer``); per-direction cells in
    ``layers[i].layer_fw.cell`` / ``layer_bw.cell``.  Built from a float LSTM by
    :meth:`from_float` (what ``prepare`` calls), converted by ``nnq.LSTM.from_observed``.
    """

    _FLOAT_MODULE = nn.LSTM

    def __init__(self, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, device: Any = None, dtype: Any = None, *,
                 split_gates: bool = False) -> None:
        super().__init__()
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Number) \
                or not 0 <= dropout <= 1:
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.training = False  # eval unless asked: from_float sets train() for QAT
        if dropout > 0:
            warnings.warn("dropout option for quantizable LSTM is ignored. If you are training, "
                          "please, use nn.LSTM version followed by `prepare` step.",
                          stacklevel=2)
            if num_layers == 1:
                warnings.warn("dropout option adds dropout after all but last recurrent layer, "
                              "so non-zero dropout expects num_layers greater than 1, but got "
                              f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        directions = 2 if bidirectional else 1
        self.layers = nn.ModuleList(
            _LSTMLayer(input_size if i == 0 else hidden_size * directions, hidden_size, bias,
                       batch_first=False, bidirectional=bidirectional, device=device,
                       dtype=dtype, split_gates=split_gates)
            for i in range(num_layers))

    def _get_name(self) -> str:
        return "QuantizableLSTM"

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if not self.bias:
            s += ", bias=False"
        if self.batch_first:
            s += ", batch_first=True"
        if self.bidirectional:
            s += ", bidirectional=True"
        return s

    def _initial_states(self, x: Tensor, hidden: Any) -> list:
        directions = 2 if self.bidirectional else 1
        batch = x.shape[1]
        if hidden is None:
            shape = (directions, batch, self.hidden_size) if directions == 2 \
                else (batch, self.hidden_size)
            qdtype = x.qdtype if isinstance(x, QTensor) else None
            zeros = _zeros_like_state(shape, x, (1.0, 0), qdtype)
            return [(zeros, zeros)] * self.num_layers
        if not isinstance(hidden, (tuple, list)) or len(hidden) != 2:
            raise ValueError(f"{self._get_name()}: hidden must be a tuple (h_0, c_0)")
        h0, c0 = hidden
        if not isinstance(h0, Tensor):  # already a per-layer list of (h, c)
            if len(hidden) != self.num_layers:
                raise ValueError(f"{self._get_name()}: per-layer hidden states must have "
                                 f"{self.num_layers} entries")
            return list(hidden)
        want = (self.num_layers * directions, batch, self.hidden_size)
        for name, t in (("h_0", h0), ("c_0", c0)):
            if tuple(t.shape) != want:
                raise ValueError(f"{self._get_name()}: expected {name} of shape {want}, got "
                                 f"{tuple(t.shape)}")
        split = (self.num_layers, directions, batch, self.hidden_size)
        hx, cx = h0.reshape(split), c0.reshape(split)
        if directions == 1:
            return [(hx[i][0], cx[i][0]) for i in range(self.num_layers)]
        return [(hx[i], cx[i]) for i in range(self.num_layers)]

    def forward(self, x: Tensor, hidden: Optional[Union[_Hidden, list]] = None
                ) -> tuple[Tensor, _Hidden]:
        if x.dim() != 3:
            layout = "(batch, seq, feature)" if self.batch_first else "(seq, batch, feature)"
            raise ValueError(f"{self._get_name()}: expected a 3-D {layout} input, got shape "
                             f"{tuple(x.shape)}")
        if x.shape[-1] != self.input_size:
            raise ValueError(f"{self._get_name()}: input has {x.shape[-1]} features, expected "
                             f"input_size={self.input_size}")
        if self.batch_first:
            x = x.transpose(0, 1)
        if x.shape[0] == 0:
            raise ValueError(f"{self._get_name()}: the input sequence is empty")
        states = self._initial_states(x, hidden)
        hs, cs = [], []
        for layer, state in zip(self.layers, states):
            x, (h, c) = layer(x, state)
            hs.append(h)
            cs.append(c)
        h_n, c_n = torch.stack(hs), torch.stack(cs)
        h_n = h_n.reshape(-1, h_n.shape[-2], h_n.shape[-1])
        c_n = c_n.reshape(-1, c_n.shape[-2], c_n.shape[-1])
        if self.batch_first:
            x = x.transpose(0, 1)
        return x, (h_n, c_n)

    @classmethod
    def from_float(cls, other: nn.LSTM, qconfig: Any = None, split_gates: bool = False
                   ) -> "LSTM":
        """Observed copy of a float ``nn.LSTM`` (weights copied), prepared for calibration
        (``prepare_qat`` instead when ``other`` is training)."""
        if not isinstance(other, cls._FLOAT_MODULE):
            raise AssertionError(f"{cls.__name__}.from_float expects {cls._FLOAT_MODULE}, got "
                                 f"{type(other)}")
        if getattr(other, "proj_size", 0):
            raise NotImplementedError("quantizable LSTM does not support proj_size > 0")
        chosen = getattr(other, "qconfig", None) or qconfig
        if chosen is None:
            raise AssertionError("other must have a qconfig or qconfig must be given")
        observed = cls(other.input_size, other.hidden_size, other.num_layers, other.bias,
                       other.batch_first, other.dropout, other.bidirectional,
                       split_gates=split_gates)
        observed.qconfig = chosen
        for idx in range(other.num_layers):
            observed.layers[idx] = _LSTMLayer.from_float(other, idx, chosen, batch_first=False,
                                                         split_gates=split_gates)
        observed.to(next(other.parameters()).device)
        if other.training:
            observed.train()
            return _workflow.prepare_qat(observed, inplace=True)
        observed.eval()
        return _workflow.prepare(observed, inplace=True)

    @classmethod
    def from_observed(cls, other: Any) -> Any:
        raise NotImplementedError("It looks like you are trying to convert a non-quantizable "
                                  "LSTM module. Please, see the examples on quantizable LSTMs.")
