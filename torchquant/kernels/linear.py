"""Int8 Linear kernels: weight prepacking, static, dynamic and per-token dynamic matmuls.

Weights are packed once into a :class:`PackedLinearWeight`; every call then picks a kernel
through the registry:

* ``onednn`` -- ``torch.ops.onednn.qlinear_pointwise`` on a oneDNN-blocked weight: u8 x s8 with
  the activation zero point, the requantization (or float output) and the static post-op
  (:class:`PostOp`: relu, leaky_relu, tanh, add, add_relu) fused.  Fastest
  once there are a few rows; its fixed per-call cost loses at batch 1.  On CPUs without an
  int32-accumulating u8 x s8 instruction (AVX2 / AVX-512 without VNNI or AMX) oneDNN's
  ``vpmaddubsw`` saturates ``u8*s8 + u8*s8`` to int16 and the GEMM is wrong for activations
  above 128; there (found once by :func:`onednn_u8_exact_max`) the kernel checks the input's
  maximum and runs larger inputs as two exact halves (:func:`onednn_split_linear`).
* ``int_mm`` -- ``torch._int_mm`` (s8 x s8 -> s32) on the plain weight plus one epilogue;
  uint8 activations are shifted to int8 (``x ^ 0x80 == x - 128``) and the shift is folded into
  a per-channel correction.  Wins at one or two rows; also the CUDA path.
* ``reference`` -- dequantize, float ``linear``, post-op, quantize (the numerics contract).

Fast kernels need symmetric weights (all weight zero points 0), which is what every torch
qconfig produces; asymmetric weights run on the reference.  Static results agree with the
reference within one output step (float rounding differs near ties).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple, Optional, Union

import torch
import torch.nn.functional as F

from .. import _config
from . import cpu_compiled, cpu_isa, sparse_correction
from .reference import quantize_formula
from .registry import get, mode, register
from .. import affine
from .. import dtypes as _dt

__all__ = ["PackedLinearWeight", "pack_linear_weight", "quantized_linear", "dynamic_linear",
           "per_token_dynamic_linear", "POST_OPS", "PostOp", "post_op_of", "quantize_post_op",
           "onednn_available", "onednn_u8_exact_max", "onednn_u8s8_exact", "onednn_exact_for",
           "onednn_usable"]

Scalar = Union[float, int, torch.Tensor]

# Below this many rows ``_int_mm`` + epilogue is used instead of oneDNN.  On the AMX Xeon of
# the benchmarks oneDNN wins from one row (1x768x3072: 48 us against _int_mm's 131 us; an AMD
# EPYC measured earlier favoured _int_mm at one row), so oneDNN takes every row count.
ONEDNN_MIN_ROWS = _config.onednn_min_rows()
_UINT8_TO_INT8_SHIFT = 128
_SIGN_BIT = torch.tensor(-128, dtype=torch.int8)  # x_u8 ^ 0x80 viewed as int8 == x_u8 - 128
_EPILOGUE_CACHE_SIZE = 8


@functools.cache
def onednn_available() -> bool:
    """Whether this torch build has oneDNN's quantized linear/conv ops on CPU (asked once: the
    registry checks it on every call)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_pointwise")
            and hasattr(torch.ops.onednn, "qconv_pointwise"))


# --------------------------------------------------------------------------------------------
# oneDNN's u8 x s8 exactness on this CPU
# --------------------------------------------------------------------------------------------

# Without VNNI / AMX, x86 u8 x s8 dot products use ``vpmaddubsw``, which adds the two products
# ``u8 * s8 + u8 * s8`` with int16 saturation: 255 * 127 * 2 = 64770 does not fit.  With
# activations <= 128 no pair can leave int16 (2 * 128 * -128 = -32768, 2 * 128 * 127 = 32512),
# which is why torch's x86 / fbgemm qconfigs quantize activations to 0..127 (reduce_range).
ONEDNN_SAFE_U8_MAX = 128
_FULL_U8_MAX = 255


def _onednn_linear_exact(x_value: int, w_value: int) -> bool:
    k, n = 64, 16
    w = torch.full((n, k), w_value, dtype=torch.int8)
    ones, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int64)
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    for rows in (1, 8):  # oneDNN may pick a GEMV kernel for one row
        x = torch.full((rows, k), x_value, dtype=torch.uint8)
        y = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, ones, zeros, None, 1.0, 0,
                                               torch.float32, "none", [], "")
        if not bool((y == float(x_value * w_value * k)).all()):
            return False
    return True


def _onednn_conv_exact(x_value: int, w_value: int) -> bool:
    for dims in (1, 2, 3):
        for c_in, c_out, kernel, groups in ((8, 16, 3, 1), (8, 16, 1, 1), (8, 8, 3, 8)):
            w = torch.full((c_out, c_in // groups) + (kernel,) * dims, w_value, dtype=torch.int8)
            ones, zeros = torch.ones(c_out), torch.zeros(c_out, dtype=torch.int64)
            one, zero = [1] * dims, [0] * dims
            packed = torch.ops.onednn.qconv_prepack(w, ones, 1.0, 0, one, zero, one, groups, None)
            x = torch.full((2, c_in) + (4,) * dims, x_value, dtype=torch.uint8)
            y = torch.ops.onednn.qconv_pointwise(x, 1.0, 0, packed, ones, zeros, None, one, zero,
                                                 one, groups, 1.0, 0, torch.float32, "none", [],
                                                 "")
            exact = x_value * w_value * (c_in // groups) * kernel ** dims
            if not bool((y == float(exact)).all()):
                return False
    return True


def onednn_u8_exact_max() -> int:
    """The largest uint8 activation for which oneDNN's u8 x s8 linear and conv are exact here:
    255 where they accumulate in int32 (VNNI, AMX), :data:`ONEDNN_SAFE_U8_MAX` (128) where
    pairs of products saturate to int16 (AVX2, AVX-512 without VNNI), -1 where even that
    fails or oneDNN is missing (then its kernels are never used).

    Measured once, on inputs whose every pair of products sits at the edge (all 255 x 127,
    then all 128 x -128), for one and several rows and for dense, 1x1 and depthwise 1-3d
    convs; the answer is exact integers or not, so it does not depend on rounding.  At most
    :data:`ONEDNN_SAFE_U8_MAX` where ``TORCHQUANT_CPU_ISA`` is ``avx2`` / ``avx512``
    (:mod:`.cpu_isa`: the saturating CPUs' paths, forced on a newer one).
    """
    measured = _onednn_u8_exact_max_measured()
    if measured > ONEDNN_SAFE_U8_MAX and cpu_isa.int8_pairs_forced_saturating():
        return ONEDNN_SAFE_U8_MAX
    return measured


@functools.cache
def _onednn_u8_exact_max_measured() -> int:
    if not onednn_available():
        return -1
    from torch.utils._python_dispatch import _disable_current_modes
    try:
        # real tensors even when first asked during a trace (export's fake / proxy modes):
        # the answer is cached for the process
        with _disable_current_modes(), torch.no_grad():
            if _onednn_linear_exact(255, 127) and _onednn_conv_exact(255, 127):
                return _FULL_U8_MAX
            if (_onednn_linear_exact(ONEDNN_SAFE_U8_MAX, -128)
                    and _onednn_conv_exact(ONEDNN_SAFE_U8_MAX, -128)):
                return ONEDNN_SAFE_U8_MAX
    except RuntimeError:  # a build whose oneDNN ops exist but cannot run here
        pass
    return -1


def onednn_u8s8_exact() -> bool:
    """Whether oneDNN's u8 x s8 kernels are exact for every uint8 activation on this CPU."""
    return onednn_u8_exact_max() == _FULL_U8_MAX


def onednn_exact_for(x: torch.Tensor) -> bool:
    """Whether oneDNN computes ``x``'s (uint8) GEMM / conv exactly on this CPU: always where it
    accumulates in int32; elsewhere only when ``x.max() <= 128`` (one reduction per call, on
    such CPUs only)."""
    limit = onednn_u8_exact_max()
    if limit >= _FULL_U8_MAX:
        return True
    if limit < 0:
        return False
    return x.numel() == 0 or int(x.max()) <= limit


def onednn_usable() -> bool:
    """oneDNN's ops exist and are exact at least on activations <= 128 (the registry's
    ``available`` for the oneDNN kernels, and whether weights get a oneDNN copy)."""
    return onednn_u8_exact_max() >= 0


# --------------------------------------------------------------------------------------------
# Argument helpers shared with conv.py
# --------------------------------------------------------------------------------------------

def as_float(value: Scalar, what: str) -> float:
    """A positive finite scale as a Python float (0-d / 1-element tensors accepted)."""
    v = float(value)
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{what} must be positive and finite, got {v}")
    return v


def as_zero_point(value: Scalar, qdtype: _dt.QDType, what: str) -> int:
    """An integer zero point inside ``qdtype``'s range as a Python int."""
    v = float(value)
    if v != int(v) or not qdtype.qmin <= v <= qdtype.qmax:
        raise ValueError(f"{what} must be an integer in [{qdtype.qmin}, {qdtype.qmax}] for "
                         f"{qdtype!r}, got {value}")
    return int(v)


def validated_qparams(x_scale: Scalar, x_zero_point: Scalar, x_qdtype: _dt.QDType,
                      out_scale: Scalar, out_zero_point: Scalar,
                      out_qdtype: _dt.QDType) -> tuple[Scalar, Scalar, Scalar, Scalar]:
    """The per-tensor input and output qparams as checked Python numbers (converted once per
    call).  Under tracing they pass through unchanged: the checks would be data-dependent."""
    if torch.compiler.is_compiling():
        return x_scale, x_zero_point, out_scale, out_zero_point
    return (as_float(x_scale, "x_scale"), as_zero_point(x_zero_point, x_qdtype, "x_zero_point"),
            as_float(out_scale, "out_scale"),
            as_zero_point(out_zero_point, out_qdtype, "out_zero_point"))


def activation_qdtype(x: torch.Tensor, op: str) -> _dt.QDType:
    """quint8 for uint8 storage, qint8 for int8; anything else is not a quantized activation."""
    if x.dtype == torch.uint8:
        return _dt.quint8
    if x.dtype == torch.int8:
        return _dt.qint8
    raise TypeError(f"{op}: expected the integer (uint8 / int8) values of a quantized input, "
                    f"got dtype {x.dtype}")


def output_qdtype(out_dtype: Any, op: str) -> _dt.QDType:
    qdtype = _dt.to_qdtype(out_dtype)
    if qdtype not in (_dt.quint8, _dt.qint8):
        raise ValueError(f"{op}: out_dtype must be quint8 or qint8, got {qdtype!r}")
    return qdtype


def per_channel_view(scale: torch.Tensor, zero_point: torch.Tensor, channels: int,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(float32 scales, int64 zero points) with one entry per output channel."""
    return (scale.to(device=device, dtype=torch.float32).reshape(-1).expand(channels).contiguous(),
            zero_point.to(device=device, dtype=torch.int64).reshape(-1).expand(channels).contiguous())


def check_weight_qparams(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                         axis: Optional[int], op: str) -> None:
    """Per-tensor (0-d / 1-element) or per-channel qparams, valid for qint8."""
    if weight.dtype != torch.int8:
        raise TypeError(f"{op}: weight must be an int8 tensor (qint8 values), got {weight.dtype}")
    expected = 1 if axis is None else weight.size(axis)
    if scale.numel() != expected or zero_point.numel() != expected:
        kind = "per-tensor" if axis is None else f"per-channel (axis {axis})"
        raise ValueError(f"{op}: {kind} weight needs {expected} scale(s) and zero point(s), got "
                         f"{scale.numel()} and {zero_point.numel()}")
    affine.check_scale(scale, "weight scale")
    affine.check_zero_point(zero_point, _dt.qint8, "weight zero_point")


def check_bias(bias: Optional[torch.Tensor], channels: int, op: str) -> Optional[torch.Tensor]:
    """None, or a float32 vector with one entry per output channel."""
    if bias is None:
        return None
    if not isinstance(bias, torch.Tensor) or not bias.dtype.is_floating_point:
        raise TypeError(f"{op}: bias must be a float tensor or None, got "
                        f"{getattr(bias, 'dtype', type(bias).__name__)}")
    if bias.shape != (channels,):
        raise ValueError(f"{op}: bias must have shape ({channels},), got {tuple(bias.shape)}")
    return bias.detach().to(torch.float32).contiguous()


# --------------------------------------------------------------------------------------------
# Packed weight
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class PackedLinearWeight:
    """An int8 Linear weight with everything the kernels need, computed once.

    ``weight`` is the plain int8 ``[out, in]`` tensor (``weight.t()`` is ``_int_mm``'s operand,
    no copy) with ``weight_scale`` / ``weight_zero_point`` as given (0-d per tensor, 1-d per
    channel along ``axis`` 0).  Derived: per-channel float32 scales and int64 zero points,
    the per-channel weight sums (``_int_mm``'s activation zero-point correction) and the
    oneDNN-blocked copy.  ``requant_epilogues`` caches the static ``_int_mm`` epilogue per
    (input, output) qparams, which a calibrated model never changes.  Pickling / deepcopy
    repack from the plain fields (oneDNN tensors have no storage to copy).
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor
    axis: Optional[int]
    bias: Optional[torch.Tensor]
    channel_scale: torch.Tensor
    channel_zero_point: torch.Tensor
    weight_sum: torch.Tensor
    symmetric: bool
    onednn_weight: Optional[torch.Tensor]
    requant_epilogues: dict = field(default_factory=dict, repr=False)
    # The eager modules' per-call cache (nn.quantized Linear: call key -> linear_plan's plan
    # and the output qparams), dropped with this pack when the weight changes.
    eager_calls: dict = field(default_factory=dict, repr=False)
    # :func:`quantized_linear`'s checked, bound calls (call_key -> linear_plan's plan).
    plans: dict = field(default_factory=dict, repr=False)

    @property
    def in_features(self) -> int:
        return self.weight.size(1)

    @property
    def out_features(self) -> int:
        return self.weight.size(0)

    def dequantized_weight(self) -> torch.Tensor:
        operands = affine.dequantize_operands(self.weight, self.weight_scale,
                                              self.weight_zero_point, self.axis)
        return get("dequantize", self.weight, per_channel=self.axis is not None)(*operands)

    def to(self, device: Union[str, torch.device]) -> "PackedLinearWeight":
        """The same weight packed for ``device``."""
        return pack_linear_weight(self.weight.to(device), self.weight_scale, self.weight_zero_point,
                                  self.axis, None if self.bias is None else self.bias.to(device))

    def __reduce__(self):
        return (pack_linear_weight, (self.weight, self.weight_scale, self.weight_zero_point,
                                     self.axis, self.bias))


def pack_linear_weight(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                       axis: Optional[int] = None,
                       bias: Optional[torch.Tensor] = None) -> PackedLinearWeight:
    """Pack int8 weights ``[out, in]`` with per-tensor (``axis=None``) or per-channel
    (``axis=0``) qparams and an optional float bias."""
    op = "pack_linear_weight"
    if not isinstance(weight, torch.Tensor) or type(weight) is not torch.Tensor:
        raise TypeError(f"{op}: weight must be a plain int8 tensor (QTensor: pass .int_data), "
                        f"got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [out_features, in_features], got shape "
                         f"{tuple(weight.shape)}")
    if axis not in (None, 0):
        raise ValueError(f"{op}: per-channel weights must be quantized along axis 0, got {axis}")
    scale, zero_point = torch.as_tensor(scale), torch.as_tensor(zero_point)
    check_weight_qparams(weight, scale, zero_point, axis, op)
    weight = weight.detach().contiguous()
    n = weight.size(0)
    bias = check_bias(bias, n, op)
    if bias is not None:
        bias = bias.to(weight.device)
    channel_scale, channel_zp = per_channel_view(scale, zero_point, n, weight.device)
    symmetric = not bool(channel_zp.any())
    onednn_weight = None
    if symmetric and weight.device.type == "cpu" and onednn_usable() and weight.numel():
        onednn_weight = torch.ops.onednn.qlinear_prepack(weight, None)
    return PackedLinearWeight(weight, scale, zero_point, axis, bias, channel_scale, channel_zp,
                              weight.sum(1, dtype=torch.int32), symmetric, onednn_weight)


def quantize_float_result(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          qmin: int, qmax: int, storage_dtype: torch.dtype,
                          axis: Optional[int] = None, mode: str = affine.FMA) -> torch.Tensor:
    """:func:`torchquant.affine.quantize_int` on the registered quantize kernel for this call
    (one fused pass where it applies): how the composite kernels here and in :mod:`.conv`
    quantize their float intermediates."""
    x32, inv, zp, mode = affine.quantize_operands(x, scale, zero_point, axis, mode)
    fn = get("quantize", x, mode=mode, per_channel=axis is not None)
    return fn(x32, inv, zp, qmin, qmax, storage_dtype, mode)


def _as_signed(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """int8 values for ``_int_mm`` and the shift subtracted from them (128 for uint8)."""
    if x.dtype == torch.uint8:
        return torch.bitwise_xor(x.view(torch.int8), _SIGN_BIT), _UINT8_TO_INT8_SHIFT
    return x, 0


@functools.cache
def int_mm_exact_on_cpu() -> bool:
    """Whether ``torch._int_mm`` is exact on this CPU for all int8 operands.  ATen runs it on
    oneDNN where it sees AVX-512 VNNI, else on its own loop; oneDNN held below VNNI
    (``ONEDNN_MAX_CPU_ISA=AVX2`` on a VNNI CPU) then computes s8 x s8 as (s8 + 128) x s8 with
    saturating int16 pairs.  Measured once on edge values, as :func:`onednn_u8_exact_max`."""
    k = 64
    try:
        with torch.no_grad():
            for x_value, w_value in ((127, 127), (127, -128), (-128, -128)):
                x = torch.full((32, k), x_value, dtype=torch.int8)
                w = torch.full((k, 16), w_value, dtype=torch.int8)
                if not bool((torch._int_mm(x, w) == x_value * w_value * k).all()):
                    return False
    except RuntimeError:
        return False
    return True


def _int_mm_available() -> bool:
    return torch.cuda.is_available() or int_mm_exact_on_cpu()


def _int_mm_applies(x: torch.Tensor, packed: PackedLinearWeight, **_: Any) -> bool:
    if not packed.symmetric or x.device != packed.weight.device:
        return False
    if x.device.type == "cuda":  # cuBLASLt's int8 GEMM constraints
        return x.size(0) > 16 and x.size(1) % 8 == 0 and packed.out_features % 8 == 0
    return x.size(0) > 0 and int_mm_exact_on_cpu()


def _onednn_applies(x: torch.Tensor, packed: PackedLinearWeight, **_: Any) -> bool:
    return (packed.onednn_weight is not None and x.dtype == torch.uint8
            and x.size(0) >= ONEDNN_MIN_ROWS)


# --------------------------------------------------------------------------------------------
# Fused epilogues of the static linear / conv kernels
# --------------------------------------------------------------------------------------------

POST_OPS = ("none", "relu", "leaky_relu", "tanh", "add", "add_relu")
_ADDS = ("add", "add_relu")
DEFAULT_NEGATIVE_SLOPE = 0.01  # torch.nn.LeakyReLU's


class PostOp(NamedTuple):
    """What a static linear / conv does to its float result ``y = op(x_hat, w_hat, bias)``
    before its one requantization (torch's fused modules LinearReLU, LinearLeakyReLU,
    LinearTanh, ConvReLU1d-3d, ConvAdd2d, ConvAddReLU2d):

    ``none`` y, ``relu`` relu(y), ``leaky_relu`` leaky_relu(y, negative_slope), ``tanh``
    tanh(y), ``add`` y + other_hat, ``add_relu`` relu(y + other_hat), where other_hat is the
    dequantized second operand (``other_scale``, ``other_zero_point``), of the output's shape.

    A tuple of numbers, so plan and epilogue caches can key on it; the operand itself changes
    every call and travels beside it.
    """

    name: str = "none"
    negative_slope: float = DEFAULT_NEGATIVE_SLOPE
    other_scale: float = 1.0
    other_zero_point: int = 0

    @property
    def adds(self) -> bool:
        return self.name in _ADDS

    @property
    def relu(self) -> bool:
        """ReLU last (``relu``, ``add_relu``): a clamp at the output zero point."""
        return self.name == "relu" or self.name == "add_relu"


_PLAIN_POST_OPS = {name: PostOp(name) for name in ("none", "relu", "tanh")}


def post_op_of(name: str, negative_slope: float, other: Optional[torch.Tensor],
               other_scale: Scalar, other_zero_point: Scalar, out_shape: tuple,
               op: str) -> PostOp:
    """The checked :class:`PostOp` of a call whose result has shape ``out_shape``; ``other``
    (the integers of a per-tensor quantized tensor of that shape) only for the adds."""
    plain = _PLAIN_POST_OPS.get(name)
    if plain is not None and other is None:
        return plain
    if name not in POST_OPS:
        raise ValueError(f"{op}: post_op must be one of {POST_OPS}, got {name!r}")
    if name not in _ADDS:
        if other is not None:
            raise ValueError(f"{op}: post_op={name!r} takes no second operand (other is only "
                             "for 'add' / 'add_relu')")
        slope = float(negative_slope)
        if not math.isfinite(slope):
            raise ValueError(f"{op}: negative_slope must be finite, got {slope}")
        return PostOp(name, slope)
    if not isinstance(other, torch.Tensor):
        raise TypeError(f"{op}: post_op={name!r} needs the integers of the added tensor as "
                        f"`other`, got {type(other).__name__}")
    other_qdtype = activation_qdtype(other, op)
    if tuple(other.shape) != tuple(out_shape):
        raise ValueError(f"{op}: the added tensor must have the output's shape "
                         f"{tuple(out_shape)}, got {tuple(other.shape)}")
    return PostOp(name, DEFAULT_NEGATIVE_SLOPE, as_float(other_scale, "other_scale"),
                  as_zero_point(other_zero_point, other_qdtype, "other_zero_point"))


def apply_post_op_(y: torch.Tensor, post_op: PostOp,
                   other: Optional[torch.Tensor]) -> torch.Tensor:
    """The epilogue on a float32 result, in place (``y`` is the kernel's own temporary)."""
    name = post_op.name
    if name == "none":
        return y
    if post_op.adds:
        y = y.add_(affine.dequantize_per_tensor_int(other, post_op.other_scale,
                                                    post_op.other_zero_point))
    if post_op.relu:
        return y.relu_()
    if name == "leaky_relu":
        return F.leaky_relu_(y, post_op.negative_slope)
    if name == "tanh":
        return y.tanh_()
    return y


def quantize_post_op(y: torch.Tensor, post_op: PostOp, other: Optional[torch.Tensor],
                     out_scale: Scalar, out_zero_point: Scalar,
                     out_qdtype: _dt.QDType) -> torch.Tensor:
    """``quantize(post_op(y))``: the epilogue and the requantization of a float result (the
    reference kernels, and the fast ones where they cannot fuse the post-op)."""
    y = apply_post_op_(y, post_op, other)
    scale, zero_point = affine.per_tensor_qparams(float(out_scale), int(out_zero_point), y.device)
    mode = affine.quantize_mode(out_qdtype, per_channel=False)
    if (mode == affine.FMA and out_qdtype.bits == 8 and y.dtype == torch.float32
            and 1.0 / float(out_scale) < _FINITE_INV_SCALE_LIMIT):
        # y is finite by construction (integer accumulators times finite scales, a finite
        # bias, post-ops of finite values) and so is 1 / out_scale: the general formula's NaN
        # mask is a no-op, and the finite form is the same integers in fewer passes.
        _, inv, zp, _ = affine.quantize_operands(y, scale, zero_point, None, mode)
        return get("quantize_finite", y)(y, inv, zp, out_qdtype.qmin, out_qdtype.qmax,
                                         out_qdtype.storage_dtype)
    return quantize_float_result(y, scale, zero_point, out_qdtype.qmin, out_qdtype.qmax,
                                 out_qdtype.storage_dtype, None, mode)


# 1 / out_scale below this (float32's largest finite value) keeps x * inv free of inf * 0.
_FINITE_INV_SCALE_LIMIT = 3.0e38


# --------------------------------------------------------------------------------------------
# Static: quantized activations in, requantized activations out
# --------------------------------------------------------------------------------------------

def call_key(x: torch.Tensor, *call: Any) -> Optional[tuple]:
    """A hashable description of a kernel call on ``x`` (its shape, strides, dtype, device,
    the kernel mode and CPU cap, and the call's other arguments) under which a checked, bound
    plan may be kept; None where calls are not cached (tracing, tensor qparams, lists)."""
    if torch.compiler.is_compiling():
        return None
    key = (tuple(x.shape), x.stride(), x.dtype, x.device, mode(), cpu_isa.cpu_isa_cap(), *call)
    try:
        hash(key)
    except TypeError:
        return None
    if any(isinstance(v, torch.Tensor) for v in call):
        return None
    return key


_PLAN_CACHE_SIZE = 16


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
        if len(packed.plans) >= _PLAN_CACHE_SIZE:
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
    ``x`` (:func:`onednn_exact_for`) is still asked per call."""
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
            if onednn_exact_for(x2d):
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
          and out_qdtype == _dt.quint8, available=onednn_usable)
def _quantized_linear_onednn(x, x_scale, x_zp, packed, out_scale, out_zp, out_qdtype, post_op,
                             other):
    """oneDNN's fused post-ops: eltwise relu / leaky_relu / tanh (torch's LinearReLU,
    LinearLeakyReLU and LinearTanh run these very kernels, so the results are torch's), and the
    adds as its in-place ``sum`` into a copy of the added (quint8) tensor."""
    if not onednn_exact_for(x):  # would saturate on this CPU: two exact halves, float sum
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
                                        requant_epilogues={}, eager_calls={})
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
          applies=lambda x, packed, **_: _onednn_applies(x, packed), available=onednn_usable)
def _dynamic_linear_onednn(x_q, x_scale, x_zp, packed, relu):
    # the accumulator through oneDNN at unit scales, then torch.ao's epilogue
    ones, zeros, _, unit_pack = _unit_epilogue_operands(packed)
    if not onednn_exact_for(x_q):  # would saturate on this CPU (reduce_range=False activations)
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
    (:func:`onednn_u8_exact_max` < 255) they go through :func:`onednn_split_linear`."""
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
    if onednn_u8s8_exact():
        y = torch.ops.onednn.qlinear_pointwise(
            x_u8, 1.0, _UINT8_TO_INT8_SHIFT, packed.onednn_weight, packed.channel_scale,
            packed.channel_zero_point, None, 1.0, 0, torch.float32, "none", [], "")
    else:
        y = onednn_split_linear(x_u8, 1.0, _UINT8_TO_INT8_SHIFT, packed, with_bias=False)
    return _row_rescale_(y, scale, packed, relu)
