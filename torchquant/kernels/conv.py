"""Int8 convolution kernels (1d / 2d / 3d, static): weight prepacking and the quantized conv.

* ``onednn`` -- ``torch.ops.onednn.qconv_pointwise`` on a weight blocked once by
  ``qconv_prepack``: u8 activations with their zero point, s8 symmetric weights, per-channel
  requantization and ReLU fused.  It accepts NCHW or channels-last input and returns a tensor
  of the logical ``[N, C, *spatial]`` shape in channels-last memory format (what torch's x86
  quantized conv returns too): feeding it to the next conv skips a layout conversion.  Where
  oneDNN saturates int16 pairs of products (no VNNI / AMX, see
  ``linear.onednn_u8_exact_max``) inputs above 128 run as two exact halves (``x & 127`` and
  ``x >> 7``) with float output and one requantization, still returned channels-last.
* ``reference`` -- dequantize, float ``conv``, quantize (the numerics contract); contiguous
  output.  Also the only path for transposed convolution, for asymmetric weights, and where
  oneDNN is missing (non-x86 builds, CUDA).

The packed weight remembers the geometry it was blocked for; calls must use the same one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .registry import get, register
from .registry import mode as kernel_mode
from .. import affine
from .. import dtypes as _dt
from .linear import (Scalar, activation_qdtype, check_bias, check_weight_qparams,
                     onednn_exact_for, onednn_u8s8_exact, onednn_usable, per_channel_view,
                     quantize_float_result, validated_qparams)

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


def quantized_conv(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                   stride: IntOrTuple, padding: IntOrTuple, dilation: IntOrTuple, groups: int,
                   out_scale: Scalar, out_zp: Scalar, relu: bool = False) -> torch.Tensor:
    """``quantize(conv(x_hat, w_hat, bias), out_scale, out_zp)`` on integers, quint8 output.

    ``x_int`` holds the uint8 (quint8) values of a per-tensor quantized ``[N, C, *spatial]``
    input (NCHW or channels-last); ``relu`` clamps at the output zero point (fused).
    """
    op = "quantized_conv"
    key = _plan_key(x_int, x_scale, x_zp, stride, padding, dilation, groups, out_scale, out_zp,
                    relu)
    plan = packed.plans.get(key) if key is not None else None
    if plan is not None:  # this exact call was checked before
        return plan(x_int)
    if packed.transposed:
        raise ValueError(f"{op}: the weight was packed for a transposed conv; use "
                         "quantized_conv_transpose")
    _check_call(x_int, packed, op, {"stride": stride, "padding": padding, "dilation": dilation,
                                    "groups": groups})
    x_scale, x_zp, out_scale, out_zp = _qparams(x_int, x_scale, x_zp, out_scale, out_zp)
    fn = get("quantized_conv", x_int, packed=packed)
    if key is not None and fn is _quantized_conv_onednn:
        if len(packed.plans) >= _PLAN_CACHE_SIZE:
            packed.plans.clear()
        plan = packed.plans[key] = _onednn_plan(x_int, x_scale, x_zp, packed, out_scale, out_zp,
                                                relu)
        return plan(x_int)
    return fn(x_int, x_scale, x_zp, packed, out_scale, out_zp, relu)


_PLAN_CACHE_SIZE = 16


def _plan_key(x: torch.Tensor, *call: Any) -> Optional[tuple]:
    """A hashable description of a conv call, or None where calls are not cached (tracing,
    tensor qparams, list geometry)."""
    if torch.compiler.is_compiling():
        return None
    key = (tuple(x.shape), x.stride(), x.dtype, x.device, kernel_mode(), *call)
    try:
        hash(key)
    except TypeError:
        return None
    if any(isinstance(v, torch.Tensor) for v in call):
        return None
    return key


def _requantize_float(y: torch.Tensor, out_scale: Scalar, out_zp: Scalar,
                      relu: bool) -> torch.Tensor:
    if relu:
        y = torch.relu(y)
    return quantize_float_result(y, torch.as_tensor(out_scale), torch.as_tensor(out_zp),
                                 _dt.quint8.qmin, _dt.quint8.qmax, torch.uint8,
                                 mode=affine.quantize_mode(_dt.quint8, per_channel=False))


@register("quantized_conv", "reference")
def _quantized_conv_reference(x, x_scale, x_zp, packed, out_scale, out_zp, relu):
    x_hat = affine.dequantize_int(x.contiguous(), torch.as_tensor(x_scale), torch.as_tensor(x_zp))
    y = _FLOAT_CONV[packed.spatial_dims](x_hat, packed.dequantized_weight(), packed.bias,
                                         packed.stride, packed.padding, packed.dilation,
                                         packed.groups)
    return _requantize_float(y, out_scale, out_zp, relu)


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


def _onednn_plan(x: torch.Tensor, x_scale: Scalar, x_zp: Scalar, packed: PackedConvWeight,
                 out_scale: Scalar, out_zp: Scalar, relu: bool) -> Callable[[torch.Tensor],
                                                                       torch.Tensor]:
    """The oneDNN conv for inputs like ``x`` with these qparams, its arguments bound."""
    # oneDNN has no ReLU post-op for 3-D convs.  quantize() is monotone with
    # quantize(0) == zero_point, so quantize(relu(y)) == max(quantize(y), zero_point).
    late_relu = relu and packed.spatial_dims == 3
    zero_point = int(out_zp)
    args = (float(x_scale), int(x_zp), _sized_onednn_weight(packed, x, x_scale, x_zp),
            packed.channel_scale, packed.channel_zero_point, packed.bias, packed.stride,
            packed.padding, packed.dilation, packed.groups, float(out_scale), zero_point, None,
            "relu" if relu and not late_relu else "none", [], "")
    conv = torch.ops.onednn.qconv_pointwise.default
    if late_relu:
        plan = lambda x_int: conv(x_int, *args).clamp_min_(zero_point)  # noqa: E731
    else:
        plan = lambda x_int: conv(x_int, *args)  # noqa: E731
    if onednn_u8s8_exact():
        return plan

    # This CPU's oneDNN saturates int16 pairs of u8 x s8 products above 128.  Such inputs are
    # split, x = lo + 128 * hi (lo = x & 127, hi = x >> 7, both exact for oneDNN):
    # (x - zp) * w = (lo - zp) * w + 128 * hi * w, two float-output convs (zero padding stays
    # zero in both), one requantization, returned in oneDNN's channels-last layout so the
    # layout does not depend on the data.
    geometry = (packed.stride, packed.padding, packed.dilation, packed.groups)
    hi_weight = _sized_onednn_weight(packed, x, float(x_scale) * 128.0, 0)

    def split(x_int: torch.Tensor) -> torch.Tensor:
        lo = torch.bitwise_and(x_int, 127)
        hi = torch.bitwise_right_shift(x_int, 7)
        y = conv(lo, float(x_scale), int(x_zp), args[2], packed.channel_scale,
                 packed.channel_zero_point, packed.bias, *geometry, 1.0, 0, torch.float32,
                 "none", [], "")
        y = y.add_(conv(hi, float(x_scale) * 128.0, 0, hi_weight, packed.channel_scale,
                        packed.channel_zero_point, None, *geometry, 1.0, 0, torch.float32,
                        "none", [], ""))
        out = _requantize_float(y, out_scale, out_zp, relu)
        return out.movedim(1, -1).contiguous().movedim(-1, 1)

    def guarded(x_int: torch.Tensor) -> torch.Tensor:
        return plan(x_int) if onednn_exact_for(x_int) else split(x_int)
    return guarded


@register("quantized_conv", "onednn", devices=("cpu",), available=onednn_usable,
          applies=lambda x, packed, **_: packed.onednn_weight is not None and x.dtype == torch.uint8)
def _quantized_conv_onednn(x, x_scale, x_zp, packed, out_scale, out_zp, relu):
    return _onednn_plan(x, x_scale, x_zp, packed, out_scale, out_zp, relu)(x)


def quantized_conv_transpose(x_int: torch.Tensor, x_scale: Scalar, x_zp: Scalar,
                             packed: PackedConvWeight, stride: IntOrTuple, padding: IntOrTuple,
                             output_padding: IntOrTuple, dilation: IntOrTuple, groups: int,
                             out_scale: Scalar, out_zp: Scalar, relu: bool = False) -> torch.Tensor:
    """Transposed conv, reference only: dequantize, ``conv_transpose``, quantize (quint8)."""
    op = "quantized_conv_transpose"
    if not packed.transposed:
        raise ValueError(f"{op}: the weight was packed for a plain conv (transposed=False)")
    _check_call(x_int, packed, op, {"stride": stride, "padding": padding,
                                    "output_padding": output_padding, "dilation": dilation,
                                    "groups": groups})
    x_scale, x_zp, out_scale, out_zp = _qparams(x_int, x_scale, x_zp, out_scale, out_zp)
    fn = get("quantized_conv_transpose", x_int, packed=packed)
    return fn(x_int, x_scale, x_zp, packed, out_scale, out_zp, relu)


@register("quantized_conv_transpose", "reference")
def _quantized_conv_transpose_reference(x, x_scale, x_zp, packed, out_scale, out_zp, relu):
    x_hat = affine.dequantize_int(x.contiguous(), torch.as_tensor(x_scale), torch.as_tensor(x_zp))
    y = _FLOAT_CONV_TRANSPOSE[packed.spatial_dims](
        x_hat, packed.dequantized_weight(), packed.bias, packed.stride, packed.padding,
        packed.output_padding, packed.groups, packed.dilation)
    return _requantize_float(y, out_scale, out_zp, relu)


def conv_halves_float(lo: torch.Tensor, hi: torch.Tensor, x_scale: float, x_zp: int,
                      packed: PackedConvWeight) -> torch.Tensor:
    """``conv(x_hat, w_hat) + bias`` in float32 for ``x = lo + 128 * hi`` (``lo`` in 0..127,
    ``hi`` in 0..1, both uint8): the two exact oneDNN convs of the saturating-CPU split, summed,
    before requantization.  ``torch.compile`` lowers a conv on such CPUs to this op between
    elementwise steps it fuses with its neighbours (the split, the requantization)."""
    if packed.onednn_weight is None or packed.transposed:
        raise ValueError("conv_halves_float needs a oneDNN-packed (non-transposed) conv weight")
    geometry = (packed.stride, packed.padding, packed.dilation, packed.groups)
    conv = torch.ops.onednn.qconv_pointwise.default
    y = conv(lo, float(x_scale), int(x_zp), _sized_onednn_weight(packed, lo, x_scale, x_zp),
             packed.channel_scale, packed.channel_zero_point, packed.bias, *geometry, 1.0, 0,
             torch.float32, "none", [], "")
    hi_scale = float(x_scale) * 128.0
    return y.add_(conv(hi, hi_scale, 0, _sized_onednn_weight(packed, hi, hi_scale, 0),
                       packed.channel_scale, packed.channel_zero_point, None, *geometry, 1.0, 0,
                       torch.float32, "none", [], ""))
