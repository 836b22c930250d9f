"""Dynamic quantized ``Linear``: float in, float out, int8 (or float16) weights.

The weight is quantized once at conversion and packed for the int8 kernels; the activation is
quantized on every call from its own range (:func:`torchquant.ops.linear.linear_dynamic`,
torch's fbgemm numerics).  State dict as torch's: ``scale`` / ``zero_point`` (unused
placeholders), ``_packed_params.dtype`` and ``_packed_params._packed_params`` = ``(weight,
bias)``.

Two things torch leaves implicit are attributes here (plain attributes, not state):

* ``reduce_range`` -- torch's module always asks its kernel for ``reduce_range=True`` and the
  quantized engine decides (fbgemm / x86 / onednn honour it, qnnpack ignores it).  Default True
  (x86 numbers); set False for qnnpack's.  The qconfig's activation observer does not change it,
  exactly as in torch (``default_dynamic_qconfig``'s observer says 0..255, yet torch uses 0..127).
* ``per_token`` -- activations quantized int8 symmetric with one scale per row
  (:func:`torchquant.ops.linear.linear_per_token_dynamic`); chosen by ``from_float`` when the
  qconfig's activation is :class:`torchquant.quantization.qconfig.PerTokenDynamicObserver`
  (``per_token_dynamic_qconfig``) and a keyword-only constructor argument.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..... import dtypes as _dt
from .....ops import linear as ops_linear
from .....ops import linear_fp16 as ops_linear_fp16
from .....tensor.qtensor import QTensor
from ...modules import linear as _nnq_linear
from ...modules.utils import quantize_weight
from .... import _workflow
from ....intrinsic.modules import fused as _nni
from ....qat.dynamic.modules.linear import Linear as _QATDynamicLinear

__all__ = ["Linear"]

_FP16_MAX = torch.finfo(torch.float16).max


def _is_float16(dtype: Any) -> bool:
    return dtype in (torch.float16, torch.half)


def weight_dtype_of(dtype: Any) -> Any:
    """Our qint8 for integer weights, ``torch.float16`` for half weights; anything else
    (quint8, qint32, sub-byte ...) is rejected: the dynamic kernels take signed int8 weights."""
    if _is_float16(dtype):
        return torch.float16
    try:
        qdtype = _dt.to_qdtype(dtype)
    except (TypeError, ValueError, KeyError):
        qdtype = None
    if qdtype is not _dt.qint8:
        raise RuntimeError(f"dynamic quantized modules take qint8 or float16 weights, got "
                           f"{dtype!r}")
    return qdtype


def to_float16_weight(weight: torch.Tensor) -> torch.Tensor:
    """The float16 copy of a float weight, saturated at float16's range (torch's fp16 prepack
    saturates too, rather than storing inf)."""
    if isinstance(weight, QTensor):
        raise TypeError("a float16 weight must be a float tensor, got a QTensor")
    w = weight.detach().float()
    return w.clamp(-_FP16_MAX, _FP16_MAX).to(torch.float16)


def is_per_token_observer(observer: Any) -> bool:
    """Whether an activation observer asks for per-token (per-row) int8 activations."""
    return bool(getattr(observer, "is_per_token", False))


def dynamic_weight_observer(mod: torch.nn.Module) -> Any:
    """``mod.qconfig.weight()``, or ``default_dynamic_qconfig``'s when there is none (torch)."""
    qconfig = getattr(mod, "qconfig", None)
    if qconfig is not None and qconfig.weight is not None:
        return qconfig.weight()
    return _workflow.default_dynamic_qconfig().weight()


def quantize_dynamic_weight(weight: torch.Tensor, observer: Any,
                            observe: bool = True) -> torch.Tensor:
    """A float weight as the dynamic kernels store it: a qint8 QTensor (observer run on it
    unless ``observe`` is False, i.e. precomputed fake-quant qparams) or float32 weights for
    float16 observers (rounded to float16 when packed)."""
    dtype = weight_dtype_of(observer.dtype)
    if dtype is torch.float16:
        return weight.detach().float()
    if observe:
        observer(weight)
    return quantize_weight(weight.detach().float(), observer)


class Linear(_nnq_linear.Linear):
    """``linear(x, w_hat, b)`` on a float ``x`` whose quantization is chosen per call.

    ``dtype=qint8``: the input is quantized per tensor (quint8, from its min / max) and runs on
    the int8 kernels; ``dtype=torch.float16``: the weight is rounded to float16 and the matmul
    runs in float32 (as fbgemm's fp16 GEMM accumulates).  Weights: per-tensor or per-channel
    (axis 0) qint8 from the qconfig's weight observer.
    """

    _version = 4
    _FUSED_RELU = False
    _FLOAT_MODULE: Any = (torch.nn.Linear, torch.nn.modules.linear.NonDynamicallyQuantizableLinear,
                          _nni.LinearReLU)  # and nn.qat.dynamic.Linear (see _float_types)
    reduce_range: bool = True

    def __init__(self, in_features: int, out_features: int, bias_: bool = True,
                 dtype: Any = _dt.qint8, *, per_token: bool = False) -> None:
        dtype = weight_dtype_of(dtype)
        super().__init__(in_features, out_features, bias_, dtype=_dt.qint8)
        self.version = 4
        if per_token and dtype is torch.float16:
            raise ValueError("per-token activations need qint8 weights, not float16")
        self.per_token = bool(per_token)
        self._fp16_packed: Optional[ops_linear_fp16.PackedLinearFp16Weight] = None
        if dtype is torch.float16:
            self._packed_params = _nnq_linear.LinearPackedParams(torch.float16)
            self._packed_params.set_weight_bias(
                torch.zeros(out_features, in_features, dtype=torch.float16),
                torch.zeros(out_features) if bias_ else None)

    def _get_name(self) -> str:
        return "DynamicQuantizedLinear"

    @property
    def weight_dtype(self) -> Any:
        return self._packed_params.dtype

    def extra_repr(self) -> str:
        s = (f"in_features={self.in_features}, out_features={self.out_features}, "
             f"dtype={self._packed_params.dtype}")
        if self._packed_params.dtype is not torch.float16:
            s += f", qscheme={self.weight().qscheme()}"
            if self.per_token:
                s += ", activation=per_token_symmetric"
            elif not self.reduce_range:
                s += ", reduce_range=False"
        return s

    # ---- compute ------------------------------------------------------------------------------
    def _float16_packed(self) -> ops_linear_fp16.PackedLinearFp16Weight:
        """The float16 weight packed for :func:`~torchquant.ops.linear_fp16.linear_dynamic_fp16`
        (its float32 widening built once), cached until the weight changes."""
        weight, bias = self._packed_params.packed
        packed = getattr(self, "_fp16_packed", None)  # (absent in modules pickled before)
        # tensors compared, not the (weight, bias) tuple: dynamo traces this too
        if packed is None or packed.weight is not weight or packed.bias is not bias:
            packed = ops_linear_fp16.pack_linear_fp16(weight, bias)
            self._fp16_packed = packed
        return packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if isinstance(x, QTensor):
            raise TypeError(f"{self._get_name()} takes a float input, got a quantized tensor "
                            "(dequantize it, or use the static quantized Linear)")
        relu = self._FUSED_RELU
        if self._packed_params.dtype is torch.float16:
            if not isinstance(x, torch.Tensor) or not x.dtype.is_floating_point:
                raise TypeError(f"{self._get_name()}: expected a float input, got "
                                f"{getattr(x, 'dtype', type(x).__name__)}")
            return ops_linear_fp16.linear_dynamic_fp16(x, self._float16_packed(), relu=relu)
        packed = self._packed_params.packed
        if self.per_token:
            return ops_linear.linear_per_token_dynamic(x, packed, relu=relu)
        return ops_linear.linear_dynamic(x, packed, reduce_range=self.reduce_range, relu=relu)

    # ---- weights ------------------------------------------------------------------------------
    def weight(self) -> torch.Tensor:
        """The qint8 QTensor weight, or (float16 modules) the float16-rounded weight as float32,
        as torch's unpack returns it."""
        w = self._weight_bias()[0]
        return w.float() if self._packed_params.dtype is torch.float16 else w

    def set_weight_bias(self, w: torch.Tensor, b: Optional[torch.Tensor]) -> None:
        if self._packed_params.dtype is torch.float16:
            if tuple(w.shape) != (self.out_features, self.in_features):
                raise ValueError(f"weight of shape {tuple(w.shape)} does not fit a Linear("
                                 f"{self.in_features}, {self.out_features})")
            self._packed_params.set_weight_bias(to_float16_weight(w), b)
            return
        super().set_weight_bias(w, b)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "_packed_params._packed_params"
        if self._packed_params.dtype is torch.float16 and key in state_dict:
            weight, bias = state_dict[key]  # torch saves fp16 weights widened to float32
            if isinstance(weight, torch.Tensor) and not isinstance(weight, QTensor):
                state_dict[key] = (to_float16_weight(weight), bias)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    # ---- conversion ---------------------------------------------------------------------------
    @classmethod
    def _float_types(cls) -> tuple:
        """The float module types ``from_float`` accepts."""
        return tuple(cls._FLOAT_MODULE) + (_QATDynamicLinear,)

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "Linear":
        """A dynamic quantized Linear from a float ``nn.Linear`` (or fused ``LinearReLU``, or
        dynamic QAT Linear) whose ``qconfig`` gives the weight observer (torch: a missing
        qconfig attribute is an error, ``qconfig=None`` means ``default_dynamic_qconfig``)."""
        allowed = cls._float_types()
        if type(mod) not in allowed:
            names = ", ".join(t.__name__ for t in allowed)
            raise AssertionError(f"{cls.__module__}.{cls.__name__}.from_float only works for "
                                 f"one of [{names}], got {type(mod)}")
        if not hasattr(mod, "qconfig"):
            raise AssertionError("Input float module must have qconfig defined")
        qconfig = mod.qconfig
        linear = mod[0] if isinstance(mod, _nni._FusedModule) else mod
        precomputed = use_precomputed_fake_quant and hasattr(linear, "weight_fake_quant")
        observer = linear.weight_fake_quant if precomputed else dynamic_weight_observer(mod)
        dtype = getattr(observer, "dtype", None)
        if not _is_float16(dtype) and _dt.to_qdtype(dtype) is not _dt.qint8:
            raise AssertionError("The only supported dtypes for dynamic quantized linear are "
                                 f"qint8 and float16, got: {dtype}")
        per_token = (qconfig is not None and qconfig.activation is not None
                     and is_per_token_observer(qconfig.activation()))
        qweight = quantize_dynamic_weight(linear.weight, observer, observe=not precomputed)
        qlinear = cls(linear.in_features, linear.out_features, linear.bias is not None,
                      dtype=weight_dtype_of(dtype), per_token=per_token)
        qlinear.set_weight_bias(qweight, linear.bias)
        return qlinear

    @classmethod
    def from_reference(cls, ref_qlinear: torch.nn.Module) -> "Linear":  # type: ignore[override]
        """From a reference quantized Linear (float weight + its qparams / ``weight_dtype``)."""
        dtype = getattr(ref_qlinear, "weight_dtype", _dt.qint8)
        qlinear = cls(ref_qlinear.in_features, ref_qlinear.out_features,
                      ref_qlinear.bias is not None, dtype=weight_dtype_of(dtype))
        qlinear.set_weight_bias(ref_qlinear.get_quantized_weight(), ref_qlinear.bias)
        return qlinear


