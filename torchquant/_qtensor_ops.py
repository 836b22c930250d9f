"""torch-namespace ops on QTensors that torch supports on quantized tensors.

Eager quantized models call ``torch.sigmoid(q)``, ``F.max_pool2d(q, 2)``, ``F.interpolate(q)``
and the like directly on quantized activations.  Importing this module registers QTensor
handlers for the aten ops those calls reach, with the numerics of
:mod:`torchquant.nn.quantized.functional` (same qparams, except sigmoid / hardsigmoid / tanh,
which take torch's fixed output qparams).

``F.adaptive_avg_pool2d(q, 1)`` reaches QTensor as ``aten.mean.dim`` over the spatial dims, so
``mean.dim`` is refined too: over the innermost dims of a contiguous tensor torch uses the
integer kernel of adaptive pooling, and so does the adaptive pooling of channels-last input
(where ``torch.mean`` proper would dequantize: that rare call may differ by a step); elsewhere
the existing (float) handler still applies.
For channels-last input torch then restrides that result in place (``as_strided_``).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

import torch.nn.functional as F

from .ops import pooling
from .qtensor import _OPS, QTensor, _implements, _implements_function, _refresh_metadata
from . import _qtensor_pointwise as _pointwise
from ._validation import require_per_tensor

aten = torch.ops.aten


@_implements(aten.sigmoid.default)
def _sigmoid(func, q):
    return _pointwise.sigmoid(require_per_tensor(q, "sigmoid"))


@_implements(aten.tanh.default)
def _tanh(func, q):
    return _pointwise.tanh(require_per_tensor(q, "tanh"))


@_implements(aten.hardsigmoid.default)
def _hardsigmoid(func, q):
    return _pointwise.hardsigmoid(require_per_tensor(q, "hardsigmoid"))


@_implements(aten.hardsigmoid_.default)
def _hardsigmoid_(func, q):
    return _pointwise.store_inplace(q, _hardsigmoid(func, q))


@_implements(aten.leaky_relu.default)
def _leaky_relu(func, q, negative_slope=0.01):
    return _pointwise.leaky_relu(require_per_tensor(q, "leaky_relu"), float(negative_slope))


@_implements(aten.leaky_relu_.default)
def _leaky_relu_(func, q, negative_slope=0.01):
    return _pointwise.store_inplace(q, _leaky_relu(func, q, negative_slope))


@_implements(aten.hardtanh.default)
def _hardtanh(func, q, min_val=-1.0, max_val=1.0):
    return _pointwise.clamp(require_per_tensor(q, "hardtanh"), float(min_val), float(max_val))


@_implements(aten.hardtanh_.default)
def _hardtanh_(func, q, min_val=-1.0, max_val=1.0):
    return _pointwise.store_inplace(q, _hardtanh(func, q, min_val, max_val))


@_implements(aten.clamp.default)
def _clamp(func, q, min=None, max=None):
    return _pointwise.clamp(require_per_tensor(q, "clamp"), min, max)


@_implements(aten.threshold.default)
def _threshold(func, q, threshold, value):
    return _pointwise.threshold(require_per_tensor(q, "threshold"), float(threshold),
                                float(value))


def _max_pool(q: QTensor, ndim: int, kernel_size, stride, padding, dilation, ceil_mode,
              return_indices: bool):
    if return_indices:
        values, indices = pooling.max_pool(q._values(), ndim, kernel_size, stride, padding,
                                           dilation, ceil_mode, return_indices=True)
        return q._with(values), indices
    return q._with(pooling.max_pool(q._values(), ndim, kernel_size, stride, padding, dilation,
                                    ceil_mode))


def _max_pool_with_indices(ndim: int):
    def handler(func, q, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        require_per_tensor(q, f"max_pool{ndim}d")
        return _max_pool(q, ndim, kernel_size, stride, padding, dilation, ceil_mode,
                         return_indices=True)
    return handler


_implements(aten.max_pool2d_with_indices.default)(_max_pool_with_indices(2))
_implements(aten.max_pool3d_with_indices.default)(_max_pool_with_indices(3))


def _max_pool_function(ndim: int):
    """``F.max_poolNd`` / ``torch.max_poolNd`` taken before torch turns them into the
    with-indices op: without indices the integer kernels apply (channels-last included)."""
    def handler(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
                return_indices=False):
        q = require_per_tensor(input, f"max_pool{ndim}d")
        return _max_pool(q, ndim, kernel_size, stride, padding, dilation, ceil_mode,
                         return_indices)
    return handler


_implements_function(F.max_pool2d, torch.max_pool2d)(_max_pool_function(2))
_implements_function(F.max_pool3d, torch.max_pool3d)(_max_pool_function(3))


def _adaptive_avg_pool_q(q: QTensor, ndim: int, output_size) -> QTensor:
    q = require_per_tensor(q, f"adaptive_avg_pool{ndim}d")
    return q._with(pooling.adaptive_avg_pool(q._values(), q._scale_zp()[1], q.qdtype, ndim,
                                             output_size))


def _adaptive_avg_pool_function(ndim: int):
    """``F.adaptive_avg_poolNd`` taken whole (it would reach QTensor as ``mean.dim`` plus a
    restride for channels-last input)."""
    def handler(input, output_size):
        return _adaptive_avg_pool_q(input, ndim, output_size)
    return handler


_implements_function(F.adaptive_avg_pool2d)(_adaptive_avg_pool_function(2))
_implements_function(F.adaptive_avg_pool3d)(_adaptive_avg_pool_function(3))


def _avg_pool(ndim: int):
    def handler(func, q, kernel_size, stride=(), padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
        q = require_per_tensor(q, f"avg_pool{ndim}d")
        return q._with(pooling.avg_pool(q._values(), q._scale_zp()[1], q.qdtype, ndim,
                                        kernel_size, stride, padding, ceil_mode,
                                        count_include_pad, divisor_override))
    return handler


_implements(aten.avg_pool2d.default)(_avg_pool(2))
_implements(aten.avg_pool3d.default)(_avg_pool(3))


def _adaptive_avg_pool(ndim: int):
    def handler(func, q, output_size):
        return _adaptive_avg_pool_q(q, ndim, output_size)
    return handler


_implements(aten._adaptive_avg_pool2d.default)(_adaptive_avg_pool(2))
_implements(aten._adaptive_avg_pool3d.default)(_adaptive_avg_pool(3))


@_implements(aten.upsample_nearest2d.default, aten.upsample_nearest2d.vec,
             aten.upsample_nearest3d.default, aten.upsample_nearest3d.vec,
             aten._upsample_nearest_exact2d.default, aten._upsample_nearest_exact2d.vec,
             aten._upsample_nearest_exact3d.default, aten._upsample_nearest_exact3d.vec)
def _upsample_nearest(func, q, *args, **kwargs):
    require_per_tensor(q, str(func.overloadpacket.__name__))
    names = [a.name for a in func._schema.arguments][1:]
    bound = {**dict(zip(names, args)), **kwargs}
    ndim = 3 if str(func.overloadpacket.__name__).endswith("3d") else 2
    if "scale_factors" in names:  # the .vec overloads: an output size or scale factors
        output_size, factors = bound.get("output_size"), bound.get("scale_factors")
        if output_size is None:
            if factors is None:
                raise RuntimeError(f"{func}: either output_size or scale_factors must be given")
            output_size = [int(size * factor) for size, factor in zip(q.shape[-ndim:], factors)]
            scales = tuple(factors)
        else:
            scales = None
    else:
        output_size = bound["output_size"]
        scales = tuple(bound.get(name) for name in ("scales_d", "scales_h", "scales_w")[3 - ndim:])
    exact = func.overloadpacket in (aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d)
    return q._with(pooling.upsample_nearest(q._values(), output_size, scales, exact))


@_implements(aten.upsample_bilinear2d.default)
def _upsample_bilinear(func, q, output_size: Sequence[int], align_corners: bool,
                       scales_h: Optional[float] = None, scales_w: Optional[float] = None):
    q = require_per_tensor(q, "upsample_bilinear2d")
    return q._with(pooling.upsample_bilinear(q._values(), q._scale_zp()[1], q.qdtype,
                                             output_size, align_corners, (scales_h, scales_w)))


@_implements(aten.upsample_bilinear2d.vec)
def _upsample_bilinear_vec(func, q, output_size: Optional[Sequence[int]], align_corners: bool,
                           scale_factors: Optional[Sequence[float]]):
    if output_size is None:
        output_size = [int(size * factor) for size, factor in zip(q.shape[-2:], scale_factors)]
        scales = tuple(scale_factors)
    else:
        scales = (None, None)
    return _upsample_bilinear(func, q, output_size, align_corners, *scales)


_float_mean_dim = _OPS.get(aten.mean.dim)


def _is_inner(dims, ndim: int) -> bool:
    wrapped = sorted(d % ndim for d in dims)
    return bool(wrapped) and wrapped == list(range(ndim - len(wrapped), ndim))


def _is_spatial_pool(q: QTensor, dims, keepdim: bool) -> bool:
    """Whether this is what ``F.adaptive_avg_pool2d(q, 1)`` of channels-last input becomes."""
    return (keepdim and q.dim() == 4 and sorted(d % 4 for d in dims) == [2, 3]
            and q.is_contiguous(memory_format=torch.channels_last))


@_implements(aten.mean.dim)
def _mean_dim(func, q, dim=None, keepdim=False, *, dtype=None):
    if (dtype is None and q.axis is None and not q.qdtype.is_sub_byte and q.dim() and dim
            and len(set(dim)) == len(dim) and _is_inner(dim, q.dim())
            and (q.is_contiguous() or _is_spatial_pool(q, dim, keepdim))):
        return q._with(pooling.mean_inner_dims(q._values(), q._scale_zp()[1], q.qdtype,
                                               len(dim), keepdim))
    if _float_mean_dim is None:
        raise NotImplementedError(f"torchquant.QTensor does not support {func} here")
    kwargs = {} if dtype is None else {"dtype": dtype}
    return _float_mean_dim(func, q, dim, keepdim, **kwargs)


@_implements(aten.as_strided_.default)
def _as_strided_(func, q, size, stride, storage_offset=None):
    require_per_tensor(q, "as_strided_")
    q.int_data.as_strided_(size, stride, storage_offset)
    _refresh_metadata(q)
    return q
