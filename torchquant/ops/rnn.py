"""One time step of the dynamic quantized recurrent layers, as registered ops.

A dynamic LSTM / GRU / RNN projects a layer's whole input sequence once
(:func:`~torchquant.ops.linear.linear_dynamic` or
:func:`~torchquant.ops.linear_fp16.linear_dynamic_fp16`); what repeats every step is the
hidden-to-hidden projection (a dynamic quantized matmul of the hidden state) followed by the
gate arithmetic.  :func:`lstm_step`, :func:`gru_step` and :func:`rnn_step` are that step:
``ih`` (this step's input projection, input bias included) and the hidden state in, the new
hidden state out, all float32 ``[batch, ...]``.

The hidden weight is int8 (a :class:`PackedLinearWeight`: activations quantized per tensor,
quint8, torch's fbgemm numerics) or float16 (a :class:`PackedLinearFp16Weight`: float32
matmul).  In graphs it enters as the plain weight tensor -- int8 with 0-d / 1-d qparams, or
float16 with ``None`` qparams -- and the bias.

Eager speed matters here (the step runs once per time step, on small tensors):

* the int8 projection picks its qparams with the scalar form of ATen's rule and quantizes
  with the float32 reciprocal of the scale through ``affine.requantize`` -- the same integers
  as ``dynamic_linear`` (``clamp(nearbyint(fma(x, 1/s, zp)))``; ``1 / s`` rounded once from
  double is the correctly rounded float32 quotient; no NaN guard, which finite values do not
  need: a NaN / inf state fails the qparam choice first), ~4x cheaper on a hidden state;
* the gate arithmetic is torch's cell arithmetic in torch's order, merged only where that
  changes no element (one sigmoid over all four LSTM gates with the tanh gate taken apart; one
  add + sigmoid for GRU's r and z).  On CPU it runs as one inductor kernel per (batch, hidden)
  shape (:mod:`torchquant.kernels.cpu_compiled`, built on the first call so every call of a
  shape takes the same path; inductor's sigmoid / tanh may round an ulp away from eager
  torch's, and the eager form runs only where no kernel can be built).  The registered ops
  run the same code, so graphs and eager modules agree bit for bit.
"""
from __future__ import annotations

import struct
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import affine
from .. import kernels as _kernels
from ..kernels import cpu_compiled as _cpu_compiled
from ..kernels import linear as _klinear
from ..kernels.linear import PackedLinearWeight
from ._library import PackCache, weight_qparams
from .linear import pack_linear
from .linear_fp16 import PackedLinearFp16Weight, pack_linear_fp16

__all__ = ["lstm_step", "gru_step", "rnn_step", "hidden_projection", "GateWeight"]

GateWeight = Union[PackedLinearWeight, PackedLinearFp16Weight]

_NONLINEARITIES = ("tanh", "relu")


# ---- the hidden-to-hidden projection --------------------------------------------------------

def _reference_dynamic_linear() -> Callable:
    return _kernels.implementations("dynamic_linear")["reference"].fn


def hidden_projection(h: Tensor, packed: GateWeight, reduce_range: bool) -> Tensor:
    """``linear(h, w_hh, b_hh)`` for a 2-D float32 finite hidden state: dynamic int8 (the
    numbers of :func:`~torchquant.kernels.linear.dynamic_linear`, with the per-call overhead
    cut) or the float16-weight matmul.  Eager only (the step ops call it)."""
    if isinstance(packed, PackedLinearFp16Weight):
        return F.linear(h, packed.weight32, packed.bias)
    if h.numel() == 0:
        return _klinear.dynamic_linear(h, packed, reduce_range=reduce_range)
    mn, mx = torch.aminmax(h)
    scale, zp = affine.choose_qparams_aten_scalar(mn.item(), mx.item(), 0, 255, False,
                                                  reduce_range)
    inv = struct.unpack("f", struct.pack("f", 1.0 / scale))[0]
    h_q = affine.requantize(h, torch.tensor(inv), torch.tensor(float(zp)), 0, 255, torch.uint8)
    fn = _kernels.get("dynamic_linear", h_q, packed=packed)
    if fn is _reference_dynamic_linear():
        return fn(h_q, torch.tensor(scale), torch.tensor(zp), packed, False)
    return fn(h_q, scale, zp, packed, False)  # the fast kernels take Python scalars


# ---- gate arithmetic (float32, torch's CPU order) -------------------------------------------

def _lstm_pointwise(hh: Tensor, ih: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    gates = hh + ih
    hs = gates.size(1) // 4
    i, f, _, o = gates.sigmoid().chunk(4, 1)
    g = gates[:, 2 * hs:3 * hs].tanh()
    c = f * c + i * g
    return o * c.tanh(), c


def _gru_pointwise(hh: Tensor, ih: Tensor, h: Tensor) -> tuple[Tensor]:
    hs = h.size(1)
    rz = (hh[:, :2 * hs] + ih[:, :2 * hs]).sigmoid()
    r, z = rz[:, :hs], rz[:, hs:]
    n = (ih[:, 2 * hs:] + hh[:, 2 * hs:] * r).tanh()
    return ((h - n) * z + n,)


def _pointwise(source: Callable, *args: Tensor) -> tuple:
    """``source(*args)`` through its compiled CPU kernel (eager torch elsewhere)."""
    if (args[0].device.type == "cpu" and _kernels.mode() == "auto"
            and not torch.compiler.is_compiling()):
        kernel = _cpu_compiled.compiled(source.__name__, args, source, hot_calls=1)
        if kernel is not None:
            return tuple(kernel(list(args)))
    return source(*args)


def _lstm_step(ih: Tensor, h: Tensor, c: Tensor, packed: GateWeight,
               reduce_range: bool) -> tuple[Tensor, Tensor]:
    return _pointwise(_lstm_pointwise, hidden_projection(h, packed, reduce_range), ih, c)


def _gru_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool) -> Tensor:
    return _pointwise(_gru_pointwise, hidden_projection(h, packed, reduce_range), ih, h)[0]


def _rnn_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool,
              nonlinearity: str) -> Tensor:
    pre = hidden_projection(h, packed, reduce_range).add_(ih)
    return torch.tanh(pre) if nonlinearity == "tanh" else torch.relu(pre)


# ---- graph form: the hidden weight as plain tensors -----------------------------------------

_INT8_PACKS = PackCache(pack_linear)
_FP16_PACKS = PackCache(pack_linear_fp16)


def _graph_args(packed: GateWeight) -> tuple:
    if isinstance(packed, PackedLinearFp16Weight):
        return packed.weight, None, None, packed.bias
    return (packed.weight,
            *weight_qparams(packed.weight_scale, packed.weight_zero_point, packed.axis),
            packed.bias)


def _unpack(weight: Tensor, weight_scale: Optional[Tensor], weight_zero_point: Optional[Tensor],
            bias: Optional[Tensor]) -> GateWeight:
    if weight.dtype == torch.float16:
        return _FP16_PACKS.get(weight, bias)
    if weight_scale is None or weight_zero_point is None:
        raise ValueError("an int8 hidden weight needs its scale and zero point")
    return _INT8_PACKS.get(weight, weight_scale, weight_zero_point, bias)


def _check_nonlinearity(nonlinearity: str) -> None:
    if nonlinearity not in _NONLINEARITIES:
        raise ValueError(f"rnn_step: nonlinearity must be 'tanh' or 'relu', got "
                         f"{nonlinearity!r}")


@torch.library.custom_op("torchquant::lstm_step_dynamic", mutates_args=())
def _lstm_step_op(ih: Tensor, h: Tensor, c: Tensor, weight: Tensor,
                  weight_scale: Optional[Tensor], weight_zero_point: Optional[Tensor],
                  bias: Optional[Tensor], reduce_range: bool) -> tuple[Tensor, Tensor]:
    h, c = _lstm_step(ih, h, c, _unpack(weight, weight_scale, weight_zero_point, bias),
                      reduce_range)
    return h, c


@_lstm_step_op.register_fake
def _(ih, h, c, weight, weight_scale, weight_zero_point, bias, reduce_range):
    return torch.empty_like(h, dtype=torch.float32), torch.empty_like(c, dtype=torch.float32)


@torch.library.custom_op("torchquant::gru_step_dynamic", mutates_args=())
def _gru_step_op(ih: Tensor, h: Tensor, weight: Tensor, weight_scale: Optional[Tensor],
                 weight_zero_point: Optional[Tensor], bias: Optional[Tensor],
                 reduce_range: bool) -> Tensor:
    return _gru_step(ih, h, _unpack(weight, weight_scale, weight_zero_point, bias),
                     reduce_range)


@_gru_step_op.register_fake
def _(ih, h, weight, weight_scale, weight_zero_point, bias, reduce_range):
    return torch.empty_like(h, dtype=torch.float32)


@torch.library.custom_op("torchquant::rnn_step_dynamic", mutates_args=())
def _rnn_step_op(ih: Tensor, h: Tensor, weight: Tensor, weight_scale: Optional[Tensor],
                 weight_zero_point: Optional[Tensor], bias: Optional[Tensor],
                 reduce_range: bool, nonlinearity: str) -> Tensor:
    _check_nonlinearity(nonlinearity)
    return _rnn_step(ih, h, _unpack(weight, weight_scale, weight_zero_point, bias),
                     reduce_range, nonlinearity)


@_rnn_step_op.register_fake
def _(ih, h, weight, weight_scale, weight_zero_point, bias, reduce_range, nonlinearity):
    _check_nonlinearity(nonlinearity)
    return torch.empty_like(h, dtype=torch.float32)


# ---- what modules call ----------------------------------------------------------------------

def _eager(ih: Tensor, h: Tensor, c: Optional[Tensor] = None) -> bool:
    """``not traced(ih, h, c)`` unrolled: it runs once per time step (plain-tensor checks
    first; dynamo shows traced tensors as plain, hence ``is_compiling`` after them)."""
    return (type(ih) is Tensor and type(h) is Tensor and (c is None or type(c) is Tensor)
            and not torch.compiler.is_compiling())


def lstm_step(ih: Tensor, h: Tensor, c: Tensor, packed: GateWeight,
              reduce_range: bool = True) -> tuple[Tensor, Tensor]:
    """One LSTM step: gates ``ih + linear(h, w_hh, b_hh)`` (i, f, g, o), then
    ``c' = f * c + i * g`` and ``h' = o * tanh(c')``; returns ``(h', c')``."""
    if _eager(ih, h, c):
        return _lstm_step(ih, h, c, packed, reduce_range)
    return torch.ops.torchquant.lstm_step_dynamic(ih, h, c, *_graph_args(packed), reduce_range)


def gru_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool = True) -> Tensor:
    """One GRU step (torch's gate order r, z, n; ``n = tanh(ih_n + r * hh_n)``); returns
    ``h' = (h - n) * z + n``."""
    if _eager(ih, h):
        return _gru_step(ih, h, packed, reduce_range)
    return torch.ops.torchquant.gru_step_dynamic(ih, h, *_graph_args(packed), reduce_range)


def rnn_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool = True,
             nonlinearity: str = "tanh") -> Tensor:
    """One Elman step: ``h' = act(linear(h, w_hh, b_hh) + ih)``, act 'tanh' or 'relu'."""
    if _eager(ih, h):
        return _rnn_step(ih, h, packed, reduce_range, nonlinearity)
    return torch.ops.torchquant.rnn_step_dynamic(ih, h, *_graph_args(packed), reduce_range,
                                                 nonlinearity)
