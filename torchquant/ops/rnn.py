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

Eager speed matters here (the step runs once per time step, on small tensors).  Where the
native kernels run (:mod:`torchquant.kernels.native`), :func:`lstm_sequence` /
:func:`gru_sequence` do a whole direction in one C++ call (fbgemm's projection, the cell
arithmetic fused, torch.ao's numbers) and the projections below are one fbgemm call; otherwise:

* the int8 projection picks its qparams with the scalar form of ATen's rule and quantizes
  with the float32 reciprocal of the scale (``clamp(nearbyint(fma(x, 1/s, zp)))``, fbgemm's
  quantize; ``1 / s`` rounded once from double is the correctly rounded float32 quotient; no
  NaN guard, which finite values do not need: a NaN / inf state fails the qparam choice
  first).  At a few rows on CPUs where oneDNN's int8 GEMM is slow (AVX2) the integers go
  through an exact float32 GEMM with fbgemm's fused epilogue
  (:mod:`torchquant.kernels.linear_small_m`): torch.ao's projection bit for bit;
* the gate arithmetic is torch's CPU cell arithmetic: the same ATen ops in the same order
  (merged into fewer calls only where that changes no element), run eagerly.  Nothing is
  compiled: a first call does not wait on a compiler, every call of a shape takes the same
  path, and with torch.ao's gate inputs the outputs are torch.ao's bit for bit.  The
  registered ops run the same code, so graphs and eager modules agree bit for bit.
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from .. import affine
from .. import kernels as _kernels
from ..kernels import linear as _klinear
from ..kernels import linear_small_m as _small_m
from ..kernels.packed_linear import PackedLinearWeight
from ._library import weight_qparams
from .linear import packed_linear_weight
from .linear_fp16 import PackedLinearFp16Weight, packed_linear_fp16_weight

__all__ = ["lstm_step", "gru_step", "rnn_step", "hidden_projection", "input_projection",
           "lstm_sequence", "gru_sequence", "GateWeight"]

GateWeight = Union[PackedLinearWeight, PackedLinearFp16Weight]

_NONLINEARITIES = ("tanh", "relu")


# ---- the hidden-to-hidden projection --------------------------------------------------------

def _reference_dynamic_linear() -> Callable:
    return _kernels.implementations("dynamic_linear")["reference"].fn


_ZERO_POINTS: list[Tensor] = []  # 0-d float32 zero points 0..255, made once (one per step)


def _zero_point_tensor(zp: int) -> Tensor:
    if not _ZERO_POINTS:
        _ZERO_POINTS.extend(torch.tensor(float(z)) for z in range(256))
    return _ZERO_POINTS[zp]


def _int8_projection(x: Tensor, packed: PackedLinearWeight, reduce_range: bool) -> Tensor:
    """The dynamic int8 Linear of a 2-D float32 finite ``x`` with torch.ao's (fbgemm's)
    numbers: per-tensor quint8 activations by ATen's rule, ``fma(acc, x_scale * w_scale,
    bias)`` on the exact accumulator (:mod:`torchquant.kernels.linear_small_m`); the registry's
    dynamic Linear (oneDNN's multiply-then-add epilogue, or the reference) where that cannot
    run."""
    if x.numel() == 0:
        return _klinear.dynamic_linear(x, packed, reduce_range=reduce_range)
    native = _kernels.implementations("dynamic_linear_float").get("native")
    if native is not None and _kernels.mode() == "auto" and native.accepts(
            x, {"packed": packed, "reduce_range": reduce_range}):
        return native.fn(x, packed, reduce_range, False)  # fbgemm's own numbers, one C++ call
    mn, mx = torch.aminmax(x)
    scale, zp = affine.choose_qparams_aten_scalar(mn.item(), mx.item(), 0, 255, False,
                                                  reduce_range)
    inv = affine.round_to_float32(1.0 / scale)
    if _small_m.exact_float_gemm_applies(x, packed):
        # torch.add(zp, x, alpha=inv) is the fused fma(x, inv, zp) on CPU (tested)
        codes = torch.add(_zero_point_tensor(zp), x, alpha=inv).round_().clamp_(0, 255)
        if zp:
            codes.sub_(zp)
        return _small_m.dynamic_linear_codes(codes, scale, packed)
    x_q = affine.requantize(x, torch.tensor(inv), torch.tensor(float(zp)), 0, 255, torch.uint8)
    y = _small_m.dynamic_linear_fused_epilogue(x_q, scale, zp, packed)
    if y is not None:
        return y
    fn = _kernels.get("dynamic_linear", x_q, packed=packed)
    if fn is _reference_dynamic_linear():
        return fn(x_q, torch.tensor(scale), torch.tensor(zp), packed, False)
    return fn(x_q, scale, zp, packed, False)  # the fast kernels take Python scalars


def hidden_projection(h: Tensor, packed: GateWeight, reduce_range: bool) -> Tensor:
    """``linear(h, w_hh, b_hh)`` for a 2-D float32 finite hidden state: dynamic int8
    (torch.ao's numbers, see :func:`_int8_projection`) or the float16-weight matmul.  Eager
    only (the step ops call it)."""
    if isinstance(packed, PackedLinearFp16Weight):
        return F.linear(h, packed.weight32, packed.bias)
    return _int8_projection(h, packed, reduce_range)


def _input_projection(x: Tensor, packed: PackedLinearWeight, reduce_range: bool) -> Tensor:
    if x.dim() == 0 or x.size(-1) != packed.in_features:
        raise ValueError(f"input_projection: input's last dimension must be in_features="
                         f"{packed.in_features}, got shape {tuple(x.shape)}")
    x2d = x.reshape(-1, packed.in_features).to(torch.float32)  # NaN / inf: the qparams raise
    return _int8_projection(x2d, packed, reduce_range).reshape(*x.shape[:-1],
                                                               packed.out_features)


# ---- gate arithmetic (float32, torch's CPU ops in torch's order) ----------------------------

# Where every gate's row length is a multiple of this, ATen's elementwise kernels run every
# element of a gate chunk through their vector loop (no scalar tail: AVX-512's 16 floats
# unrolled twice), so one sigmoid over all gates equals torch's per-chunk sigmoids element for
# element; other hidden sizes take torch's per-chunk form (a scalar tail can round an ulp
# apart from the vector loop).
_MERGE_GATES_MULTIPLE = 64


def _lstm_pointwise(hh: Tensor, ih: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    """torch's LSTM cell after the gate matmuls (``hh`` is the projection's own temporary and
    is overwritten): ``c' = f * c + i * g`` (two products, one add), ``h' = o * tanh(c')``."""
    gates = hh.add_(ih)
    hs = c.size(1)
    i, f, g, o = gates.unsafe_chunk(4, 1)
    if hs % _MERGE_GATES_MULTIPLE == 0:
        g = g.tanh()
        gates.sigmoid_()
    else:
        i.sigmoid_()
        f.sigmoid_()
        g.tanh_()
        o.sigmoid_()
    c = (f * c).add_(i * g)
    return o * c.tanh(), c


def _gru_pointwise(hh: Tensor, ih: Tensor, h: Tensor) -> Tensor:
    """torch's GRU cell after the gate matmuls (``hh`` overwritten): r, z =
    sigmoid(hh + ih), ``n = tanh(ih_n + r * hh_n)``, ``h' = (h - n) * z + n``."""
    hs = h.size(1)
    hh_r, hh_z, hh_n = hh.unsafe_chunk(3, 1)
    ih_r, ih_z, ih_n = ih.unsafe_chunk(3, 1)
    if hs % _MERGE_GATES_MULTIPLE == 0:
        rz = hh[:, :2 * hs].add_(ih[:, :2 * hs]).sigmoid_()
        r, z = rz[:, :hs], rz[:, hs:]
    else:
        r = hh_r.add_(ih_r).sigmoid_()
        z = hh_z.add_(ih_z).sigmoid_()
    n = ih_n.add(hh_n.mul_(r)).tanh_()
    return (h - n).mul_(z).add_(n)


def _lstm_step(ih: Tensor, h: Tensor, c: Tensor, packed: GateWeight,
               reduce_range: bool) -> tuple[Tensor, Tensor]:
    return _lstm_pointwise(hidden_projection(h, packed, reduce_range), ih, c)


def _gru_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool) -> Tensor:
    return _gru_pointwise(hidden_projection(h, packed, reduce_range), ih, h)


def _rnn_step(ih: Tensor, h: Tensor, packed: GateWeight, reduce_range: bool,
              nonlinearity: str) -> Tensor:
    pre = hidden_projection(h, packed, reduce_range).add_(ih)
    return pre.tanh_() if nonlinearity == "tanh" else pre.relu_()


# ---- graph form: the hidden weight as plain tensors -----------------------------------------

def _graph_args(packed: GateWeight) -> tuple:
    if isinstance(packed, PackedLinearFp16Weight):
        return packed.weight, None, None, packed.bias
    return (packed.weight,
            *weight_qparams(packed.weight_scale, packed.weight_zero_point, packed.axis),
            packed.bias)


def _unpack(weight: Tensor, weight_scale: Optional[Tensor], weight_zero_point: Optional[Tensor],
            bias: Optional[Tensor]) -> GateWeight:
    if weight.dtype == torch.float16:
        return packed_linear_fp16_weight(weight, bias)
    if weight_scale is None or weight_zero_point is None:
        raise ValueError("an int8 hidden weight needs its scale and zero point")
    return packed_linear_weight(weight, weight_scale, weight_zero_point, bias)


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


@torch.library.custom_op("torchquant::rnn_input_projection_dynamic", mutates_args=())
def _input_projection_op(x: Tensor, weight: Tensor, weight_scale: Tensor,
                         weight_zero_point: Tensor, bias: Optional[Tensor],
                         reduce_range: bool) -> Tensor:
    return _input_projection(x, packed_linear_weight(weight, weight_scale, weight_zero_point, bias),
                             reduce_range)


@_input_projection_op.register_fake
def _(x, weight, weight_scale, weight_zero_point, bias, reduce_range):
    return x.new_empty((*x.shape[:-1], weight.size(0)), dtype=torch.float32)


# ---- what modules call ----------------------------------------------------------------------

def _eager(ih: Tensor, h: Tensor, c: Optional[Tensor] = None) -> bool:
    """``not traced(ih, h, c)`` unrolled: it runs once per time step (plain-tensor checks
    first; dynamo shows traced tensors as plain, hence ``is_compiling`` after them)."""
    return (type(ih) is Tensor and type(h) is Tensor and (c is None or type(c) is Tensor)
            and not torch.compiler.is_compiling())


def input_projection(x: Tensor, packed: PackedLinearWeight,
                     reduce_range: bool = True) -> Tensor:
    """``linear(x, w_ih, b_ih)`` of a float ``[..., in]`` input (a layer's whole sequence, or
    a cell's batch) through an int8 weight, one activation quantization for all of it: the
    dynamic Linear with torch.ao's numbers bit for bit (fbgemm's fused epilogue on the exact
    accumulator), so the gates see what torch's do.  Float32 out."""
    if type(x) is Tensor and not torch.compiler.is_compiling():
        return _input_projection(x, packed, reduce_range)
    return torch.ops.torchquant.rnn_input_projection_dynamic(x, *_graph_args(packed),
                                                              reduce_range)


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


# ---- a whole direction in one native call ---------------------------------------------------

def _sequence_kernel(op: str, ih: Tensor, packed: GateWeight,
                     reduce_range: bool) -> Optional[Callable]:
    """The native whole-direction kernel where it runs this call (eager, int8 hidden weight),
    the registry's reference under ``TORCHQUANT_KERNELS=reference``; else None (the caller
    steps with :func:`lstm_step` / :func:`gru_step`, which have their own fast paths)."""
    if not isinstance(packed, PackedLinearWeight) or type(ih) is not Tensor \
            or torch.compiler.is_compiling():
        return None
    if _kernels.mode() == "reference":
        return _kernels.get(op, ih, packed=packed, reduce_range=reduce_range)
    native = _kernels.implementations(op).get("native")
    if native is not None and native.accepts(ih, {"packed": packed, "reduce_range": reduce_range}):
        return native.fn
    return None


def _compiled_sequence(packed: GateWeight) -> bool:
    """Under ``torch.compile`` (not export, whose graphs keep one node per step), an int8
    direction is one opaque op that runs the native loop at run time: stepping would be
    ``T`` opaque step calls, each re-reading its weight."""
    return (isinstance(packed, PackedLinearWeight) and torch.compiler.is_compiling()
            and not torch.compiler.is_exporting())


def _sequence_at_run_time(op: str, ih: Tensor, packed: PackedLinearWeight,
                          reduce_range: bool) -> Optional[Callable]:
    native = _kernels.implementations(op).get("native")
    if (_kernels.mode() == "auto" and native is not None
            and native.accepts(ih, {"packed": packed, "reduce_range": reduce_range})):
        return native.fn
    return None


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


@torch.library.custom_op("torchquant::lstm_sequence_dynamic", mutates_args=())
def _lstm_sequence_op(ih: Tensor, h0: Tensor, c0: Tensor, weight: Tensor,
                      weight_scale: Tensor, weight_zero_point: Tensor, bias: Optional[Tensor],
                      reduce_range: bool, reverse: bool) -> tuple[Tensor, Tensor, Tensor]:
    packed = packed_linear_weight(weight, weight_scale, weight_zero_point, bias)
    fn = _sequence_at_run_time("lstm_sequence", ih, packed, reduce_range)
    if fn is not None:
        out, h, c = fn(ih, h0, c0, packed, reduce_range, reverse)
    else:  # the step functions: the numbers of the eager model where no native loop runs
        h, c = h0, c0
        steps: list[Tensor] = [h0] * ih.size(0)
        for t in _steps(ih.size(0), reverse):
            h, c = _lstm_step(ih[t], h, c, packed, reduce_range)
            steps[t] = h
        out = torch.stack(steps)
    return out, h.clone(), c.clone()  # a custom op's outputs may not alias each other


@_lstm_sequence_op.register_fake
def _(ih, h0, c0, weight, weight_scale, weight_zero_point, bias, reduce_range, reverse):
    return (ih.new_empty((ih.size(0), *h0.shape)), torch.empty_like(h0),
            torch.empty_like(c0))


@torch.library.custom_op("torchquant::gru_sequence_dynamic", mutates_args=())
def _gru_sequence_op(ih: Tensor, h0: Tensor, weight: Tensor, weight_scale: Tensor,
                     weight_zero_point: Tensor, bias: Optional[Tensor], reduce_range: bool,
                     reverse: bool) -> tuple[Tensor, Tensor]:
    packed = packed_linear_weight(weight, weight_scale, weight_zero_point, bias)
    fn = _sequence_at_run_time("gru_sequence", ih, packed, reduce_range)
    if fn is not None:
        out, h = fn(ih, h0, packed, reduce_range, reverse)
    else:
        h = h0
        steps: list[Tensor] = [h0] * ih.size(0)
        for t in _steps(ih.size(0), reverse):
            h = steps[t] = _gru_step(ih[t], h, packed, reduce_range)
        out = torch.stack(steps)
    return out, h.clone()


@_gru_sequence_op.register_fake
def _(ih, h0, weight, weight_scale, weight_zero_point, bias, reduce_range, reverse):
    return ih.new_empty((ih.size(0), *h0.shape)), torch.empty_like(h0)


def lstm_sequence(ih: Tensor, h0: Tensor, c0: Tensor, packed: GateWeight, reduce_range: bool,
                  reverse: bool) -> Optional[tuple[Tensor, Tensor, Tensor]]:
    """A whole LSTM direction over ``ih`` (``[T, B, 4H]`` float32 input projections) from
    ``(h0, c0)``: ``(outputs [T, B, H], h_T, c_T)``, the same numbers as stepping with
    :func:`lstm_step`; None where no whole-direction kernel runs (then step)."""
    if _compiled_sequence(packed):
        return torch.ops.torchquant.lstm_sequence_dynamic(ih, h0, c0, *_graph_args(packed),
                                                          reduce_range, reverse)
    fn = _sequence_kernel("lstm_sequence", ih, packed, reduce_range)
    return None if fn is None else fn(ih, h0, c0, packed, reduce_range, reverse)


def gru_sequence(ih: Tensor, h0: Tensor, packed: GateWeight, reduce_range: bool,
                 reverse: bool) -> Optional[tuple[Tensor, Tensor]]:
    """:func:`lstm_sequence` for the GRU: ``(outputs [T, B, H], h_T)`` or None."""
    if _compiled_sequence(packed):
        return torch.ops.torchquant.gru_sequence_dynamic(ih, h0, *_graph_args(packed),
                                                         reduce_range, reverse)
    fn = _sequence_kernel("gru_sequence", ih, packed, reduce_range)
    return None if fn is None else fn(ih, h0, packed, reduce_range, reverse)
