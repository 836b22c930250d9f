"""Top-level tensor functions: ``quantize_per_tensor``, ``quantize_per_channel``, ``dequantize``...

Thin, validating front ends over :mod:`torchquant.affine`; the math lives there.
"""
from __future__ import annotations

from typing import Any, Sequence, Union

import torch

from .. import affine
from .. import dtypes as _dt
from ..ops import fake_quantize as ops_fake_quantize
from ..ops import quantize as ops_quantize
from ..ops import quantize_dynamic as ops_quantize_dynamic
from ..ops._library import plain_eager
from .qtensor import QTensor, _normalise_qparams, new_qtensor, shared_qparams

__all__ = ["quantize_per_tensor", "quantize_per_channel", "dequantize",
           "quantize_per_tensor_dynamic", "fake_quantize_per_tensor_affine",
           "fake_quantize_per_channel_affine"]


def _check_float_input(x: Any, fn: str, reject_reduced: bool = False) -> torch.Tensor:
    if isinstance(x, QTensor):
        raise TypeError(f"{fn} expects a float tensor, got an already quantized QTensor")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{fn} expects a float tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{fn} expects a floating-point input, got dtype {x.dtype}")
    if reject_reduced and x.dtype in (torch.float16, torch.bfloat16):
        # torch's message and type: half / bfloat16 input is not quantized (float64 is,
        # unlike torch, which rejects it too).
        name = "Half" if x.dtype == torch.float16 else "BFloat16"
        raise RuntimeError(f"Quantize only works on Float Tensor, got {name} ({fn})")
    return x.detach()


def _make(x: torch.Tensor, scale_t: torch.Tensor, zp_t: torch.Tensor, qdtype: _dt.QDType,
          axis) -> QTensor:
    mode = affine.quantize_mode(qdtype, axis is not None)
    vals = ops_quantize.quantize_int(x, scale_t.to(x.device), zp_t.to(x.device), qdtype.qmin,
                                     qdtype.qmax, qdtype.storage_dtype, axis, mode)
    scale_t, zp_t = scale_t.to(x.device), zp_t.to(x.device)
    if qdtype.is_sub_byte:
        return QTensor(affine.pack_sub_byte(vals, qdtype.bits), scale_t, zp_t, qdtype, axis,
                       tuple(x.shape))
    return QTensor(vals, scale_t, zp_t, qdtype, axis)


def quantize_per_tensor(input: Union[torch.Tensor, Sequence[torch.Tensor]], scale: Any,
                        zero_point: Any, dtype: Any) -> Union[QTensor, tuple]:
    """Affine-quantize with one scale and integer zero point (``torch.quantize_per_tensor``).

    A list of tensors with 1-d ``scale``/``zero_point`` tensors gives a tuple of QTensors."""
    qdtype = _dt.to_qdtype(dtype)
    if isinstance(input, (list, tuple)):
        scales = torch.as_tensor(scale).reshape(-1)
        zps = torch.as_tensor(zero_point).reshape(-1)
        if scales.numel() != len(input) or zps.numel() != len(input):
            raise ValueError(f"quantize_per_tensor on {len(input)} tensors needs {len(input)} "
                             f"scales and zero points, got {scales.numel()} and {zps.numel()}")
        return tuple(quantize_per_tensor(t, scales[i], zps[i], qdtype) for i, t in enumerate(input))
    x = _check_float_input(input, "quantize_per_tensor", reject_reduced=True)
    if isinstance(scale, (int, float)) and isinstance(zero_point, int) and not qdtype.is_sub_byte:
        # Python-number qparams (a converted model's): the op a graph can hold as one node,
        # and the numbers kept on the result for the ops that follow.  Their 0-d tensors are
        # validated (before any work) and made once per qparams, outside tracing.
        numbers = (float(scale), int(zero_point))
        if x.device.type == "cpu" and plain_eager(x):
            scale_t, zp_t = shared_qparams(*numbers, qdtype)
            values = ops_quantize.quantize_per_tensor(x, *numbers, qdtype)
            return new_qtensor(values, scale_t, zp_t, qdtype, None, numbers)
        scale_t, zp_t = _normalise_qparams(scale, zero_point, qdtype, None, x.shape)
        values = ops_quantize.quantize_per_tensor(x, *numbers, qdtype)
        return QTensor(values, scale_t.to(x.device), zp_t.to(x.device), qdtype,
                       numbers=numbers)
    scale_t, zp_t = _normalise_qparams(scale, zero_point, qdtype, None, x.shape)
    return _make(x, scale_t, zp_t, qdtype, None)


def quantize_per_channel(input: torch.Tensor, scales: Any, zero_points: Any, axis: int,
                         dtype: Any) -> QTensor:
    """Per-channel affine quantization along ``axis``; float ``zero_points`` select the
    float-qparams scheme (embeddings)."""
    qdtype = _dt.to_qdtype(dtype)
    x = _check_float_input(input, "quantize_per_channel", reject_reduced=True)
    if not isinstance(axis, int):
        raise TypeError(f"axis must be an int, got {type(axis).__name__}")
    scale_t, zp_t = _normalise_qparams(scales, zero_points, qdtype, axis, x.shape)
    return _make(x, scale_t, zp_t, qdtype, axis % x.dim())


def dequantize(tensor: Any) -> Any:
    """Float32 values of a QTensor; a float tensor comes back unchanged; a list gives a tuple."""
    if isinstance(tensor, (list, tuple)):
        return tuple(dequantize(t) for t in tensor)
    if isinstance(tensor, QTensor):
        return tensor.dequantize()
    if isinstance(tensor, torch.Tensor):
        if tensor.dtype.is_floating_point:
            return tensor
        raise TypeError(f"dequantize expects a QTensor or float tensor, got dtype {tensor.dtype}")
    raise TypeError(f"dequantize expects a tensor, got {type(tensor).__name__}")


def quantize_per_tensor_dynamic(input: torch.Tensor, dtype: Any, reduce_range: bool) -> QTensor:
    """Per-tensor affine quantization with qparams chosen from the input's min/max (ATen rule)."""
    qdtype = _dt.to_qdtype(dtype)
    if qdtype not in (_dt.quint8, _dt.qint8):
        raise TypeError(f"quantize_per_tensor_dynamic supports quint8 and qint8, got {qdtype!r}")
    x = _check_float_input(input, "quantize_per_tensor_dynamic", reject_reduced=True)
    try:
        values, scale, zero_point = ops_quantize_dynamic.quantize_dynamic_per_tensor(
            x, qdtype, reduce_range)
    except ValueError as err:
        raise ValueError("quantize_per_tensor_dynamic: input contains NaN or Inf") from err
    # the scale stays the double ATen computes (torch keeps it too); the integers are ATen's
    numbers = (float(scale), int(zero_point))
    scale_t, zp_t = _normalise_qparams(*numbers, qdtype, None, x.shape)
    return QTensor(values, scale_t.to(x.device), zp_t.to(x.device), qdtype, numbers=numbers)


def fake_quantize_per_tensor_affine(input: torch.Tensor, scale: Any, zero_point: Any,
                                    quant_min: int, quant_max: int) -> torch.Tensor:
    """Quantize-dequantize with a straight-through gradient (zero where clamped)."""
    _check_float_input(input, "fake_quantize_per_tensor_affine")
    return ops_fake_quantize.fake_quantize(input, torch.as_tensor(scale, dtype=torch.float32),
                                           torch.as_tensor(zero_point), quant_min, quant_max)


_ATEN_DTYPE_NAMES = {torch.float64: "Double", torch.float32: "Float", torch.float16: "Half",
                     torch.bfloat16: "BFloat16", torch.int64: "Long", torch.int32: "Int",
                     torch.int16: "Short", torch.int8: "Char", torch.uint8: "Byte",
                     torch.bool: "Bool"}


def _check_per_channel_fake_quant_qparams(scale: Any, zero_point: Any, quant_min: int,
                                          quant_max: int) -> None:
    if isinstance(zero_point, torch.Tensor) and zero_point.dtype not in (
            torch.int32, torch.float32, torch.float16):
        found = _ATEN_DTYPE_NAMES.get(zero_point.dtype, str(zero_point.dtype))
        raise RuntimeError(f"Zero-point must be Int32, Float or Half, found {found}")
    if isinstance(scale, torch.Tensor) and scale.dtype not in (torch.float32, torch.bfloat16):
        found = _ATEN_DTYPE_NAMES.get(scale.dtype, str(scale.dtype))
        raise RuntimeError(f"Scale must be Float or BFloat16, found {found}")
    if isinstance(zero_point, torch.Tensor) and not zero_point.dtype.is_floating_point \
            and zero_point.numel() and quant_min <= quant_max:
        lo, hi = torch.aminmax(zero_point)
        if int(lo) < quant_min or int(hi) > quant_max:
            raise RuntimeError("`zero_point` must be between `quant_min` and `quant_max`.")


def fake_quantize_per_channel_affine(input: torch.Tensor, scale: torch.Tensor,
                                     zero_point: torch.Tensor, axis: int, quant_min: int,
                                     quant_max: int) -> torch.Tensor:
    """Per-channel fake quantization along ``axis``.

    The qparams are checked as torch checks them (RuntimeError, torch's messages): an int32,
    float32 or float16 ``zero_point``, a float32 or bfloat16 ``scale``, and integer zero
    points inside ``[quant_min, quant_max]`` (float ones are not range-checked, as torch)."""
    _check_float_input(input, "fake_quantize_per_channel_affine")
    _check_per_channel_fake_quant_qparams(scale, zero_point, quant_min, quant_max)
    return ops_fake_quantize.fake_quantize(input, scale, zero_point, quant_min, quant_max, axis)
