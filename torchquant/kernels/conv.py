"""Int8 convolution kernels (1d / 2d / 3d, static): weight prepacking and the quantized conv.

* ``onednn`` -- ``torch.ops.onednn.qconv_pointwise`` on a weight blocked once by
  ``qconv_prepack``: u8 activations with their zero point, s8 symmetric weights, per-channel
  requantization and the post-op fused where oneDNN can (ReLU; the adds of ConvAdd2d), else
  applied to its float output (:func:`~.post_ops.quantize_post_op`).  It accepts NCHW or
  channels-last input and returns a tensor of the logical ``[N, C, *spatial]`` shape in
  channels-last memory format (what torch's x86 quantized conv returns too): feeding it to
  the next conv skips a layout conversion.  Where oneDNN saturates int16 pairs of products (no
  VNNI / AMX, see ``onednn_exactness.onednn_u8_exact_max``) inputs above 128 run as two exact halves
  (``x & 127`` and ``x >> 7``; the second scattered from its few nonzero positions where it
  is sparse, :mod:`.sparse_correction`) with float output, the post-op and one
  requantization, still returned channels-last.
  Small 2-d convs (:func:`.native.conv_preferred`: where oneDNN's per-call set-up outweighs
  its kernel) run torchquant's native conv instead, bound the same way (:func:`_native_plan`).
* ``reference`` -- dequantize, float ``conv``, post-op, quantize (the numerics contract);
  contiguous output.  Also the only path for transposed convolution, for asymmetric weights,
  and where oneDNN is missing (non-x86 builds, CUDA).

The packed weight remembers the geometry it was blocked for; calls must use the same one.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from . import native as _native
from .native import onednn as _onednn_library
from . import sparse_correction as _sparse
from .registry import get, register
from .. import affine
from .._log import emit_once
from .. import dtypes as _dt
from .arguments import (PLAN_CACHE_SIZE, Scalar, activation_qdtype, call_key, check_bias,
                        check_weight_qparams, per_channel_view, validated_qparams)
from .onednn_exactness import ONEDNN_SAFE_U8_MAX, onednn_u8s8_exact, onednn_usable
from .post_ops import DEFAULT_NEGATIVE_SLOPE, PostOp, post_op_of, quantize_post_op

__all__ = ["PackedConvWeight", "pack_conv_weight", "quantized_conv", "quantized_conv_transpose"]

IntOrTuple = Union[int, Sequence[int]]
_FLOAT_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_FLOAT_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _ntuple(value: IntOrTuple, n: int, what: str, minimum: int) -> tuple[int, ...]:
    values = (value,) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) == 1 and n > 1:
        values = values * n
    if len(values) != n or any(v < minimum for v in values):
        raise ValueError(f"{what} must be {n} integer(s) >= {minimum}, got {value}")
    return values


@dataclass(frozen=True, eq=False)
class PackedConvWeight:
    """An int8 conv weight with its geometry, blocked for oneDNN once.

    ``weight`` is the plain int8 tensor, ``[out, in / groups, *kernel]`` (transposed:
    ``[in, out / groups, *kernel]``), with ``weight_scale`` / ``weight_zero_point`` as given
    (0-d per tensor, 1-d per channel along ``axis``).  ``channel_scale`` / ``channel_zero_point``
    are the per-output-channel expansions the oneDNN kernel takes.  Pickling / deepcopy repack
    from the plain fields.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor
    axis: Optional[int]
    bias: Optional[torch.Tensor]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    transposed: bool
    output_padding: tuple[int, ...]
    channel_scale: Optional[torch.Tensor]
    channel_zero_point: Optional[torch.Tensor]
    onednn_weight: Optional[torch.Tensor]
    # oneDNN weights re-blocked for a known (input shape, input qparams): ~10% faster calls
    # than the shape-agnostic blocking (measured on ResNet-18 shapes); a calibrated model
    # sees few distinct keys.
    onednn_sized: dict = field(default_factory=dict, repr=False)
    # Ready-bound kernel calls per (input layout, qparams, geometry): a module's calls repeat
    # them, and the checks and argument building cost as much as a small conv (~25 us).
    plans: dict = field(default_factory=dict, repr=False)
    # The sparse high half's tables (_sparse_plan): the weight as rows of taps per input
    # channel, and per input shape the scaling order and scatter table.
    sparse_taps: dict = field(default_factory=dict, repr=False)
    # The stride-1 packing of a strided 1x1 conv (_unit_stride_twin), built on first use.
    unit_stride_twin: list = field(default_factory=list, repr=False)

    @property
    def spatial_dims(self) -> int:
        return self.weight.dim() - 2

    @property
    def in_channels(self) -> int:
        return self.weight.size(0) if self.transposed else self.weight.size(1) * self.groups

    @property
    def out_channels(self) -> int:
        return self.weight.size(1) * self.groups if self.transposed else self.weight.size(0)

    def dequantized_weight(self) -> torch.Tensor:
        operands = affine.dequantize_operands(self.weight, self.weight_scale,
                                              self.weight_zero_point, self.axis)
        return get("dequantize", self.weight, per_channel=self.axis is not None)(*operands)

    def to(self, device: Union[str, torch.device]) -> "PackedConvWeight":
        """The same weight packed for ``device``."""
        args = list(self._pack_args())
        args[0] = self.weight.to(device)
        args[4] = None if self.bias is None else self.bias.to(device)
        return pack_conv_weight(*args)

    def _pack_args(self) -> tuple:
        return (self.weight, self.weight_scale, self.weight_zero_point, self.axis, self.bias,
                self.stride, self.padding, self.dilation, self.groups, self.transposed,
                self.output_padding)

    def __reduce__(self):
        return (pack_conv_weight, self._pack_args())


def pack_conv_weight(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                     axis: Optional[int], bias: Optional[torch.Tensor], stride: IntOrTuple = 1,
                     padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
                     transposed: bool = False,
                     output_padding: IntOrTuple = 0) -> PackedConvWeight:
    """Pack an int8 conv weight (per-tensor ``axis=None`` or per-channel) for this geometry.

    Per-channel axis: 0 for a conv; 0 or 1 for a transposed conv (torch quantizes those along
    1, the output channels).  Only symmetric non-transposed weights get a oneDNN copy.
    """
    op = "pack_conv_weight"
    if not isinstance(weight, torch.Tensor) or type(weight) is not torch.Tensor:
        raise TypeError(f"{op}: weight must be a plain int8 tensor (QTensor: pass .int_data), "
                        f"got {type(weight).__name__}")
    n = weight.dim() - 2
    if n not in _FLOAT_CONV:
        raise ValueError(f"{op}: weight must be 3-D, 4-D or 5-D [out, in/groups, *kernel], got "
                         f"shape {tuple(weight.shape)}")
    if axis not in ((None, 0, 1) if transposed else (None, 0)):
        raise ValueError(f"{op}: unsupported per-channel axis {axis} for a "
                         f"{'transposed ' if transposed else ''}conv weight")
    scale, zero_point = torch.as_tensor(scale), torch.as_tensor(zero_point)
    check_weight_qparams(weight, scale, zero_point, axis, op)
    stride = _ntuple(stride, n, "stride", 1)
    padding = _ntuple(padding, n, "padding", 0)
    dilation = _ntuple(dilation, n, "dilation", 1)
    output_padding = _ntuple(output_padding, n, "output_padding", 0)
    groups = int(groups)
    grouped_dim = weight.size(0)
    if groups < 1 or grouped_dim % groups:
        raise ValueError(f"{op}: groups={groups} must be >= 1 and divide weight.size(0)="
                         f"{grouped_dim}")
    weight = weight.detach().contiguous()
    out_channels = weight.size(1) * groups if transposed else weight.size(0)
    bias = check_bias(bias, out_channels, op)
    if bias is not None:
        bias = bias.to(weight.device)
    channel_scale = channel_zp = onednn_weight = None
    if not transposed:
        channel_scale, channel_zp = per_channel_view(scale, zero_point, out_channels, weight.device)
        if (not bool(channel_zp.any()) and weight.device.type == "cpu" and onednn_usable()
                and weight.numel()):
            onednn_weight = torch.ops.onednn.qconv_prepack(
                weight, channel_scale, 1.0, 0, list(stride), list(padding), list(dilation),
                groups, None)
    return PackedConvWeight(weight, scale, zero_point, axis, bias, stride, padding, dilation,
                            groups, transposed, output_padding, channel_scale, channel_zp,
                            onednn_weight)


def _same_geometry(given: Any, packed_value: Any) -> bool:
    if isinstance(packed_value, int) or isinstance(given, int):
        return (given == packed_value if isinstance(packed_value, int)
                else all(v == given for v in packed_value))
    given = tuple(given)
    return given == packed_value or (len(given) == 1 and all(v == given[0] for v in packed_value))


def _check_call(x_int: torch.Tensor, packed: PackedConvWeight, op: str,
                geometry: dict[str, Any]) -> None:
    activation_qdtype(x_int, op)
    n = packed.spatial_dims
    if x_int.dim() != n + 2 or x_int.size(1) != packed.in_channels:
        raise ValueError(f"{op}: expected a {n + 2}-D input with {packed.in_channels} channels "
                         f"[N, C, *spatial], got shape {tuple(x_int.shape)}")
    packed_values = tuple(getattr(packed, name) for name in geometry)
    if tuple(geometry.values()) == packed_values:  # a module passes what it packed with
        return
    for (name, value), packed_value in zip(geometry.items(), packed_values):
        if not _same_geometry(value, packed_value):
            raise ValueError(f"{op}: the weight was packed for {name}={packed_value}, "
                             f"called with {name}={value}")


def _qparams(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar, out_scale: Scalar,
             out_zp: Scalar) -> tuple[Scalar, Scalar, Scalar, Scalar]:
    return validated_qparams(x_scale, x_zp, activation_qdtype(x_int, "quantized_conv"),
                             out_scale, out_zp, _dt.quint8)


def _output_shape(x_int: torch.Tensor, packed: PackedConvWeight) -> tuple[int, ...]:
    """``[N, C_out, *spatial]`` of the conv (transposed or not) of ``x_int``."""
    kernel = packed.weight.shape[2:]
    spatial = []
    for i, size in enumerate(x_int.shape[2:]):
        span = packed.dilation[i] * (kernel[i] - 1)
        if packed.transposed:
            spatial.append((size - 1) * packed.stride[i] - 2 * packed.padding[i] + span
                           + packed.output_padding[i] + 1)
        else:
            spatial.append(_native.conv_output_size(size, kernel[i], packed.stride[i],
                                                    packed.padding[i], packed.dilation[i]))
    return (x_int.size(0), packed.out_channels, *spatial)


def _epilogue(x_int: torch.Tensor, packed: PackedConvWeight, post_op: str, negative_slope: float,
              other: Optional[torch.Tensor], other_scale: Scalar, other_zero_point: Scalar,
              op: str) -> PostOp:
    out_shape = _output_shape(x_int, packed) if other is not None else ()
    return post_op_of(post_op, negative_slope, other, other_scale, other_zero_point, out_shape,
                      op)


def quantized_conv(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                   stride: IntOrTuple, padding: IntOrTuple, dilation: IntOrTuple, groups: int,
                   out_scale: Scalar, out_zp: Scalar, post_op: str = "none", *,
                   negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
                   other: Optional[torch.Tensor] = None, other_scale: Scalar = 1.0,
                   other_zero_point: Scalar = 0) -> torch.Tensor:
    """``quantize(post_op(conv(x_hat, w_hat, bias)), out_scale, out_zp)`` on integers, quint8
    output.

    ``x_int`` holds the uint8 (quint8) values of a per-tensor quantized ``[N, C, *spatial]``
    input (NCHW or channels-last).  ``post_op`` (:class:`~.post_ops.PostOp`) is fused before the
    one requantization: ``relu``, ``leaky_relu`` (``negative_slope``), ``tanh``, or ``add`` /
    ``add_relu`` of ``other`` (integers of the output's shape quantized with ``other_scale`` /
    ``other_zero_point``: torch's ConvAdd2d / ConvAddReLU2d).
    """
    op = "quantized_conv"
    key = call_key(x_int, x_scale, x_zp, stride, padding, dilation, groups, out_scale, out_zp,
                    post_op, negative_slope, other_scale, other_zero_point,
                    None if other is None else (other.dtype, other.shape), _native_isa())
    plan = packed.plans.get(key) if key is not None else None
    if plan is not None:  # this exact call was checked before
        return plan(x_int, other)
    if packed.transposed:
        raise ValueError(f"{op}: the weight was packed for a transposed conv; use "
                         "quantized_conv_transpose")
    _check_call(x_int, packed, op, {"stride": stride, "padding": padding, "dilation": dilation,
                                    "groups": groups})
    epilogue = _epilogue(x_int, packed, post_op, negative_slope, other, other_scale,
                         other_zero_point, op)
    x_scale, x_zp, out_scale, out_zp = _qparams(x_int, x_scale, x_zp, out_scale, out_zp)
    fn = get("quantized_conv", x_int, packed=packed)
    if key is not None and fn is _quantized_conv_onednn:
        if len(packed.plans) >= PLAN_CACHE_SIZE:
            packed.plans.clear()
        plan = packed.plans[key] = _onednn_plan(x_int, x_scale, x_zp, packed, out_scale, out_zp,
                                                epilogue, other)
        return plan(x_int, other)
    return fn(x_int, x_scale, x_zp, packed, out_scale, out_zp, epilogue, other)



def cached_conv_plan(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar,
                     packed: PackedConvWeight, out_scale: Scalar, out_zp: Scalar,
                     post_op: str = "none",
                     negative_slope: float = DEFAULT_NEGATIVE_SLOPE) -> Optional[_Plan]:
    """The plan :func:`quantized_conv` built (and checked) for a call like this one -- the
    packed geometry, no added ``other`` -- as ``plan(x_int, None)``; None where it has none
    (not yet called, another kernel, tracing).  Eager modules keep it under a cheaper key."""
    key = call_key(x_int, x_scale, x_zp, packed.stride, packed.padding, packed.dilation,
                    packed.groups, out_scale, out_zp, post_op, negative_slope, 1.0, 0, None,
                    _native_isa())
    return None if key is None else packed.plans.get(key)


def _native_isa() -> Optional[str]:
    """fbgemm's instruction set now (a plan may bind the native conv, exact on some only)."""
    return _native.isa() if _native.available() else None


def _float_conv_reference(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar,
                          packed: PackedConvWeight) -> torch.Tensor:
    """``conv(x_hat, w_hat, bias)`` (transposed or not) in float32, contiguous."""
    x_hat = affine.dequantize_int(x.contiguous(), torch.as_tensor(x_scale), torch.as_tensor(x_zp))
    if packed.transposed:
        return _FLOAT_CONV_TRANSPOSE[packed.spatial_dims](
            x_hat, packed.dequantized_weight(), packed.bias, packed.stride, packed.padding,
            packed.output_padding, packed.groups, packed.dilation)
    return _FLOAT_CONV[packed.spatial_dims](x_hat, packed.dequantized_weight(), packed.bias,
                                            packed.stride, packed.padding, packed.dilation,
                                            packed.groups)


@register("quantized_conv", "reference")
def _quantized_conv_reference(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other):
    """The reference of both ``quantized_conv`` and ``quantized_conv_transpose``."""
    y = _float_conv_reference(x, x_scale, x_zp, packed)
    return quantize_post_op(y, post_op, other, out_scale, out_zp, _dt.quint8)


_SIZED_CACHE_SIZE = 8


def _sized_onednn_weight(packed: PackedConvWeight, x: torch.Tensor, x_scale: Scalar,
                         x_zp: Scalar) -> torch.Tensor:
    if torch.compiler.is_compiling():
        return packed.onednn_weight
    key = (tuple(x.shape), float(x_scale), int(x_zp))
    weight = packed.onednn_sized.get(key)
    if weight is None:
        if len(packed.onednn_sized) >= _SIZED_CACHE_SIZE:
            packed.onednn_sized.clear()
        weight = packed.onednn_sized[key] = torch.ops.onednn.qconv_prepack(
            packed.weight, packed.channel_scale, key[1], key[2], list(packed.stride),
            list(packed.padding), list(packed.dilation), packed.groups, list(key[0]))
    return weight


def _channels_last(y: torch.Tensor) -> torch.Tensor:
    """``y`` in the layout oneDNN writes its outputs in (channels last, 1-3 d)."""
    return y.movedim(1, -1).contiguous().movedim(-1, 1)


_Plan = Callable[[torch.Tensor, Optional[torch.Tensor]], torch.Tensor]


def _strided_pointwise(packed: PackedConvWeight) -> bool:
    """A 1x1 conv without padding and with a stride > 1 (a ResNet downsample)."""
    return (not packed.transposed and packed.stride != (1,) * packed.spatial_dims
            and all(k == 1 for k in packed.weight.shape[2:])
            and packed.padding == (0,) * packed.spatial_dims)


def _unit_stride_twin(packed: PackedConvWeight) -> PackedConvWeight:
    """The same weight packed with stride 1, for :func:`_subsampled` inputs.

    Why: oneDNN's int8 1x1 strided conv on AVX2 (torch 2.13) reads memory it never wrote for
    some small inputs -- e.g. [1, 8, 4, 4] or [1, 24, 4, 4] at stride 2 gave a different
    result on each call, with or without a shape-sized weight.  A 1x1 conv with stride s and
    no padding is the stride-1 conv of every s-th input position (the same integers), and
    oneDNN's stride-1 kernel showed no such variation.  Taken where oneDNN's u8 x s8 kernels
    are the saturating AVX2 / AVX-512 ones (and where that is forced); its VNNI kernels gave
    the same, correct result on every call for 135 such shapes (tests/kernels/test_conv.py
    checks a set of them), and the rewrite's extra copy made a downsample conv 2.3x torch.ao's."""
    if not packed.unit_stride_twin:
        args = list(packed._pack_args())
        args[5] = (1,) * packed.spatial_dims
        packed.unit_stride_twin.append(pack_conv_weight(*args))
    return packed.unit_stride_twin[0]


def _subsampled(x: torch.Tensor, stride: tuple[int, ...]) -> torch.Tensor:
    """Every ``stride``-th spatial position of ``x``, channels-last (oneDNN's layout)."""
    return _channels_last(x[(slice(None), slice(None), *(slice(None, None, s) for s in stride))])


def _onednn_plan(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                 out_scale: Scalar, out_zp: Scalar, post_op: PostOp,
                 other: Optional[torch.Tensor]) -> _Plan:
    native = _native_plan(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other)
    if native is not None:
        return native
    kept = _kept_onednn_plan(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other)
    if kept is not None:
        return kept
    if _strided_pointwise(packed) and not onednn_u8s8_exact():
        stride = packed.stride
        inner = _onednn_plan_unit(_subsampled(x, stride), x_scale, x_zp,
                                  _unit_stride_twin(packed), out_scale, out_zp, post_op, other)
        return lambda x_int, other: inner(_subsampled(x_int, stride), other)
    return _onednn_plan_unit(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other)


def _native_plan(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                 out_scale: Scalar, out_zp: Scalar, post_op: PostOp,
                 other: Optional[torch.Tensor]) -> Optional[_Plan]:
    """torchquant's native conv (``torchquant_native::qconv2d``) bound like a oneDNN plan, where
    it beats oneDNN's call (:func:`.native.conv_preferred`: small 2-d convs on a CPU whose
    products are exact) and fuses the post-op (ReLU; the adds, reading ``other`` without a
    copy); None elsewhere.  oneDNN's requantization order: the same integers up to its one-step
    rounding differences (tests/kernels/test_native_conv.py)."""
    if (packed.spatial_dims != 2 or packed.onednn_weight is None
            or not _native.conv_preferred(x.shape, packed.weight.shape, packed.stride,
                                          packed.padding, packed.dilation, packed.groups,
                                          int(x_zp))):
        return None
    if post_op.name in ("none", "relu"):
        unary = post_op.name
    elif post_op.adds and other is not None and other.dtype == torch.uint8:
        unary = "relu" if post_op.relu else "none"
    else:
        return None
    conv = torch.ops.torchquant_native.qconv2d.default
    head = (float(x_scale), int(x_zp), packed.weight, packed.channel_scale, packed.bias,
            list(packed.stride), list(packed.padding), list(packed.dilation), packed.groups)
    tail = (unary, [], float(out_scale), int(out_zp), torch.uint8)
    if not post_op.adds:
        return lambda x_int, _: conv(x_int, *head, None, 1.0, 0, *tail)
    other_qparams = (float(post_op.other_scale), int(post_op.other_zero_point))
    return lambda x_int, other: conv(x_int, *head, other, *other_qparams, *tail)


def _kept_onednn_plan(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                      out_scale: Scalar, out_zp: Scalar, post_op: PostOp,
                      other: Optional[torch.Tensor]) -> Optional[_Plan]:
    """oneDNN's conv primitive for inputs shaped like ``x``, built once and kept
    (:mod:`.native.onednn`: torch.ao's integers without the public op's per-call set-up), for
    2-d convs with no post-op, a ReLU, or the adds of a uint8 ``other`` (ConvAdd2d /
    ConvAddReLU2d); None elsewhere."""
    if (packed.spatial_dims != 2 or packed.onednn_weight is None
            or not _onednn_library.available()):
        return None
    other_qparams = None
    if post_op.adds:
        if other is None or other.dtype != torch.uint8:
            return None
        other_qparams = (float(post_op.other_scale), int(post_op.other_zero_point))
    elif post_op.name not in ("none", "relu"):
        return None
    try:
        plan = _onednn_library.conv_plan(packed.weight, packed.channel_scale, packed.bias,
                                         x.shape, packed.stride, packed.padding, packed.dilation,
                                         packed.groups, "relu" if post_op.relu else "none",
                                         x_zero_point=int(x_zp), other_qparams=other_qparams)
    except RuntimeError as e:  # a conv oneDNN 3.2 has no primitive for: the public op runs it
        emit_once(logging.DEBUG, f"kept oneDNN conv primitive not built ({e}); oneDNN's "
                  "public op runs this conv", key="kept-conv-failed")
        return None
    return _onednn_library.bound_conv(plan, x_scale, x_zp, out_scale, out_zp)


def _onednn_plan_unit(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                      out_scale: Scalar, out_zp: Scalar, post_op: PostOp,
                      other: Optional[torch.Tensor]) -> _Plan:
    """The oneDNN conv for inputs like ``x`` (and an added ``other`` like this one) with these
    qparams and post-op, its arguments bound: ``plan(x_int, other)``.

    oneDNN fuses ReLU (1-d, 2-d) and the adds (2-d, as its in-place ``sum`` into a copy of the
    quint8 ``other``: what torch's ConvAdd2d / ConvAddReLU2d run).  3-d ReLU is a clamp at the
    output zero point after it (quantize() is monotone with quantize(0) == zero_point, so
    quantize(relu(y)) == max(quantize(y), zero_point)).  Other post-ops run on oneDNN's float
    output, then one requantization (:func:`~.post_ops.quantize_post_op`)."""
    zero_point = int(out_zp)
    geometry = (packed.stride, packed.padding, packed.dilation, packed.groups)
    head = (float(x_scale), int(x_zp), _sized_onednn_weight(packed, x, x_scale, x_zp),
            packed.channel_scale, packed.channel_zero_point)
    conv = torch.ops.onednn.qconv_pointwise.default
    dims = packed.spatial_dims
    fused: Optional[_Plan] = None
    if post_op.name == "none" or (post_op.name == "relu" and dims < 3):
        args = (*head, packed.bias, *geometry, float(out_scale), zero_point, None, post_op.name,
                [], "")
        fused = lambda x_int, _: conv(x_int, *args)  # noqa: E731
    elif post_op.name == "relu":
        args = (*head, packed.bias, *geometry, float(out_scale), zero_point, None, "none", [], "")
        fused = lambda x_int, _: conv(x_int, *args).clamp_min_(zero_point)  # noqa: E731
    elif post_op.adds and dims == 2 and other is not None and other.dtype == torch.uint8:
        conv_sum = torch.ops.onednn.qconv2d_pointwise.binary
        tail = (packed.bias, *geometry, float(out_scale), zero_point, None, post_op.other_scale,
                post_op.other_zero_point, "sum", 1.0, "relu" if post_op.relu else "none", [], "")

        def fused(x_int: torch.Tensor, other: Optional[torch.Tensor]) -> torch.Tensor:
            accum = other.clone(memory_format=torch.channels_last)  # oneDNN sums into it
            return conv_sum(x_int, *head, accum, *tail)

    # Where this CPU's oneDNN saturates int16 pairs of u8 x s8 products above 128 such inputs
    # are split (_halves_float), float output, one requantization, returned in oneDNN's
    # channels-last layout so the layout does not depend on the data.
    float_out = (1.0, 0, torch.float32, "none", [], "")

    def unfused(x_int: torch.Tensor, other: Optional[torch.Tensor],
                split: Optional[_sparse.HighBits]) -> torch.Tensor:
        if split is None:
            y = conv(x_int, *head, packed.bias, *geometry, *float_out)
        else:
            y = _halves_float(x_int, split, float(x_scale), int(x_zp), packed, head[2])
        return _channels_last(quantize_post_op(y, post_op, other, out_scale, zero_point,
                                               _dt.quint8))

    if onednn_u8s8_exact():
        return fused if fused is not None else lambda x_int, other: unfused(x_int, other, None)
    listed = _sparse_pays(packed, x)
    if fused is None:
        return lambda x_int, other: unfused(x_int, other, _split_needed(x_int, listed))

    def checked(x_int: torch.Tensor, other: Optional[torch.Tensor]) -> torch.Tensor:
        split = _split_needed(x_int, listed)
        return fused(x_int, other) if split is None else unfused(x_int, other, split)

    return checked


def _sparse_pays(packed: PackedConvWeight, x: torch.Tensor) -> bool:
    """Whether the dense high-half conv of inputs like ``x`` is big enough for the sparse one
    to pay (:data:`~.sparse_correction.SPARSE_MIN_MACS`)."""
    macs = math.prod(_output_shape(x, packed)) * packed.weight[0].numel()
    return macs >= _sparse.SPARSE_MIN_MACS


def _split_needed(x: torch.Tensor, listed: bool) -> Optional[_sparse.HighBits]:
    """None where one oneDNN call is exact for uint8 ``x`` on this saturating CPU (no value
    above 128), else :func:`~.sparse_correction.high_bits` of ``x`` for :func:`_halves_float`
    (one ``max`` when None; the values above 127 listed only where ``listed``)."""
    bits = _sparse.high_bits(x, listed)
    return None if bits.top <= ONEDNN_SAFE_U8_MAX else bits


def _halves_float(x: torch.Tensor, bits: _sparse.HighBits, x_scale: float, x_zp: int,
                  packed: PackedConvWeight,
                  lo_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``conv(x_hat, w_hat) + bias`` in float32, exactly as oneDNN would give it without
    saturation, for uint8 ``x`` whose values above 127 ``bits`` locates
    (:func:`~.sparse_correction.high_bits`).

    ``x = lo + 128 * hi`` with ``lo = x & 127`` and ``hi = x >> 7`` both exact for oneDNN, and
    ``(x - zp) * w = (lo - zp) * w + 128 * hi * w`` (zero padding stays zero in both): one
    float-output oneDNN conv of ``lo`` (with the bias) plus the high half, scattered from the
    listed positions where ``bits`` lists them and the scaling order is known
    (:func:`_sparse_plan`), else a second oneDNN conv of ``hi``.  Both forms give the same
    floats (tested); with no value above 127 the one call on ``x`` is the ``lo`` call."""
    geometry = (packed.stride, packed.padding, packed.dilation, packed.groups)
    float_out = (1.0, 0, torch.float32, "none", [], "")
    conv = torch.ops.onednn.qconv_pointwise.default
    if lo_weight is None:
        lo_weight = _sized_onednn_weight(packed, x, x_scale, x_zp)
    split = bits.top > 127
    y = conv(torch.bitwise_and(x, 127) if split else x, x_scale, x_zp, lo_weight,
             packed.channel_scale, packed.channel_zero_point, packed.bias, *geometry, *float_out)
    if not split:
        return y
    plan = None if bits.flat is None else _sparse_plan(packed, x, x_scale)
    if plan is not None:
        return _sparse.conv_correction_(y, bits, packed.in_channels, packed.sparse_taps["rows"],
                                        *plan, packed.groups)
    hi_scale = x_scale * 128.0
    return y.add_(conv(torch.bitwise_right_shift(x, 7), hi_scale, 0,
                       _sized_onednn_weight(packed, x, hi_scale, 0), packed.channel_scale,
                       packed.channel_zero_point, None, *geometry, *float_out))


@register("quantized_conv", "onednn", devices=("cpu",), available=onednn_usable,
          applies=lambda x, packed, **_: packed.onednn_weight is not None and x.dtype == torch.uint8)
def _quantized_conv_onednn(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other):
    return _onednn_plan(x, x_scale, x_zp, packed, out_scale, out_zp, post_op, other)(x, other)


def quantized_conv_transpose(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar,
                             packed: PackedConvWeight, stride: IntOrTuple, padding: IntOrTuple,
                             output_padding: IntOrTuple, dilation: IntOrTuple, groups: int,
                             out_scale: Scalar, out_zp: Scalar, post_op: str = "none", *,
                             negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
                             other: Optional[torch.Tensor] = None, other_scale: Scalar = 1.0,
                             other_zero_point: Scalar = 0) -> torch.Tensor:
    """Transposed conv, reference only: dequantize, ``conv_transpose``, post-op (as
    :func:`quantized_conv`), quantize (quint8)."""
    op = "quantized_conv_transpose"
    if not packed.transposed:
        raise ValueError(f"{op}: the weight was packed for a plain conv (transposed=False)")
    _check_call(x_int, packed, op, {"stride": stride, "padding": padding,
                                    "output_padding": output_padding, "dilation": dilation,
                                    "groups": groups})
    epilogue = _epilogue(x_int, packed, post_op, negative_slope, other, other_scale,
                         other_zero_point, op)
    x_scale, x_zp, out_scale, out_zp = _qparams(x_int, x_scale, x_zp, out_scale, out_zp)
    fn = get("quantized_conv_transpose", x_int, packed=packed)
    return fn(x_int, x_scale, x_zp, packed, out_scale, out_zp, epilogue, other)


register("quantized_conv_transpose", "reference")(_quantized_conv_reference)


_SPARSE_CACHE_SIZE = 16


def _sparse_plan(packed: PackedConvWeight, x: torch.Tensor,
                 x_scale: float) -> Optional[tuple[_sparse.ConvScatter, _sparse.HighScale]]:
    """The sparse high half's scatter table and scaling for inputs like ``x``, built once per
    input shape / layout, scale and thread count (oneDNN may pick its kernel by any of them;
    None: no sparse half for such inputs).

    The order (:func:`~.sparse_correction.matching_scale_order`) is probed: a dense random 0/1
    input through the dense high-half oneDNN call against the integer sums of a float conv
    (exact in float32 for 0/1 inputs and int8 weights below a fan-in of 2^17, float64 above,
    unless the float conv's algorithm rounds, e.g. Winograd: then no order matches and the
    dense call stays)."""
    key = (tuple(x.shape), x.stride(), float(x_scale), torch.get_num_threads())
    cache = packed.sparse_taps
    if key in cache:
        return cache[key]
    if len(cache) > _SPARSE_CACHE_SIZE:
        rows = cache.get("rows")
        cache.clear()
        if rows is not None:
            cache["rows"] = rows
    if "rows" not in cache:
        cache["rows"] = _sparse.conv_tap_rows(packed.weight, packed.groups)
    generator = torch.Generator(device=x.device).manual_seed(0)
    probe = torch.empty_like(x).copy_(torch.randint(0, 2, x.shape, generator=generator,
                                                    dtype=torch.uint8, device=x.device))
    hi_scale = float(x_scale) * 128.0
    geometry = (packed.stride, packed.padding, packed.dilation, packed.groups)
    high = torch.ops.onednn.qconv_pointwise.default(
        probe, hi_scale, 0, _sized_onednn_weight(packed, probe, hi_scale, 0),
        packed.channel_scale, packed.channel_zero_point, None, *geometry,
        1.0, 0, torch.float32, "none", [], "")
    dtype = _sparse.exact_sums_dtype(packed.weight[0].numel())
    sums = _FLOAT_CONV[packed.spatial_dims](probe.to(dtype), packed.weight.to(dtype), None,
                                           *geometry)
    scale = packed.channel_scale.view((1, -1) + (1,) * packed.spatial_dims)
    order = _sparse.matching_scale_order(high, sums, x_scale, scale)
    plan = None
    if order is not None:
        scatter = _sparse.conv_scatter(x.shape[2:], high.shape[2:], packed.weight.shape[2:],
                                       packed.stride, packed.padding, packed.dilation)
        plan = (scatter, _sparse.HighScale.of(x_scale, packed.channel_scale.view(
            packed.groups, -1), order))
    cache[key] = plan
    return plan


def conv_exact_float(x: torch.Tensor, x_scale: float, x_zp: int,
                     packed: PackedConvWeight) -> torch.Tensor:
    """``conv(x_hat, w_hat) + bias`` in float32 (channels-last) through oneDNN for quint8 ``x``
    on a CPU whose oneDNN saturates u8 x s8 pairs above 128: what ``torch.compile`` lowers a
    conv to (an opaque op between elementwise steps inductor fuses, the requantization).

    It looks at the data as the graph cannot: one oneDNN call where no value exceeds 127, else
    the split of :func:`_halves_float` (the high half sparse or dense by its density).  The
    floats are those of always splitting (the ``hi`` half of an input below 128 is zero)."""
    if packed.onednn_weight is None or packed.transposed:
        raise ValueError("conv_exact_float needs a oneDNN-packed (non-transposed) conv weight")
    if _strided_pointwise(packed) and not onednn_u8s8_exact():  # see _unit_stride_twin
        x, packed = _subsampled(x, packed.stride), _unit_stride_twin(packed)
    bits = _sparse.high_bits(x, _sparse_pays(packed, x))
    return _halves_float(x, bits, float(x_scale), int(x_zp), packed)
