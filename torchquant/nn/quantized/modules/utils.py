"""Helpers every weighted quantized module shares: weight quantization from an observer and
the output qparams of an observed float module."""
from __future__ import annotations

from typing import Any

import torch

from .... import dtypes as _dt
from ....qtensor import QTensor
from ....tensor_functions import quantize_per_channel, quantize_per_tensor

__all__ = ["quantize_weight", "observed_output_qparams", "weight_observer_of"]

_PER_TENSOR = ("per_tensor_affine", "per_tensor_symmetric")
_PER_CHANNEL = ("per_channel_affine", "per_channel_symmetric")


def _qscheme_name(qscheme: Any) -> str:
    return str(_dt.to_qscheme(qscheme)).rsplit(".", 1)[-1]


def quantize_weight(float_weight: torch.Tensor, observer: torch.nn.Module) -> QTensor:
    """Quantize a float weight with the qparams its (already run) observer computed.

    As torch does, the integers are then clamped to the observer's own quant range when that
    is narrower than the dtype's (e.g. the -127..127 weight observers).
    """
    scale, zero_point = observer.calculate_qparams()
    qdtype = _dt.to_qdtype(observer.dtype)
    scheme = _qscheme_name(observer.qscheme)
    w = float_weight.detach().float()
    if scheme in _PER_TENSOR:
        q = quantize_per_tensor(w, float(scale), int(zero_point), qdtype)
    elif scheme in _PER_CHANNEL:
        q = quantize_per_channel(w, scale.double(), zero_point.long(), observer.ch_axis, qdtype)
    elif scheme == "per_channel_affine_float_qparams":
        q = quantize_per_channel(w, scale.float(), zero_point.float(), observer.ch_axis, qdtype)
    else:
        raise ValueError(f"unexpected weight qscheme {observer.qscheme!r}")
    qmin, qmax = getattr(observer, "quant_min", None), getattr(observer, "quant_max", None)
    if (qmin is not None and qmax is not None and (qmin, qmax) != (qdtype.qmin, qdtype.qmax)
            and not qdtype.is_sub_byte):
        q = q._with(q.int_data.clamp(qmin, qmax))
    return q


def observed_output_qparams(mod: torch.nn.Module) -> tuple[float, int]:
    """(scale, zero_point) of an observed float module's output observer."""
    if not hasattr(mod, "activation_post_process"):
        raise AssertionError(f"{type(mod).__name__} has no activation_post_process: prepare "
                             "and calibrate the model before converting it")
    scale, zero_point = mod.activation_post_process.calculate_qparams()
    return float(scale), int(zero_point)


def weight_observer_of(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False):
    """The weight observer / fake-quant of a float or QAT module, run on its weight."""
    if hasattr(mod, "weight_fake_quant"):
        observer = mod.weight_fake_quant
    else:
        if getattr(mod, "qconfig", None) is None:
            raise AssertionError(f"{type(mod).__name__} must have a qconfig to be converted")
        observer = mod.qconfig.weight()
    if not use_precomputed_fake_quant:
        observer(mod.weight)
    return observer
