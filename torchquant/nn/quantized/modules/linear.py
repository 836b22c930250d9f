"""Quantized ``Linear`` (static: quantized input, quantized output) and its packed weights.

The weight is packed once (:func:`torchquant.ops.linear.pack_linear_weight`) whenever it
is set -- ``from_float``, ``set_weight_bias`` or ``load_state_dict`` -- never per call.
``LinearPackedParams`` holds it and serializes it as torch does, under
``_packed_params._packed_params`` as a ``(weight, bias)`` tuple (our QTensor and a float
tensor, both loadable with ``torch.load(weights_only=True)``) and ``_packed_params.dtype``.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .... import dtypes as _dt
from ....ops import linear as ops_linear
from ....ops._library import kernel_mode
from ....tensor.qtensor import QTensor, new_qtensor
from ....tensor.validation import require_quantized
from ...intrinsic.modules import fused as _fused
from .utils import (NotScriptable, OutputQParams, observed_output_qparams, quantize_weight,
                    weight_observer_of)

__all__ = ["LinearPackedParams", "Linear"]


def _weight_dtype(dtype: Any) -> Any:
    """Our QDType for integer weights, ``torch.float16`` for half weights (dynamic only)."""
    if dtype in (torch.float16, torch.half):
        return torch.float16
    return _dt.to_qdtype(dtype)


class LinearPackedParams(NotScriptable, torch.nn.Module):
    """A Linear's weight and bias, prepacked for the int8 kernels (or kept as float16)."""

    _version = 3

    def __init__(self, dtype: Any = _dt.qint8) -> None:
        super().__init__()
        self.dtype = _weight_dtype(dtype)
        if self.dtype is not torch.float16 and self.dtype is not _dt.qint8:
            raise TypeError(f"quantized Linear weights must be qint8 or float16, got {dtype!r}")
        self.packed: Any = None
        if self.dtype is torch.float16:
            self.set_weight_bias(torch.zeros(1, 1, dtype=torch.float16), None)
        else:
            zeros = torch.zeros(1, 1, dtype=torch.int8)
            self.set_weight_bias(QTensor.from_int(zeros, 1.0, 0, _dt.qint8), None)

    def set_weight_bias(self, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
        if self.dtype is torch.float16:
            if isinstance(weight, QTensor) or weight.dim() != 2:
                raise TypeError("a float16 Linear weight must be a 2-D float tensor")
            self.packed = (weight.detach().to(torch.float16),
                           None if bias is None else bias.detach().float())
            self._eager_calls = None  # Linear's eager forward keeps no calls for float16
            return
        if not isinstance(weight, QTensor):
            raise TypeError(f"quantized Linear weight must be a qint8 QTensor, got "
                            f"{type(weight).__name__} of dtype {weight.dtype}")
        if weight.qdtype is not _dt.qint8:
            raise TypeError(f"quantized Linear weight must be qint8, got {weight.qdtype!r}")
        if weight.dim() != 2:
            raise ValueError(f"Linear weight must be 2-D, got shape {tuple(weight.shape)}")
        if bias is not None:
            bias = bias.detach().float()
        self.packed = ops_linear.pack_linear_weight(weight.int_data, weight.scale,
                                                  weight.zero_point, weight.axis, bias)
        # Linear's eager per-call cache (call key -> the bound kernel call and the output
        # qparams), kept beside the pack and emptied with every new one.
        self._eager_calls: Optional[dict] = {}

    def __getstate__(self) -> dict:  # copies and pickles start with an empty call cache
        state = super().__getstate__()
        state["_eager_calls"] = None if self.dtype is torch.float16 else {}
        return state

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if "_eager_calls" not in self.__dict__:  # pickled before this module held the cache
            self._eager_calls = None if self.dtype is torch.float16 else {}

    def _weight_bias(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if self.dtype is torch.float16:
            return self.packed
        p = self.packed
        return QTensor.from_int(p.weight, p.weight_scale, p.weight_zero_point, _dt.qint8,
                                p.axis), p.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "dtype"] = self.dtype
        destination[prefix + "_packed_params"] = self._weight_bias()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        dtype_key, params_key = prefix + "dtype", prefix + "_packed_params"
        if dtype_key in state_dict:
            loaded = _weight_dtype(state_dict.pop(dtype_key))
            if loaded is not self.dtype:
                error_msgs.append(f"{dtype_key}: the checkpoint holds {loaded!r} weights, this "
                                  f"module expects {self.dtype!r}")
        elif strict:
            missing_keys.append(dtype_key)
        if params_key in state_dict:
            weight, bias = state_dict.pop(params_key)
            current, _ = self._weight_bias()
            if tuple(weight.shape) != tuple(current.shape) and current.numel() != 1:
                error_msgs.append(f"size mismatch for {params_key}: copying a weight of shape "
                                  f"{tuple(weight.shape)}, the module has {tuple(current.shape)}")
            else:
                try:
                    self.set_weight_bias(weight, bias)
                except (TypeError, ValueError) as exc:
                    error_msgs.append(f"{params_key}: {exc}")
        elif strict:
            missing_keys.append(params_key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys,
                                      unexpected_keys, error_msgs)

    def __repr__(self) -> str:
        return repr(self._weight_bias())


class Linear(OutputQParams, torch.nn.Module):
    """``y = quantize(x_hat @ w_hat.T + b)`` on a per-tensor quantized input.

    ``scale`` / ``zero_point`` give the output's qparams: plain, assignable Python numbers as in
    torch, saved as float32 / int64 0-d tensors (:class:`~.utils.OutputQParams`).  The output
    has the input's dtype (quint8 for the x86 qconfigs).
    """

    _version = 3
    _FLOAT_MODULE: Any = (torch.nn.Linear, torch.nn.modules.linear.NonDynamicallyQuantizableLinear)
    _POST_OP = "none"  # the fused post-op of the subclasses (ops.linear.POST_OPS)
    _OUTPUT_QDTYPES = (_dt.quint8, _dt.qint8)

    scale: float
    zero_point: int

    def __init__(self, in_features: int, out_features: int, bias_: bool = True,
                 dtype: Any = _dt.qint8) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self._packed_params = LinearPackedParams(dtype)
        weight = QTensor.from_int(torch.zeros(out_features, in_features, dtype=torch.int8), 1.0,
                                  0, _dt.qint8)
        self._packed_params.set_weight_bias(weight,
                                            torch.zeros(out_features) if bias_ else None)
        self._init_output_qparams(1.0, 0)

    def _get_name(self) -> str:
        return "QuantizedLinear"

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"{self._qparams_repr()}, qscheme={self.weight().qscheme()}")

    def __repr__(self) -> str:  # the packed params child is an implementation detail
        return f"{self._get_name()}({self.extra_repr()})"

    def _post_op_args(self) -> tuple:
        """``post_op`` and ``negative_slope`` of :func:`ops.linear.linear` (LinearLeakyReLU
        has a slope)."""
        return (self._POST_OP,)

    def forward(self, x: QTensor) -> QTensor:
        if type(x) is QTensor and not torch.compiler.is_compiling():
            # Plain eager: a call like an earlier one (input shape, dtype and qparams, output
            # qparams, post-op, kernel mode) reruns that call's checked, bound kernel.
            ints = x.int_data
            if type(ints) is torch.Tensor and x.axis is None and x.qdtype.bits == 8:
                key = (ints.shape, ints.dtype, ints.device, x.__dict__.get("_numbers"),
                       *self._output_qparams(), *self._post_op_args(), kernel_mode())
                calls = self._packed_params._eager_calls  # (float16 weights: None)
                hit = None if calls is None else calls.get(key)
                if hit is not None:
                    return new_qtensor(hit[0](ints), hit[1], hit[2], x.qdtype, None, hit[3])
                out = self._linear(x)
                if calls is not None:
                    self._remember_call(calls, key[:3] + (x._scale_zp(),) + key[4:], x, out)
                return out
        return self._linear(x)

    def _remember_call(self, calls: dict, key: tuple, q: QTensor, out: QTensor) -> None:
        """Keep the checked, bound kernel of the call :meth:`_linear` just made for ``q``
        under ``key`` (in the packed params' cache: a new weight empties it)."""
        x_scale, x_zp = key[3]
        plan = ops_linear.linear_plan(q.int_data, x_scale, x_zp, self._packed_params.packed,
                                      key[4], key[5], q.qdtype.storage_dtype,
                                      *self._post_op_args())
        if len(calls) >= 16:
            calls.clear()
        calls[key] = (plan, out.scale, out.zero_point, out._scale_zp())

    def _linear(self, x: QTensor) -> QTensor:
        q = require_quantized(x, "linear")
        scale, zero_point = self._output_qparams()
        x_scale, x_zp = q._scale_zp()
        out = ops_linear.linear(q.int_data, x_scale, x_zp, self._packed_params.packed, scale,
                                zero_point, q.qdtype.storage_dtype, *self._post_op_args())
        return QTensor.from_int_per_tensor(out, scale, zero_point, q.qdtype)

    # ---- weights ----------------------------------------------------------------------------
    def _weight_bias(self):
        return self._packed_params._weight_bias()

    def weight(self) -> QTensor:
        return self._weight_bias()[0]

    def bias(self) -> Optional[torch.Tensor]:
        return self._weight_bias()[1]

    def set_weight_bias(self, w: QTensor, b: Optional[torch.Tensor]) -> None:
        if tuple(w.shape) != (self.out_features, self.in_features):
            raise ValueError(f"weight of shape {tuple(w.shape)} does not fit a Linear("
                             f"{self.in_features}, {self.out_features})")
        self._packed_params.set_weight_bias(w, b)

    # ---- conversion -------------------------------------------------------------------------
    @classmethod
    def _float_linear(cls, mod: torch.nn.Module) -> torch.nn.Module:
        """The nn.Linear inside a float, fused or QAT module (ConvBn-style folding done)."""
        if isinstance(mod, _fused._FusedModule):
            return mod[0]
        return mod

    @classmethod
    def _check_float_type(cls, mod: torch.nn.Module) -> None:
        allowed = cls._FLOAT_MODULE if isinstance(cls._FLOAT_MODULE, tuple) else (cls._FLOAT_MODULE,)
        if type(mod) not in allowed:
            names = ", ".join(t.__name__ for t in allowed)
            raise AssertionError(f"nnq.{cls.__name__}.from_float only works for {names}, but got: "
                                 f"{type(mod)}")

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "Linear":
        """A quantized Linear from an observed float (or fused / QAT) module."""
        if hasattr(mod, "weight_fake_quant"):  # a QAT module
            if hasattr(mod, "bn") and hasattr(mod, "_fold_bn_into_linear"):
                mod._fold_bn_into_linear()
            linear = mod
        else:
            cls._check_float_type(mod)
            if getattr(mod, "qconfig", None) is None:
                raise AssertionError("Input float module must have qconfig defined")
            linear = cls._float_linear(mod)
            if getattr(linear, "qconfig", None) is None:
                linear.qconfig = mod.qconfig
        out_scale, out_zp = observed_output_qparams(mod)
        observer = weight_observer_of(linear, use_precomputed_fake_quant)
        if _dt.to_qdtype(observer.dtype) is not _dt.qint8:
            raise AssertionError(f"Weight observer must have dtype qint8, got "
                                 f"{observer.dtype}")
        qweight = quantize_weight(linear.weight, observer)
        qlinear = cls._new_like(mod, linear)
        qlinear.set_weight_bias(qweight, linear.bias)
        qlinear.scale, qlinear.zero_point = out_scale, out_zp
        return qlinear

    @classmethod
    def _new_like(cls, mod: torch.nn.Module, linear: torch.nn.Module) -> "Linear":
        return cls(linear.in_features, linear.out_features, linear.bias is not None)

    @classmethod
    def from_reference(cls, ref_qlinear: torch.nn.Module, output_scale: float,
                       output_zero_point: int) -> "Linear":
        """A quantized Linear from a reference quantized Linear (float weights + qparams)."""
        qlinear = cls._new_like(ref_qlinear, ref_qlinear)
        qlinear.set_weight_bias(ref_qlinear.get_quantized_weight(), ref_qlinear.bias)
        qlinear.scale, qlinear.zero_point = output_scale, output_zero_point
        return qlinear
