"""Static quantized convolutions: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``.

The qint8 weight is packed once (:func:`torchquant.ops.conv.pack_conv_weight`) whenever it
is set -- construction, ``from_float``, ``set_weight_bias``, ``load_state_dict`` -- never per
call.  The state dict holds what torch's holds, in torch's order: ``weight`` (our QTensor),
``bias`` (float or None), ``scale`` (float32 0-d) and ``zero_point`` (int64 0-d); in the
module ``scale`` / ``zero_point`` are plain, assignable Python numbers, as in torch.

``padding_mode='reflect'`` pads the uint8 input itself (reflection only moves values, so it is
exact on the integers) and packs the weight for zero padding, as torch does.
"""
from __future__ import annotations

from typing import Any, ClassVar, Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from .... import dtypes as _dt
from ....ops import conv as ops_conv
from ....ops._library import kernel_mode
from ....tensor.qtensor import QTensor, new_qtensor
from ....tensor.functions import quantize_per_channel, quantize_per_tensor
from ...intrinsic.modules import fused as _fused
from ....tensor.validation import require_quantized
from .utils import OutputQParams, quantize_weight

__all__ = ["Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d"]

IntOrTuple = Union[int, Sequence[int]]
_SUPPORTED_PADDING = ("zeros", "reflect")
_INPUT_LAYOUT = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def _ntuple(value: Any, n: int, what: str) -> tuple[int, ...]:
    if isinstance(value, str):
        raise ValueError(f"quantized convolution does not support string {what}={value!r}; "
                         "give the integer padding")
    values = (int(value),) * n if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) == 1 and n > 1:
        values *= n
    if len(values) != n:
        raise ValueError(f"{what} must be an int or {n} ints, got {value}")
    return values


def _reflect_pad_amounts(padding: tuple[int, ...]) -> list[int]:
    """F.pad's order: last spatial dim first, (before, after) for each."""
    return [p for p in reversed(padding) for _ in range(2)]


def _has_float_dtype(observer: Any) -> bool:
    dtype = getattr(observer, "dtype", None)
    return isinstance(dtype, torch.dtype) and dtype.is_floating_point


def _fold_qat_bn(mod: nn.Module) -> None:
    """A QAT conv+bn: fold the running statistics into the conv's weight and bias (in place,
    as torch's convert does) before the weight is quantized."""
    bn = getattr(mod, "bn", None)
    if bn is None:
        return
    if bn.running_mean is None or bn.running_var is None:
        raise AssertionError("mod.bn.running_var and mod.bn.running_mean must not be None")
    mod.weight, mod.bias = torch.nn.utils.fuse_conv_bn_weights(
        mod.weight, mod.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)


def _reference_quantized_weight(ref: nn.Module) -> QTensor:
    """The QTensor weight of a reference quantized conv.

    Read from its ``weight_qscheme / weight_dtype / weight_scale / weight_zero_point /
    weight_axis`` attributes when it has them (so a torch reference module works too, without
    producing a torch quantized tensor), else from its ``get_quantized_weight()``."""
    names = ("weight_qscheme", "weight_dtype", "weight_scale", "weight_zero_point")
    if not all(hasattr(ref, n) for n in names):
        getter = getattr(ref, "get_quantized_weight", None)
        if getter is None:
            raise AssertionError(f"{type(ref).__name__} is not a reference quantized conv: it has "
                                 f"neither get_quantized_weight() nor the weight_* qparams")
        w = getter()
        if not isinstance(w, QTensor):
            raise TypeError(f"{type(ref).__name__}.get_quantized_weight() must return a "
                            f"QTensor, got {type(w).__name__}")
        return w
    scheme = _dt.to_qscheme(ref.weight_qscheme)
    qdtype = _dt.to_qdtype(ref.weight_dtype)
    w = ref.weight.detach().float()
    scale, zero_point = ref.weight_scale, ref.weight_zero_point
    if scheme in (_dt.per_tensor_affine, _dt.per_tensor_symmetric):
        return quantize_per_tensor(w, float(scale), int(zero_point), qdtype)
    if scheme in (_dt.per_channel_affine, _dt.per_channel_symmetric):
        axis = int(getattr(ref, "weight_axis", 0))
        return quantize_per_channel(w, torch.as_tensor(scale).double(),
                                    torch.as_tensor(zero_point).long(), axis, qdtype)
    raise ValueError(f"unsupported reference weight qscheme {scheme!r} for a quantized conv")


def _from_torch_checkpoint(w: Any) -> Any:
    """A weight from a checkpoint saved by torch (a tensor of torch's qint8 dtype) as our
    QTensor, so torch state dicts load; anything else is returned as is."""
    if isinstance(w, QTensor) or not isinstance(w, torch.Tensor) or not w.is_quantized:
        return w
    if "per_channel" in str(w.qscheme()):
        return QTensor.from_int(w.int_repr(), w.q_per_channel_scales().double(),
                                w.q_per_channel_zero_points().long(), w.dtype,
                                w.q_per_channel_axis())
    return QTensor.from_int(w.int_repr(), w.q_scale(), w.q_zero_point(), w.dtype)


class _ConvNd(OutputQParams, nn.Module):
    """Shared body.  Subclasses set ``_SPATIAL`` (1, 2, 3), ``_TRANSPOSED``, ``_NAME`` and
    ``_FLOAT_MODULE`` (the float type ``from_float`` accepts); fused ones ``_POST_OP`` (one
    of ``ops.conv.POST_OPS``)."""

    _SPATIAL: ClassVar[int]
    _TRANSPOSED: ClassVar[bool] = False
    _NAME: ClassVar[str]
    _FLOAT_MODULE: ClassVar[Any]
    _POST_OP: ClassVar[str] = "none"
    _OUTPUT_QDTYPES = (_dt.quint8,)

    scale: float
    zero_point: int

    def _init(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
              stride: IntOrTuple, padding: IntOrTuple, dilation: IntOrTuple,
              output_padding: IntOrTuple, groups: int, bias: bool, padding_mode: str,
              device: Any = None) -> None:
        super().__init__()
        n = self._SPATIAL
        if out_channels <= 0:
            raise ValueError(f"out_channels must be greater than 0, got {out_channels}")
        if in_channels <= 0:
            raise ValueError(f"in_channels must be greater than 0, got {in_channels}")
        if groups <= 0 or in_channels % groups:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups:
            raise ValueError("out_channels must be divisible by groups")
        if padding_mode not in _SUPPORTED_PADDING:
            raise ValueError(f"'padding_mode' {padding_mode} is not supported by quantized "
                             f"convolution")
        if self._TRANSPOSED and padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for '
                             f'{type(self).__name__}')
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = _ntuple(kernel_size, n, "kernel_size")
        self.stride = _ntuple(stride, n, "stride")
        self.padding = _ntuple(padding, n, "padding")
        self.dilation = _ntuple(dilation, n, "dilation")
        self.transposed = self._TRANSPOSED
        self.output_padding = _ntuple(output_padding, n, "output_padding")
        self.groups = int(groups)
        self.padding_mode = padding_mode
        self._init_output_qparams(1.0, 0)
        weight = QTensor.from_int(torch.zeros(self._weight_shape(), dtype=torch.int8,
                                              device=device), 1.0, 0, _dt.qint8)
        self.set_weight_bias(weight, torch.zeros(self.out_channels, device=device)
                             if bias else None)

    def _get_name(self) -> str:
        return self._NAME

    def _weight_shape(self) -> tuple[int, ...]:
        if self.transposed:
            return (self.in_channels, self.out_channels // self.groups, *self.kernel_size)
        return (self.out_channels, self.in_channels // self.groups, *self.kernel_size)

    def extra_repr(self) -> str:
        n = self._SPATIAL
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
             f"stride={self.stride}, {self._qparams_repr()}")
        if self.padding != (0,) * n:
            s += f", padding={self.padding}"
        if self.dilation != (1,) * n:
            s += f", dilation={self.dilation}"
        if self.output_padding != (0,) * n:
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias() is None:
            s += ", bias=False"
        return s

    # ---- weights ----------------------------------------------------------------------------
    def set_weight_bias(self, w: QTensor, b: Optional[torch.Tensor]) -> None:
        """Set (and pack) a qint8 weight -- per-tensor, or per-channel along axis 0 (transposed
        convs: axis 1, the output channels, as torch; axis 0 is accepted too) -- and a float
        bias."""
        name = self._get_name()
        if not isinstance(w, QTensor):
            raise TypeError(f"{name} weight must be a qint8 QTensor, got {type(w).__name__} of "
                            f"dtype {getattr(w, 'dtype', None)}")
        if w.qdtype is not _dt.qint8:
            raise TypeError(f"{name} weight must be qint8, got {w.qdtype!r}")
        if tuple(w.shape) != self._weight_shape():
            layout = ("[in, out/groups, *kernel]" if self.transposed
                      else "[out, in/groups, *kernel]")
            raise ValueError(f"{name} weight must have shape {self._weight_shape()} ({layout}), "
                             f"got {tuple(w.shape)}")
        if b is not None:
            if not isinstance(b, torch.Tensor) or isinstance(b, QTensor) \
                    or not b.dtype.is_floating_point:
                raise TypeError(f"{name} bias must be a float tensor or None, got "
                                f"{type(b).__name__} of dtype {getattr(b, 'dtype', None)}")
            b = b.detach().float()
        padding = self.padding if self.padding_mode == "zeros" else (0,) * self._SPATIAL
        self._packed_params = ops_conv.pack_conv_weight(
            w.int_data, w.scale, w.zero_point, w.axis, b, self.stride, padding, self.dilation,
            self.groups, transposed=self.transposed, output_padding=self.output_padding)
        # The eager forward's per-call cache (call key -> the bound kernel call and the output
        # qparams): the module's own, emptied with every new pack.
        self._eager_calls: dict = {}

    def _weight_bias(self) -> tuple[QTensor, Optional[torch.Tensor]]:
        p = self._packed_params
        return QTensor.from_int(p.weight, p.weight_scale, p.weight_zero_point, _dt.qint8,
                                p.axis), p.bias

    def weight(self) -> QTensor:
        return self._weight_bias()[0]

    def bias(self) -> Optional[torch.Tensor]:
        return self._packed_params.bias

    # ---- forward ----------------------------------------------------------------------------
    def _quantized_input(self, x: Any) -> QTensor:
        """``x`` checked (quint8, per tensor, right rank); reflect padding applied."""
        op = self._get_name()
        q = require_quantized(x, op)
        if q.qdtype is not _dt.quint8:
            raise TypeError(f"{op}: only quint8 inputs are supported, got {q.qdtype!r}")
        n = self._SPATIAL
        values = q.int_data  # (its shape is the QTensor's: no torch-function round trip)
        if values.dim() != n + 2:
            raise ValueError(f"{op}: Input shape must be `{_INPUT_LAYOUT[n]}`! got shape "
                             f"{tuple(q.shape)}")
        if values.size(1) != self.in_channels:
            raise ValueError(f"{op}: expected {self.in_channels} input channels, got input of "
                             f"shape {tuple(q.shape)}")
        return q

    def _input_int(self, q: QTensor) -> torch.Tensor:
        if self.padding_mode == "zeros":
            return q.int_data
        return F.pad(q.int_data, _reflect_pad_amounts(self.padding), mode=self.padding_mode)

    def _conv(self, q: QTensor, other: Optional[QTensor] = None) -> QTensor:
        """The one conv op call: ``quantize(post_op(conv(q)))`` to the module's qparams, the
        post-op adding ``other`` for ConvAdd2d / ConvAddReLU2d."""
        scale, zero_point = self._output_qparams()
        x_scale, x_zp = q._scale_zp()
        run = ops_conv.conv_transpose if self.transposed else ops_conv.conv
        if other is None:
            out = run(self._input_int(q), x_scale, x_zp, self._packed_params, scale, zero_point,
                      self._POST_OP)
        else:
            other_scale, other_zp = other._scale_zp()
            out = run(self._input_int(q), x_scale, x_zp, self._packed_params, scale, zero_point,
                      self._POST_OP, other=other.int_data, other_scale=other_scale,
                      other_zero_point=other_zp)
        return QTensor.from_int_per_tensor(out, scale, zero_point, _dt.quint8)

    def forward(self, input: QTensor) -> QTensor:
        if type(input) is QTensor and not torch.compiler.is_compiling():
            # Plain eager: a call like an earlier one (same input layout and qparams, same
            # output qparams and kernel mode) reruns that call's checked, bound kernel.
            ints = input.int_data
            if type(ints) is torch.Tensor and input.qdtype is _dt.quint8 and input.axis is None:
                key = (ints.shape, ints.stride(), ints.device, input.__dict__.get("_numbers"),
                       *self._output_qparams(), kernel_mode())
                hit = self._eager_calls.get(key)
                if hit is not None:
                    return new_qtensor(hit[0](ints, None), hit[1], hit[2], _dt.quint8, None,
                                       hit[3])
                out = self._conv(self._quantized_input(input))
                self._remember_call(key[:3] + (input._scale_zp(),) + key[4:], input, out)
                return out
        return self._conv(self._quantized_input(input))

    def _remember_call(self, key: tuple, q: QTensor, out: QTensor) -> None:
        """Keep the kernel call :meth:`_conv` just made for ``q`` (when it has a reusable one:
        zero padding, no transposition, the oneDNN kernel) under ``key``."""
        if self.padding_mode != "zeros" or self.transposed:
            return
        packed = self._packed_params
        x_scale, x_zp = key[3]
        plan = ops_conv.cached_plan(q.int_data, x_scale, x_zp, packed, key[4], key[5],
                                    self._POST_OP)
        if plan is None:
            return
        calls = self._eager_calls
        if len(calls) >= 16:
            calls.clear()
        calls[key] = (plan, out.scale, out.zero_point, out._scale_zp())

    def __getstate__(self) -> dict:  # copies and pickles start with an empty call cache
        state = super().__getstate__()
        state["_eager_calls"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_eager_calls", {})  # pickled before the module held it

    # ---- serialization ----------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        w, b = self._weight_bias()  # torch's order: weight, bias, then scale, zero_point
        destination[prefix + "weight"] = w
        destination[prefix + "bias"] = b
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        keys = {name: prefix + name for name in ("weight", "bias")}
        present = {name: key in state_dict for name, key in keys.items()}
        for name, key in keys.items():
            if not present[name] and strict:
                missing_keys.append(key)
        values = {name: state_dict.pop(key) for name, key in keys.items() if present[name]}
        if "weight" in values:
            w = _from_torch_checkpoint(values["weight"])
            b = values.get("bias", self.bias())
            if not isinstance(w, QTensor):
                error_msgs.append(f"{keys['weight']}: expected a qint8 QTensor, got "
                                  f"{type(w).__name__} of dtype {getattr(w, 'dtype', None)}")
            elif tuple(w.shape) != self._weight_shape():
                error_msgs.append(f"size mismatch for {keys['weight']}: copying a weight of "
                                  f"shape {tuple(w.shape)}, the module has "
                                  f"{self._weight_shape()}")
            elif b is not None and (not isinstance(b, torch.Tensor)
                                    or tuple(b.shape) != (self.out_channels,)):
                error_msgs.append(f"size mismatch for {keys['bias']}: expected shape "
                                  f"({self.out_channels},), got "
                                  f"{tuple(getattr(b, 'shape', ())) or type(b).__name__}")
            else:
                try:
                    self.set_weight_bias(w, b)
                except (TypeError, ValueError) as exc:
                    error_msgs.append(f"{keys['weight']}: {exc}")
        elif "bias" in values:
            error_msgs.append(f"{keys['bias']} given without {keys['weight']}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    # ---- conversion -------------------------------------------------------------------------
    @classmethod
    def _from_geometry(cls, conv: nn.Module) -> "_ConvNd":
        """A fresh module with ``conv``'s geometry (a float, QAT or reference conv)."""
        return cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                   conv.padding, conv.dilation, conv.groups, conv.bias is not None,
                   conv.padding_mode)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "_ConvNd":
        """A quantized conv from an observed float conv (or fused container / QAT conv).

        The weight observer comes from ``mod.qconfig.weight()`` (QAT: ``mod.weight_fake_quant``,
        not re-run with ``use_precomputed_fake_quant=True``); the output qparams from
        ``mod.activation_post_process``.  A QAT conv+bn has its BN folded in first.
        """
        if hasattr(mod, "weight_fake_quant"):
            _fold_qat_bn(mod)
            if not hasattr(mod, "activation_post_process"):
                raise AssertionError("Input QAT module must have observer attached")
            conv, activation, observer = mod, mod.activation_post_process, mod.weight_fake_quant
            if not use_precomputed_fake_quant:
                observer(conv.weight)
        else:
            if type(mod) is not cls._FLOAT_MODULE:
                raise AssertionError(f"nnq.{cls.__name__}.from_float only works for "
                                     f"{cls._FLOAT_MODULE.__name__} but got: {type(mod).__name__}")
            if getattr(mod, "qconfig", None) is None:
                raise AssertionError("Input float module must have qconfig defined.")
            activation = getattr(mod, "activation_post_process", None)
            conv = mod[0] if isinstance(mod, _fused._FusedModule) else mod
            qconfig = getattr(conv, "qconfig", None) or mod.qconfig
            observer = qconfig.weight()
            observer(conv.weight)
        if _dt.to_qdtype(observer.dtype) is not _dt.qint8:
            raise AssertionError(f"Weight observer must have a dtype of qint8, got "
                                 f"{observer.dtype}")
        qconv = cls._from_geometry(conv)
        qconv.set_weight_bias(quantize_weight(conv.weight.float(), observer), conv.bias)
        if activation is not None and not _has_float_dtype(activation):
            qconv.scale, qconv.zero_point = activation.calculate_qparams()
        return qconv

    @classmethod
    def from_reference(cls, ref_qconv: nn.Module, output_scale: float,
                       output_zero_point: int) -> "_ConvNd":
        """A quantized conv from a reference quantized conv (float weight + weight qparams);
        a fused reference container contributes its first child."""
        if isinstance(ref_qconv, nn.Sequential):
            ref_qconv = ref_qconv[0]
        qconv = cls._from_geometry(ref_qconv)
        qconv.set_weight_bias(_reference_quantized_weight(ref_qconv), ref_qconv.bias)
        qconv.scale, qconv.zero_point = output_scale, output_zero_point
        return qconv


class Conv1d(_ConvNd):
    """Quantized 1-D convolution: ``quantize(conv1d(x_hat, w_hat, bias), scale, zero_point)``."""

    _SPATIAL = 1
    _NAME = "QuantizedConv1d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv1d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        self._init(in_channels, out_channels, kernel_size, stride, padding, dilation, 0, groups,
                   bias, padding_mode, device)


class Conv2d(_ConvNd):
    """Quantized 2-D convolution."""

    _SPATIAL = 2
    _NAME = "QuantizedConv2d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv2d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        self._init(in_channels, out_channels, kernel_size, stride, padding, dilation, 0, groups,
                   bias, padding_mode, device)


class Conv3d(_ConvNd):
    """Quantized 3-D convolution."""

    _SPATIAL = 3
    _NAME = "QuantizedConv3d"
    _FLOAT_MODULE: ClassVar[Any] = nn.Conv3d

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0, dilation: IntOrTuple = 1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 device: Any = None, dtype: Any = None) -> None:
        self._init(in_channels, out_channels, kernel_size, stride, padding, dilation, 0, groups,
                   bias, padding_mode, device)


class _ConvTransposeNd(_ConvNd):
    """Transposed convs: torch's argument order (``output_padding`` before ``groups``,
    ``dilation`` after ``bias``); weight ``[in, out / groups, *kernel]``; zero padding only."""

    _TRANSPOSED = True

    def __init__(self, in_channels: int, out_channels: int, kernel_size: IntOrTuple,
                 stride: IntOrTuple = 1, padding: IntOrTuple = 0,
                 output_padding: IntOrTuple = 0, groups: int = 1, bias: bool = True,
                 dilation: IntOrTuple = 1, padding_mode: str = "zeros", device: Any = None,
                 dtype: Any = None) -> None:
        self._init(in_channels, out_channels, kernel_size, stride, padding, dilation,
                   output_padding, groups, bias, padding_mode, device)

    @classmethod
    def _from_geometry(cls, conv: nn.Module) -> "_ConvTransposeNd":
        return cls(conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
                   conv.padding, conv.output_padding, conv.groups, conv.bias is not None,
                   conv.dilation, conv.padding_mode)


class ConvTranspose1d(_ConvTransposeNd):
    """Quantized 1-D transposed convolution."""

    _SPATIAL = 1
    _NAME = "QuantizedConvTranspose1d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose1d


class ConvTranspose2d(_ConvTransposeNd):
    """Quantized 2-D transposed convolution."""

    _SPATIAL = 2
    _NAME = "QuantizedConvTranspose2d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose2d


class ConvTranspose3d(_ConvTransposeNd):
    """Quantized 3-D transposed convolution."""

    _SPATIAL = 3
    _NAME = "QuantizedConvTranspose3d"
    _FLOAT_MODULE: ClassVar[Any] = nn.ConvTranspose3d
