"""ONNX translations of ``torch.ops.torchquant.*`` (onnxscript, traced by the torch exporter).

onnxscript is optional: without it this module still imports (``op`` / ``ir`` are None) and
:func:`torchquant.onnx.export` says what to install before anything here runs.  Each function
takes an op's arguments (ONNX values for tensors, Python values for the rest) and emits ONNX
ops:

* q / dq ops become QuantizeLinear / DequantizeLinear (per-channel ``axis`` for weights);
* the fused static ops (conv, linear, add, cat) become the QDQ pattern ONNX Runtime fuses into
  its integer kernels: DequantizeLinear of the codes and of the int8 weight initializer (and an
  int32 bias quantized with ``x_scale * w_scale``), the float op, QuantizeLinear of the output
  (a conv with an ``add`` epilogue, as PT2E's residual blocks lower to, has the float Add
  between Conv and QuantizeLinear, which ORT runs as a float conv: fusing it would need an
  intermediate quantization torchquant does not do);
* ops that only move or clamp codes (max pool, clamp) run on the uint8 codes themselves;
* dynamic Linear (and the LSTM's projections) becomes ONNX Runtime's dynamic form
  (QuantizeLinear with qparams computed by torch's rule in plain ops, MatMulInteger, a float
  rescale), because ``DynamicQuantizeLinear`` picks qparams differently from torch (no
  ``reduce_range``, another zero-point rule).

The arguments' names are the op schemas' (the exporter binds keyword arguments by name).
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

try:
    import onnx_ir as ir
    from onnxscript import opset18 as op
except ImportError:  # the optional ``onnx`` extra is absent; export() raises first
    ir = op = None

from .. import affine
from .. import dtypes as _dt

_NP_TYPES = {"quint8": np.uint8, "qint8": np.int8}


def _onnx_type(qdtype: str) -> "ir.DataType":
    return ir.DataType.UINT8 if qdtype == "quint8" else ir.DataType.INT8


def _const(value, dtype) -> ir.Value:
    return op.Constant(value=ir.tensor(np.asarray(value, dtype=dtype)))


def _f32(value: float) -> ir.Value:
    return _const(value, np.float32)


def _np_type(x: ir.Value):
    """numpy type of an integer code tensor (uint8 / int8 / int32)."""
    return {ir.DataType.UINT8: np.uint8, ir.DataType.INT8: np.int8,
            ir.DataType.INT32: np.int32}[x.dtype]


def _to_float(x: ir.Value) -> ir.Value:
    return x if x.dtype == ir.DataType.FLOAT else op.Cast(x, to=ir.DataType.FLOAT)


def _rank(x: ir.Value) -> Optional[int]:
    return None if x.shape is None else len(x.shape)


def _channel_qparams(x: ir.Value, scale: ir.Value, zero_point: ir.Value
                     ) -> tuple[ir.Value, ir.Value]:
    """A weight's qparams as DequantizeLinear takes them: float32 scale, zero point in the
    weight's own integer type (the op carries float64 / int64 tensors)."""
    return (op.Cast(scale, to=ir.DataType.FLOAT), op.Cast(zero_point, to=x.dtype))


def _dequantize_weight(weight: ir.Value, scale: ir.Value, zero_point: ir.Value,
                       axis: int) -> ir.Value:
    w_scale, w_zp = _channel_qparams(weight, scale, zero_point)
    if _rank(scale) == 0:
        return op.DequantizeLinear(weight, w_scale, w_zp)
    return op.DequantizeLinear(weight, w_scale, w_zp, axis=axis)


def _quantized_bias(bias: ir.Value, x_scale: float, weight_scale: ir.Value) -> ir.Value:
    """The float bias as int32 codes of step ``x_scale * w_scale`` then dequantized: the form
    ONNX Runtime's QDQ fusion takes for QLinearConv / QGemm (it quantizes a float bias the
    same way itself).  torch adds the bias in float after scaling the accumulator, so each
    output can move by up to half an accumulator step times ``x_scale * w_scale / out_scale``
    before rounding: the main source of one-step differences from torchquant (the exact
    forms below, ``export(..., exact=True)``, avoid it at float-conv speed in ORT)."""
    b_scale = op.Mul(op.Cast(weight_scale, to=ir.DataType.FLOAT), _f32(x_scale))
    codes = op.Cast(op.Round(op.Div(_to_float(bias), b_scale)), to=ir.DataType.INT32)
    if _rank(weight_scale) == 0:
        return op.DequantizeLinear(codes, b_scale)
    return op.DequantizeLinear(codes, b_scale, axis=0)


def _requantize(y: ir.Value, post_op: str, out_scale: float, out_zero_point: int,
                zp_type, other: Optional[ir.Value] = None, other_scale: float = 1.0,
                other_zero_point: int = 0) -> ir.Value:
    """The fused epilogue (``relu``, ``add``, ``add_relu``) then QuantizeLinear."""
    if post_op in ("add", "add_relu"):
        y = op.Add(y, op.DequantizeLinear(other, _f32(other_scale),
                                          _const(other_zero_point, _np_type(other))))
    if post_op in ("relu", "add_relu"):
        y = op.Relu(y)
    return op.QuantizeLinear(y, _f32(out_scale), _const(out_zero_point, zp_type))


# ---- quantize / dequantize ------------------------------------------------------------------

def quantize_per_tensor(x, scale: float, zero_point: int, qdtype: str,
                        rounding: Optional[str] = None):
    """QuantizeLinear (``round(x / scale) + zero_point``, half to even, saturated): torchao's
    decomposed rounding (``rounding="decomposed"``) up to the float32 rounding of the quotient,
    torch's fused multiply-add form up to ties."""
    return op.QuantizeLinear(_to_float(x), _f32(scale),
                             _const(zero_point, _NP_TYPES[qdtype]))


def dequantize_per_tensor(x, scale: float, zero_point: int):
    return op.DequantizeLinear(x, _f32(scale), _const(zero_point, _np_type(x)))


def quantize_per_channel(x, scales, zero_points, axis: int, qdtype: str):
    zp = op.Cast(zero_points, to=_onnx_type(qdtype))
    return op.QuantizeLinear(_to_float(x), op.Cast(scales, to=ir.DataType.FLOAT), zp, axis=axis)


def dequantize_per_channel(x, scales, zero_points, axis: int):
    return _dequantize_weight(x, scales, zero_points, axis)


# ---- static fused ops -----------------------------------------------------------------------

def conv(x, x_scale: float, x_zero_point: int, weight, weight_scale, weight_zero_point,
         bias, weight_axis: int, stride: Sequence[int], padding: Sequence[int],
         dilation: Sequence[int], groups: int, out_scale: float, out_zero_point: int,
         post_op: str = "none", negative_slope: float = 0.01, other=None,
         other_scale: float = 1.0, other_zero_point: int = 0):
    xf = op.DequantizeLinear(x, _f32(x_scale), _const(x_zero_point, _np_type(x)))
    wf = _dequantize_weight(weight, weight_scale, weight_zero_point, weight_axis)
    inputs = [xf, wf]
    if bias is not None:
        inputs.append(_quantized_bias(bias, x_scale, weight_scale))
    y = op.Conv(*inputs, strides=list(stride), pads=list(padding) * 2,
                dilations=list(dilation), group=groups)
    return _requantize(y, post_op, out_scale, out_zero_point, np.uint8, other, other_scale,
                       other_zero_point)


def linear(x, x_scale: float, x_zero_point: int, weight, weight_scale, weight_zero_point,
           bias, out_scale: float, out_zero_point: int, out_dtype, post_op: str = "none",
           negative_slope: float = 0.01, other=None, other_scale: float = 1.0,
           other_zero_point: int = 0):
    xf = op.DequantizeLinear(x, _f32(x_scale), _const(x_zero_point, _np_type(x)))
    wf = _dequantize_weight(weight, weight_scale, weight_zero_point, 0)
    b = None if bias is None else _quantized_bias(bias, x_scale, weight_scale)
    if _rank(x) == 2:
        y = op.Gemm(xf, wf, b, transB=1) if b is not None else op.Gemm(xf, wf, transB=1)
    else:
        y = op.MatMul(xf, op.Transpose(wf, perm=[1, 0]))
        if b is not None:
            y = op.Add(y, b)
    out_type = _out_np_type(out_dtype)
    if out_type is None:  # float output: the epilogue without the final quantize
        if post_op == "relu":
            y = op.Relu(y)
        return y
    return _requantize(y, post_op, out_scale, out_zero_point, out_type, other, other_scale,
                       other_zero_point)


# ---- exact static forms (``export(..., exact=True)``) ------------------------------------------
#
# torchquant's integers in ONNX Runtime: the codes minus their zero points as float32 and the
# integer weight as float32 go through a float Conv / MatMul, whose products and partial sums
# are integers, exact in any summation order while below 2**24 in magnitude (certain for up to
# 514 worst-case terms 255 * 128, in practice for real activations and weights), then the
# epilogue op by op in float32: ``(acc * x_scale) * w_scale[c] + bias[c]`` (the order of
# torchquant's oneDNN convs and of torch.ao's; Linears are written the same way, though
# torchquant's other GEMM paths may round a tie in another order: one step), the add / ReLU,
# ``y * (1 / out_scale)`` rounded half to even, plus the zero point, clipped.  ORT runs these
# as float ops (no QDQ unit to fuse), slower than its integer kernels.

def _codes_as_float(x: ir.Value, zero_point: int) -> ir.Value:
    """``x - zero_point`` as exact float32 integers."""
    xf = op.Cast(x, to=ir.DataType.FLOAT)
    return xf if int(zero_point) == 0 else op.Sub(xf, _f32(float(zero_point)))


def _channel_shaped(values: ir.Value, spatial_dims: int) -> ir.Value:
    """A per-output-channel float32 vector (or a scalar) shaped to broadcast over ``[N, C,
    *spatial]`` (``spatial_dims`` 0 for a Linear's ``[..., C]``)."""
    v = op.Cast(values, to=ir.DataType.FLOAT)
    if _rank(values) == 0 or spatial_dims == 0:
        return v
    return op.Reshape(v, _const([-1] + [1] * spatial_dims, np.int64))


def _weight_as_float(weight: ir.Value, zero_point: ir.Value, spatial_dims: int) -> ir.Value:
    """The int8 weight minus its zero points (per output channel, axis 0) as float32."""
    wf = op.Cast(weight, to=ir.DataType.FLOAT)
    zp = op.Cast(zero_point, to=ir.DataType.FLOAT)
    if _rank(zero_point) != 0:
        zp = op.Reshape(zp, _const([-1] + [1] * (spatial_dims + 1), np.int64))
    return op.Sub(wf, zp)


def _exact_epilogue(acc: ir.Value, x_scale: float, weight_scale: ir.Value,
                    bias: Optional[ir.Value], spatial_dims: int) -> ir.Value:
    y = op.Mul(op.Mul(acc, _f32(x_scale)), _channel_shaped(weight_scale, spatial_dims))
    if bias is not None:
        y = op.Add(y, _channel_shaped(bias, spatial_dims))
    return y


def _exact_requantize(y: ir.Value, post_op: str, out_scale: float, out_zero_point: int,
                      np_type, other: Optional[ir.Value] = None, other_scale: float = 1.0,
                      other_zero_point: int = 0) -> ir.Value:
    """The fused epilogue (the addend as ``other_scale * (other - zero point)``), then
    ``round(y * (1 / out_scale)) + zero_point`` clipped to the output type."""
    if post_op in ("add", "add_relu"):
        y = op.Add(y, op.Mul(_codes_as_float(other, other_zero_point), _f32(other_scale)))
    if post_op in ("relu", "add_relu"):
        y = op.Relu(y)
    info = np.iinfo(np_type)
    q = op.Add(op.Round(op.Mul(y, _f32(affine.inv_scale_float32(out_scale)))),
               _f32(float(out_zero_point)))
    q = op.Clip(q, _f32(float(info.min)), _f32(float(info.max)))
    return op.Cast(q, to=ir.DataType.UINT8 if np_type == np.uint8 else ir.DataType.INT8)


def conv_exact(x, x_scale: float, x_zero_point: int, weight, weight_scale, weight_zero_point,
               bias, weight_axis: int, stride: Sequence[int], padding: Sequence[int],
               dilation: Sequence[int], groups: int, out_scale: float, out_zero_point: int,
               post_op: str = "none", negative_slope: float = 0.01, other=None,
               other_scale: float = 1.0, other_zero_point: int = 0):
    dims = len(stride)
    acc = op.Conv(_codes_as_float(x, x_zero_point),
                  _weight_as_float(weight, weight_zero_point, dims), strides=list(stride),
                  pads=list(padding) * 2, dilations=list(dilation), group=groups)
    y = _exact_epilogue(acc, x_scale, weight_scale, bias, dims)
    return _exact_requantize(y, post_op, out_scale, out_zero_point, np.uint8, other,
                             other_scale, other_zero_point)


def linear_exact(x, x_scale: float, x_zero_point: int, weight, weight_scale, weight_zero_point,
                 bias, out_scale: float, out_zero_point: int, out_dtype, post_op: str = "none",
                 negative_slope: float = 0.01, other=None, other_scale: float = 1.0,
                 other_zero_point: int = 0):
    wf = _weight_as_float(weight, weight_zero_point, 0)
    acc = op.MatMul(_codes_as_float(x, x_zero_point), op.Transpose(wf, perm=[1, 0]))
    y = _exact_epilogue(acc, x_scale, weight_scale, bias, 0)
    out_type = _out_np_type(out_dtype)
    if out_type is None:
        return op.Relu(y) if post_op == "relu" else y
    return _exact_requantize(y, post_op, out_scale, out_zero_point, out_type, other,
                             other_scale, other_zero_point)


def _fma_dequantize(codes: ir.Value, scale: float, zero_point: int) -> ir.Value:
    """``fma(q, scale, -zero_point * scale)`` in float32 (torch's vectorised dequantize in its
    quantized add): the product and the difference are exact in float64, one rounding."""
    f64 = ir.DataType.DOUBLE
    s = affine.round_to_float32(scale)
    premul = affine.round_to_float32(s * -float(zero_point))
    t = op.Add(op.Mul(op.Cast(codes, to=f64), _const(s, np.float64)), _const(premul, np.float64))
    return op.Cast(t, to=ir.DataType.FLOAT)


def add_exact(a, a_scale: float, a_zero_point: int, b, b_scale: float, b_zero_point: int,
              out_scale: float, out_zero_point: int, qdtype: str, post_op: str):
    """torchquant's quantized add (:func:`torchquant.kernels.reference.add_formula`)."""
    y = op.Add(_fma_dequantize(a, a_scale, a_zero_point),
               _fma_dequantize(b, b_scale, b_zero_point))
    return _exact_requantize(y, post_op, out_scale, out_zero_point, _NP_TYPES[qdtype])


def _out_np_type(out_dtype):
    code = {torch.uint8: np.uint8, torch.int8: np.int8, torch.float32: None}
    if isinstance(out_dtype, torch.dtype):
        return code[out_dtype]
    # the exporter may pass a torch.dtype as its ONNX type number
    return {int(ir.DataType.UINT8): np.uint8, int(ir.DataType.INT8): np.int8,
            int(ir.DataType.FLOAT): None}[int(out_dtype)]


def add(a, a_scale: float, a_zero_point: int, b, b_scale: float, b_zero_point: int,
        out_scale: float, out_zero_point: int, qdtype: str, post_op: str):
    y = op.Add(op.DequantizeLinear(a, _f32(a_scale), _const(a_zero_point, _np_type(a))),
               op.DequantizeLinear(b, _f32(b_scale), _const(b_zero_point, _np_type(b))))
    return _requantize(y, post_op, out_scale, out_zero_point, _NP_TYPES[qdtype])


def cat(tensors, scales: Sequence[float], zero_points: Sequence[int], dim: int,
        out_scale: float, out_zero_point: int, qdtype: str):
    parts = [op.DequantizeLinear(t, _f32(s), _const(z, _np_type(t)))
             for t, s, z in zip(tensors, scales, zero_points)]
    return op.QuantizeLinear(op.Concat(*parts, axis=dim), _f32(out_scale),
                             _const(out_zero_point, _NP_TYPES[qdtype]))


def clamp(x, scale: float, zero_point: int, min: Optional[float], max: Optional[float],
          qdtype: str):
    """Clip of the codes with the bounds torchquant rounds (``clamp_bounds``' rule)."""
    q = _dt.qdtype_of(qdtype)
    np_type = _NP_TYPES[qdtype]

    def bound(value: Optional[float], default: int) -> ir.Value:
        if value is None:
            return _const(default, np_type)
        return _const(affine.quantize_scalar(float(value), scale, zero_point, q.qmin, q.qmax,
                                             affine.MUL_ADD), np_type)
    low, high = bound(min, q.qmin), bound(max, q.qmax)
    if min is not None and max is not None and min > max:  # torch: max everywhere
        low = high
    return op.Clip(x, low, high)


# ---- pooling on codes -----------------------------------------------------------------------

def max_pool2d(values, kernel_size: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool):
    """MaxPool on the integer codes (ONNX's MaxPool takes uint8 / int8; padding never wins,
    as in torchquant)."""
    kernel = list(kernel_size)
    pooled, _ = op.MaxPool(values, kernel_shape=kernel, strides=list(stride) or kernel,
                           pads=list(padding) * 2, dilations=list(dilation),
                           ceil_mode=int(ceil_mode))
    return pooled


def adaptive_avg_pool2d(values, zero_point: int, qdtype: str, output_size: Sequence[int]):
    """Global average of the codes, rounded half to even and saturated (output_size 1 only;
    :mod:`torchquant.onnx` rejects other sizes before export)."""
    q = _dt.qdtype_of(qdtype)
    mean = op.Round(op.GlobalAveragePool(_to_float(values)))
    mean = op.Clip(mean, _f32(q.qmin), _f32(q.qmax))
    return op.Cast(mean, to=_onnx_type(qdtype))


# ---- dynamic ops ----------------------------------------------------------------------------

def _dynamic_qparams(x: ir.Value, qmin: int, qmax: int, reduce_range: bool
                     ) -> tuple[ir.Value, ir.Value]:
    """torch's dynamic activation qparams (ATen's ChooseQuantizationParams, as
    :func:`torchquant.affine.choose_qparams_aten_scalar`) in few ONNX ops -- an LSTM runs them
    every step, and ORT pays per node: the float32 range widened to hold 0, ``reduce_range``
    halving the grid, the scale in float64, 0.1 for an all-zero input, ATen's floor on tiny
    scales.  Returns the float64 scale and the zero point as float64 (integral).

    Two of ATen's steps are folded, with the same results up to the rounding of one value:
    under the floor ATen widens the range by ``threshold / scale`` and recomputes the zero
    point from it, which is the zero point of the unwidened range (``mn * a / (scale * a)``),
    so the floor is ``max(scale, threshold)`` on the final scale only; and ATen takes the
    zero point from whichever end of the range loses less (``qmin - mn / scale`` or
    ``qmax - mx / scale``), two expressions equal but for float64 rounding (``scale`` is
    ``(mx - mn) / (qmax - qmin)``), so one is used: they round apart only on a zero point
    within ~1e-13 of a tie."""
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    f64 = ir.DataType.DOUBLE
    xf = _to_float(x)
    mn = op.Cast(op.Min(op.ReduceMin(xf, keepdims=0), _f32(0.0)), to=f64)
    mx = op.Cast(op.Max(op.ReduceMax(xf, keepdims=0), _f32(0.0)), to=f64)
    scale = op.Div(op.Sub(mx, mn), _const(float(qmax - qmin), np.float64))
    # ATen tests the float32 scale for 0 (and for an infinite reciprocal: a range below
    # ~1e-36, taken as zero here)
    scale = op.Where(op.Equal(op.Cast(scale, to=ir.DataType.FLOAT), _f32(0.0)),
                     _const(0.1, np.float64), scale)
    zp = op.Sub(_const(float(qmin), np.float64), op.Div(mn, scale))
    zp = op.Round(op.Clip(zp, _const(float(qmin), np.float64), _const(float(qmax), np.float64)))
    thr = affine.round_to_float32(affine.SMALL_SCALE_THRESHOLD)
    return op.Max(scale, _const(thr, np.float64)), zp


def _dynamic_quantize(x: ir.Value, qdtype: str, reduce_range: bool) -> tuple[ir.Value, ...]:
    """(codes, float32 scale, zero point in the codes' type, float64 scale, float64 zero
    point): QuantizeLinear with torch's dynamic qparams (values still clamp to the full
    8-bit range under ``reduce_range``, as in torch)."""
    onnx_type = _onnx_type(qdtype)
    q = _dt.qdtype_of(qdtype)
    scale64, zp64 = _dynamic_qparams(x, q.qmin, q.qmax, reduce_range)
    scale32 = op.Cast(scale64, to=ir.DataType.FLOAT)
    zp = op.Cast(zp64, to=onnx_type)
    return op.QuantizeLinear(_to_float(x), scale32, zp), scale32, zp, scale64, zp64


def quantize_dynamic_per_tensor(x, qdtype: str, reduce_range: bool,
                                qmin: Optional[int] = None, qmax: Optional[int] = None,
                                eps: Optional[float] = None):
    if eps is not None:
        return _observer_rule_quantize(x, qdtype, qmin, qmax, eps)
    codes, _, _, scale64, zp64 = _dynamic_quantize(x, qdtype, reduce_range)
    return codes, scale64, op.Cast(zp64, to=ir.DataType.INT64)


def _observer_rule_quantize(x: ir.Value, qdtype: str, qmin: Optional[int],
                            qmax: Optional[int], eps: float) -> tuple[ir.Value, ...]:
    """The op's torchao form (what ``convert_pt2e`` emits, ``eps`` given): the observer's
    float32 rule ``scale = max((max(mx, 0) - min(mn, 0)) / (qmax - qmin), eps)``,
    ``zero_point = clamp(qmin - round(min(mn, 0) / scale))``, then QuantizeLinear (round, then
    add the zero point, as torchao's decomposed quantize) clipped to [qmin, qmax]."""
    q = _dt.qdtype_of(qdtype)
    qmin = q.qmin if qmin is None else qmin
    qmax = q.qmax if qmax is None else qmax
    xf = _to_float(x)
    mn = op.Min(op.ReduceMin(xf, keepdims=0), _f32(0.0))
    mx = op.Max(op.ReduceMax(xf, keepdims=0), _f32(0.0))
    scale = op.Max(op.Div(op.Sub(mx, mn), _f32(float(qmax - qmin))),
                   _f32(affine.round_to_float32(eps)))
    zp = op.Clip(op.Sub(_f32(float(qmin)), op.Round(op.Div(mn, scale))),
                 _f32(float(qmin)), _f32(float(qmax)))
    codes = op.QuantizeLinear(xf, scale, op.Cast(zp, to=_onnx_type(qdtype)))
    if (qmin, qmax) != (q.qmin, q.qmax):
        codes = op.Clip(codes, _const(qmin, _NP_TYPES[qdtype]), _const(qmax, _NP_TYPES[qdtype]))
    return (codes, op.Cast(scale, to=ir.DataType.DOUBLE),
            op.Cast(zp, to=ir.DataType.INT64))


def _dynamic_matmul(x: ir.Value, weight: ir.Value, weight_scale: ir.Value,
                    weight_zero_point: ir.Value, bias: Optional[ir.Value],
                    reduce_range: bool) -> ir.Value:
    """torchquant's dynamic int8 Linear as ONNX Runtime's dynamic form: quint8 codes of ``x``
    by torch's rule, MatMulInteger against the int8 weight (transposed initializer, per-column
    zero points), ``acc * (x_scale * w_scale) + bias`` in float32."""
    codes, x_scale, x_zp, _, _ = _dynamic_quantize(x, "quint8", reduce_range)
    w_zp = op.Cast(weight_zero_point, to=weight.dtype)
    acc = op.MatMulInteger(codes, op.Transpose(weight, perm=[1, 0]), x_zp, w_zp)
    y = op.Mul(op.Cast(acc, to=ir.DataType.FLOAT),
               op.Mul(x_scale, op.Cast(weight_scale, to=ir.DataType.FLOAT)))
    if bias is not None:
        y = op.Add(y, _to_float(bias))
    return y


def linear_dynamic(x, weight, weight_scale, weight_zero_point, bias, reduce_range: bool,
                   relu: bool):
    y = _dynamic_matmul(x, weight, weight_scale, weight_zero_point, bias, reduce_range)
    return op.Relu(y) if relu else y


def rnn_input_projection_dynamic(x, weight, weight_scale, weight_zero_point, bias,
                                 reduce_range: bool):
    """The whole sequence's input projection: one set of qparams over all of ``x``, as
    torchquant's flattened 2-D call."""
    return _dynamic_matmul(x, weight, weight_scale, weight_zero_point, bias, reduce_range)


def lstm_step_dynamic(ih, h, c, weight, weight_scale, weight_zero_point, bias,
                      reduce_range: bool):
    """One LSTM step: the hidden projection as a dynamic int8 MatMulInteger (qparams of ``h``
    each step, as torchquant), then torch's cell arithmetic (gates i, f, g, o)."""
    gates = op.Add(_dynamic_matmul(h, weight, weight_scale, weight_zero_point, bias,
                                   reduce_range), ih)
    i, f, g, o = op.Split(gates, axis=1, num_outputs=4)
    c_next = op.Add(op.Mul(op.Sigmoid(f), c), op.Mul(op.Sigmoid(i), op.Tanh(g)))
    h_next = op.Mul(op.Sigmoid(o), op.Tanh(c_next))
    return h_next, c_next


def table(exact: bool = False) -> dict:
    """{torch op overload: translation} for ``torch.onnx.export(custom_translation_table=)``;
    ``exact``: the static conv / Linear / add in their exact forms."""
    ops = torch.ops.torchquant
    by_name = {**_BY_NAME, **_EXACT_BY_NAME} if exact else _BY_NAME
    return {getattr(ops, name).default: fn for name, fn in by_name.items()}


_BY_NAME = {
    "quantize_per_tensor": quantize_per_tensor,
    "dequantize_per_tensor": dequantize_per_tensor,
    "quantize_per_channel": quantize_per_channel,
    "dequantize_per_channel": dequantize_per_channel,
    "conv": conv,
    "linear": linear,
    "add": add,
    "cat": cat,
    "clamp": clamp,
    "max_pool2d": max_pool2d,
    "adaptive_avg_pool2d": adaptive_avg_pool2d,
    "quantize_dynamic_per_tensor": quantize_dynamic_per_tensor,
    "linear_dynamic": linear_dynamic,
    "rnn_input_projection_dynamic": rnn_input_projection_dynamic,
    "lstm_step_dynamic": lstm_step_dynamic,
}

_EXACT_BY_NAME = {"conv": conv_exact, "linear": linear_exact, "add": add_exact}
