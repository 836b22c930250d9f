"""Quantized ops on QTensors: torch's quantized functional API, ported.

Inputs are per-tensor affine QTensors; results are bit-identical to torch 2.13's quantized CPU
kernels (the numerics live in :mod:`torchquant.ops.activation`, :mod:`torchquant.ops.pooling`
and the ops behind the private ``_binary`` module; ``_pointwise`` wraps the activations for
QTensors).
"Same qparams" ops return the input's scale and zero point.
"""
from __future__ import annotations

import warnings
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import Tensor

from ...ops import pooling
from ...tensor.qtensor import QTensor
from ...tensor import pointwise as _pointwise
from ...tensor.validation import require_quantized

__all__ = [
    "avg_pool2d", "avg_pool3d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "interpolate",
    "max_pool1d", "max_pool2d", "celu", "leaky_relu", "hardtanh", "hardswish", "threshold",
    "elu", "hardsigmoid", "clamp", "upsample", "upsample_bilinear", "upsample_nearest",
]

IntOrTuple = Union[int, Sequence[int]]


def avg_pool2d(input: Tensor, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
               padding: IntOrTuple = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> QTensor:
    """2-D average pooling (same qparams); the integer average is requantized as torch does."""
    q = require_quantized(input, "avg_pool2d")
    return q._with(pooling.avg_pool(q._values(), q._scale_zp()[1], q.qdtype, 2, kernel_size,
                                    stride, padding, ceil_mode, count_include_pad,
                                    divisor_override))


def avg_pool3d(input: Tensor, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
               padding: IntOrTuple = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> QTensor:
    """3-D average pooling (same qparams)."""
    q = require_quantized(input, "avg_pool3d")
    return q._with(pooling.avg_pool(q._values(), q._scale_zp()[1], q.qdtype, 3, kernel_size,
                                    stride, padding, ceil_mode, count_include_pad,
                                    divisor_override))


def adaptive_avg_pool2d(input: Tensor, output_size: IntOrTuple) -> QTensor:
    """2-D adaptive average pooling (same qparams)."""
    q = require_quantized(input, "adaptive_avg_pool2d")
    return q._with(pooling.adaptive_avg_pool(q._values(), q._scale_zp()[1], q.qdtype, 2,
                                             output_size))


def adaptive_avg_pool3d(input: Tensor, output_size: IntOrTuple) -> QTensor:
    """3-D adaptive average pooling (same qparams)."""
    q = require_quantized(input, "adaptive_avg_pool3d")
    return q._with(pooling.adaptive_avg_pool(q._values(), q._scale_zp()[1], q.qdtype, 3,
                                             output_size))


def interpolate(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners: Optional[bool] = None) -> QTensor:
    """Resample (same qparams): 'nearest' for 4-D and 5-D input, 'bilinear' for 4-D input."""
    q = require_quantized(input, "interpolate")
    supported = {"nearest": (4, 5), "bilinear": (4,)}
    if q.dim() not in supported.get(mode, ()):
        raise NotImplementedError(f"quantized.interpolate supports mode 'nearest' (4-D or 5-D "
                                  f"input) and 'bilinear' (4-D input); got mode {mode!r} for "
                                  f"{q.dim()}-D input")
    # The float op on a meta tensor validates the arguments and gives the output size.
    shape = F.interpolate(torch.empty(q.shape, device="meta"), size, scale_factor, mode,
                          align_corners).shape
    spatial = q.dim() - 2
    if size is None:  # torch's kernels map indices with the given factors
        factors = (scale_factor,) * spatial if not isinstance(scale_factor, (tuple, list)) \
            else tuple(scale_factor)
        factors = tuple(float(f) for f in factors)
    else:
        factors = (None,) * spatial
    if mode == "nearest":
        return q._with(pooling.upsample_nearest(q._values(), shape[2:], factors))
    return q._with(pooling.upsample_bilinear(q._values(), q._scale_zp()[1], q.qdtype,
                                             shape[-2:], bool(align_corners), factors))


def max_pool1d(input: Tensor, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
               padding: IntOrTuple = 0, dilation: IntOrTuple = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> QTensor:
    """1-D max pooling on the integers (same qparams)."""
    if return_indices:
        raise NotImplementedError("return_indices is not yet implemented!")
    q = require_quantized(input, "max_pool1d")
    return q._with(pooling.max_pool(q._values(), 1, kernel_size, stride, padding, dilation,
                                    ceil_mode))


def max_pool2d(input: Tensor, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
               padding: IntOrTuple = 0, dilation: IntOrTuple = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> QTensor:
    """2-D max pooling on the integers (same qparams)."""
    if return_indices:
        raise NotImplementedError("return_indices is not yet implemented!")
    q = require_quantized(input, "max_pool2d")
    return q._with(pooling.max_pool(q._values(), 2, kernel_size, stride, padding, dilation,
                                    ceil_mode))


def celu(input: Tensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    """CELU with output qparams (scale, zero_point)."""
    q = require_quantized(input, "celu")
    return _pointwise.celu(q, float(scale), int(zero_point), float(alpha))


def leaky_relu(input: Tensor, negative_slope: float = 0.01, inplace: bool = False,
               scale: Optional[float] = None, zero_point: Optional[int] = None) -> QTensor:
    """Leaky ReLU; output qparams (scale, zero_point) when both are given, else the input's."""
    q = require_quantized(input, "leaky_relu")
    if scale is not None and zero_point is not None:
        if inplace:
            raise AssertionError("Cannot rescale with `inplace`")
        # torch writes into a fresh contiguous tensor here (the op's ``out=`` overload)
        return _pointwise.leaky_relu(q, float(negative_slope), float(scale), int(zero_point),
                                     layout="contiguous")
    result = _pointwise.leaky_relu(q, float(negative_slope))
    return _pointwise.store_inplace(q, result) if inplace else result


def hardtanh(input: Tensor, min_val: float = -1.0, max_val: float = 1.0,
             inplace: bool = False) -> QTensor:
    """Clamp to [min_val, max_val] in the integer domain (same qparams)."""
    q = require_quantized(input, "hardtanh")
    result = _pointwise.clamp(q, float(min_val), float(max_val))
    return _pointwise.store_inplace(q, result) if inplace else result


def hardswish(input: Tensor, scale: float, zero_point: int) -> QTensor:
    """Hardswish with output qparams (scale, zero_point)."""
    q = require_quantized(input, "hardswish")
    return _pointwise.hardswish(q, float(scale), int(zero_point))


def threshold(input: Tensor, threshold: float, value: float) -> QTensor:
    """``value`` where the input is <= ``threshold``, the input elsewhere (same qparams)."""
    q = require_quantized(input, "threshold")
    if threshold is None:
        raise ValueError("Input to 'threshold' must be specified!")
    if value is None:
        raise ValueError("Input to 'value' must be specified!")
    return _pointwise.threshold(q, float(threshold), float(value))


def elu(input: Tensor, scale: float, zero_point: int, alpha: float = 1.0) -> QTensor:
    """ELU with output qparams (scale, zero_point)."""
    q = require_quantized(input, "elu")
    return _pointwise.elu(q, float(scale), int(zero_point), float(alpha))


def hardsigmoid(input: Tensor, inplace: bool = False) -> QTensor:
    """Hardsigmoid with torch's fixed output qparams (1/256 and zero point 0 for quint8)."""
    q = require_quantized(input, "hardsigmoid")
    result = _pointwise.hardsigmoid(q)
    return _pointwise.store_inplace(q, result) if inplace else result


def clamp(input: Tensor, min_: float, max_: float) -> QTensor:
    """Clamp to [min_, max_] in the integer domain (same qparams)."""
    q = require_quantized(input, "clamp")
    return _pointwise.clamp(q, min_, max_)


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
             align_corners: Optional[bool] = None) -> QTensor:
    """Deprecated alias of :func:`interpolate`."""
    warnings.warn("nn.quantized.functional.upsample is deprecated. Use "
                  "nn.quantized.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode, align_corners)


def upsample_bilinear(input: Tensor, size=None, scale_factor=None) -> QTensor:
    """Deprecated: bilinear :func:`interpolate` with ``align_corners=True``."""
    warnings.warn("nn.quantized.functional.upsample_bilinear is deprecated. Use "
                  "nn.quantized.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="bilinear", align_corners=True)


def upsample_nearest(input: Tensor, size=None, scale_factor=None) -> QTensor:
    """Deprecated: nearest :func:`interpolate`."""
    warnings.warn("nn.quantized.functional.upsample_nearest is deprecated. Use "
                  "nn.quantized.functional.interpolate instead.", stacklevel=2)
    return interpolate(input, size, scale_factor, mode="nearest")


# Weighted ops live next to their modules' kernels; re-exported here under torch's names.
from ._conv_functional import *  # noqa: E402,F401,F403
from ._linear_functional import *  # noqa: E402,F401,F403
from . import _conv_functional, _linear_functional  # noqa: E402

__all__ += _conv_functional.__all__ + _linear_functional.__all__
