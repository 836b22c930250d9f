"""The affine quantization math: ranges, qparam choice, quantize, dequantize, fake-quantize.

Every other part of torchquant calls into this module; nothing re-implements these formulas.
Pure math: it imports only :mod:`torchquant.dtypes`.  The elementwise formulas here are the
reference kernels :mod:`torchquant.kernels` registers (and compiles for its fast variants);
:mod:`torchquant.ops.quantize` runs the same functions on the fastest kernel that applies.

Rounding contract (measured against torch 2.13 on CPU, see ``tests/test_affine.py``).  torch's
kernels do not all use one formula; with ``inv = float32(1 / float32(scale))``:

* per-tensor quint8 / qint8:      ``q = nearbyint(fma(x, inv, zp))``           ("fma")
* per-tensor qint32, per-channel: ``q = nearbyint(float32(x * inv) + zp)``     ("mul_add")
* sub-byte per-tensor, fake-quant:``q = nearbyint(float32(x * inv)) + zp``     ("round_add")

``nearbyint`` rounds half to even.  The result is then clamped to ``[qmin, qmax]``.  The three
differ only on inputs that sit within an ulp of a rounding tie, but they do differ, so each
call site names the mode torch uses there.
"""
from __future__ import annotations

import math
import struct
import warnings
from typing import Any, Callable, Optional, Sequence

import torch

from . import dtypes as _dt
from .dtypes import QDType, QScheme

__all__ = [
    "FMA", "MUL_ADD", "ROUND_ADD",
    "FP32_EPS", "calculate_qmin_qmax", "validate_qmin_qmax", "check_min_max_valid",
    "choose_qparams", "choose_block_qparams", "choose_qparams_aten",
    "quantize_int", "dequantize_int", "quantize_per_tensor_int", "dequantize_per_tensor_int",
    "quantize_finite_per_tensor", "per_tensor_qparams",
    "eager_fma", "nan_code", "quantize_formula", "quantize_finite_formula", "dequantize_formula",
    "fake_quantize_formula", "quantize_operands", "dequantize_operands",
    "quantize_with_multiplier_operands", "finite_per_tensor_operands",
    "block_layout", "block_qparam_shape", "block_qparams_view", "quantize_block_operands",
    "dequantize_block_operands", "quantize_block", "dequantize_block", "group_block_size",
    "fake_quantize", "fake_quantize_with_mask", "fake_quantize_args", "fake_quantize_ste",
    "fake_quantize_learnable", "pack_sub_byte", "unpack_sub_byte", "inv_scale_f32",
    "round_to_float32", "inv_scale_float32",
    "check_scale", "check_zero_point", "quantize_mode",
    "choose_qparams_aten_scalar", "requantize",
    "dequantize_int_premul", "quantize_with_multiplier", "quantize_float64", "quantize_scalar",
]

FMA, MUL_ADD, ROUND_ADD = "fma", "mul_add", "round_add"
FP32_EPS = torch.finfo(torch.float32).eps
SMALL_SCALE_THRESHOLD = 6.1e-5  # ATen's floor for dynamically chosen scales


def round_to_float32(value: float) -> float:
    """``value`` rounded to the nearest float32 (ties to even; +-inf where float32 overflows,
    nan stays nan), as a Python float: what torch does to a Python number it stores in, or
    compares with, a float32 tensor.  The one place torchquant writes this rounding.  (The
    module-level ``struct`` functions, not a ``struct.Struct``: dynamo traces those.)"""
    try:
        return struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def inv_scale_float32(scale: float) -> float:
    """:func:`inv_scale_f32` of a Python scale, as a Python float: the float32 reciprocal of
    the float32 scale (the float32 quotient of float32 operands is the float32 rounding of
    their exact double quotient)."""
    return round_to_float32(1.0 / round_to_float32(scale))


# --------------------------------------------------------------------------------------------
# Integer ranges
# --------------------------------------------------------------------------------------------

def _dtype_key(dtype: Any) -> Any:
    """QDType for integer aliases, the torch dtype itself otherwise (int16, uint16, float8...)."""
    return _dt.to_qdtype(dtype) if _dt.is_qdtype_like(dtype) else dtype


def validate_qmin_qmax(quant_min: int, quant_max: int) -> None:
    """A custom range must contain 0 and be non-empty (AssertionError, as torch)."""
    assert quant_min <= 0 <= quant_max, (
        f"Used-specified quantization range must include 0; got quant_min={quant_min}, "
        f"quant_max={quant_max}.")
    assert quant_min < quant_max, (
        f"qmin must be strictly less than qmax for user-specified quantization range; got "
        f"quant_min={quant_min}, quant_max={quant_max}.")


def calculate_qmin_qmax(quant_min: Optional[int], quant_max: Optional[int],
                        has_customized_qrange: bool, dtype: Any,
                        reduce_range: bool) -> tuple[int, int]:
    """The integer range an observer quantizes to (torch's rules, including reduce_range)."""
    key = _dtype_key(dtype)
    if has_customized_qrange:
        if quant_min is None or quant_max is None:
            lo, hi = (0, 2**32 - 1) if key == _dt.qint32 else (0, 255)
        else:
            lo, hi = quant_min, quant_max
        span = hi - lo + 1
        if key == _dt.qint8:
            assert 0 < span <= 256, ("quantization range should be positive and not exceed the "
                                     f"maximum bit range (=256); got {lo}..{hi}")
        elif key == _dt.qint32:
            assert 0 < span <= 2**32, ("quantization range should be positive and not exceed the "
                                       f"maximum bit range (=4294967296); got {lo}..{hi}")
        if reduce_range:
            lo, hi = lo // 2, hi // 2
        return int(lo), int(hi)
    if key == _dt.qint8:
        return (-64, 63) if reduce_range else (-128, 127)
    if key == _dt.quint8:
        return (0, 127) if reduce_range else (0, 255)
    if key == _dt.qint32:
        return -(2**31), 2**31 - 1
    if key == torch.uint16:
        return 0, 2**16 - 1
    if key == torch.int16:
        return -(2**15), 2**15 - 1
    return 0, 15


# --------------------------------------------------------------------------------------------
# Choosing qparams
# --------------------------------------------------------------------------------------------

def check_min_max_valid(min_val: torch.Tensor, max_val: torch.Tensor) -> bool:
    """False (with a warning) when nothing was observed; AssertionError when min > max."""
    if min_val.numel() == 0 or max_val.numel() == 0:
        warnings.warn("must run observer before calling calculate_qparams. "
                      "Returning default values.")
        return False
    if min_val.dim() == 0 or max_val.dim() == 0:
        if min_val == float("inf") and max_val == float("-inf"):
            warnings.warn("must run observer before calling calculate_qparams. "
                          "Returning default values.")
            return False
        assert min_val <= max_val, f"min {min_val} should be less than max {max_val}"
    else:
        assert torch.all(min_val <= max_val), f"min {min_val} should be less than max {max_val}"
    return True


def choose_qparams(min_val: torch.Tensor, max_val: torch.Tensor, quant_min: int, quant_max: int,
                   dtype: Any, eps: torch.Tensor, has_customized_qrange: bool,
                   qscheme: Any = _dt.per_tensor_affine) -> tuple[torch.Tensor, torch.Tensor]:
    """Observer rule for (scale, zero_point) from running min/max (per tensor or per channel).

    Scalars come back as 1-element tensors; zero_point is int32 (affine), int64 (symmetric) or
    float (float_qparams), matching what torch's observers return.
    """
    if not check_min_max_valid(min_val, max_val):
        dev = min_val.device.type
        return torch.tensor([1.0], device=dev), torch.tensor([0], device=dev)
    qscheme = _dt.to_qscheme(qscheme)
    key = _dtype_key(dtype)
    device = min_val.device
    eps = eps.to(device) if isinstance(eps, torch.Tensor) else torch.tensor([eps], device=device)
    zeros = torch.zeros_like(min_val)
    min_neg = torch.minimum(min_val, zeros)
    max_pos = torch.maximum(max_val, zeros)
    zero_point = torch.zeros(min_neg.size(), dtype=torch.int64, device=device)

    if qscheme in (_dt.per_tensor_symmetric, _dt.per_channel_symmetric):
        amax = torch.maximum(-min_neg, max_pos)
        scale = torch.maximum(amax / (float(quant_max - quant_min) / 2), eps)
        if key == _dt.quint8:
            mid = (quant_min + quant_max) // 2 if has_customized_qrange else 128
            zero_point = zero_point.new_full(zero_point.size(), mid)
        elif key == torch.uint16:
            zero_point = zero_point.new_full(zero_point.size(), 2**15)
    elif qscheme == _dt.per_channel_affine_float_qparams:
        scale = (max_val - min_val) / float(quant_max - quant_min)
        scale = torch.where(scale > eps, scale, torch.ones_like(scale))
        zero_point = -1 * min_val / scale
    else:
        scale = torch.maximum((max_pos - min_neg) / float(quant_max - quant_min), eps)
        zero_point = quant_min - torch.round(min_neg / scale).to(torch.int)
        zero_point = torch.clamp(zero_point, quant_min, quant_max)

    if scale.dim() == 0:
        scale = scale.reshape(1)
    if zero_point.dim() == 0:
        zero_point = zero_point.reshape(1)
    return scale, zero_point


def choose_block_qparams(min_val: torch.Tensor, max_val: torch.Tensor, mapping_type: str,
                         quant_min: int, quant_max: int, eps: float, preserve_zero: bool = True,
                         zero_point_domain: str = "INT"
                         ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """torchao's rule for (scale, zero_point) from per-block min/max (any shape, element-wise).

    ``mapping_type`` is ``"SYMMETRIC"``, ``"SYMMETRIC_NO_CLIPPING_ERR"`` or ``"ASYMMETRIC"``;
    ``zero_point_domain`` is ``"INT"``, ``"FLOAT"`` or ``"NONE"`` (zero_point ``None``).  It
    differs from the observer rule (:func:`choose_qparams`): the symmetric zero point is
    ``int((qmax + qmin + 1) / 2)`` whatever the dtype, the scale is clamped to ``eps`` after the
    zero point is chosen, and zero points stay floating (callers cast them).
    """
    if preserve_zero:
        min_neg = torch.minimum(min_val, torch.zeros_like(min_val))
        max_pos = torch.maximum(max_val, torch.zeros_like(max_val))
    else:
        min_neg, max_pos = min_val, max_val
    if mapping_type in ("SYMMETRIC", "SYMMETRIC_NO_CLIPPING_ERR"):
        if not preserve_zero:
            raise ValueError("preserve_zero=False is not supported for symmetric mappings")
        if zero_point_domain == "FLOAT":
            raise ValueError("symmetric mappings need zero_point_domain INT or NONE, got FLOAT")
        if mapping_type == "SYMMETRIC":
            scale = torch.maximum(-min_neg, max_pos) / (float(quant_max - quant_min) / 2)
        else:
            from_min = min_neg / float(quant_min)
            from_max = max_pos / float(quant_max)
            scale = torch.where(from_min > from_max, from_min, from_max)
        zero_point = (None if zero_point_domain == "NONE"
                      else torch.full_like(scale, int((quant_max + quant_min + 1) / 2)))
        return torch.clamp(scale, min=eps), zero_point
    if mapping_type != "ASYMMETRIC":
        raise ValueError(f"unknown mapping_type {mapping_type!r}")
    scale = torch.clamp((max_pos - min_neg) / float(quant_max - quant_min), min=eps)
    if zero_point_domain == "NONE":
        return scale, None
    if preserve_zero:
        if zero_point_domain != "INT":
            raise ValueError("preserve_zero=True needs zero_point_domain INT or NONE, "
                             f"got {zero_point_domain}")
        zero_point = torch.clamp(quant_min - torch.round(min_neg / scale), quant_min, quant_max)
        return scale, zero_point
    if zero_point_domain != "FLOAT":
        raise ValueError("preserve_zero=False needs zero_point_domain FLOAT or NONE, "
                         f"got {zero_point_domain}")
    return scale, min_neg + scale * ((quant_max + quant_min + 1) / 2)


def _concrete(*tensors: torch.Tensor) -> bool:
    """True when the tensors hold data Python may branch on: plain tensors outside a trace
    (``torch.export`` / ``torch.compile`` see fake or functional tensors)."""
    return (not torch.compiler.is_compiling()
            and all(type(t) is torch.Tensor for t in tensors))


def choose_qparams_aten(min_val: torch.Tensor, max_val: torch.Tensor, qmin: int, qmax: int,
                        preserve_sparsity: bool = False,
                        reduce_range: bool = False,
                        fbgemm: bool = False,
                        float32_scale: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """ATen's ``ChooseQuantizationParams`` vectorised over channels.

    Used by the fused moving-average fake-quant and by dynamic quantization. It differs from
    the observer rule: symmetric ranges are ``max(|min|/(n/2+1), max/(n/2))``, tiny scales are
    floored at 6.1e-5 and zero points come from whichever end loses less.  float32 variables of
    the C++ code are kept float32 here, double ones float64.  Returns (float32 scale, int64 zp)
    with the shape of ``min_val``.

    Two C++ copies of the routine exist and they differ on zero-point rounding ties (measured):
    the default is ATen's ``quant_utils`` one (dynamic quantization), which keeps the scale in
    double and compares the end errors as ``|q| - |r/scale|``.  ``fbgemm=True`` is fbgemm's (what
    ``fused_moving_avg_obs_fake_quant`` calls on x86): the scale is float32 from the start and
    the errors are ``|q| + |r/scale|``.
    """
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    mn = min_val.detach().to(torch.float32)
    mx = max_val.detach().to(torch.float32)
    concrete = _concrete(mn, mx)
    if concrete and bool((mn > mx).any()):
        raise ValueError(f"choose_qparams: min {mn} must not exceed max {mx}")
    if preserve_sparsity:
        sym_qmin = -((qmax - qmin) // 2 + 1)
        sym_qmax = (qmax - qmin) // 2
        straddles = (mn < 0) & (mx > 0)
        max_scale = torch.maximum((mn / sym_qmin).abs(), (mx / sym_qmax).abs()).double()
        mn = torch.where(straddles, (max_scale * sym_qmin).float(), mn)
        mx = torch.where(straddles, (max_scale * sym_qmax).float(), mx)
    else:
        straddles = torch.zeros_like(mn, dtype=torch.bool)
    mn = torch.clamp(mn, max=0.0)
    mx = torch.clamp(mx, min=0.0)
    scale = (mx.double() - mn.double()) / (qmax - qmin)
    scale_f = scale.float()
    degenerate = (scale_f == 0) | torch.isinf(1.0 / scale_f)
    scale = torch.where(degenerate, torch.full_like(scale, 0.1), scale)
    if fbgemm:
        scale = scale.float().double()
    small = scale < SMALL_SCALE_THRESHOLD
    if not concrete or bool(small.any()):  # (the where()s make the branch exact either way)
        thr = torch.tensor(SMALL_SCALE_THRESHOLD, dtype=torch.float32)
        org = scale.float()
        amplifier = thr / org
        new_mn = torch.where(mn == 0, mn, torch.where(mx == 0, -thr * (qmax - qmin), mn * amplifier))
        new_mx = torch.where(mn == 0, thr * (qmax - qmin), torch.where(mx == 0, mx, mx * amplifier))
        mn = torch.where(small, new_mn, mn)
        mx = torch.where(small, new_mx, mx)
        scale = torch.where(small, torch.full_like(scale, round_to_float32(SMALL_SCALE_THRESHOLD)),
                            scale)
    mnd, mxd = mn.double(), mx.double()
    zp_from_min = qmin - mnd / scale
    zp_from_max = qmax - mxd / scale
    end_error_sign = 1.0 if fbgemm else -1.0
    err_min = abs(qmin) + end_error_sign * (mnd / scale).abs()
    err_max = abs(qmax) + end_error_sign * (mxd / scale).abs()
    zp = torch.where(err_min < err_max, zp_from_min, zp_from_max)
    if preserve_sparsity:
        zp = torch.where(straddles, torch.full_like(zp, (qmin + qmax) / 2), zp)
    zp = torch.where(zp < qmin, torch.full_like(zp, qmin),
                     torch.where(zp > qmax, torch.full_like(zp, qmax), torch.round(zp)))
    return (scale.float() if float32_scale else scale), zp.to(torch.int64)


# --------------------------------------------------------------------------------------------
# Argument checks shared by the tensor constructors and modules
# --------------------------------------------------------------------------------------------

def check_scale(scale: torch.Tensor, what: str = "scale") -> None:
    """Scales must be positive and finite: a zero, negative or NaN scale silently corrupts data."""
    if scale.numel() and not bool(torch.isfinite(scale).all() and (scale > 0).all()):
        raise ValueError(f"{what} must be positive and finite, got {scale.tolist()}")


def check_zero_point(zero_point: torch.Tensor, qdtype: QDType, what: str = "zero_point") -> None:
    if zero_point.numel() and zero_point.dtype.is_floating_point:
        if not bool(torch.isfinite(zero_point).all()):
            raise ValueError(f"{what} must be finite, got {zero_point.tolist()}")
        return
    if zero_point.numel() and not bool(((zero_point >= qdtype.qmin) & (zero_point <= qdtype.qmax)).all()):
        raise ValueError(f"{what} must lie in [{qdtype.qmin}, {qdtype.qmax}] for {qdtype!r}, "
                         f"got {zero_point.tolist()}")


def inv_scale_f32(scale: torch.Tensor) -> torch.Tensor:
    """``1.0f / float(scale)``: torch quantizes with the float32 reciprocal of the float32 scale."""
    return torch.reciprocal(scale.to(torch.float32))


# --------------------------------------------------------------------------------------------
# Quantize / dequantize / fake-quantize: the reference formulas
# --------------------------------------------------------------------------------------------
# The elementwise formulas are written once, here, parameterised by the fused multiply-add to
# use: :mod:`torchquant.kernels` registers them as the reference kernels and compiles exactly
# this code for its fast variants.  The ``quantize_int`` / ``dequantize_int`` / ... functions
# below run the plain formulas; :mod:`torchquant.ops.quantize` has the same functions on the
# fastest kernel that applies (identical integers).  ``*_operands`` turn qparams into the
# formulas' arguments, so both forms share them.

def eager_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` with one rounding: torch's CPU ``addcmul`` kernel fuses it (tested)."""
    return torch.addcmul(c, a, b)


def nan_code(qmin: int, qmax: int, storage_dtype: torch.dtype, mode: str) -> int:
    """The integer torch 2.13's CPU quantize gives NaN, by the kernel ``mode`` selects
    (:func:`quantize_mode`): 8-bit per tensor (FMA) ``qmax`` (255 / 127: its vector clamp
    returns the bound for NaN); 8-bit per channel and float zero points (MUL_ADD) the code 0
    (NaN converts to INT32_MIN, whose low byte is 0); 32-bit ``qmin`` (INT32_MIN); sub-byte
    (ROUND_ADD) ``qmin``.  The same on AVX-512, AVX2 and ATen's default path (measured)."""
    if storage_dtype == torch.int32:
        return qmin
    if mode == FMA:
        return qmax
    if mode == MUL_ADD and qmin <= 0 <= qmax:
        return 0
    return qmin


def quantize_formula(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor, qmin: int, qmax: int,
                     storage_dtype: torch.dtype, mode: str, fma: Callable = eager_fma,
                     narrow_via_int32: bool = False) -> torch.Tensor:
    """``clamp(nearbyint(...))`` of ``x`` by the rounding ``mode`` (module docstring); NaN maps
    to torch's :func:`nan_code`."""
    if mode == FMA:
        y = torch.round(fma(x, inv, zp))
    elif mode == MUL_ADD:
        y = torch.round(x * inv + zp)
    elif mode == ROUND_ADD:
        y = torch.round(x * inv) + zp
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    # NaN has no integer image; torch's kernels give it nan_code.  ``y == y`` rather than
    # ``isnan``: inductor vectorises the comparison but not isnan.
    y = torch.where(y == y, y, nan_code(qmin, qmax, storage_dtype, mode))
    if storage_dtype == torch.int32:
        y = y.to(torch.float64)  # 2**31 - 1 is not a float32: clamp where it is representable
    y = torch.clamp(y, qmin, qmax)
    if narrow_via_int32 and storage_dtype != torch.int32:
        # Exact (y is already in range); inductor's float->int32->8-bit path is ~2x faster
        # than its direct float->8-bit conversion.
        y = y.to(torch.int32)
    return y.to(storage_dtype)


def quantize_finite_formula(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor, qmin: int,
                            qmax: int, storage_dtype: torch.dtype) -> torch.Tensor:
    """:func:`quantize_formula` (FMA) for float32 input known to be finite: four eager ops, no
    NaN mask -- the per-call cost that dominates small dynamic matmuls."""
    y = torch.addcmul(zp, x, inv)
    return y.round_().clamp_(qmin, qmax).to(storage_dtype)


def dequantize_formula(q: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor,
                       per_channel: bool) -> torch.Tensor:
    """``(q - zp) * scale`` in float32, rounded as torch's kernels round it."""
    if per_channel and not zp.dtype.is_floating_point:
        # torch's per-channel kernel keeps double scales and computes in double.
        return ((q.to(torch.float64) - zp.to(torch.float64)) * scale.to(torch.float64)).to(torch.float32)
    if q.dtype == torch.int32 and not zp.dtype.is_floating_point:
        # Subtract exactly in integers, then round once (torch subtracts in int32 and wraps at
        # the int32 boundary; int64 keeps those values right).
        return (q.to(torch.int64) - zp.to(torch.int64)).to(torch.float32) * scale.to(torch.float32)
    return (q.to(torch.float32) - zp.to(torch.float32)) * scale.to(torch.float32)


def fake_quantize_formula(x: torch.Tensor, inv: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor,
                          qmin: int, qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fake-quantized ``x``, mask of the unclamped elements): torch's ``round_add`` rule.

    As torch's CPU kernels compute it for every input dtype (measured bit for bit): ``x * inv``,
    its rounding and the mask in float32 -- float16 / bfloat16 inputs widened first -- or in
    float64 for float64 input; the product ``(clamped q - zp) * scale`` in ``scale``'s dtype
    (float32, except per channel for float64 input, where torch multiplies in double), then
    cast to ``x``'s dtype."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    zp_wide = zp.to(wide)
    q = torch.round(x.to(wide) * inv.to(wide)) + zp_wide
    mask = (q >= qmin) & (q <= qmax)
    q = torch.where(q == q, q, qmin)  # NaN: torch's integer conversion gives qmin (mask False)
    out = (torch.clamp(q, qmin, qmax) - zp_wide).to(scale.dtype) * scale
    return out.to(x.dtype), mask


def _broadcast(t: torch.Tensor, ndim: int, axis: Optional[int]) -> torch.Tensor:
    if axis is None or t.dim() == 0:
        return t
    shape = [1] * ndim
    shape[axis] = -1
    return t.reshape(shape)


def quantize_operands(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                      axis: Optional[int], mode: str
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """(float32 x, float32 1/scale, float32 zero point, mode) for :func:`quantize_formula`,
    broadcast along ``axis``; a floating zero point forces MUL_ADD (float qparams)."""
    inv = _broadcast(inv_scale_f32(scale), x.dim(), axis)
    zp = _broadcast(zero_point.to(torch.float32), x.dim(), axis)
    if zero_point.dtype.is_floating_point:
        mode = MUL_ADD
    return x.to(torch.float32), inv, zp, mode


def quantize_int(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int,
                 qmax: int, storage_dtype: torch.dtype, axis: Optional[int] = None,
                 mode: str = FMA) -> torch.Tensor:
    """Quantize ``x`` to integers of ``storage_dtype`` (unpacked).

    ``scale``/``zero_point`` are 0-d (per tensor) or 1-d along ``axis``; with ``axis=None`` they
    may also have any shape that broadcasts against ``x`` (block-wise qparams).  A floating
    zero_point means the float-qparams scheme (``nearbyint(x * inv + zp)``).
    """
    x32, inv, zp, mode = quantize_operands(x, scale, zero_point, axis, mode)
    return quantize_formula(x32, inv, zp, qmin, qmax, storage_dtype, mode)


def per_tensor_qparams(scale: float, zero_point: int,
                       device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Python-number per-tensor qparams as the 0-d (float64, int64) tensors the formulas take."""
    return (torch.tensor(float(scale), dtype=torch.float64, device=device),
            torch.tensor(int(zero_point), dtype=torch.int64, device=device))


def quantize_per_tensor_int(x: torch.Tensor, scale: float, zero_point: int,
                            qdtype: QDType) -> torch.Tensor:
    """:func:`quantize_int` to Python-number per-tensor qparams with ``qdtype``'s range and
    rounding rule: the one form of "quantize a float tensor to these qparams" (8/32-bit)."""
    return quantize_int(x, *per_tensor_qparams(scale, zero_point, x.device), qdtype.qmin,
                        qdtype.qmax, qdtype.storage_dtype, None,
                        quantize_mode(qdtype, per_channel=False))


def dequantize_per_tensor_int(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """:func:`dequantize_int` with Python-number per-tensor qparams (float32 result)."""
    return dequantize_int(q, *per_tensor_qparams(scale, zero_point, q.device))


def finite_per_tensor_operands(x: torch.Tensor, scale: float,
                               zero_point: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(1/scale, zero point) as float32 0-d tensors for :func:`quantize_finite_formula`."""
    inv = torch.reciprocal(torch.tensor(scale, dtype=torch.float32, device=x.device))
    zp = torch.tensor(float(zero_point), dtype=torch.float32, device=x.device)
    return inv, zp


def quantize_finite_per_tensor(x: torch.Tensor, scale: float, zero_point: int, qmin: int,
                               qmax: int, storage_dtype: torch.dtype) -> torch.Tensor:
    """:func:`quantize_int` (FMA rounding, per tensor) for float32 input already known to be
    finite -- dynamic quantization checked its min/max -- without the NaN mask."""
    return quantize_finite_formula(x, *finite_per_tensor_operands(x, scale, zero_point), qmin,
                                   qmax, storage_dtype)


def dequantize_operands(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                        axis: Optional[int]
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(q, scale, zero point, per_channel) for :func:`dequantize_formula`, broadcast along
    ``axis``."""
    return (q, _broadcast(scale, q.dim(), axis), _broadcast(zero_point, q.dim(), axis),
            axis is not None)


def dequantize_int(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                   axis: Optional[int] = None) -> torch.Tensor:
    """``(q - zp) * scale`` as float32; per-channel integer zero points compute in float64 as torch does.

    With ``axis=None``, ``scale``/``zero_point`` may have any shape that broadcasts against ``q``.
    """
    return dequantize_formula(*dequantize_operands(q, scale, zero_point, axis))


# --------------------------------------------------------------------------------------------
# Blocks (group-wise qparams): the layout torchao's quantize_affine uses
# --------------------------------------------------------------------------------------------

def block_layout(block_size: Sequence[int], shape: Sequence[int]) -> tuple[list[int], list[int]]:
    """The view that puts every block in its own trailing dims, and the dims to reduce over.

    ``block_size`` has one entry per dim of ``shape``; an entry equal to the dim's size (or 1)
    keeps the dim, any other must divide it.
    """
    if len(block_size) != len(shape):
        raise ValueError(f"block_size {tuple(block_size)} needs one entry per dim of an input of "
                         f"shape {tuple(shape)}")
    view_shape: list[int] = []
    reduce_dims: list[int] = []
    for dim, (block, size) in enumerate(zip(block_size, shape)):
        if block < 1:
            raise ValueError(f"block_size entries must be >= 1, got {tuple(block_size)}")
        if 1 < block != size:
            if size % block:
                raise ValueError(f"input dim {dim} of size {size} is not divisible by its "
                                 f"block size {block}")
            view_shape += [size // block, block]
            reduce_dims.append(len(view_shape) - 1)
        else:
            view_shape.append(size)
            if block != 1:
                reduce_dims.append(len(view_shape) - 1)
    return view_shape, reduce_dims


def block_qparam_shape(view_shape: Sequence[int], reduce_dims: Sequence[int]) -> list[int]:
    """Shape of per-block qparams viewed against the blocked input (1 on the reduced dims)."""
    return [1 if d in reduce_dims else n for d, n in enumerate(view_shape)]


def block_qparams_view(t: torch.Tensor, shape: Sequence[int], name: str) -> torch.Tensor:
    """``t`` (any shape with one element per block) viewed against the blocked input."""
    numel = math.prod(shape)
    if t.numel() != numel:
        raise ValueError(f"{name} has {t.numel()} elements but the block layout needs {numel} "
                         f"(one per block, block grid {[n for n in shape if n != 1]})")
    return t.reshape(shape)


def quantize_block_operands(x: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                            zero_point: torch.Tensor
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, str]:
    """:func:`quantize_operands` of ``x`` viewed as blocks: torchao's
    ``round(x * (1 / scale)) + zero_point`` (ROUND_ADD) per block.  Zero points are integers
    (torchao's INT domain); a floating one is rounded half-even."""
    view_shape, reduce_dims = block_layout(block_size, x.shape)
    qshape = block_qparam_shape(view_shape, reduce_dims)
    zero_point = block_qparams_view(zero_point, qshape, "zero_point")
    if zero_point.dtype.is_floating_point:
        zero_point = torch.round(zero_point).to(torch.int32)
    return quantize_operands(x.reshape(view_shape), block_qparams_view(scale, qshape, "scale"),
                             zero_point, None, ROUND_ADD)


def dequantize_block_operands(q: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                              zero_point: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """:func:`dequantize_operands` of ``q`` viewed as blocks (float32 scales, int32 zero points
    as torchao subtracts them)."""
    view_shape, reduce_dims = block_layout(block_size, q.shape)
    qshape = block_qparam_shape(view_shape, reduce_dims)
    return (q.reshape(view_shape), block_qparams_view(scale, qshape, "scale").to(torch.float32),
            torch.round(block_qparams_view(zero_point, qshape, "zero_point")).to(torch.int32)
            if zero_point.dtype.is_floating_point
            else block_qparams_view(zero_point, qshape, "zero_point").to(torch.int32), False)


def quantize_block(x: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                   zero_point: torch.Tensor, qmin: int, qmax: int,
                   storage_dtype: torch.dtype) -> torch.Tensor:
    """Integer codes of ``x`` (same shape) with one (scale, integer zero point) per block."""
    x32, inv, zp, mode = quantize_block_operands(x, block_size, scale, zero_point)
    return quantize_formula(x32, inv, zp, qmin, qmax, storage_dtype, mode).reshape(x.shape)


def dequantize_block(q: torch.Tensor, block_size: Sequence[int], scale: torch.Tensor,
                     zero_point: torch.Tensor) -> torch.Tensor:
    """float32 ``(q - zero_point) * scale`` per block (same shape as ``q``)."""
    return dequantize_formula(*dequantize_block_operands(q, block_size, scale,
                                                         zero_point)).reshape(q.shape)


def group_block_size(shape: Sequence[int], group_size: int) -> tuple[int, ...]:
    """The block size of groups of ``group_size`` along the last dim (torchao's group-wise)."""
    if not shape:
        raise ValueError("group-wise quantization needs at least one dim")
    return (1,) * (len(shape) - 1) + (int(group_size),)


# --------------------------------------------------------------------------------------------
# Fake-quantize (autograd)
# --------------------------------------------------------------------------------------------

FakeQuantizeKernel = Callable[..., tuple[torch.Tensor, torch.Tensor]]


_INT64_LIMIT = 2.0 ** 63


def _fake_quantize_float_qparams(x: torch.Tensor, inv: torch.Tensor, scale: torch.Tensor,
                                 zp: torch.Tensor, qmin: int,
                                 qmax: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Float zero points (embeddings), measured against torch's per-channel kernel:
    ``q = nearbyint(fma(x, inv, zp))`` and ``out = float32(double(clamp(q) - zp) * scale)`` --
    the subtraction is not exact in float32 when ``zp`` is fractional."""
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    # torch rounds with lrintf: a float64 sum is narrowed to float32 first
    q = torch.round(torch.addcmul(zp.to(wide), x.to(wide), inv.to(wide)).to(torch.float32))
    mask = (q >= qmin) & (q <= qmax)
    out = (torch.clamp(q, qmin, qmax).double() - zp.double()) * scale.double()
    return out.to(x.dtype), mask


def fake_quantize_with_mask(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                            qmin: int, qmax: int, axis: Optional[int] = None,
                            kernel: FakeQuantizeKernel = fake_quantize_formula
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(fake-quantized ``x``, mask where it was not clamped), no autograd.  ``kernel`` runs the
    integer-zero-point case (:func:`fake_quantize_formula` or a compiled form of it)."""
    inv = _broadcast(inv_scale_f32(scale), x.dim(), axis)
    # torch's per-channel kernel multiplies by the scale in double (visible for float64 input)
    wide = axis is not None and x.dtype == torch.float64
    sc = _broadcast(scale.to(torch.float32).to(torch.float64 if wide else torch.float32),
                    x.dim(), axis)
    if zero_point.dtype.is_floating_point:
        zp = _broadcast(zero_point.to(torch.float32), x.dim(), axis)
        return _fake_quantize_float_qparams(x, inv, sc, zp, qmin, qmax)
    zp = _broadcast(zero_point.to(torch.float32).round(), x.dim(), axis)
    if axis is not None:
        # torch's per-channel kernel converts round(x * inv) to int64 before clamping: where
        # that overflows (+-inf, |x * inv| >= 2**63) it gets INT64_MIN, i.e. qmin, as NaN does
        wide_x = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
        x = torch.where((wide_x * inv.to(wide_x.dtype)).abs() < _INT64_LIMIT, x, float("nan"))
    return kernel(x, inv, sc, zp, qmin, qmax)


class _FakeQuantizeSTE(torch.autograd.Function):
    """Fake-quantize with the straight-through estimator masked to the unclamped region."""

    @staticmethod
    def forward(ctx, x, scale, zero_point, qmin, qmax, axis, kernel):
        out, mask = fake_quantize_with_mask(x, scale, zero_point, qmin, qmax, axis, kernel)
        ctx.save_for_backward(mask)
        return out

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None, None, None, None, None, None


def fake_quantize_args(x: torch.Tensor, scale: Any, zero_point: Any, qmin: int, qmax: int,
                       axis: Optional[int]) -> tuple[torch.Tensor, torch.Tensor, Optional[int]]:
    """Validated (scale, zero_point, axis) of a fake-quantize call, qparams as tensors on ``x``'s
    device and ``axis`` non-negative."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"fake_quantize expects a floating-point input, got {x.dtype}")
    if qmin > qmax:
        raise ValueError(f"quant_min ({qmin}) must not exceed quant_max ({qmax})")
    scale = torch.as_tensor(scale, device=x.device)
    zero_point = torch.as_tensor(zero_point, device=x.device)
    if axis is not None:
        axis = axis % x.dim()
        if scale.numel() != x.size(axis) or zero_point.numel() != x.size(axis):
            raise ValueError(f"fake_quantize: {scale.numel()} scales / {zero_point.numel()} zero "
                             f"points for {x.size(axis)} channels along axis {axis}")
    return scale, zero_point, axis


def fake_quantize_ste(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int,
                      qmax: int, axis: Optional[int],
                      kernel: FakeQuantizeKernel = fake_quantize_formula) -> torch.Tensor:
    """:func:`fake_quantize` of arguments :func:`fake_quantize_args` has checked."""
    return _FakeQuantizeSTE.apply(x, scale, zero_point, qmin, qmax, axis, kernel)


def fake_quantize(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int,
                  qmax: int, axis: Optional[int] = None,
                  kernel: FakeQuantizeKernel = fake_quantize_formula) -> torch.Tensor:
    """Quantize-dequantize in float with an STE gradient (zero where the value was clamped)."""
    scale, zero_point, axis = fake_quantize_args(x, scale, zero_point, qmin, qmax, axis)
    return fake_quantize_ste(x, scale, zero_point, qmin, qmax, axis, kernel)


class _LearnableFakeQuantize(torch.autograd.Function):
    """Fake-quantize whose scale and zero point get gradients (LSQ, torch's learnable op).

    Measured against torch: the forward is the plain fake-quantize with the zero point rounded
    half-even and clamped; the backward recomputes ``q = nearbyint(fma(x, inv, zp))`` with the
    zero point re-derived as ``trunc(clamp(zp + 0.5))`` per tensor (``round().clamp()`` per
    channel) and fuses ``(q_clamped - zp) * scale - x`` into one fma.
    """

    @staticmethod
    def forward(ctx, x, scale, zero_point, qmin, qmax, axis, grad_factor, kernel):
        scale = scale.detach().to(torch.float32)
        zero_point = zero_point.detach().to(torch.float32)
        rounded_zp = torch.clamp(torch.round(zero_point), qmin, qmax)
        backward_zp = rounded_zp if axis is not None else torch.clamp(zero_point + 0.5, qmin, qmax).trunc()
        ctx.save_for_backward(x, scale, backward_zp)
        ctx.qrange, ctx.axis, ctx.grad_factor = (qmin, qmax), axis, grad_factor
        return fake_quantize(x.detach(), scale, rounded_zp.to(torch.int32), qmin, qmax, axis,
                             kernel)

    @staticmethod
    def backward(ctx, grad):
        x, scale, zero_point = ctx.saved_tensors
        (qmin, qmax), axis, grad_factor = ctx.qrange, ctx.axis, ctx.grad_factor
        sc = _broadcast(scale, x.dim(), axis)
        inv = _broadcast(inv_scale_f32(scale), x.dim(), axis)
        zp = _broadcast(zero_point, x.dim(), axis)
        q = torch.round(torch.addcmul(zp, x, inv))
        inside = (q >= qmin) & (q <= qmax)
        grad_x = grad * inside
        rounding_error = torch.addcmul(-x, torch.clamp(q, qmin, qmax) - zp, sc)
        clipped_grad_scale = torch.where(q < qmin, grad * (qmin - zp), grad * (qmax - zp))
        grad_scale = torch.where(inside, grad * rounding_error * inv * grad_factor,
                                 clipped_grad_scale * grad_factor)
        grad_zp = torch.where(inside, torch.zeros_like(grad), grad * (-1) * sc * grad_factor)
        if axis is None:
            grad_scale = grad_scale.sum().reshape(scale.shape)
            grad_zp = grad_zp.sum().reshape(zero_point.shape)
        else:
            dims = [d for d in range(x.dim()) if d != axis]
            grad_scale, grad_zp = grad_scale.sum(dims), grad_zp.sum(dims)
        return grad_x, grad_scale, grad_zp, None, None, None, None, None


def fake_quantize_learnable(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                            qmin: int, qmax: int, axis: Optional[int] = None,
                            grad_factor: float = 1.0,
                            kernel: FakeQuantizeKernel = fake_quantize_formula) -> torch.Tensor:
    """Fake-quantize with gradients for ``x``, ``scale`` and the float ``zero_point``.

    ``grad_factor`` scales the scale / zero-point gradients (LSQ's gradient normalisation).
    Inside the range ``d/dscale = (fq(x) - x) / scale``; below / above it ``qmin - zp`` /
    ``qmax - zp``; ``d/dzp = -scale`` outside the range and 0 inside.
    """
    if x.dtype != torch.float32:
        raise TypeError(f"fake_quantize_learnable expects a float32 input, got {x.dtype}")
    if qmin > qmax:
        raise ValueError(f"quant_min ({qmin}) must not exceed quant_max ({qmax})")
    if axis is not None:
        axis = axis % x.dim()
        if scale.numel() != x.size(axis) or zero_point.numel() != x.size(axis):
            raise ValueError(f"fake_quantize_learnable: {scale.numel()} scales / "
                             f"{zero_point.numel()} zero points for {x.size(axis)} channels "
                             f"along axis {axis}")
    return _LearnableFakeQuantize.apply(x, scale, zero_point, qmin, qmax, axis, float(grad_factor),
                                        kernel)


# --------------------------------------------------------------------------------------------
# Sub-byte packing (quint4x2, quint2x4)
# --------------------------------------------------------------------------------------------

def pack_sub_byte(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned ``bits``-wide values, flattened, low bits first: element ``k*i + j`` goes to
    bits ``[j*bits, (j+1)*bits)`` of byte ``i``.  Returns a 1-D uint8 tensor."""
    per = 8 // bits
    flat = values.reshape(-1).to(torch.uint8)
    pad = (-flat.numel()) % per
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    flat = flat.view(-1, per)
    out = flat[:, 0].clone()
    for j in range(1, per):
        out |= flat[:, j] << (j * bits)
    return out


def unpack_sub_byte(packed: torch.Tensor, bits: int, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_sub_byte`: the first ``numel`` values as a 1-D uint8 tensor."""
    per = 8 // bits
    mask = (1 << bits) - 1
    parts = [(packed >> (j * bits)) & mask for j in range(per)]
    return torch.stack(parts, dim=1).reshape(-1)[:numel]



def quantize_mode(qdtype: QDType, per_channel: bool) -> str:
    """Which rounding formula torch 2.13 uses for this dtype / granularity (module docstring)."""
    if qdtype.is_sub_byte and not per_channel:
        return ROUND_ADD
    if per_channel or qdtype.bits == 32:
        return MUL_ADD
    return FMA


# --------------------------------------------------------------------------------------------
# Per-call forms for the int8 kernels (scalar qparams, accumulator requantization)
# --------------------------------------------------------------------------------------------

def choose_qparams_aten_scalar(min_val: float, max_val: float, qmin: int, qmax: int,
                               preserve_sparsity: bool = False,
                               reduce_range: bool = False,
                               float32_scale: bool = True) -> tuple[float, int]:
    """:func:`choose_qparams_aten` for one (min, max) pair of Python floats.

    Dynamic quantization picks activation qparams on every call; the tensor version costs ~40
    tiny tensor ops, this one a few microseconds of Python.  Same arithmetic step for step
    (float32 steps emulated with :func:`round_to_float32`), so the results are identical
    (tested); returns (scale as a float32 value, zero_point).  ``float32_scale=False`` returns
    the scale as the double ATen computes (what ``torch.quantize_per_tensor_dynamic`` stores as
    ``q_scale``); quantizing rounds it to float32 either way.
    """
    if reduce_range:
        qmin, qmax = qmin // 2, qmax // 2
    mn, mx = round_to_float32(float(min_val)), round_to_float32(float(max_val))
    if not (math.isfinite(mn) and math.isfinite(mx)):
        raise ValueError(f"choose_qparams: min {mn} and max {mx} must be finite")
    if mn > mx:
        raise ValueError(f"choose_qparams: min {mn} must not exceed max {mx}")
    straddles = preserve_sparsity and mn < 0 < mx
    if straddles:
        sym_qmin = -((qmax - qmin) // 2 + 1)
        sym_qmax = (qmax - qmin) // 2
        max_scale = max(abs(round_to_float32(mn / sym_qmin)), abs(round_to_float32(mx / sym_qmax)))
        mn, mx = round_to_float32(max_scale * sym_qmin), round_to_float32(max_scale * sym_qmax)
    mn, mx = min(mn, 0.0), max(mx, 0.0)
    scale = (mx - mn) / (qmax - qmin)
    scale_f = round_to_float32(scale)
    if scale_f == 0 or math.isinf(round_to_float32(1.0 / scale_f)):
        scale = 0.1
    if scale < SMALL_SCALE_THRESHOLD:
        thr = round_to_float32(SMALL_SCALE_THRESHOLD)
        amplifier = round_to_float32(thr / round_to_float32(scale))
        if mn == 0:
            mx = round_to_float32(thr * (qmax - qmin))
        elif mx == 0:
            mn = round_to_float32(-thr * (qmax - qmin))
        else:
            mn, mx = round_to_float32(mn * amplifier), round_to_float32(mx * amplifier)
        scale = thr
    err_min = abs(qmin) - abs(mn / scale)
    err_max = abs(qmax) - abs(mx / scale)
    zp = qmin - mn / scale if err_min < err_max else qmax - mx / scale
    if straddles:
        zp = (qmin + qmax) / 2
    zero_point = qmin if zp < qmin else qmax if zp > qmax else int(round(zp))
    return (round_to_float32(scale) if float32_scale else scale), zero_point


def requantize(acc: torch.Tensor, multiplier: torch.Tensor, offset: torch.Tensor, qmin: int,
               qmax: int, storage_dtype: torch.dtype) -> torch.Tensor:
    """Map an integer accumulator onto an output grid: ``clamp(nearbyint(acc * m + offset))``.

    The epilogue of the int8 GEMM kernels.  With ``m = x_scale * w_scale / out_scale`` and
    ``offset = bias / out_scale + out_zero_point`` (plus any zero-point correction) it folds
    "dequantize the accumulator, then quantize" into one multiply-add, so it can differ from
    quantizing the float result by one step where that sits within float rounding of a tie.
    """
    y = torch.addcmul(offset, acc, multiplier)
    return torch.clamp_(y.round_(), qmin, qmax).to(storage_dtype)


# --------------------------------------------------------------------------------------------
# Forms used inside torch's quantized operator kernels (activations, pooling, add, ...)
# --------------------------------------------------------------------------------------------

def dequantize_int_premul(q: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """``fma(scale, float(q), -zero_point * scale)`` in float32: how torch's SIMD operator
    kernels dequantize (the product ``-zp * scale`` is rounded to float32 first).  It can
    differ from :func:`dequantize_int` by an ulp, which moves results that sit on a rounding
    tie.  ``torch.addcmul`` computes the fused multiply-add on CPU (tested)."""
    scale_f = torch.tensor(scale, dtype=torch.float32, device=q.device)
    premul = scale_f * torch.tensor(-float(zero_point), dtype=torch.float32, device=q.device)
    return torch.addcmul(premul, q.to(torch.float32), scale_f)


def quantize_with_multiplier_operands(x: torch.Tensor, multiplier: Any, zero_point: Any
                                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 x, float32 multiplier, float32 zero point) for :func:`quantize_formula`."""
    inv = torch.as_tensor(multiplier, dtype=torch.float32, device=x.device)
    zp = torch.as_tensor(zero_point, device=x.device).to(torch.float32)
    return x.to(torch.float32), inv, zp


def quantize_with_multiplier(x: torch.Tensor, multiplier: Any, zero_point: Any, qmin: int,
                             qmax: int, storage_dtype: torch.dtype,
                             mode: str = ROUND_ADD) -> torch.Tensor:
    """Quantize ``x`` with a float32 ``multiplier`` standing in for ``1 / scale``.

    torch's operator kernels requantize with a multiplier they compute themselves (for example
    ``in_scale * out_inv_scale``, or ``1 / pool_size``), which need not be the float32 reciprocal
    of any scale; ``mode`` is one of FMA / MUL_ADD / ROUND_ADD as in :func:`quantize_int`.  Both
    ``multiplier`` and ``zero_point`` broadcast against ``x``."""
    return quantize_formula(*quantize_with_multiplier_operands(x, multiplier, zero_point), qmin,
                            qmax, storage_dtype, mode)


def quantize_float64(x: torch.Tensor, scale: float, zero_point: int, qmin: int, qmax: int,
                     storage_dtype: torch.dtype) -> torch.Tensor:
    """``clamp(nearbyint(x / scale + zero_point))`` computed in float64 (division, not the
    float32 reciprocal), for kernels whose requantization does not round in float32 (torch's
    quantized bilinear upsampling)."""
    y = torch.round(x.to(torch.float64) / scale + zero_point)
    y = torch.where(torch.isnan(y), torch.full_like(y, zero_point), y)
    return torch.clamp(y, qmin, qmax).to(storage_dtype)


def quantize_scalar(value: float, scale: float, zero_point: int, qmin: int, qmax: int,
                    mode: str = MUL_ADD) -> int:
    """:func:`quantize_int` of one Python float, in Python (float32 steps emulated exactly):
    for the bounds and constants that kernels quantize once per call."""
    inv = inv_scale_float32(scale)
    product = round_to_float32(round_to_float32(value) * inv)
    if mode == ROUND_ADD:
        y = round(product) + zero_point if math.isfinite(product) else product
    elif mode == MUL_ADD:
        y = round(round_to_float32(product + zero_point)) if math.isfinite(product) else product
    elif mode == FMA:
        y = round_to_float32(round_to_float32(value) * inv + zero_point)
        y = round(y) if math.isfinite(y) else y
    else:
        raise ValueError(f"unknown rounding mode {mode!r}")
    if math.isnan(y):
        return nan_code(qmin, qmax, torch.int32 if qmin < -(1 << 16) else torch.uint8, mode)
    return int(min(max(y, qmin), qmax))
