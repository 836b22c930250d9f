"""Dynamic quantized recurrent modules: ``LSTM``, ``GRU``, ``RNNCell``, ``LSTMCell``, ``GRUCell``.

Float in, float out.  Every gate matmul is a dynamic quantized Linear (int8 weights packed once,
the input quantized per call, per tensor) or a float16-weight matmul, exactly the structure of
torch's CPU kernels:

* the input-to-hidden projection of a whole layer's sequence is ONE call (one set of activation
  qparams over all time steps -- torch's CPU layers precompute it the same way, packed
  sequences included: :func:`torchquant.ops.rnn.input_projection`); the hidden-to-hidden
  projection and the gate arithmetic are one :mod:`torchquant.ops.rnn` step per time step;
  int8 outputs equal torch.ao's bit for bit (fbgemm's epilogue, torch's gate ops in order);
* activations use ``reduce_range=True`` (0..127, fbgemm clamping), what torch's sequence
  modules and cell ops compute on the x86 / fbgemm engines (attribute ``reduce_range``: set it
  False for qnnpack's numbers);
* gate arithmetic in float32 in torch's order.

State dict keys are torch's: ``_all_weight_values.<k>.param`` for each layer x direction
(k = layer * num_directions + direction) holding ``(w_ih, w_hh, b_ih, b_hh)``, and the cells'
``_packed_weight_ih`` / ``_packed_weight_hh`` holding ``(weight, bias)``.  Weights are qint8
QTensors or float16 tensors (torch stores opaque packed objects under the same keys), so the
state survives ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import numbers
import warnings
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

from ..... import dtypes as _dt
from .....ops import linear as ops_linear
from .....ops import linear_fp16 as ops_linear_fp16
from .....ops import rnn as ops_rnn
from .....tensor.qtensor import QTensor
from ...modules.utils import NotScriptable
from .linear import (dynamic_weight_observer, quantize_dynamic_weight, to_float16_weight,
                     weight_dtype_of)

__all__ = ["PackedParameter", "RNNBase", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell",
           "GRUCell"]

Hidden = tuple[Tensor, ...]


# --------------------------------------------------------------------------------------------
# One gate matmul's weights
# --------------------------------------------------------------------------------------------

class _GateWeight:
    """The weight (+ bias) of one gate matmul, packed once for the ops: int8
    (:class:`~torchquant.ops.linear.PackedLinearWeight`) or float16
    (:class:`~torchquant.ops.linear_fp16.PackedLinearFp16Weight`)."""

    __slots__ = ("dtype", "packed")

    def __init__(self, weight: Tensor, bias: Optional[Tensor], dtype: Any) -> None:
        self.dtype = weight_dtype_of(dtype)
        if bias is not None:
            if isinstance(bias, QTensor) or not bias.dtype.is_floating_point:
                raise TypeError(f"an RNN bias must be a float tensor, got {bias.dtype}")
            bias = bias.detach().float().contiguous()
        self.packed: ops_rnn.GateWeight
        if self.dtype is torch.float16:
            if isinstance(weight, QTensor):
                raise TypeError("a float16 RNN weight must be a float tensor, got a QTensor")
            weight16 = to_float16_weight(weight)
            if bias is not None and bias.shape != (weight16.size(0),):
                raise ValueError(f"bias of shape {tuple(bias.shape)} does not fit a weight of "
                                 f"shape {tuple(weight16.shape)}")
            self.packed = ops_linear_fp16.pack_linear_fp16(weight16, bias)
            return
        if not isinstance(weight, QTensor) or weight.qdtype is not _dt.qint8:
            raise TypeError("a qint8 RNN weight must be a qint8 QTensor, got "
                            f"{getattr(weight, 'qdtype', getattr(weight, 'dtype', type(weight)))}")
        self.packed = ops_linear.pack_linear_weight(weight.int_data, weight.scale,
                                                    weight.zero_point, weight.axis, bias)

    @property
    def bias(self) -> Optional[Tensor]:
        return self.packed.bias

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.packed.weight.shape)  # type: ignore[return-value]

    def __call__(self, x: Tensor, reduce_range: bool) -> Tensor:
        """The dynamic quantized matmul of a float32 ``[..., in]`` input (one activation
        quantization for all of it; int8: torch.ao's numbers bit for bit)."""
        if self.dtype is torch.float16:
            return ops_linear_fp16.linear_dynamic_fp16(x, self.packed)
        return ops_rnn.input_projection(x, self.packed, reduce_range)

    def weight(self) -> Tensor:
        """qint8 QTensor, or the float16-rounded weight as float32 (what torch unpacks)."""
        p = self.packed
        if self.dtype is torch.float16:
            return p.weight32
        return QTensor.from_int(p.weight, p.weight_scale, p.weight_zero_point, _dt.qint8, p.axis)

    def state(self) -> tuple[Tensor, Optional[Tensor]]:
        """(weight, bias) as saved: the QTensor, or the float16 weight itself."""
        w = self.packed.weight if self.dtype is torch.float16 else self.weight()
        return w, self.bias

    def __reduce__(self):
        return (_GateWeight, (*self.state(), self.dtype))


def _placeholder_weight(rows: int, cols: int, dtype: Any) -> Tensor:
    if dtype is torch.float16:
        return torch.zeros(rows, cols)
    return QTensor.from_int(torch.zeros(rows, cols, dtype=torch.int8), 1.0, 0, _dt.qint8)


def _dtype_of_saved(weight: Any) -> Any:
    return _dt.qint8 if isinstance(weight, QTensor) else torch.float16


def _check_saved_shape(key: str, weight: Any, expected: tuple[int, int],
                       error_msgs: list) -> bool:
    if not isinstance(weight, torch.Tensor):
        error_msgs.append(f"{key}: expected a weight tensor, got {type(weight).__name__}")
        return False
    if tuple(weight.shape) != tuple(expected):
        error_msgs.append(f"size mismatch for {key}: copying a weight of shape "
                          f"{tuple(weight.shape)}, the module has {tuple(expected)}")
        return False
    return True


def _float_input(x: Any, what: str) -> Tensor:
    if isinstance(x, QTensor):
        raise TypeError(f"{what} takes float inputs, got a quantized tensor (dequantize it)")
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{what}: expected a float tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    return x


# --------------------------------------------------------------------------------------------
# One time step: an ops.rnn call (hidden-to-hidden projection + gate arithmetic)
# --------------------------------------------------------------------------------------------

def _lstm_cell(ih: Tensor, hidden: Hidden, w_hh: _GateWeight, reduce_range: bool) -> Hidden:
    return ops_rnn.lstm_step(ih, hidden[0], hidden[1], w_hh.packed, reduce_range)


def _gru_cell(ih: Tensor, hidden: Hidden, w_hh: _GateWeight, reduce_range: bool) -> Hidden:
    return (ops_rnn.gru_step(ih, hidden[0], w_hh.packed, reduce_range),)


def _simple_cell(nonlinearity: str):
    def cell(ih: Tensor, hidden: Hidden, w_hh: _GateWeight, reduce_range: bool) -> Hidden:
        return (ops_rnn.rnn_step(ih, hidden[0], w_hh.packed, reduce_range, nonlinearity),)
    return cell


# a whole direction in one call where a kernel runs it (None: step with the cells)
_SEQUENCES: dict[str, Callable] = {
    "LSTM": lambda ih, h0, w, rr, rev: ops_rnn.lstm_sequence(ih, h0[0], h0[1], w, rr, rev),
    "GRU": lambda ih, h0, w, rr, rev: ops_rnn.gru_sequence(ih, h0[0], w, rr, rev)}

_CELLS = {"LSTM": _lstm_cell, "GRU": _gru_cell, "RNN_TANH": _simple_cell("tanh"),
          "RNN_RELU": _simple_cell("relu")}


def _run_direction(cell: Callable, ih_steps: list[Tensor], batch_sizes: Optional[list[int]],
                   hidden: Hidden, w_hh: _GateWeight, reduce_range: bool,
                   reverse: bool) -> tuple[list[Tensor], Hidden]:
    """Run ``cell`` over precomputed input projections; returns the per-step outputs in time
    order and the final hidden state.  With ``batch_sizes`` (a packed sequence) the batch
    shrinks as sequences end: finished rows keep their last state (forward), or join when
    their sequence starts (reverse)."""
    steps = len(ih_steps)
    outputs: list[Optional[Tensor]] = [None] * steps
    order = range(steps - 1, -1, -1) if reverse else range(steps)
    if batch_sizes is None:
        for t in order:
            hidden = cell(ih_steps[t], hidden, w_hh, reduce_range)
            outputs[t] = hidden[0]
        return outputs, hidden  # type: ignore[return-value]
    initial = hidden
    if not reverse:
        finished: list[Hidden] = []
        current = batch_sizes[0]
        for t in order:
            b = batch_sizes[t]
            if b < current:
                finished.append(tuple(s[b:current] for s in hidden))
                hidden = tuple(s[:b] for s in hidden)
                current = b
            hidden = cell(ih_steps[t], hidden, w_hh, reduce_range)
            outputs[t] = hidden[0]
        finished.append(hidden)
        final = tuple(torch.cat([part[k] for part in reversed(finished)])
                      for k in range(len(hidden)))
        return outputs, final  # type: ignore[return-value]
    current = batch_sizes[-1]
    hidden = tuple(s[:current] for s in initial)
    for t in order:
        b = batch_sizes[t]
        if b > current:
            hidden = tuple(torch.cat([s, s0[current:b]]) for s, s0 in zip(hidden, initial))
            current = b
        hidden = cell(ih_steps[t], hidden, w_hh, reduce_range)
        outputs[t] = hidden[0]
    return outputs, hidden  # type: ignore[return-value]


# --------------------------------------------------------------------------------------------
# LSTM / GRU
# --------------------------------------------------------------------------------------------

class _CellParams:
    """One layer x direction: the input-to-hidden and hidden-to-hidden gate weights."""

    __slots__ = ("ih", "hh")

    def __init__(self, ih: _GateWeight, hh: _GateWeight) -> None:
        self.ih, self.hh = ih, hh

    @classmethod
    def from_weights(cls, w_ih: Tensor, w_hh: Tensor, b_ih: Optional[Tensor],
                     b_hh: Optional[Tensor], dtype: Any) -> "_CellParams":
        return cls(_GateWeight(w_ih, b_ih, dtype), _GateWeight(w_hh, b_hh, dtype))

    def state(self) -> tuple:
        (w_ih, b_ih), (w_hh, b_hh) = self.ih.state(), self.hh.state()
        return w_ih, w_hh, b_ih, b_hh

    def __reduce__(self):
        return (_CellParams, (self.ih, self.hh))


class PackedParameter(NotScriptable, nn.Module):
    """Holds one layer x direction's packed weights; saved as ``param`` = ``(w_ih, w_hh,
    b_ih, b_hh)``."""

    def __init__(self, param: _CellParams) -> None:
        super().__init__()
        self.param = param

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "param"] = self.param.state()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "param"
        if key in state_dict:
            value = state_dict.pop(key)
            if not isinstance(value, (tuple, list)) or len(value) != 4:
                error_msgs.append(f"{key}: expected a (w_ih, w_hh, b_ih, b_hh) tuple, got "
                                  f"{type(value).__name__} (torch's packed ScriptObjects cannot "
                                  "be loaded)")
            else:
                w_ih, w_hh, b_ih, b_hh = value
                ok = (_check_saved_shape(key + "[w_ih]", w_ih, self.param.ih.shape, error_msgs)
                      and _check_saved_shape(key + "[w_hh]", w_hh, self.param.hh.shape,
                                             error_msgs))
                if ok:
                    try:
                        self.param = _CellParams.from_weights(w_ih, w_hh, b_ih, b_hh,
                                                              _dtype_of_saved(w_ih))
                    except (TypeError, ValueError, RuntimeError) as exc:
                        error_msgs.append(f"{key}: {exc}")
        elif strict:
            missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys,
                                      unexpected_keys, error_msgs)

    def __repr__(self) -> str:
        return "PackedParameter()"


class RNNBase(NotScriptable, nn.Module):
    """Multi-layer dynamic quantized LSTM / GRU (``mode``), nn.LSTM's forward contract:
    ``(seq, batch, feature)`` or ``batch_first``, a ``PackedSequence``, ``hx`` optional."""

    _FLOAT_MODULE: Any = nn.RNNBase
    _version = 2
    reduce_range: bool = True

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, dtype: Any = _dt.qint8) -> None:
        super().__init__()
        if mode not in ("LSTM", "GRU"):
            raise ValueError("Unrecognized RNN mode: " + str(mode))
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):  # type: ignore[operator]
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:  # type: ignore[operator]
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", stacklevel=2)
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.dtype = weight_dtype_of(dtype)
        self.version = 2
        self.training = False
        gates = (4 if mode == "LSTM" else 3) * hidden_size
        params = []
        for layer in range(num_layers):
            layer_input = input_size if layer == 0 else hidden_size * self._num_directions
            for _ in range(self._num_directions):
                b = torch.zeros(gates) if bias else None
                params.append(PackedParameter(_CellParams.from_weights(
                    _placeholder_weight(gates, layer_input, self.dtype),
                    _placeholder_weight(gates, hidden_size, self.dtype), b,
                    None if b is None else b.clone(), self.dtype)))
        self._all_weight_values = nn.ModuleList(params)

    @property
    def _num_directions(self) -> int:
        return 2 if self.bidirectional else 1

    def _get_name(self) -> str:
        return "DynamicQuantizedRNN"

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        if self.dtype is torch.float16:
            s += ", dtype=torch.float16"
        return s

    def __repr__(self) -> str:  # the packed parameters are not children worth printing
        return f"{self._get_name()}({self.extra_repr()})"

    # ---- forward ------------------------------------------------------------------------------
    def _check_input(self, x: Tensor, packed: bool) -> None:
        name = self._get_name()
        expected = 2 if packed else 3
        if x.dim() != expected:
            layout = ("(total_steps, input_size) data of a PackedSequence" if packed else
                      "(batch, seq_len, input_size)" if self.batch_first else
                      "(seq_len, batch, input_size)")
            extra = "" if packed or x.dim() != 2 else " (unbatched input is not supported: " \
                                                      "add a batch dimension)"
            raise RuntimeError(f"{name}: input must have {expected} dimensions {layout}, got "
                               f"{x.dim()} (shape {tuple(x.shape)}){extra}")
        if x.size(-1) != self.input_size:
            raise RuntimeError(f"{name}: input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {x.size(-1)}")

    def _initial_hidden(self, hx: Any, batch: int, like: Tensor,
                        sorted_indices: Optional[Tensor]) -> Hidden:
        count = 2 if self.mode == "LSTM" else 1
        expected = (self.num_layers * self._num_directions, batch, self.hidden_size)
        if hx is None:
            zeros = like.new_zeros(expected, dtype=torch.float32)
            return (zeros,) * count
        parts = tuple(hx) if self.mode == "LSTM" else (hx,)
        if len(parts) != count:
            raise RuntimeError(f"{self._get_name()}: hx must be a (h_0, c_0) tuple")
        checked = []
        for k, part in enumerate(parts):
            part = _float_input(part, self._get_name())
            label = f"hidden[{k}]" if self.mode == "LSTM" else "hidden"
            if tuple(part.shape) != expected:
                raise RuntimeError(f"{self._get_name()}: Expected {label} size {expected}, got "
                                   f"{list(part.shape)}")
            if sorted_indices is not None:
                part = part.index_select(1, sorted_indices)
            checked.append(part.float())
        return tuple(checked)

    def _run(self, data: Tensor, batch_sizes: Optional[list[int]], hidden0: Hidden,
             steps: int) -> tuple[Tensor, Hidden]:
        """All layers over ``data`` ([steps, batch, in] padded, or [total, in] packed)."""
        cell = _CELLS[self.mode]
        rr = self.reduce_range
        finals: list[Hidden] = []
        x = data
        for layer in range(self.num_layers):
            outs = []
            for direction in range(self._num_directions):
                k = layer * self._num_directions + direction
                params = self._all_weight_values[k].param
                ih = params.ih(x, rr)  # one call for the whole sequence
                h0 = tuple(s[k] for s in hidden0)
                whole = None
                if batch_sizes is None and self.mode in _SEQUENCES:
                    whole = _SEQUENCES[self.mode](ih, h0, params.hh.packed, rr, direction == 1)
                if whole is not None:  # the whole direction in one kernel call
                    outs.append(whole[0])
                    finals.append(tuple(whole[1:]))
                    continue
                ih_steps = list(ih.unbind(0) if batch_sizes is None else ih.split(batch_sizes))
                step_out, final = _run_direction(cell, ih_steps, batch_sizes, h0, params.hh, rr,
                                                 reverse=direction == 1)
                outs.append(torch.stack(step_out) if batch_sizes is None else
                            torch.cat(step_out))
                finals.append(final)
            x = outs[0] if len(outs) == 1 else torch.cat(outs, -1)
            if self.dropout and self.training and layer + 1 < self.num_layers:
                x = F.dropout(x, self.dropout, training=True)
        hidden = tuple(torch.stack([f[i] for f in finals]) for i in range(len(hidden0)))
        return x, hidden

    def forward(self, input: Union[Tensor, PackedSequence], hx: Any = None) -> Any:
        name = self._get_name()
        if isinstance(input, PackedSequence):
            data, batch_sizes_t, sorted_indices, unsorted_indices = input
            data = _float_input(data, name)
            self._check_input(data, packed=True)
            batch_sizes = [int(b) for b in batch_sizes_t]
            hidden0 = self._initial_hidden(hx, batch_sizes[0], data, sorted_indices)
            out, hidden = self._run(data.float(), batch_sizes, hidden0, len(batch_sizes))
            out = PackedSequence(out.to(data.dtype), batch_sizes_t, sorted_indices,
                                 unsorted_indices)
            if unsorted_indices is not None:
                hidden = tuple(s.index_select(1, unsorted_indices) for s in hidden)
            dtype = data.dtype
        else:
            data = _float_input(input, name)
            self._check_input(data, packed=False)
            x = data.transpose(0, 1) if self.batch_first else data
            hidden0 = self._initial_hidden(hx, x.size(1), x, None)
            out, hidden = self._run(x.float(), None, hidden0, x.size(0))
            out = (out.transpose(0, 1) if self.batch_first else out).to(data.dtype)
            dtype = data.dtype
        hidden = tuple(s.to(dtype) for s in hidden)
        return out, (hidden if self.mode == "LSTM" else hidden[0])

    # ---- weights ------------------------------------------------------------------------------
    def _names(self):
        for layer in range(self.num_layers):
            for direction in range(self._num_directions):
                suffix = "_reverse" if direction == 1 else ""
                yield layer * self._num_directions + direction, f"l{layer}{suffix}"

    def _weight_bias(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {"weight": {}, "bias": {}}
        for k, tag in self._names():
            p = self._all_weight_values[k].param
            out["weight"][f"weight_ih_{tag}"] = p.ih.weight()
            out["weight"][f"weight_hh_{tag}"] = p.hh.weight()
            out["bias"][f"bias_ih_{tag}"] = p.ih.bias
            out["bias"][f"bias_hh_{tag}"] = p.hh.bias
        return out

    def get_weight(self) -> dict[str, Any]:
        return self._weight_bias()["weight"]

    def get_bias(self) -> dict[str, Any]:
        return self._weight_bias()["bias"]

    def set_weight_bias(self, weight_bias_dict: dict[str, Any]) -> None:
        """From a flat dict ``weight_ih_l0``, ``bias_ih_l0``, ... (``_reverse`` for the backward
        direction): qint8 QTensors, or float tensors for a float16 module."""
        params = []
        for k, tag in self._names():
            w_ih, w_hh = weight_bias_dict[f"weight_ih_{tag}"], weight_bias_dict[f"weight_hh_{tag}"]
            current = self._all_weight_values[k].param
            for key, w, shape in ((f"weight_ih_{tag}", w_ih, current.ih.shape),
                                  (f"weight_hh_{tag}", w_hh, current.hh.shape)):
                if tuple(w.shape) != tuple(shape):
                    raise ValueError(f"{key} of shape {tuple(w.shape)} does not fit "
                                     f"{self._get_name()}'s {tuple(shape)}")
            dtype = _dt.qint8 if isinstance(w_ih, QTensor) else torch.float16
            params.append(PackedParameter(_CellParams.from_weights(
                w_ih, w_hh, weight_bias_dict.get(f"bias_ih_{tag}"),
                weight_bias_dict.get(f"bias_hh_{tag}"), dtype)))
            self.dtype = dtype
        self._all_weight_values = nn.ModuleList(params)

    # ---- conversion ---------------------------------------------------------------------------
    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "RNNBase":
        """From a float ``nn.LSTM`` / ``nn.GRU`` with a ``qconfig`` (its weight observer; a
        ``None`` qconfig means ``default_dynamic_qconfig``); float16 observers keep float16
        weights.  One fresh observer per weight matrix, as torch."""
        if type(mod) not in (nn.LSTM, nn.GRU):
            raise AssertionError("nn.quantized.dynamic.RNNBase.from_float only works for "
                                 f"nn.LSTM and nn.GRU, got {type(mod)}")
        if not hasattr(mod, "qconfig"):
            raise AssertionError("Input float module must have qconfig defined")
        if getattr(mod, "proj_size", 0):
            raise NotImplementedError("dynamic quantized LSTM does not support proj_size > 0")
        dtype = dynamic_weight_observer(mod).dtype
        try:
            dtype = weight_dtype_of(dtype)
        except RuntimeError:
            raise RuntimeError(f"Unsupported dtype for dynamic RNN quantization: {dtype}") from None
        target = LSTM if mod.mode == "LSTM" else GRU
        qmod = target(mod.input_size, mod.hidden_size, mod.num_layers, mod.bias,
                      mod.batch_first, mod.dropout, mod.bidirectional, dtype)
        weights: dict[str, Any] = {}
        for _, tag in qmod._names():
            for kind in ("ih", "hh"):
                w = getattr(mod, f"weight_{kind}_{tag}")
                weights[f"weight_{kind}_{tag}"] = quantize_dynamic_weight(
                    w, dynamic_weight_observer(mod))
                weights[f"bias_{kind}_{tag}"] = getattr(mod, f"bias_{kind}_{tag}", None)
        qmod.set_weight_bias(weights)
        return qmod

    @classmethod
    def from_reference(cls, ref_mod: nn.Module) -> "RNNBase":
        """From a reference quantized LSTM / GRU (``weight_ih_l0_dtype``,
        ``get_quantized_weight_bias_dict()``)."""
        if not hasattr(ref_mod, "weight_ih_l0_dtype"):
            raise AssertionError("We are assuming weight_ih_l0 exists in the reference module")
        qmod = cls(ref_mod.input_size, ref_mod.hidden_size, ref_mod.num_layers, ref_mod.bias,
                   ref_mod.batch_first, ref_mod.dropout, ref_mod.bidirectional,
                   ref_mod.weight_ih_l0_dtype)
        qmod.set_weight_bias(ref_mod.get_quantized_weight_bias_dict())
        return qmod


class LSTM(RNNBase):
    """Dynamic quantized ``nn.LSTM``: ``forward(input, hx=None) -> (output, (h_n, c_n))``."""

    _FLOAT_MODULE = nn.LSTM

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)

    def _get_name(self) -> str:
        return "DynamicQuantizedLSTM"


class GRU(RNNBase):
    """Dynamic quantized ``nn.GRU``: ``forward(input, hx=None) -> (output, h_n)``."""

    _FLOAT_MODULE = nn.GRU

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("GRU", *args, **kwargs)

    def _get_name(self) -> str:
        return "DynamicQuantizedGRU"


# --------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------

class RNNCellBase(NotScriptable, nn.Module):
    """One step of an RNN / LSTM / GRU cell with dynamic quantized gate matmuls."""

    reduce_range: bool = True  # as torch's cell ops on x86 / fbgemm (measured: bit-equal)
    _CELL_MODE = ""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 num_chunks: int = 4, dtype: Any = _dt.qint8) -> None:
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_dtype = weight_dtype_of(dtype)
        rows = num_chunks * hidden_size
        b = torch.zeros(rows) if bias else None
        self._packed_weight_ih = _GateWeight(
            _placeholder_weight(rows, input_size, self.weight_dtype), b, self.weight_dtype)
        self._packed_weight_hh = _GateWeight(
            _placeholder_weight(rows, hidden_size, self.weight_dtype),
            None if b is None else b.clone(), self.weight_dtype)

    @property
    def bias_ih(self) -> Optional[Tensor]:
        return self._packed_weight_ih.bias

    @property
    def bias_hh(self) -> Optional[Tensor]:
        return self._packed_weight_hh.bias

    def _get_name(self) -> str:
        return "DynamicQuantizedRNNBase"

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        if self.weight_dtype is torch.float16:
            s += ", dtype=torch.float16"
        return s

    def _check_input(self, x: Any) -> Tensor:
        x = _float_input(x, self._get_name())
        if x.dim() != 2:
            raise RuntimeError(f"{self._get_name()}: input must have 2 dimensions (batch, "
                               f"input_size), got {x.dim()} (shape {tuple(x.shape)})")
        if x.size(1) != self.input_size:
            raise RuntimeError(f"{self._get_name()}: input has inconsistent input_size: got "
                               f"{x.size(1)}, expected {self.input_size}")
        return x

    def _check_hidden(self, x: Tensor, hx: Any, label: str = "") -> Tensor:
        hx = _float_input(hx, self._get_name())
        if hx.dim() != 2 or hx.size(0) != x.size(0):
            raise RuntimeError(f"{self._get_name()}: Input batch size {x.size(0)} doesn't match "
                               f"hidden{label} of shape {tuple(hx.shape)}")
        if hx.size(1) != self.hidden_size:
            raise RuntimeError(f"{self._get_name()}: hidden{label} has inconsistent hidden_size: "
                               f"got {hx.size(1)}, expected {self.hidden_size}")
        return hx.float()

    def _step(self, x: Tensor, hidden: Hidden) -> Hidden:
        ih = self._packed_weight_ih(x.float(), self.reduce_range)
        return _CELLS[self._CELL_MODE](ih, hidden, self._packed_weight_hh, self.reduce_range)

    # ---- weights ------------------------------------------------------------------------------
    def _weight_bias(self) -> dict[str, dict[str, Any]]:
        return {"weight": {"weight_ih": self._packed_weight_ih.weight(),
                           "weight_hh": self._packed_weight_hh.weight()},
                "bias": {"bias_ih": self.bias_ih, "bias_hh": self.bias_hh}}

    def get_weight(self) -> dict[str, Any]:
        return self._weight_bias()["weight"]

    def get_bias(self) -> dict[str, Any]:
        return self._weight_bias()["bias"]

    def set_weight_bias(self, weight_bias_dict: dict[str, dict[str, Any]]) -> None:
        w, b = weight_bias_dict["weight"], weight_bias_dict["bias"]
        for kind in ("ih", "hh"):
            current = getattr(self, f"_packed_weight_{kind}").shape
            if tuple(w[f"weight_{kind}"].shape) != tuple(current):
                raise ValueError(f"weight_{kind} of shape {tuple(w[f'weight_{kind}'].shape)} "
                                 f"does not fit {self._get_name()}'s {tuple(current)}")
        self._packed_weight_ih = _GateWeight(w["weight_ih"], b.get("bias_ih"), self.weight_dtype)
        self._packed_weight_hh = _GateWeight(w["weight_hh"], b.get("bias_hh"), self.weight_dtype)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "_packed_weight_ih"] = self._packed_weight_ih.state()
        destination[prefix + "_packed_weight_hh"] = self._packed_weight_hh.state()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        for kind in ("ih", "hh"):
            key = f"{prefix}_packed_weight_{kind}"
            if key not in state_dict:
                if strict:
                    missing_keys.append(key)
                continue
            value = state_dict.pop(key)
            if not isinstance(value, (tuple, list)) or len(value) != 2:
                error_msgs.append(f"{key}: expected a (weight, bias) tuple, got "
                                  f"{type(value).__name__}")
                continue
            weight, bias = value
            current = getattr(self, f"_packed_weight_{kind}")
            if not _check_saved_shape(key, weight, current.shape, error_msgs):
                continue
            dtype = _dtype_of_saved(weight)
            if dtype is not self.weight_dtype:
                error_msgs.append(f"{key}: the checkpoint holds {dtype} weights, this module "
                                  f"expects {self.weight_dtype}")
                continue
            try:
                setattr(self, f"_packed_weight_{kind}", _GateWeight(weight, bias, dtype))
            except (TypeError, ValueError, RuntimeError) as exc:
                error_msgs.append(f"{key}: {exc}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys,
                                      unexpected_keys, error_msgs)

    # ---- conversion ---------------------------------------------------------------------------
    @classmethod
    def _new_from(cls, mod: nn.Module, dtype: Any) -> "RNNCellBase":
        if type(mod) is nn.LSTMCell:
            return LSTMCell(mod.input_size, mod.hidden_size, bias=mod.bias, dtype=dtype)
        if type(mod) is nn.GRUCell:
            return GRUCell(mod.input_size, mod.hidden_size, bias=mod.bias, dtype=dtype)
        return RNNCell(mod.input_size, mod.hidden_size, bias=mod.bias,
                       nonlinearity=mod.nonlinearity, dtype=dtype)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "RNNCellBase":
        """From a float ``nn.LSTMCell`` / ``nn.GRUCell`` / ``nn.RNNCell`` with a ``qconfig``."""
        if type(mod) not in (nn.LSTMCell, nn.GRUCell, nn.RNNCell):
            raise AssertionError("nn.quantized.dynamic.RNNCellBase.from_float only works for "
                                 f"nn.LSTMCell, nn.GRUCell and nn.RNNCell, got {type(mod)}")
        if not hasattr(mod, "qconfig"):
            raise AssertionError("Input float module must have qconfig defined")
        dtype = dynamic_weight_observer(mod).dtype
        try:
            dtype = weight_dtype_of(dtype)
        except RuntimeError:
            raise RuntimeError(f"Unsupported dtype for dynamic RNN quantization: {dtype}") from None
        qmod = cls._new_from(mod, dtype)
        qmod.set_weight_bias({
            "weight": {f"weight_{k}": quantize_dynamic_weight(getattr(mod, f"weight_{k}"),
                                                              dynamic_weight_observer(mod))
                       for k in ("ih", "hh")},
            "bias": {"bias_ih": mod.bias_ih, "bias_hh": mod.bias_hh}})
        return qmod

    @classmethod
    def from_reference(cls, ref_mod: nn.Module) -> "RNNCellBase":
        """From a reference quantized cell (``weight_ih_dtype``, ``get_quantized_weight_ih()``
        / ``_hh()``)."""
        if not hasattr(ref_mod, "weight_ih_dtype"):
            raise AssertionError("We are assuming weight_ih exists in the reference module")
        kwargs: dict[str, Any] = {"dtype": ref_mod.weight_ih_dtype}
        if hasattr(ref_mod, "nonlinearity"):
            kwargs["nonlinearity"] = ref_mod.nonlinearity
        qmod = cls(ref_mod.input_size, ref_mod.hidden_size, ref_mod.bias, **kwargs)
        qmod.set_weight_bias({
            "weight": {"weight_ih": ref_mod.get_quantized_weight_ih(),
                       "weight_hh": ref_mod.get_quantized_weight_hh()},
            "bias": {"bias_ih": ref_mod.bias_ih, "bias_hh": ref_mod.bias_hh}})
        return qmod


class RNNCell(RNNCellBase):
    """``h' = act(W_ih x + b_ih + W_hh h + b_hh)``, act ``tanh`` or ``relu``."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 nonlinearity: str = "tanh", dtype: Any = _dt.qint8) -> None:
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, num_chunks=1, dtype=dtype)
        self.nonlinearity = nonlinearity

    @property
    def _CELL_MODE(self) -> str:  # type: ignore[override]
        return "RNN_TANH" if self.nonlinearity == "tanh" else "RNN_RELU"

    def _get_name(self) -> str:
        return "DynamicQuantizedRNNCell"

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x = self._check_input(input)
        h = (x.new_zeros(x.size(0), self.hidden_size, dtype=torch.float32) if hx is None
             else self._check_hidden(x, hx))
        return self._step(x, (h,))[0].to(x.dtype)


class LSTMCell(RNNCellBase):
    """One LSTM step: ``forward(input, (h, c)=None) -> (h', c')``."""

    _CELL_MODE = "LSTM"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 dtype: Any = _dt.qint8) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=4, dtype=dtype)

    def _get_name(self) -> str:
        return "DynamicQuantizedLSTMCell"

    def forward(self, input: Tensor,
                hx: Optional[tuple[Tensor, Tensor]] = None) -> tuple[Tensor, Tensor]:
        x = self._check_input(input)
        if hx is None:
            zeros = x.new_zeros(x.size(0), self.hidden_size, dtype=torch.float32)
            hidden: Hidden = (zeros, zeros)
        else:
            hidden = (self._check_hidden(x, hx[0], "[0]"), self._check_hidden(x, hx[1], "[1]"))
        h, c = self._step(x, hidden)
        return h.to(x.dtype), c.to(x.dtype)


class GRUCell(RNNCellBase):
    """One GRU step: ``forward(input, h=None) -> h'``."""

    _CELL_MODE = "GRU"

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True,
                 dtype: Any = _dt.qint8) -> None:
        super().__init__(input_size, hidden_size, bias, num_chunks=3, dtype=dtype)

    def _get_name(self) -> str:
        return "DynamicQuantizedGRUCell"

    def forward(self, input: Tensor, hx: Optional[Tensor] = None) -> Tensor:
        x = self._check_input(input)
        h = (x.new_zeros(x.size(0), self.hidden_size, dtype=torch.float32) if hx is None
             else self._check_hidden(x, hx))
        return self._step(x, (h,))[0].to(x.dtype)
