"""Helpers shared by the quantization workflows (torch's quantization ``utils`` names).

The range / qparam math is :mod:`torchquant.affine`'s; this module re-exports it under torch's
names and adds the qconfig classification helpers the eager, FX and PT2E flows ask.
"""
from __future__ import annotations

from typing import Any, Callable, Union

import torch

from .. import dtypes as _dt
from ..affine import calculate_qmin_qmax, check_min_max_valid, choose_qparams, validate_qmin_qmax
from .observer import PlaceholderObserver, is_per_channel, is_per_tensor  # is_per_*: observer uses them
from . import calibration as _calibration
from .quant_type import QuantType

__all__ = [
    "calculate_qmin_qmax", "validate_qmin_qmax", "check_min_max_valid", "determine_qparams",
    "is_per_tensor", "is_per_channel", "get_qparam_dict",
    "activation_dtype", "weight_dtype", "get_qconfig_dtypes",
    "activation_is_statically_quantized", "activation_is_dynamically_quantized",
    "activation_is_int8_quantized", "activation_is_int32_quantized",
    "weight_is_quantized", "weight_is_statically_quantized",
    "op_is_int8_dynamically_quantized", "get_quant_type",
]

_FLOAT8 = (torch.float8_e5m2, torch.float8_e4m3fn)
# The dtype lists torch uses to classify qconfigs, with aliases folded (uint8 is quint8 etc.).
_STATIC_ACTIVATION_DTYPES = (_dt.quint8, _dt.qint8, _dt.qint32, torch.float16, torch.int16) + _FLOAT8
_QUANTIZED_WEIGHT_DTYPES = (_dt.quint8, _dt.qint8, _dt.qint32, _dt.quint4x2, torch.float16,
                            torch.int16) + _FLOAT8
_INTEGER_QUANT_DTYPES = (_dt.quint8, _dt.qint8, _dt.quint4x2, _dt.qint32, torch.int16) + _FLOAT8


def _canonical_dtype(dtype: Any) -> Any:
    """The QDType for a quantized dtype or one of its aliases, anything else unchanged."""
    return _dt.to_qdtype(dtype) if _dt.is_qdtype_like(dtype) else dtype


def _dtype_in(dtype: Any, choices: tuple) -> bool:
    dtype = _canonical_dtype(dtype)
    return any(dtype is c for c in choices)


def determine_qparams(min_val: torch.Tensor, max_val: torch.Tensor, quant_min: int,
                      quant_max: int, dtype: Any, eps: torch.Tensor,
                      has_customized_qrange: bool,
                      qscheme: Any = _dt.per_tensor_affine) -> tuple[torch.Tensor, torch.Tensor]:
    """The observer rule (SPEC §1.5) as a function of min/max, per tensor or per channel.

    Returns float64 scales and int64 zero points, as torch's function does (float-qparams
    zero points are truncated to int64 there too).
    """
    scale, zero_point = choose_qparams(min_val, max_val, quant_min, quant_max, dtype, eps,
                                       has_customized_qrange, qscheme)
    return scale.to(torch.float64), zero_point.to(torch.int64)


def get_qparam_dict(observer_or_fake_quant: torch.nn.Module) -> dict[str, Any]:
    """The qparams a reference module stores (``weight_qparams``): qscheme, dtype, scale,
    zero_point, quant_min/quant_max and ``axis`` for per-channel.

    Symmetric schemes are reported as their affine counterparts because a quantized tensor only
    knows affine schemes.  Placeholder observers (no integer quantization) give only the dtype.
    """
    qscheme = getattr(observer_or_fake_quant, "qscheme", None)
    dtype = observer_or_fake_quant.dtype
    if qscheme is None or isinstance(observer_or_fake_quant, PlaceholderObserver):
        return {"qscheme": None, "dtype": dtype}
    qparams: dict[str, Any] = {"qscheme": qscheme, "dtype": dtype}
    if is_per_tensor(qscheme):
        qparams["qscheme"] = _dt.per_tensor_affine
    elif is_per_channel(qscheme):
        qparams["qscheme"] = (_dt.per_channel_affine if qscheme == _dt.per_channel_symmetric
                              else _dt.to_qscheme(qscheme))
        qparams["axis"] = observer_or_fake_quant.ch_axis
    else:
        raise RuntimeError(f"Unrecognized qscheme: {qscheme}")
    qparams["scale"], qparams["zero_point"] = observer_or_fake_quant.calculate_qparams()
    if hasattr(observer_or_fake_quant, "quant_min"):
        qparams["quant_min"] = observer_or_fake_quant.quant_min
    if hasattr(observer_or_fake_quant, "quant_max"):
        qparams["quant_max"] = observer_or_fake_quant.quant_max
    return qparams


def _require_qconfig(qconfig: Any, what: str) -> None:
    if qconfig is None:
        raise AssertionError(f"qconfig must be provided to determine {what}")


def activation_dtype(qconfig: Any) -> Any:
    """dtype of the activation observer the qconfig builds (constructs one to ask it)."""
    _require_qconfig(qconfig, "activation dtype")
    return qconfig.activation().dtype


def weight_dtype(qconfig: Any) -> Any:
    """dtype of the weight observer the qconfig builds (constructs one to ask it)."""
    _require_qconfig(qconfig, "weight dtype")
    return qconfig.weight().dtype


def get_qconfig_dtypes(qconfig: Any) -> tuple[Any, Any, bool]:
    """``(activation dtype, weight dtype, activation is dynamic)``."""
    _require_qconfig(qconfig, "dtypes")
    activation = qconfig.activation()
    weight = qconfig.weight()
    return activation.dtype, weight.dtype, getattr(activation, "is_dynamic", False)


def activation_is_dynamically_quantized(qconfig: Any) -> bool:
    return get_qconfig_dtypes(qconfig)[2]


def activation_is_statically_quantized(qconfig: Any) -> bool:
    """Activations are quantized ahead of time (to an integer dtype, float16 or float8)."""
    return (_dtype_in(activation_dtype(qconfig), _STATIC_ACTIVATION_DTYPES)
            and not activation_is_dynamically_quantized(qconfig))


def activation_is_int8_quantized(qconfig: Any) -> bool:
    return _dtype_in(activation_dtype(qconfig), (_dt.quint8, _dt.qint8))


def activation_is_int32_quantized(qconfig: Any) -> bool:
    return _dtype_in(activation_dtype(qconfig), (_dt.qint32,))


def weight_is_quantized(qconfig: Any) -> bool:
    return _dtype_in(weight_dtype(qconfig), _QUANTIZED_WEIGHT_DTYPES)


def weight_is_statically_quantized(qconfig: Any) -> bool:
    """Weights are stored as 8-bit integers."""
    return _dtype_in(weight_dtype(qconfig), (_dt.quint8, _dt.qint8))


def op_is_int8_dynamically_quantized(qconfig: Any) -> bool:
    """quint8 activations quantized at run time with qint8 weights (dynamic Linear / LSTM)."""
    act, weight, act_is_dynamic = get_qconfig_dtypes(qconfig)
    return bool(_dtype_in(act, (_dt.quint8,)) and _dtype_in(weight, (_dt.qint8,))
                and act_is_dynamic)


def get_quant_type(qconfig: Any) -> QuantType:
    """Classify a qconfig as DYNAMIC, STATIC or WEIGHT_ONLY from its observers' dtypes."""
    _require_qconfig(qconfig, "quant type")
    activation = qconfig.activation()
    weight = qconfig.weight()
    act_is_dynamic = bool(getattr(activation, "is_dynamic", False))
    if _dtype_in(weight.dtype, _INTEGER_QUANT_DTYPES):
        if act_is_dynamic:
            return QuantType.DYNAMIC
        if _dtype_in(activation.dtype, _INTEGER_QUANT_DTYPES):
            return QuantType.STATIC
        return QuantType.WEIGHT_ONLY
    if weight.dtype == torch.float16:
        if act_is_dynamic:
            return QuantType.DYNAMIC
        if activation.dtype == torch.float16:
            return QuantType.STATIC
    raise ValueError(f"Unrecognized dtype combination in get_quant_type: "
                     f"activation({activation.dtype}), weight({weight.dtype})")


def _parent_name(target: str) -> tuple[str, str]:
    """``"a.b.c"`` -> ``("a.b", "c")``; ``"c"`` -> ``("", "c")``."""
    parent, _, name = target.rpartition(".")
    return parent, name


def progress_bar(iterable: Any, desc: str, enabled: Any = None) -> Any:
    """``iterable`` wrapped in a progress bar (see :func:`.calibration.progress_bar`): on a
    terminal (``enabled=None``), always (``True``) or never (``False``)."""
    return _calibration.progress_bar(iterable, desc, enabled)


class MatchAllNode:
    """Placeholder in an FX pattern (reversed nested tuple format) that matches any node, e.g.
    the other operand of ``(torch.add, MatchAllNode, nn.Conv2d)``."""


# An FX pattern: a module class, a function, a method-name string, or a tuple of patterns.
Pattern = Union[Callable, tuple[Any, Any], tuple[Any, tuple[Any, Any]], Any]
