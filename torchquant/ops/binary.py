"""Quantized binary ops on plain per-tensor quantized integers, with torch's numerics.

* ``add`` (+ReLU): both operands are dequantized, added in float and requantized; torch's
  vectorised loop and its scalar tail round differently, and :mod:`._lanes` reproduces which
  elements take which path.  A repeated call (a residual add in a model: same qparams, shapes
  and layout) is bound once to one compiled-kernel call.
* ``mul`` (+ReLU) multiplies the zero-point-shifted integers exactly and requantizes the
  product with the float32 multiplier ``a_scale * b_scale * (1 / out_scale)``.
* ``add_scalar`` / ``mul_scalar`` keep the integers (nearly) unchanged under output qparams
  chosen from the input's (:func:`add_scalar_qparams`, :func:`mul_scalar_qparams`: scalar
  arithmetic only): a zero-point shift, a scale change, a flip for negative factors.
* ``cat`` requantizes every input to the output qparams: dequantize then quantize, except on
  torch's channels-last fast path (4-D, dim 1), which vectorises over 8 channels at a time.
* ``matmul`` is dequantize, float matmul, quantize.
* ``prelu`` works on integers (see :func:`prelu`), requantized like ``mul``.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

import torch

from .. import affine, kernels
from . import quantize as ops_quantize
from ..kernels import cpu_compiled
from .. import dtypes as _dt
from ._library import traced
from . import _lanes, compile_lowering

__all__ = ["add", "mul", "add_scalar", "add_scalar_qparams", "mul_scalar",
           "mul_scalar_qparams", "cat", "matmul", "prelu"]


def _f32(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


_ADD_CONSTANTS: dict[tuple, tuple] = {}  # a calibrated model reuses a handful of qparam sets


def _add_constants(a_s: float, a_z: int, b_s: float, b_z: int, scale: float, zero_point: int,
                   device: torch.device) -> tuple:
    """The fused kernel's 0-d operands (per input: scale, -zp * scale; the output's float32
    inverse scale and zero point), made once per set."""
    key = (a_s, a_z, b_s, b_z, scale, zero_point, device)
    constants = _ADD_CONSTANTS.get(key)
    if constants is None:
        xs, ys = _f32(a_s, device), _f32(b_s, device)
        inv_out = affine.inv_scale_f32(torch.tensor(scale, device=device)).to(torch.float32)
        constants = (xs, xs * _f32(-float(a_z), device), ys, ys * _f32(-float(b_z), device),
                     inv_out, _f32(float(zero_point), device))
        if len(_ADD_CONSTANTS) >= 256:
            _ADD_CONSTANTS.clear()
        _ADD_CONSTANTS[key] = constants
    return constants


# Ready-bound adds per (qparams, layout, threads, kernel mode): in a model each residual add
# repeats one call, and the checks and views around the fused kernel cost more than the kernel
# itself -- several times more right after a conv has flushed the caches (measured).
_ADD_PLANS: dict[tuple, Callable] = {}


def _eager_plan(key: tuple, to_flat: Callable, from_flat: Callable, operands: list,
                statics: tuple, compiled) -> Optional[Callable]:
    """A dense, tail-free add on another kernel than the compiled one (small tensors, the
    compiled kernel not yet hot, reference mode): the registry's kernel on flat views, as
    :func:`_lanes.apply` runs it for such operands, without its layout analysis.  Once the
    registry chooses the compiled kernel the plan drops itself, so that the next call binds
    that one (:func:`_plan`)."""
    def eager(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        flat_x = to_flat(x)
        fn = kernels.get("add", flat_x)
        if compiled is not None and fn is compiled.fn:
            _ADD_PLANS.pop(key, None)
        return from_flat(fn(flat_x, to_flat(y), *operands, *statics))
    return eager


def _plan(values_a: torch.Tensor, values_b: torch.Tensor, qd: _dt.QDType, operands: list,
          relu: bool, key: tuple = ()) -> Optional[Callable]:
    """The add as one compiled-kernel call on flat views, where it is that (dense operands,
    no tail elements, the compiled kernel chosen and hot); else None."""
    native = kernels.implementations("add").get("native")
    if (native is not None and values_a.device.type == "cpu"
            and kernels.get("add", values_a) is native.fn
            and values_a.stride() == values_b.stride()
            and (values_a.is_contiguous()
                 or values_a.is_contiguous(memory_format=torch.channels_last))):
        # the native add reads operands of one dense layout in place, whatever the size
        return kernels.native.quantized_add_plan(operands, qd.qmin, qd.qmax, relu)
    lanes = _lanes.lane_count(qd.storage_dtype)
    layout = _lanes.dense_layout([values_a, values_b], lanes, _lanes.suggested_format(values_a))
    if layout is None:
        return None
    to_flat, from_flat = layout
    flat_a = to_flat(values_a)
    statics = (qd.qmin, qd.qmax, qd.storage_dtype, relu)
    compiled = kernels.implementations("add").get("cpu_compiled")
    if compiled is None or kernels.get("add", flat_a) is not compiled.fn:
        if values_a.device.type != "cpu":  # (apply takes one reshaped path there)
            return None
        return _eager_plan(key, to_flat, from_flat, operands, statics, compiled)
    kernel = cpu_compiled.add_kernel((flat_a, to_flat(values_b), *operands, *statics))
    if kernel is None:
        return None
    return lambda x, y: from_flat(kernel([to_flat(x), to_flat(y), *operands]))


def _plan_key(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float,
              b_zp: int, out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> tuple:
    return (qd, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, relu, a.shape, a.stride(),
            b.shape, b.stride(), a.device, torch.get_num_threads(), kernels.mode())


def _add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
         out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> torch.Tensor:
    key = None
    if not torch.compiler.is_compiling():
        key = _plan_key(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qd, relu)
        plan = _ADD_PLANS.get(key)
        if plan is not None:  # this exact call was checked before
            return plan(a, b)
    operands = list(_add_constants(a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, a.device))
    inv_out = operands[4]

    def vector_path(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # One fused kernel (compiled on CPU for large tensors): the formula of
        # affine.dequantize_int_premul for both operands, then ROUND_ADD requantization.
        return kernels.get("add", x)(x, y, *operands, qd.qmin, qd.qmax, qd.storage_dtype, relu)

    def tail_path(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = (ops_quantize.dequantize_per_tensor_int(x, a_scale, a_zp)
                 + ops_quantize.dequantize_per_tensor_int(y, b_scale, b_zp))
        if relu:
            total = torch.clamp(total, min=0.0)
        return ops_quantize.quantize_with_multiplier(total, inv_out, out_zp, qd.qmin, qd.qmax,
                                                     qd.storage_dtype, affine.MUL_ADD)

    out = _lanes.apply([a, b], vector_path, tail_path, _lanes.lane_count(qd.storage_dtype),
                       _lanes.suggested_format(a))
    if key is not None and a.shape == b.shape:
        plan = _plan(a, b, qd, operands, relu, key)
        if plan is not None:
            if len(_ADD_PLANS) >= 256:
                _ADD_PLANS.clear()
            _ADD_PLANS[key] = plan
    return out


@torch.library.custom_op("torchquant::add", mutates_args=())
def _add_op(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor, b_scale: float,
            b_zero_point: int, out_scale: float, out_zero_point: int, qdtype: str,
            post_op: str) -> torch.Tensor:
    return _add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point,
                _dt.qdtype_of(qdtype), post_op == "relu")


@_add_op.register_fake
def _(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, qdtype,
      post_op):
    return torch.empty_like(a + b)


def add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qdtype: _dt.QDType, relu: bool = False) -> torch.Tensor:
    """The integers of ``quantize(relu?(a_hat + b_hat))`` (broadcasting as torch) for two
    per-tensor quantized operands of ``qdtype`` (the output's too)."""
    if traced(a, b):
        if compile_lowering.active():
            lowered = compile_lowering.add(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp,
                                           qdtype, relu)
            if lowered is not None:
                return lowered
        return torch.ops.torchquant.add(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp,
                                        qdtype.name, "relu" if relu else "none")
    return _add(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qdtype, relu)


# ---- mul -------------------------------------------------------------------------------------

def _mul(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
         out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> torch.Tensor:
    device = a.device
    multiplier = (_f32(a_scale, device) * _f32(b_scale, device)
                  * affine.inv_scale_f32(torch.tensor(out_scale, device=device)))
    wide = torch.int64 if qd.bits > 16 else torch.int32  # 8-bit products fit in int32
    product = (a.to(wide) - a_zp) * (b.to(wide) - b_zp)
    return ops_quantize.quantize_with_multiplier(product, multiplier, out_zp,
                                                 out_zp if relu else qd.qmin, qd.qmax,
                                                 qd.storage_dtype, affine.ROUND_ADD)


@torch.library.custom_op("torchquant::mul", mutates_args=())
def _mul_op(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor, b_scale: float,
            b_zero_point: int, out_scale: float, out_zero_point: int, qdtype: str,
            post_op: str) -> torch.Tensor:
    return _mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point,
                _dt.qdtype_of(qdtype), post_op == "relu")


@_mul_op.register_fake
def _(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, qdtype,
      post_op):
    return torch.empty_like(a + b, dtype=_dt.qdtype_of(qdtype).storage_dtype)


def mul(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qdtype: _dt.QDType, relu: bool = False) -> torch.Tensor:
    """The integers of ``quantize(a_hat * b_hat)`` (broadcasting as torch) for two per-tensor
    quantized operands of ``qdtype`` (the output's too); ``relu`` clamps at the output zero
    point."""
    if traced(a, b):
        return torch.ops.torchquant.mul(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp,
                                        qdtype.name, "relu" if relu else "none")
    return _mul(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qdtype, relu)


# ---- cat -------------------------------------------------------------------------------------

CAT_NHWC_LANES = 8  # channels per vector in torch's channels-last cat kernel (measured)


def _is_cat_nhwc_fast_path(tensors: Sequence[torch.Tensor], dim: int) -> bool:
    return dim == 1 and all(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
                            for t in tensors)


def _requantize_float(x: torch.Tensor, scale: float, zp: int, out_scale: float, out_zp: int,
                      qd: _dt.QDType) -> torch.Tensor:
    return ops_quantize.quantize_per_tensor_int(
        ops_quantize.dequantize_per_tensor_int(x, scale, zp), out_scale, out_zp, qd)


def _cat_nhwc_part(x: torch.Tensor, scale: float, zp: int, out_scale: float, out_zp: int,
                   qd: _dt.QDType) -> torch.Tensor:
    """One input of the channels-last cat kernel: vectors of 8 channels, scalar remainder."""
    if scale == out_scale and zp == out_zp:
        return x
    inv_out = affine.inv_scale_f32(torch.tensor(out_scale, device=x.device))
    vector = ops_quantize.quantize_with_multiplier(affine.dequantize_int_premul(x, scale, zp),
                                                   inv_out, out_zp, qd.qmin, qd.qmax,
                                                   qd.storage_dtype, affine.ROUND_ADD)
    split = x.shape[1] // CAT_NHWC_LANES * CAT_NHWC_LANES
    if split < x.shape[1]:
        rest = x[:, split:]
        vector[:, split:] = ops_quantize.quantize_with_multiplier(
            ops_quantize.dequantize_per_tensor_int(rest, scale, zp),
            inv_out, out_zp, qd.qmin, qd.qmax, qd.storage_dtype, affine.MUL_ADD)
    return vector


def _cat(tensors: Sequence[torch.Tensor], scales: Sequence[float], zero_points: Sequence[int],
         dim: int, out_scale: float, out_zp: int, qd: _dt.QDType) -> torch.Tensor:
    if _is_cat_nhwc_fast_path(tensors, dim):
        parts = [_cat_nhwc_part(t, s, z, out_scale, out_zp, qd)
                 for t, s, z in zip(tensors, scales, zero_points)]
        return torch.cat(parts, 1).contiguous(memory_format=torch.channels_last)
    return torch.cat([_requantize_float(t, s, z, out_scale, out_zp, qd)
                      for t, s, z in zip(tensors, scales, zero_points)], dim)


@torch.library.custom_op("torchquant::cat", mutates_args=())
def _cat_op(tensors: list[torch.Tensor], scales: list[float], zero_points: list[int], dim: int,
            out_scale: float, out_zero_point: int, qdtype: str) -> torch.Tensor:
    return _cat(tensors, scales, zero_points, dim, out_scale, out_zero_point,
                _dt.qdtype_of(qdtype))


@_cat_op.register_fake
def _(tensors, scales, zero_points, dim, out_scale, out_zero_point, qdtype):
    # the layouts of the eager path: requantized parts keep their inputs' layout
    storage = _dt.qdtype_of(qdtype).storage_dtype
    parts = [torch.empty_like(t, dtype=storage) for t in tensors]
    if _is_cat_nhwc_fast_path(tensors, dim):
        return torch.cat(parts, 1).contiguous(memory_format=torch.channels_last)
    return torch.cat(parts, dim)


def cat(tensors: Sequence[torch.Tensor], scales: Sequence[float], zero_points: Sequence[int],
        dim: int, out_scale: float, out_zp: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(cat([t_hat ...], dim))``: every per-tensor quantized input
    (all of ``qdtype``, with its own scale and zero point) requantized to
    (out_scale, out_zp)."""
    if traced(*tensors):
        return torch.ops.torchquant.cat(list(tensors), [float(s) for s in scales],
                                        [int(z) for z in zero_points], dim, out_scale, out_zp,
                                        qdtype.name)
    return _cat(tensors, scales, zero_points, dim, out_scale, out_zp, qdtype)


# ---- scalar add / mul --------------------------------------------------------------------------

def add_scalar_qparams(scale: float, zero_point: int, other: float,
                       qdtype: _dt.QDType) -> tuple[float, int]:
    """The output (scale, zero_point) of ``q + other``: the zero point moved by
    ``round(other / scale)`` steps; where that would leave the integer range, the zero point is
    pinned at that end and the scale widened just enough to keep every value representable."""
    steps = round(float(other) / scale)
    shifted = zero_point - steps
    if qdtype.qmin <= shifted <= qdtype.qmax:
        return scale, shifted
    span = qdtype.qmax - qdtype.qmin
    if shifted < qdtype.qmin:
        return (qdtype.qmax - shifted) / span * scale, qdtype.qmin
    return (shifted - qdtype.qmin) / span * scale, qdtype.qmax


def _add_scalar(x: torch.Tensor, scale: float, zp: int, other: float, out_scale: float,
                out_zp: int, qd: _dt.QDType, relu: bool) -> torch.Tensor:
    steps = round(float(other) / scale)
    device = x.device
    multiplier = _f32(scale, device) * affine.inv_scale_f32(torch.tensor(out_scale, device=device))
    moved = x.to(torch.int64) - zp + steps
    return ops_quantize.quantize_with_multiplier(moved, multiplier, out_zp,
                                                 out_zp if relu else qd.qmin, qd.qmax,
                                                 qd.storage_dtype, affine.ROUND_ADD)


@torch.library.custom_op("torchquant::add_scalar", mutates_args=())
def _add_scalar_op(x: torch.Tensor, scale: float, zero_point: int, other: float,
                   out_scale: float, out_zero_point: int, qdtype: str,
                   post_op: str) -> torch.Tensor:
    return _add_scalar(x, scale, zero_point, other, out_scale, out_zero_point,
                       _dt.qdtype_of(qdtype), post_op == "relu")


@_add_scalar_op.register_fake
def _(x, scale, zero_point, other, out_scale, out_zero_point, qdtype, post_op):
    return torch.empty_like(x, dtype=_dt.qdtype_of(qdtype).storage_dtype)


def add_scalar(x: torch.Tensor, scale: float, zp: int, other: float, out_scale: float,
               out_zp: int, qdtype: _dt.QDType, relu: bool = False) -> torch.Tensor:
    """The integers of ``q + other`` on the output grid (out_scale, out_zp) chosen by
    :func:`add_scalar_qparams`; ``relu`` clamps at the output zero point."""
    if traced(x):
        return torch.ops.torchquant.add_scalar(x, scale, zp, float(other), out_scale, out_zp,
                                               qdtype.name, "relu" if relu else "none")
    return _add_scalar(x, scale, zp, other, out_scale, out_zp, qdtype, relu)


def mul_scalar_qparams(scale: float, zero_point: int, other: float,
                       qdtype: _dt.QDType) -> tuple[float, int]:
    """The output (scale, zero_point) of ``q * other``: the scale times ``|other|``, the zero
    point mirrored for a negative factor; (1.0, 0) for zero."""
    factor = float(other)
    if factor == 0:
        return 1.0, 0
    if factor > 0:
        return scale * factor, zero_point
    return scale * -factor, qdtype.qmax + qdtype.qmin - zero_point


def _mul_scalar(x: torch.Tensor, other: float, qd: _dt.QDType) -> torch.Tensor:
    factor = float(other)
    if factor == 0:
        return torch.zeros_like(x)
    if factor > 0:
        return x.clone()
    return ((qd.qmax + qd.qmin) - x.to(torch.int64)).to(qd.storage_dtype)


@torch.library.custom_op("torchquant::mul_scalar", mutates_args=())
def _mul_scalar_op(x: torch.Tensor, other: float, qdtype: str) -> torch.Tensor:
    return _mul_scalar(x, other, _dt.qdtype_of(qdtype))


@_mul_scalar_op.register_fake
def _(x, other, qdtype):
    return _mul_scalar(x, other, _dt.qdtype_of(qdtype))  # layout ops only: valid on fakes


def mul_scalar(x: torch.Tensor, other: float, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``q * other`` under :func:`mul_scalar_qparams`: unchanged for a
    positive factor, mirrored within the range for a negative one, zeros for zero."""
    if traced(x):
        return torch.ops.torchquant.mul_scalar(x, float(other), qdtype.name)
    return _mul_scalar(x, other, qdtype)


# ---- matmul ----------------------------------------------------------------------------------

def _matmul(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float,
            b_zp: int, out_scale: float, out_zp: int, qd: _dt.QDType) -> torch.Tensor:
    product = torch.matmul(ops_quantize.dequantize_per_tensor_int(a, a_scale, a_zp),
                           ops_quantize.dequantize_per_tensor_int(b, b_scale, b_zp))
    return ops_quantize.quantize_per_tensor_int(product, out_scale, out_zp, qd)


@torch.library.custom_op("torchquant::matmul", mutates_args=())
def _matmul_op(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor,
               b_scale: float, b_zero_point: int, out_scale: float, out_zero_point: int,
               qdtype: str) -> torch.Tensor:
    return _matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale,
                   out_zero_point, _dt.qdtype_of(qdtype))


@_matmul_op.register_fake
def _(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, qdtype):
    product = torch.matmul(torch.empty_like(a, dtype=torch.float32),
                           torch.empty_like(b, dtype=torch.float32))
    return torch.empty_like(product, dtype=_dt.qdtype_of(qdtype).storage_dtype)


def matmul(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float,
           b_zp: int, out_scale: float, out_zp: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``quantize(a_hat @ b_hat)`` (dequantize, float matmul, quantize)."""
    if traced(a, b):
        return torch.ops.torchquant.matmul(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp,
                                           qdtype.name)
    return _matmul(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qdtype)


# ---- prelu -----------------------------------------------------------------------------------

def _prelu_weight_shape(x: torch.Tensor, weight: torch.Tensor) -> list:
    shape = [1] * x.dim()
    if x.dim() > 1:
        shape[1] = weight.numel()
    return shape


def _prelu(x: torch.Tensor, x_scale: float, x_zp: int, weight: torch.Tensor, w_scale: float,
           w_zp: int, out_scale: float, out_zp: int, qd: _dt.QDType) -> torch.Tensor:
    if x.dim() == 0:
        raise RuntimeError("qprelu: zero-dim input tensor is not allowed.")
    w_values = weight.reshape(_prelu_weight_shape(x, weight)).to(torch.int64) - w_zp
    one = affine.quantize_scalar(1.0, w_scale, w_zp, qd.qmin, qd.qmax, affine.MUL_ADD) - w_zp
    values = x.to(torch.int64)
    acc = (torch.clamp(values, min=x_zp) - x_zp) * one + (torch.clamp(values, max=x_zp) - x_zp) \
        * w_values
    device = x.device
    multiplier = (_f32(x_scale, device) * _f32(w_scale, device)
                  * affine.inv_scale_f32(torch.tensor(out_scale, device=device)))
    return ops_quantize.quantize_with_multiplier(acc, multiplier, out_zp, qd.qmin, qd.qmax,
                                                 qd.storage_dtype, affine.ROUND_ADD)


@torch.library.custom_op("torchquant::prelu", mutates_args=())
def _prelu_op(x: torch.Tensor, x_scale: float, x_zero_point: int, weight: torch.Tensor,
              weight_scale: float, weight_zero_point: int, out_scale: float, out_zero_point: int,
              qdtype: str) -> torch.Tensor:
    return _prelu(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, out_scale,
                  out_zero_point, _dt.qdtype_of(qdtype))


@_prelu_op.register_fake
def _(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, out_scale,
      out_zero_point, qdtype):
    if x.dim() == 0:
        raise RuntimeError("qprelu: zero-dim input tensor is not allowed.")
    acc = x.to(torch.int64) * weight.reshape(_prelu_weight_shape(x, weight)).to(torch.int64)
    return torch.empty_like(acc, dtype=_dt.qdtype_of(qdtype).storage_dtype)


def prelu(x: torch.Tensor, x_scale: float, x_zp: int, weight: torch.Tensor, w_scale: float,
          w_zp: int, out_scale: float, out_zp: int, qdtype: _dt.QDType) -> torch.Tensor:
    """The integers of ``max(x, 0) + w * min(x, 0)`` with the per-tensor quantized weight
    along dim 1 (or one shared weight), computed on integers: ``(q - zp)`` times the weight's
    integer above its zero point for negative inputs, times the weight grid's integer for 1.0
    for positive ones (so positive inputs shrink when 1.0 clamps on that grid, as in torch),
    requantized like :func:`mul`."""
    if traced(x, weight):
        return torch.ops.torchquant.prelu(x, x_scale, x_zp, weight, w_scale, w_zp, out_scale,
                                          out_zp, qdtype.name)
    return _prelu(x, x_scale, x_zp, weight, w_scale, w_zp, out_scale, out_zp, qdtype)
