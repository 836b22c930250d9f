"""torch-namespace ops on QTensors that torch supports on quantized tensors.

Eager quantized models call ``torch.sigmoid(q)``, ``F.max_pool2d(q, 2)``, ``F.interpolate(q)``
and the like directly on quantized activations.  Importing this module registers QTensor
handlers for the aten ops those calls reach and for the torch-level functions themselves
(taken before dispatch, which export's and dynamo's tracers would not make for a QTensor built
in the graph), all calling the ``torchquant.ops`` functions that
:mod:`torchquant.nn.quantized.functional` calls (same qparams, except sigmoid / hardsigmoid /
tanh, which take torch's fixed output qparams).

``F.adaptive_avg_pool2d(q, 1)`` reaches QTensor as ``aten.mean.dim`` over the spatial dims, so
``mean.dim`` is refined too: over the innermost dims of a contiguous tensor torch uses the
integer kernel of adaptive pooling, and so does the adaptive pooling of channels-last input
(where ``torch.mean`` proper would dequantize: that rare call may differ by a step); elsewhere
the existing (float) handler still applies.
For channels-last input torch then restrides that result in place (``as_strided_``).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

import torch.nn.functional as F

from .. import dtypes as _dt
from ..ops import pooling
from ..ops import quantize as ops_quantize
from .qtensor import _OPS, QTensor, _implements, _implements_function, _refresh_metadata
from . import pointwise as _pointwise
from .validation import require_per_tensor

aten = torch.ops.aten


def _unless_quantized(input: Any) -> bool:
    """Whether a torch-level handler must leave the call to the default path (the first
    argument is not a QTensor: another argument made torch ask QTensor)."""
    return not isinstance(input, QTensor)


# ---- activations: aten ops (eager dispatch) and the torch-level functions that reach them ------
# Both spellings call the same QTensor wrapper of torchquant.ops.activation; the torch-level
# one is taken before dispatch, so that export's and dynamo's tracers (which do not re-dispatch
# an aten op to a QTensor built in the graph) see the torchquant op.

def _sigmoid_q(q):
    return _pointwise.sigmoid(require_per_tensor(q, "sigmoid"))


def _tanh_q(q):
    return _pointwise.tanh(require_per_tensor(q, "tanh"))


def _hardsigmoid_q(q, inplace: bool = False):
    q = require_per_tensor(q, "hardsigmoid")
    out = _pointwise.hardsigmoid(q)
    return _pointwise.store_inplace(q, out) if inplace else out


def _leaky_relu_q(q, negative_slope=0.01, inplace: bool = False):
    q = require_per_tensor(q, "leaky_relu")
    out = _pointwise.leaky_relu(q, float(negative_slope))
    return _pointwise.store_inplace(q, out) if inplace else out


def _hardtanh_q(q, min_val=-1.0, max_val=1.0, inplace: bool = False):
    q = require_per_tensor(q, "hardtanh")
    out = _pointwise.clamp(q, float(min_val), float(max_val))
    return _pointwise.store_inplace(q, out) if inplace else out


def _clamp_q(q, min=None, max=None):
    return _pointwise.clamp(require_per_tensor(q, "clamp"), min, max)


def _threshold_q(q, threshold, value):
    return _pointwise.threshold(require_per_tensor(q, "threshold"), float(threshold),
                                float(value))


_implements(aten.sigmoid.default)(lambda func, q: _sigmoid_q(q))
_implements(aten.tanh.default)(lambda func, q: _tanh_q(q))
_implements(aten.hardsigmoid.default)(lambda func, q: _hardsigmoid_q(q))
_implements(aten.hardsigmoid_.default)(lambda func, q: _hardsigmoid_q(q, inplace=True))
_implements(aten.leaky_relu.default)(
    lambda func, q, negative_slope=0.01: _leaky_relu_q(q, negative_slope))
_implements(aten.leaky_relu_.default)(
    lambda func, q, negative_slope=0.01: _leaky_relu_q(q, negative_slope, inplace=True))
_implements(aten.hardtanh.default)(
    lambda func, q, min_val=-1.0, max_val=1.0: _hardtanh_q(q, min_val, max_val))
_implements(aten.hardtanh_.default)(
    lambda func, q, min_val=-1.0, max_val=1.0: _hardtanh_q(q, min_val, max_val, inplace=True))
_implements(aten.clamp.default)(lambda func, q, min=None, max=None: _clamp_q(q, min, max))
_implements(aten.threshold.default)(
    lambda func, q, threshold, value: _threshold_q(q, threshold, value))


def _unary_function(handler):
    """``torch.f(input)`` / ``Tensor.f`` taken at the torch-function level."""
    def run(input, *, out=None):
        if _unless_quantized(input) or out is not None:
            return NotImplemented
        return handler(input)
    return run


_implements_function(torch.sigmoid, torch.Tensor.sigmoid)(_unary_function(_sigmoid_q))
_implements_function(torch.tanh, torch.Tensor.tanh)(_unary_function(_tanh_q))


@_implements_function(F.hardsigmoid)
def _hardsigmoid_function(input, inplace=False):
    if _unless_quantized(input):
        return NotImplemented
    return _hardsigmoid_q(input, inplace)


@_implements_function(F.leaky_relu)
def _leaky_relu_function(input, negative_slope=0.01, inplace=False):
    if _unless_quantized(input):
        return NotImplemented
    return _leaky_relu_q(input, negative_slope, inplace)


def _leaky_relu_builtin_function(inplace: bool):
    def run(input, negative_slope=0.01, *, out=None):
        if _unless_quantized(input) or out is not None:
            return NotImplemented
        return _leaky_relu_q(input, negative_slope, inplace)
    return run


_implements_function(torch._C._nn.leaky_relu)(_leaky_relu_builtin_function(False))
_implements_function(torch._C._nn.leaky_relu_)(_leaky_relu_builtin_function(True))


@_implements_function(F.hardtanh)
def _hardtanh_function(input, min_val=-1.0, max_val=1.0, inplace=False):
    if _unless_quantized(input):
        return NotImplemented
    return _hardtanh_q(input, min_val, max_val, inplace)


def _hardtanh_builtin_function(inplace: bool):
    def run(input, min_val=-1.0, max_val=1.0, *, out=None):
        if _unless_quantized(input) or out is not None:
            return NotImplemented
        return _hardtanh_q(input, min_val, max_val, inplace)
    return run


_implements_function(torch._C._nn.hardtanh)(_hardtanh_builtin_function(False))
_implements_function(torch._C._nn.hardtanh_)(_hardtanh_builtin_function(True))


@_implements_function(F.relu6)
def _relu6_function(input, inplace=False):
    if _unless_quantized(input):
        return NotImplemented
    return _hardtanh_q(input, 0.0, 6.0, inplace)


@_implements_function(torch.clamp, torch.Tensor.clamp, torch.clip, torch.Tensor.clip)
def _clamp_function(input, min=None, max=None, *, out=None):
    if (_unless_quantized(input) or out is not None or isinstance(min, torch.Tensor)
            or isinstance(max, torch.Tensor)):
        return NotImplemented  # tensor bounds: the default path (which torch rejects too)
    return _clamp_q(input, min, max)


@_implements_function(F.threshold, torch.threshold)
def _threshold_function(input, threshold, value, inplace=False):
    if _unless_quantized(input) or inplace:
        return NotImplemented  # torch has no quantized threshold_
    return _threshold_q(input, threshold, value)


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


def _max_pool_with_indices_function(ndim: int):
    """``F.max_poolNd(..., return_indices=True)`` (torch asks for ``F.max_poolNd_with_indices``)."""
    handler = _max_pool_function(ndim)

    def run(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
            return_indices=True):
        return handler(input, kernel_size, stride, padding, dilation, ceil_mode, True)
    return run


_implements_function(F.max_pool2d_with_indices)(_max_pool_with_indices_function(2))
_implements_function(F.max_pool3d_with_indices)(_max_pool_with_indices_function(3))


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


def _avg_pool_function(ndim: int):
    """``F.avg_poolNd`` taken at the torch-function level (same integer kernel)."""
    aten_handler = _avg_pool(ndim)

    def handler(input, kernel_size, stride=None, padding=0, ceil_mode=False,
                count_include_pad=True, divisor_override=None):
        if _unless_quantized(input):
            return NotImplemented
        return aten_handler(None, input, kernel_size, stride, padding, ceil_mode,
                            count_include_pad, divisor_override)
    return handler


_implements_function(F.avg_pool2d)(_avg_pool_function(2))
_implements_function(F.avg_pool3d)(_avg_pool_function(3))


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


@_implements_function(F.interpolate)
def _interpolate_function(input, size=None, scale_factor=None, mode="nearest",
                          align_corners=None, recompute_scale_factor=None, antialias=False):
    """``F.interpolate`` taken whole for the modes QTensor resamples ('nearest' and
    'nearest-exact' of 4-D / 5-D input, 'bilinear' of 4-D input); other calls take the
    default path (and are refused at dispatch, as torch refuses them)."""
    supported = {"nearest": (4, 5), "nearest-exact": (4, 5), "bilinear": (4,)}
    if (_unless_quantized(input) or antialias
            or input.dim() not in supported.get(mode, ())):
        return NotImplemented
    q = require_per_tensor(input, "interpolate")
    # the float function on a meta tensor validates the arguments and gives the output size
    shape = F.interpolate(torch.empty(q.shape, device="meta"), size, scale_factor, mode,
                          align_corners, recompute_scale_factor)
    spatial = q.dim() - 2
    if size is None and not recompute_scale_factor:  # torch maps indices with the factors
        factors = scale_factor if isinstance(scale_factor, (tuple, list)) \
            else (scale_factor,) * spatial
        scales = tuple(float(f) for f in factors)
    else:
        scales = (None,) * spatial
    if mode == "bilinear":
        return q._with(pooling.upsample_bilinear(q._values(), q._scale_zp()[1], q.qdtype,
                                                 shape.shape[2:], bool(align_corners), scales))
    return q._with(pooling.upsample_nearest(q._values(), shape.shape[2:], scales,
                                            mode == "nearest-exact"))


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


@_implements_function(torch.mean, torch.Tensor.mean)
def _mean_function(input, dim=None, keepdim=False, *, dtype=None, out=None):
    """``torch.mean`` / ``Tensor.mean`` taken at the torch-function level (the handlers of
    ``mean.dim`` / ``mean.default``)."""
    if _unless_quantized(input) or out is not None:
        return NotImplemented
    kwargs = {} if dtype is None else {"dtype": dtype}
    if dim is None:
        return _OPS[aten.mean.default](aten.mean.default, input, **kwargs)
    dims = [dim] if isinstance(dim, int) else list(dim)
    return _mean_dim(aten.mean.dim, input, dims, keepdim, **kwargs)


@_implements(aten.as_strided_.default)
def _as_strided_(func, q, size, stride, storage_offset=None):
    require_per_tensor(q, "as_strided_")
    q.int_data.as_strided_(size, stride, storage_offset)
    _refresh_metadata(q)
    return q


# ---- indexing, filling and layout ops torch supports on per-tensor quantized tensors ------------
# They act on the integers; a float value written into a QTensor is first quantized with its
# qparams (as torch's quantize_per_tensor rounds).  torch's quantized kernels take per-tensor
# input only (RuntimeError otherwise); so do these.

def _per_tensor_only(q: QTensor, what: str) -> QTensor:
    if q.axis is not None:
        raise RuntimeError(f"{what}: only per-tensor quantized tensors are supported (as torch); "
                           f"got a {q.qscheme()!r} tensor")
    if q.qdtype.is_sub_byte:
        raise NotImplementedError(f"{what} does not support {q.qdtype!r} tensors")
    return q


def _quantized_value(q: QTensor, value: Any, what: str) -> torch.Tensor:
    """``value`` (a number or float tensor) quantized with q's per-tensor qparams."""
    if isinstance(value, QTensor):
        raise RuntimeError(f"{what}: the value for a quantized tensor must not be quantized "
                           "(as torch); pass float values")
    if not isinstance(value, torch.Tensor):
        value = torch.full((), float(value), dtype=torch.float32, device=q.device)
    elif value.dtype != torch.float32:
        value = value.to(torch.float32)
    return ops_quantize.quantize_per_tensor(value, *q._scale_zp(), q.qdtype)


@_implements(aten.repeat.default)
def _repeat(func, q, repeats):
    _per_tensor_only(q, "repeat")
    return q._with(q._values().repeat(repeats))


@_implements(aten.index_select.default)
def _index_select(func, q, dim, index):
    _per_tensor_only(q, "index_select")
    return q._with(torch.index_select(q._values(), dim, index))


@_implements(aten.index_put_.default, aten.index_put.default)
def _index_put(func, q, indices, values, accumulate=False):
    _per_tensor_only(q, "index_put")
    if accumulate:
        raise RuntimeError("index_put for quantized tensors supports accumulate=False only "
                           "(as torch)")
    ints = _quantized_value(q, values, "index_put")
    if func is aten.index_put_.default:
        q.int_data.index_put_(indices, ints)
        return q
    return q._with(q.int_data.index_put(indices, ints))


@_implements(aten.masked_fill_.Scalar, aten.masked_fill_.Tensor, aten.masked_fill.Scalar,
             aten.masked_fill.Tensor)
def _masked_fill(func, q, mask, value):
    _per_tensor_only(q, "masked_fill")
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise RuntimeError(f"masked_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {value.dim()} dimension(s).")
    ints = _quantized_value(q, value, "masked_fill")  # 0-d: masked_fill's Tensor overload
    if func.overloadpacket is aten.masked_fill_:
        q.int_data.masked_fill_(mask, ints)
        return q
    return q._with(q.int_data.masked_fill(mask, ints))


def _masked_fill_function(input, mask, value):
    """``masked_fill`` taken at the torch-function level too (export's and dynamo's tracers
    would not dispatch it to a QTensor built in the graph)."""
    if not isinstance(input, QTensor) or isinstance(mask, QTensor):
        return NotImplemented
    return _masked_fill(aten.masked_fill.Scalar, input, mask, value)


_implements_function(torch.masked_fill, torch.Tensor.masked_fill)(_masked_fill_function)


@_implements(aten.fill_.Scalar, aten.fill_.Tensor)
def _fill_(func, q, value):
    if isinstance(value, torch.Tensor) and value.dim() != 0:
        raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor with "
                           f"{value.dim()} dimensions.")
    if isinstance(value, QTensor):
        value = value.dequantize()
    source = torch.as_tensor(value, dtype=torch.float32, device=q.device).expand(q.shape)
    return _OPS[aten.copy_.default](aten.copy_.default, q, source)


@_implements(aten._local_scalar_dense.default)
def _item(func, q):
    """``q.item()``: the real value of a one-element QTensor, as torch."""
    return q.dequantize().item()


@_implements(aten.channel_shuffle.default)
def _channel_shuffle(func, q, groups):
    _per_tensor_only(q, "channel_shuffle")
    if q.dim() != 4:
        raise RuntimeError(f"channel_shuffle expects 4D input, but got input with sizes "
                           f"{list(q.shape)}")
    if q.qdtype is not _dt.quint8:
        raise RuntimeError(f"quantized channel_shuffle works on quint8 only (as torch), got "
                           f"{q.qdtype!r}")
    return q._with(torch.native_channel_shuffle(q._values(), groups))


_GRID_MODES = {"bilinear": 0, "nearest": 1, "bicubic": 2}


def _grid_sample_q(q: QTensor, grid: torch.Tensor, mode: int, padding_mode: str,
                   align_corners: bool) -> QTensor:
    _per_tensor_only(q, "grid_sample")
    if q.qdtype is not _dt.quint8:
        raise NotImplementedError(f"grid_sample is implemented for quint8 QTensors only (as "
                                  f"torch), got {q.qdtype!r}")
    if mode != 0:
        raise RuntimeError("grid_sample of a quantized tensor: only bilinear interpolation "
                           "is supported (as torch)")
    if q.dim() != 4 or grid.dim() != 4 or grid.shape[-1] != 2 or grid.shape[0] != q.shape[0]:
        raise RuntimeError(f"grid_sample: expected 4-D input (N, C, H, W) and grid "
                           f"(N, H_out, W_out, 2) with the same N, got {tuple(q.shape)} and "
                           f"{tuple(grid.shape)}")
    if isinstance(grid, QTensor) or grid.dtype != torch.float32:
        raise RuntimeError(f"grid_sample of a quantized tensor needs a float32 grid, got "
                           f"{grid.dtype}")
    return q._with(pooling.grid_sample_bilinear(q._values(), q._scale_zp()[1], grid,
                                                padding_mode, bool(align_corners)))


@_implements(aten.grid_sampler_2d.default)
def _grid_sampler_2d(func, q, grid, interpolation_mode, padding_mode, align_corners):
    return _grid_sample_q(q, grid, interpolation_mode,
                          pooling.GRID_PADDING_MODES[padding_mode], align_corners)


@_implements_function(F.grid_sample)
def _grid_sample_function(input, grid, mode="bilinear", padding_mode="zeros",
                          align_corners=None):
    if _unless_quantized(input) or mode not in _GRID_MODES \
            or padding_mode not in pooling.GRID_PADDING_MODES:
        return NotImplemented  # the default path validates (and refuses) the arguments
    return _grid_sample_q(input, grid, _GRID_MODES[mode], padding_mode, bool(align_corners))
