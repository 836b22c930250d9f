"""Int8 Linear kernels: static, dynamic and per-token dynamic matmuls.

Weights are packed once into a :class:`~.packed_linear.PackedLinearWeight`; every call then
picks a kernel through the registry:

* ``onednn`` -- ``torch.ops.onednn.qlinear_pointwise`` on a oneDNN-blocked weight: u8 x s8 with
  the activation zero point, the requantization (or float output) and the static post-op
  (:class:`~.post_ops.PostOp`: relu, leaky_relu, tanh, add, add_relu) fused.  Fastest
  once there are a few rows; its fixed per-call cost loses at batch 1.  On CPUs without an
  int32-accumulating u8 x s8 instruction (AVX2 / AVX-512 without VNNI or AMX) oneDNN's
  ``vpmaddubsw`` saturates ``u8*s8 + u8*s8`` to int16 and the GEMM is wrong for activations
  above 128; there (found once by :func:`~.onednn_exactness.onednn_u8_exact_max`) the kernel
  checks the input's maximum and runs larger inputs as two exact halves
  (:func:`onednn_split_linear`).
* ``int_mm`` -- ``torch._int_mm`` (s8 x s8 -> s32) on the plain weight plus one epilogue;
  uint8 activations are shifted to int8 (``x ^ 0x80 == x - 128``) and the shift is folded into
  a per-channel correction.  Wins at one or two rows; also the CUDA path.
* ``reference`` -- dequantize, float ``linear``, post-op, quantize (the numerics contract).

Fast kernels need symmetric weights (all weight zero points 0), which is what every torch
qconfig produces; asymmetric weights run on the reference.  Static results agree with the
reference within one output step (float rounding differs near ties).

The pieces these kernels share with others have homes of their own: the CPU exactness probes
in :mod:`.onednn_exactness` (read through that module at call time), the argument checks and
call keys in :mod:`.arguments`, the post-op vocabulary and requantization in :mod:`.post_ops`,
the packed weight in :mod:`.packed_linear`.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F

from .. import _config
from . import cpu_compiled, onednn_exactness as _exactness, sparse_correction
from .arguments import (PLAN_CACHE_SIZE, Scalar, activation_qdtype, call_key, output_qdtype,
                        validated_qparams)
from .packed_linear import PackedLinearWeight
from .post_ops import (DEFAULT_NEGATIVE_SLOPE, post_op_of, quantize_float_result,
                       quantize_post_op)
from .reference import quantize_formula
from .registry import get, mode, register
from .. import affine
from .. import dtypes as _dt

__all__ = ["quantized_linear", "linear_plan", "dynamic_linear", "per_token_dynamic_linear",
           "onednn_split_linear"]

# Below this many rows ``_int_mm`` + epilogue is used instead of oneDNN.  On the AMX Xeon of
# the benchmarks oneDNN wins from one row (1x768x3072: 48 us against _int_mm's 131 us; an AMD
# EPYC measured earlier favoured _int_mm at one row), so oneDNN takes every row count.
ONEDNN_MIN_ROWS = _config.onednn_min_rows()
_UINT8_TO_INT8_SHIFT = 128
_SIGN_BIT = torch.tensor(-128, dtype=torch.int8)  # x_u8 ^ 0x80 viewed as int8 == x_u8 - 128
_EPILOGUE_CACHE_SIZE = 8


def _as_signed(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """int8 values for ``_int_mm`` and the shift subtracted from them (128 for uint8)."""
    if x.dtype == torch.uint8:
        return torch.bitwise_xor(x.view(torch.int8), _SIGN_BIT), _UINT8_TO_INT8_SHIFT
    return x, 0


def _int_mm_available() -> bool:
    return torch.cuda.is_available() or _exactness.int_mm_exact_on_cpu()


def _int_mm_applies(x: torch.Tensor, packed: PackedLinearWeight, **_: Any) -> bool:
    if not packed.symmetric or x.device != packed.weight.device:
        return False
    if x.device.type == "cuda":  # cuBLASLt's int8 GEMM constraints
        return x.size(0) > 16 and x.size(1) % 8 == 0 and packed.out_features % 8 == 0
    return x.size(0) > 0 and _exactness.int_mm_exact_on_cpu()


def _onednn_applies(x: torch.Tensor, packed: PackedLinearWeight, **_: Any) -> bool:
    return (packed.onednn_weight is not None and x.dtype == torch.uint8
            and x.size(0) >= ONEDNN_MIN_ROWS)


# --------------------------------------------------------------------------------------------
# Static: quantized activations in, requantized activations out
# --------------------------------------------------------------------------------------------

def quantized_linear(x_int: torch.Tensor, x_scale: Scalar, x_zero_point: Scalar,
                     packed: PackedLinearWeight, out_scale: Scalar, out_zero_point: Scalar,
                     out_dtype: Any = _dt.quint8, post_op: str = "none", *,
                     negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
                     other: Optional[torch.Tensor] = None, other_scale: Scalar = 1.0,
                     other_zero_point: Scalar = 0) -> torch.Tensor:
    """``quantize(post_op(linear(x_hat, w_hat, bias)), out_scale, out_zero_point)`` on integers.

    ``x_int`` holds the uint8 (quint8) or int8 (qint8) values of a per-tensor quantized input
    ``[..., in_features]``; the result holds ``out_dtype`` values ``[..., out_features]``.
    ``post_op`` (:class:`PostOp`) is fused before the one requantization: ``relu``,
    ``leaky_relu`` (``negative_slope``), ``tanh``, or ``add`` / ``add_relu`` of ``other``
    (integers of the output's shape quantized with ``other_scale`` / ``other_zero_point``).
    """
    key = None if other is not None else call_key(x_int, x_scale, x_zero_point, out_scale,
                                                    out_zero_point, out_dtype, post_op,
                                                    negative_slope)
    plan = packed.plans.get(key) if key is not None else None
    if plan is not None:  # this exact call was checked before
        return plan(x_int)
    if key is not None:
        plan = linear_plan(x_int, x_scale, x_zero_point, packed, out_scale, out_zero_point,
                           out_dtype, post_op, negative_slope)
        if len(packed.plans) >= PLAN_CACHE_SIZE:
            packed.plans.clear()
        packed.plans[key] = plan
        return plan(x_int)
    op = "quantized_linear"
    x_qdtype = activation_qdtype(x_int, op)
    out_qdtype = output_qdtype(out_dtype, op)
    if x_int.dim() == 0 or x_int.size(-1) != packed.in_features:
        raise ValueError(f"{op}: input's last dimension must be in_features="
                         f"{packed.in_features}, got shape {tuple(x_int.shape)}")
    out_shape = (*x_int.shape[:-1], packed.out_features)
    epilogue = post_op_of(post_op, negative_slope, other, other_scale, other_zero_point,
                          out_shape, op)
    qparams = validated_qparams(x_scale, x_zero_point, x_qdtype, out_scale, out_zero_point,
                                out_qdtype)
    x2d = x_int.reshape(-1, packed.in_features)
    if other is not None:
        other = other.reshape(-1, packed.out_features)
    fn = get("quantized_linear", x2d, packed=packed, out_qdtype=out_qdtype,
             post_op=epilogue.name)
    x_scale, x_zero_point, out_scale, out_zero_point = qparams
    y = fn(x2d, x_scale, x_zero_point, packed, out_scale, out_zero_point, out_qdtype, epilogue,
           other)
    return y.reshape(out_shape)


def linear_plan(x_int: torch.Tensor, x_scale: Scalar, x_zero_point: Scalar,
                packed: PackedLinearWeight, out_scale: Scalar, out_zero_point: Scalar,
                out_dtype: Any = _dt.quint8, post_op: str = "none",
                negative_slope: float = DEFAULT_NEGATIVE_SLOPE) -> Callable[[torch.Tensor],
                                                                           torch.Tensor]:
    """:func:`quantized_linear` (no added ``other``) for inputs of ``x_int``'s shape, dtype and
    device, with its checks done and its kernel chosen once: ``plan(x) == quantized_linear(x,
    x_scale, ...)`` for such ``x``.  The oneDNN kernel's call is bound; whether it is exact for
    ``x`` (:func:`~.onednn_exactness.onednn_exact_for`) is still asked per call."""
    op = "quantized_linear"
    x_qdtype = activation_qdtype(x_int, op)
    out_qdtype = output_qdtype(out_dtype, op)
    in_features = packed.in_features
    if x_int.dim() == 0 or x_int.size(-1) != in_features:
        raise ValueError(f"{op}: input's last dimension must be in_features="
                         f"{in_features}, got shape {tuple(x_int.shape)}")
    out_shape = (*x_int.shape[:-1], packed.out_features)
    epilogue = post_op_of(post_op, negative_slope, None, 1.0, 0, out_shape, op)
    x_scale, x_zero_point, out_scale, out_zero_point = validated_qparams(
        x_scale, x_zero_point, x_qdtype, out_scale, out_zero_point, out_qdtype)
    fn = get("quantized_linear", x_int.reshape(-1, in_features), packed=packed,
             out_qdtype=out_qdtype, post_op=epilogue.name)
    args = (x_scale, x_zero_point, packed, out_scale, out_zero_point, out_qdtype, epilogue, None)
    run = lambda x2d: fn(x2d, *args)  # noqa: E731
    bind = getattr(fn, "plan", None)  # a kernel that binds its own call (the native one)
    if bind is not None:
        run = bind(x_int.reshape(-1, in_features), *args[:-1]) or run
    if fn is _quantized_linear_onednn:
        bound = (float(x_scale), int(x_zero_point), packed.onednn_weight, packed.channel_scale,
                 packed.channel_zero_point, packed.bias, float(out_scale), int(out_zero_point),
                 None, epilogue.name,
                 [epilogue.negative_slope] if epilogue.name == "leaky_relu" else [], "")
        qlinear = torch.ops.onednn.qlinear_pointwise.default

        def run(x2d: torch.Tensor) -> torch.Tensor:  # _quantized_linear_onednn, bound
            if _exactness.onednn_exact_for(x2d):
                return qlinear(x2d, *bound)
            return fn(x2d, *args)
    if x_int.dim() == 2:
        return run
    return lambda x: run(x.reshape(-1, in_features)).reshape(out_shape)


@register("quantized_linear", "reference")
def _quantized_linear_reference(x, x_scale, x_zp, packed, out_scale, out_zp, out_qdtype, post_op,
                                other):
    x_hat = affine.dequantize_int(x, torch.as_tensor(x_scale), torch.as_tensor(x_zp))
    y = F.linear(x_hat, packed.dequantized_weight(), packed.bias)
    return quantize_post_op(y, post_op, other, out_scale, out_zp, out_qdtype)


def _requant_epilogue(packed: PackedLinearWeight, x_scale: float, x_zp: int, shift: int,
                      out_scale: float, out_zp: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(multiplier, offset) with ``q = acc * multiplier + offset`` for ``acc = (x - shift) @ w.T``:
    multiplier = x_scale * w_scale / out_scale,
    offset = multiplier * (shift - x_zp) * sum_k w + bias / out_scale + out_zp."""
    key = (x_scale, x_zp, shift, out_scale, out_zp)
    cached = packed.requant_epilogues.get(key)
    if cached is None:
        multiplier = packed.channel_scale * (x_scale / out_scale)
        offset = torch.addcmul(torch.full_like(multiplier, float(out_zp)), multiplier,
                               packed.weight_sum, value=shift - x_zp)
        if packed.bias is not None:
            offset.add_(packed.bias, alpha=1.0 / out_scale)
        if len(packed.requant_epilogues) >= _EPILOGUE_CACHE_SIZE:
            packed.requant_epilogues.clear()
        cached = packed.requant_epilogues[key] = (multiplier, offset)
    return cached


@register("quantized_linear", "int_mm", devices=("cpu", "cuda"), applies=_int_mm_applies,
          available=_int_mm_available)
def _quantized_linear_int_mm(x, x_scale, x_zp, packed, out_scale, out_zp, out_qdtype, post_op,
                             other):
    if post_op.name != "none" and post_op.name != "relu":  # epilogue on the float result
        y = _dynamic_linear_int_mm(x, x_scale, x_zp, packed, False)
        return quantize_post_op(y, post_op, other, out_scale, out_zp, out_qdtype)
    x_signed, shift = _as_signed(x)
    acc = torch._int_mm(x_signed, packed.weight.t())
    oz = int(out_zp)
    multiplier, offset = _requant_epilogue(packed, float(x_scale), int(x_zp), shift,
                                           float(out_scale), oz)
    lo = max(out_qdtype.qmin, oz) if post_op.relu else out_qdtype.qmin
    return affine.requantize(acc, multiplier, offset, lo, out_qdtype.qmax,
                             out_qdtype.storage_dtype)


def _sparse_scale_order(packed: PackedLinearWeight, rows: int,
                        x_scale: float) -> Optional[str]:
    """How oneDNN rounds the scaling of the high half of ``rows``-row inputs
    (:func:`.sparse_correction.matching_scale_order`), probed once per row count, scale and
    thread count with a dense random 0/1 input; cached with the requantization epilogues."""
    key = ("sparse_scale_order", rows, x_scale, torch.get_num_threads())
    if key in packed.requant_epilogues:
        return packed.requant_epilogues[key]
    generator = torch.Generator(device=packed.weight.device).manual_seed(0)
    probe = torch.randint(0, 2, (rows, packed.in_features), generator=generator,
                          dtype=torch.uint8, device=packed.weight.device)
    high = torch.ops.onednn.qlinear_pointwise(
        probe, x_scale * 128.0, 0, packed.onednn_weight, packed.channel_scale,
        packed.channel_zero_point, None, 1.0, 0, torch.float32, "none", [], "")
    dtype = sparse_correction.exact_sums_dtype(packed.in_features)
    sums = probe.to(dtype) @ packed.weight.to(dtype).t()
    if len(packed.requant_epilogues) >= _EPILOGUE_CACHE_SIZE:
        packed.requant_epilogues.clear()
    order = packed.requant_epilogues[key] = sparse_correction.matching_scale_order(
        high, sums, x_scale, packed.channel_scale)
    return order


def onednn_split_linear(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar,
                        packed: PackedLinearWeight, with_bias: bool = True) -> torch.Tensor:
    """``linear(x_hat, w_hat, bias)`` in float32 through oneDNN on a CPU whose u8 x s8 products
    saturate int16 pairs above 128: ``x = lo + 128 * hi`` with ``lo = x & 127`` and
    ``hi = x >> 7`` are both exact for it, and ``(x - zp) . w = (lo - zp) . w + 128 * hi . w``.
    One GEMM of ``lo`` plus the high half: a second GEMM where ``hi`` is dense, its few nonzero
    entries' weight columns scattered where it is sparse
    (:mod:`.sparse_correction`, the same floats), nothing where it is zero (vs the exact but
    unvectorised ``_int_mm`` on such CPUs)."""
    bits = sparse_correction.high_bits(x, x.size(0) * packed.weight.numel()
                                       >= sparse_correction.SPARSE_MIN_MACS)
    split = bits.top > 127
    y = torch.ops.onednn.qlinear_pointwise(
        torch.bitwise_and(x, 127) if split else x, float(x_scale), int(x_zp),
        packed.onednn_weight, packed.channel_scale, packed.channel_zero_point,
        packed.bias if with_bias else None, 1.0, 0, torch.float32, "none", [], "")
    if not split:
        return y
    order = (None if bits.flat is None
             else _sparse_scale_order(packed, x.size(0), float(x_scale)))
    if order is not None:
        return sparse_correction.linear_correction_(y, bits, float(x_scale), order,
                                                    packed.weight, packed.channel_scale)
    return y.add_(torch.ops.onednn.qlinear_pointwise(
        torch.bitwise_right_shift(x, 7), float(x_scale) * 128.0, 0, packed.onednn_weight,
        packed.channel_scale, packed.channel_zero_point, None, 1.0, 0, torch.float32, "none",
        [], ""))


@register("quantized_linear", "onednn", devices=("cpu",),
          applies=lambda x, packed, out_qdtype, **_: _onednn_applies(x, packed)
          and out_qdtype == _dt.quint8, available=_exactness.onednn_usable)
def _quantized_linear_onednn(x, x_scale, x_zp, packed, out_scale, out_zp, out_qdtype, post_op,
                             other):
    """oneDNN's fused post-ops: eltwise relu / leaky_relu / tanh (torch's LinearReLU,
    LinearLeakyReLU and LinearTanh run these very kernels, so the results are torch's), and the
    adds as its in-place ``sum`` into a copy of the added (quint8) tensor."""
    if not _exactness.onednn_exact_for(x):  # would saturate on this CPU: two exact halves
        y = onednn_split_linear(x, x_scale, x_zp, packed)
        return quantize_post_op(y, post_op, other, out_scale, out_zp, out_qdtype)
    if post_op.adds:
        if other.dtype != torch.uint8:
            y = _dynamic_linear_onednn(x, x_scale, x_zp, packed, False)
            return quantize_post_op(y, post_op, other, out_scale, out_zp, out_qdtype)
        accum = other.clone(memory_format=torch.contiguous_format)  # oneDNN writes into it
        return torch.ops.onednn.qlinear_pointwise.binary(
            x, float(x_scale), int(x_zp), packed.onednn_weight, packed.channel_scale,
            packed.channel_zero_point, accum, packed.bias, float(out_scale), int(out_zp), None,
            post_op.other_scale, post_op.other_zero_point, "sum", 1.0,
            "relu" if post_op.relu else "none", [], "")
    return torch.ops.onednn.qlinear_pointwise(
        x, float(x_scale), int(x_zp), packed.onednn_weight, packed.channel_scale,
        packed.channel_zero_point, packed.bias, float(out_scale), int(out_zp), None,
        post_op.name, [post_op.negative_slope] if post_op.name == "leaky_relu" else [], "")


# --------------------------------------------------------------------------------------------
# Dynamic: float in, activation quantized per call, float out
# --------------------------------------------------------------------------------------------

def _check_float_input(x: torch.Tensor, packed: PackedLinearWeight, op: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
        raise TypeError(f"{op}: expected a float input, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() == 0 or x.size(-1) != packed.in_features:
        raise ValueError(f"{op}: input's last dimension must be in_features="
                         f"{packed.in_features}, got shape {tuple(x.shape)}")
    return x.detach().reshape(-1, packed.in_features).to(torch.float32)


def _float_linear_out(x: torch.Tensor, packed: PackedLinearWeight,
                      kernel: Callable[[torch.Tensor], torch.Tensor], op: str) -> torch.Tensor:
    """Run ``kernel`` on the 2-D float32 view of ``x``; restore its leading shape and dtype."""
    x2d = _check_float_input(x, packed, op)
    if x2d.size(0) == 0:
        y = x2d.new_zeros(0, packed.out_features)
    else:
        y = kernel(x2d)
    return y.reshape(*x.shape[:-1], packed.out_features).to(x.dtype)


def dynamic_linear(x_float: torch.Tensor, packed: PackedLinearWeight, reduce_range: bool = True,
                   relu: bool = False) -> torch.Tensor:
    """torch's dynamic quantized Linear: quantize ``x`` per tensor from its min/max, int8 GEMM,
    float output (``relu`` applied to it).

    Activations are quint8 with ATen's qparam rule; ``reduce_range=True`` (the x86 / fbgemm
    qconfigs) chooses them for 0..127 -- but, as fbgemm does, values are clamped to 0..255, so
    the top of the range can land on 128.  ``reduce_range=False`` gives qnnpack's numbers.
    """
    if (type(x_float) is torch.Tensor and x_float.dtype == torch.float32 and x_float.dim() >= 2
            and x_float.numel() and x_float.size(-1) == packed.weight.size(1)
            and not x_float.requires_grad):
        # the common call (float32, no autograd) without the checks, detach and casts of the
        # general path: they were a third of a small call's time
        x2d = x_float if x_float.dim() == 2 else x_float.reshape(-1, x_float.size(-1))
        fn = get("dynamic_linear_float", x2d, packed=packed, reduce_range=reduce_range)
        y = fn(x2d, packed, reduce_range, relu)
        return y if x_float.dim() == 2 else y.reshape(*x_float.shape[:-1], y.size(-1))

    def kernel(x2d: torch.Tensor) -> torch.Tensor:
        fn = get("dynamic_linear_float", x2d, packed=packed, reduce_range=reduce_range)
        return fn(x2d, packed, reduce_range, relu)
    return _float_linear_out(x_float, packed, kernel, "dynamic_linear")


@register("dynamic_linear_float", "reference")
def _dynamic_linear_float_reference(x2d: torch.Tensor, packed: PackedLinearWeight,
                                    reduce_range: bool, relu: bool) -> torch.Tensor:
    """The dynamic Linear of a 2-D float32 input in plain torch: quantize (ATen's qparams),
    then the registry's ``dynamic_linear`` on the integers (the native kernel does it all)."""
    mn, mx = torch.aminmax(x2d)
    if torch.compiler.is_compiling():
        scale, zp = affine.choose_qparams_aten(mn, mx, 0, 255, False, reduce_range)
    else:  # the scalar form of the same rule: microseconds instead of ~40 tensor ops
        s, z = affine.choose_qparams_aten_scalar(mn.item(), mx.item(), 0, 255, False,
                                                 reduce_range)
        inv, zp_f = affine.finite_per_tensor_operands(x2d, s, z)
        x_q = get("quantize_finite", x2d)(x2d, inv, zp_f, 0, 255, torch.uint8)
        fn = get("dynamic_linear", x_q, packed=packed)
        return fn(x_q, s, z, packed, relu)
    x_q = affine.quantize_int(x2d, scale, zp, 0, 255, torch.uint8)
    fn = get("dynamic_linear", x_q, packed=packed)
    return fn(x_q, scale, zp, packed, relu)


@register("dynamic_linear", "reference")
def _dynamic_linear_reference(x_q, x_scale, x_zp, packed, relu):
    x_hat = affine.dequantize_int(x_q, torch.as_tensor(x_scale, dtype=torch.float64),
                                  torch.as_tensor(x_zp))
    y = F.linear(x_hat, packed.dequantized_weight(), packed.bias)
    return torch.relu(y) if relu else y


@register("dynamic_linear", "int_mm", devices=("cpu", "cuda"), applies=_int_mm_applies,
          available=_int_mm_available)
def _dynamic_linear_int_mm(x_q, x_scale, x_zp, packed, relu):
    # y = (acc + (shift - x_zp) * sum_k w) * x_scale * w_scale + bias, the correction exact in int32
    x_signed, shift = _as_signed(x_q)
    acc = torch._int_mm(x_signed, packed.weight.t())
    acc.add_(packed.weight_sum, alpha=shift - int(x_zp))
    multiplier = packed.channel_scale * float(x_scale)
    y = acc * multiplier if packed.bias is None else torch.addcmul(packed.bias, acc, multiplier)
    return y.relu_() if relu else y


def _unit_epilogue_operands(packed: PackedLinearWeight) -> tuple:
    """(unit channel scales, zero channel zero points, the per-tensor weight scale or None,
    the pack with unit scales and no bias), made once per pack (kept in
    ``requant_epilogues`` under a key no qparams tuple takes)."""
    operands = packed.requant_epilogues.get("dynamic_unit")
    if operands is None:
        n = packed.out_features
        per_tensor = float(packed.channel_scale[0]) if packed.axis is None and n else None
        ones = torch.ones(n)
        unit_pack = dataclasses.replace(packed, channel_scale=ones, bias=None, plans={},
                                        requant_epilogues={})
        operands = packed.requant_epilogues["dynamic_unit"] = (
            ones, torch.zeros(n, dtype=torch.int64), per_tensor, unit_pack)
    return operands


def fbgemm_dynamic_epilogue(acc: torch.Tensor, x_scale: Scalar, packed: PackedLinearWeight,
                            relu: bool = False) -> torch.Tensor:
    """torch.ao's (fbgemm's) dynamic Linear epilogue on the float32 integer accumulator
    ``acc``: ``fma(acc, float32(x_scale * w_scale), bias)`` then ReLU, in place where it can.
    oneDNN's own epilogue (multiply, then add: two roundings) lands an ulp apart on about
    half of the outputs; ``torch.add(b, a, alpha=m)`` and ``torch.addcmul`` are fused
    multiply-adds on CPU (tests/nn/test_dynamic_modules.py checks the bits against torch.ao)."""
    per_tensor = _unit_epilogue_operands(packed)[2]
    if per_tensor is not None:
        x32 = affine.round_to_float32(float(x_scale))
        multiplier = affine.round_to_float32(per_tensor * x32)  # exact, rounded once
        y = (acc.mul_(multiplier) if packed.bias is None
             else torch.add(packed.bias, acc, alpha=multiplier))
    else:
        multiplier = packed.channel_scale * float(x_scale)
        y = acc.mul_(multiplier) if packed.bias is None else torch.addcmul(packed.bias, acc,
                                                                           multiplier)
    return y.relu_() if relu else y


@register("dynamic_linear", "onednn", devices=("cpu",),
          applies=lambda x, packed, **_: _onednn_applies(x, packed),
          available=_exactness.onednn_usable)
def _dynamic_linear_onednn(x_q, x_scale, x_zp, packed, relu):
    # the accumulator through oneDNN at unit scales, then torch.ao's epilogue
    ones, zeros, _, unit_pack = _unit_epilogue_operands(packed)
    if not _exactness.onednn_exact_for(x_q):  # saturates here (reduce_range=False activations)
        # two exact halves at unit scales: integer floats, their sum exact below 2**24
        acc = onednn_split_linear(x_q, 1.0, x_zp, unit_pack, with_bias=False)
        return fbgemm_dynamic_epilogue(acc, x_scale, packed, relu)
    acc = torch.ops.onednn.qlinear_pointwise(
        x_q, 1.0, int(x_zp), packed.onednn_weight, ones, zeros, None, 1.0, 0, torch.float32,
        "none", [], "")
    return fbgemm_dynamic_epilogue(acc, x_scale, packed, relu)


# --------------------------------------------------------------------------------------------
# Per-token dynamic: int8 symmetric activations with one scale per row
# --------------------------------------------------------------------------------------------

# torchao's int8 dynamic activations: symmetric -127..127, scale = max|row| / 127 >= 1e-5.
PER_TOKEN_QMIN, PER_TOKEN_QMAX, PER_TOKEN_EPS = -127, 127, 1e-5


def per_token_dynamic_linear(x_float: torch.Tensor, packed: PackedLinearWeight,
                             relu: bool = False) -> torch.Tensor:
    """Dynamic Linear with one activation scale per row (token), as torchao's
    ``Int8DynamicActivationInt8WeightConfig``: far closer to float than per-tensor activations,
    at the same int8 GEMM cost.

    Rows are quantized int8 symmetric with torchao's rule, then one int8 GEMM and one rescale
    ``acc * x_scale[row] * w_scale[col] + bias`` (``relu`` applied to the result).
    """
    def kernel(x2d: torch.Tensor) -> torch.Tensor:
        fast = _per_token_fast(x2d, packed, relu)
        if fast is not None:
            return fast
        scale = per_token_scale(x2d)
        if not torch.compiler.is_compiling() and not bool(torch.isfinite(scale).all()):
            raise ValueError("per_token_dynamic_linear: input contains NaN or Inf")
        zero_point = torch.zeros_like(scale, dtype=torch.int64)
        x_q = quantize_float_result(x2d, scale, zero_point, PER_TOKEN_QMIN, PER_TOKEN_QMAX,
                                    torch.int8, axis=0,
                                    mode=affine.quantize_mode(_dt.qint8, per_channel=True))
        fn = get("per_token_linear", x_q, packed=packed)
        return fn(x_q, scale, packed, relu)
    return _float_linear_out(x_float, packed, kernel, "per_token_dynamic_linear")


@register("per_token_linear", "reference")
def _per_token_linear_reference(x_q, x_scale, packed, relu):
    x_hat = affine.dequantize_int(x_q, x_scale, torch.zeros_like(x_scale, dtype=torch.int64), 0)
    y = F.linear(x_hat, packed.dequantized_weight(), packed.bias)
    return torch.relu(y) if relu else y


@register("per_token_linear", "int_mm", devices=("cpu", "cuda"), applies=_int_mm_applies,
          available=_int_mm_available)
def _per_token_linear_int_mm(x_q, x_scale, packed, relu):
    acc = torch._int_mm(x_q, packed.weight.t())
    return _row_rescale_(acc * packed.channel_scale, x_scale, packed, relu)


def _row_rescale_(y: torch.Tensor, row_scale: torch.Tensor, packed: PackedLinearWeight,
                  relu: bool) -> torch.Tensor:
    """``y * row_scale[:, None] + bias`` (ReLU'd) in place: the per-token epilogue."""
    row_scale = row_scale.to(torch.float32).unsqueeze(1)
    if packed.bias is None:
        y.mul_(row_scale)
    else:
        torch.addcmul(packed.bias, y, row_scale, out=y)
    return y.relu_() if relu else y


def per_token_scale(x: torch.Tensor) -> torch.Tensor:
    """torchao's per-token rule: one symmetric scale per row, max|row| / 127 floored at eps."""
    mn, mx = torch.aminmax(x, dim=1)
    scale, _ = affine.choose_block_qparams(mn, mx, "SYMMETRIC", PER_TOKEN_QMIN, PER_TOKEN_QMAX,
                                           PER_TOKEN_EPS, zero_point_domain="NONE")
    return scale


# --------------------------------------------------------------------------------------------
# Fast per-token path (CPU): the rows quantized in one compiled pass, oneDNN's u8 x s8 GEMM
# with the weight scales applied in its epilogue, one in-place rescale by the row scales
# --------------------------------------------------------------------------------------------

# From this many activation elements a hot shape's quantize runs as one compiled kernel; below,
# its eager ops cost about what a kernel call does.
FUSED_DYNAMIC_MIN_NUMEL = 1 << 14


def _per_token_rows_u8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's per-token int8 integers, shifted by +128 into uint8 (oneDNN takes u8
    activations; a zero point of 128 undoes the shift exactly), and the row scales."""
    scale = per_token_scale(x)
    inv = affine.inv_scale_f32(scale).unsqueeze(1)
    x_q = quantize_formula(x, inv, torch.zeros_like(inv), PER_TOKEN_QMIN, PER_TOKEN_QMAX,
                           torch.int8, affine.quantize_mode(_dt.qint8, per_channel=True),
                           narrow_via_int32=True)
    # int8 q + 128 as uint8 is q's bits with the sign bit flipped; inductor vectorises this
    # form, an integer add with a cast to uint8 ran 3x slower (measured)
    return torch.bitwise_xor(x_q.view(torch.uint8), _UINT8_TO_INT8_SHIFT), scale


def _per_token_fast(x2d: torch.Tensor, packed: PackedLinearWeight,
                    relu: bool) -> Optional[torch.Tensor]:
    """The fast per-token Linear where it applies (CPU, oneDNN weight, auto kernel mode);
    None sends the caller down the general path.

    The shifted rows span 1..255: on CPUs where oneDNN saturates int16 pairs above 128
    (:func:`~.onednn_exactness.onednn_u8_exact_max` < 255) they go through
    :func:`onednn_split_linear`."""
    if (mode() == "reference" or torch.compiler.is_compiling() or x2d.device.type != "cpu"
            or packed.onednn_weight is None or x2d.size(0) < ONEDNN_MIN_ROWS):
        return None
    x2d = x2d.contiguous()
    kernel = (cpu_compiled.compiled("per_token_rows_u8", (x2d,), _per_token_rows_u8,
                                    amortise=True)
              if x2d.numel() >= FUSED_DYNAMIC_MIN_NUMEL else None)
    if kernel is not None:
        x_u8, scale = kernel([x2d])
    else:  # eager; its time counts towards a build (cpu_compiled's amortised builds)
        start = time.perf_counter()
        x_u8, scale = _per_token_rows_u8(x2d)
        cpu_compiled.note_eager_seconds(time.perf_counter() - start)
    if not bool(torch.isfinite(scale).all()):
        raise ValueError("per_token_dynamic_linear: input contains NaN or Inf")
    if _exactness.onednn_u8s8_exact():
        y = torch.ops.onednn.qlinear_pointwise(
            x_u8, 1.0, _UINT8_TO_INT8_SHIFT, packed.onednn_weight, packed.channel_scale,
            packed.channel_zero_point, None, 1.0, 0, torch.float32, "none", [], "")
    else:
        y = onednn_split_linear(x_u8, 1.0, _UINT8_TO_INT8_SHIFT, packed, with_bias=False)
    return _row_rescale_(y, scale, packed, relu)
