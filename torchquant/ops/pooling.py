"""Quantized pooling and resampling ops on plain integer tensors, with torch's numerics.

Every function takes the integers of a per-tensor quantized tensor (8- or 32-bit storage) and
returns the integers of the result, which keeps the input's qparams: only the zero point and
the dtype's range enter the numerics.

* Max pooling and nearest resampling select integers, so they run torch's float kernels on the
  integer values (exact: 8-bit values in float32, 32-bit ones in float64); 8-bit max pooling
  on CPU takes separable integer maxima instead (NCHW or channels-last memory).
* Average pooling sums the integers of each window exactly, removes the zero point once per
  valid element and requantizes with the float32 multiplier ``1 / divisor``
  (``nearbyint(acc * m + zp)``, the ``mul_add`` rounding; measured).
* Bilinear resampling interpolates the raw integers in float32 exactly as torch's kernel orders
  the operations and rounds the result (measured).

Each computation is also a registered ``torch.ops.torchquant`` op (``max_pool{1,2,3}d``,
``max_pool{1,2,3}d_with_indices``, ``avg_pool{2,3}d``, ``adaptive_avg_pool{2,3}d``,
``mean_inner_dims``, ``upsample_nearest{2,3}d``, ``upsample_bilinear2d``); the functions here
run the implementation directly in eager mode and emit the op while traced.  The shape-keyed
tables cached here are therefore only ever built from real tensors (inside an op, tensors are
real); the caches also refuse to keep anything built from fake or functional tensors.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .. import affine, kernels
from . import quantize as ops_quantize
from .. import dtypes as _dt
from ._library import cached as _cached, traced

__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "mean_inner_dims", "upsample_nearest",
           "grid_sample_bilinear",
           "upsample_bilinear"]

IntOrTuple = Union[int, Sequence[int]]

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {2: F.avg_pool2d, 3: F.avg_pool3d}
_ADAPTIVE_AVG_POOL = {2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}
_CHANNELS_LAST = {2: torch.channels_last, 3: torch.channels_last_3d}


def _tuple(value: IntOrTuple, n: int) -> tuple[int, ...]:
    if isinstance(value, int):
        return (value,) * n
    value = tuple(int(v) for v in value)
    return value * n if len(value) == 1 else value


def _exact_float(values: torch.Tensor) -> torch.Tensor:
    """The integers as a float dtype that holds them exactly."""
    return values.to(torch.float32 if values.element_size() < 4 else torch.float64)


def _channels_last_view(values: torch.Tensor, ndim: int) -> Optional[torch.Tensor]:
    """``values`` (N, C, *spatial) as its contiguous (N, *spatial, C) memory, or None."""
    if values.dim() != ndim + 2:
        return None
    nhwc = values.permute(0, *range(2, ndim + 2), 1)
    return nhwc if nhwc.is_contiguous() else None


# ---- max pooling -----------------------------------------------------------------------------

def _pool_out_size(size: int, kernel: int, stride: int, pad: int, dilation: int,
                   ceil_mode: bool) -> int:
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (span + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window may not start in the right padding
    return out


def _max_along(x: torch.Tensor, dim: int, kernel: int, stride: int, pad: int, dilation: int,
               out_size: int, lowest: int) -> torch.Tensor:
    """1-D max pooling of ``x`` along ``dim``, one ``maximum`` per kernel tap over the output
    positions where that tap lands inside the input.  Padding never wins, so no padded copy is
    needed; a window wholly in padding keeps ``lowest`` (the quantized kernel's start value)."""
    return _run_max_along(x, _max_along_steps(tuple(x.shape), dim, kernel, stride, pad,
                                              dilation, out_size, lowest))


def _max_along_steps(shape: tuple, dim: int, kernel: int, stride: int, pad: int, dilation: int,
                     out_size: int, lowest: int) -> tuple:
    """:func:`_max_along`'s operations for an input of ``shape``, as indices: how the output
    starts (the max of two taps, a copy of one, or a fill) and the (output slice, input
    slice) pairs folded into it in place."""
    size = shape[dim]
    head = (slice(None),) * dim
    taps = []  # (first output, past the last output, input slice) of each tap inside the input
    for tap in range(kernel):
        offset = tap * dilation - pad  # output j reads input j * stride + offset
        lo = max(0, -(offset // stride))
        hi = min(out_size, (size - 1 - offset) // stride + 1)
        if lo < hi:
            start = lo * stride + offset
            taps.append((lo, hi, head + (slice(start, start + (hi - lo - 1) * stride + 1,
                                                  stride),)))
    # Start from the taps that cover every output (one fused op, no fill), then fold the rest
    # in place: each pass over the data costs about as much as the op itself.
    full = [src for lo, hi, src in taps if lo == 0 and hi == out_size]
    if len(full) >= 2:
        first: tuple = ("max", full[0], full[1])
        full = full[2:]
    elif full:
        first = ("clone", full.pop())
    else:
        out_shape = list(shape)
        out_shape[dim] = out_size
        first = ("fill", out_shape, lowest)
    rest = [(head + (slice(0, out_size),), src) for src in full]
    rest += [(head + (slice(lo, hi),), src) for lo, hi, src in taps
             if lo > 0 or hi < out_size]
    return first, tuple(rest)


def _run_max_along(x: torch.Tensor, steps: tuple) -> torch.Tensor:
    first, rest = steps
    if first[0] == "max":
        out = torch.maximum(x[first[1]], x[first[2]])
    elif first[0] == "clone":
        out = x[first[1]].clone()
    else:
        out = x.new_full(first[1], first[2])
    for dst_index, src_index in rest:
        dst = out[dst_index]
        torch.maximum(dst, x[src_index], out=dst)
    return out


def _max_pool_route(values: torch.Tensor, ndim: int, return_indices: bool) -> str:
    """Which path pools ``values``: separable integer maxima on the NCHW ("nchw") or the
    channels-last ("nhwc") memory, or torch's float kernel on the integers ("float")."""
    if (return_indices or ndim not in (2, 3) or values.dim() != ndim + 2
            or values.dtype not in (torch.uint8, torch.int8) or values.device.type != "cpu"):
        return "float"
    if values.is_contiguous():
        # ~10x torch's own 8-bit NCHW kernel and ~3x torch's quantized one on (8, 64, 56, 56)
        return "nchw"
    # torch's own 8-bit channels-last kernel is broken and the float round trip costs ~6x
    return "nhwc" if _channels_last_view(values, ndim) is not None else "float"


def _max_pool_sizes(spatial: Sequence[int], ndim: int, kernel: Sequence[int],
                    strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                    ceil_mode: bool) -> list[int]:
    """Output sizes of the separable path, with the checks of torch's quantized kernel (its
    padding bound ignores dilation)."""
    if min(kernel) <= 0 or min(strides) <= 0 or min(dilations) <= 0:
        raise RuntimeError(f"max_pool{ndim}d: kernel_size, stride and dilation should be "
                           f"greater than zero, got {tuple(kernel)}, {tuple(strides)}, "
                           f"{tuple(dilations)}")
    if any(p < 0 or p > k // 2 for p, k in zip(pads, kernel)):
        raise RuntimeError(f"max_pool{ndim}d: padding should be smaller than half of "
                           f"kernel_size, got padding={tuple(pads)}, kernel_size={tuple(kernel)}")
    sizes = [_pool_out_size(i, k, s, p, d, ceil_mode)
             for i, k, s, p, d in zip(spatial, kernel, strides, pads, dilations)]
    if min(sizes) <= 0:
        raise RuntimeError(f"max_pool{ndim}d: given input size {tuple(spatial)}, "
                           f"calculated output size {tuple(sizes)}: output size is too small")
    return sizes


def _max_pool_separable(values: torch.Tensor, ndim: int, kernel: Sequence[int],
                        strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                        ceil_mode: bool, channels_last: bool) -> torch.Tensor:
    """Separable max pooling on the NCHW memory or on the (N, *spatial, C) memory; the latter
    result stays channels-last, as torch's quantized max pooling keeps it."""
    return _separable_plan(values, ndim, kernel, strides, pads, dilations, ceil_mode,
                           channels_last)(values)


def _separable_plan(values: torch.Tensor, ndim: int, kernel: Sequence[int],
                    strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                    ceil_mode: bool, channels_last: bool) -> Callable[[torch.Tensor],
                                                                      torch.Tensor]:
    """:func:`_max_pool_separable` for inputs of ``values``' shape and strides, checked and
    its slices computed once: ``plan(values)``."""
    memory = _channels_last_view(values, ndim) if channels_last else values
    first = 1 if channels_last else 2  # where the spatial dims start
    sizes = _max_pool_sizes(memory.shape[first:first + ndim], ndim, kernel, strides, pads,
                            dilations, ceil_mode)
    lowest = torch.iinfo(memory.dtype).min
    shape = list(memory.shape)
    steps = []
    for axis in reversed(range(ndim)):  # innermost spatial dim first: it shrinks the most data
        dim = axis + first
        steps.append(_max_along_steps(tuple(shape), dim, kernel[axis], strides[axis],
                                      pads[axis], dilations[axis], sizes[axis], lowest))
        shape[dim] = sizes[axis]
    to_memory = (0, *range(2, ndim + 2), 1)
    back = (0, ndim + 1, *range(1, ndim + 1))

    def plan(values: torch.Tensor) -> torch.Tensor:
        out = values.permute(to_memory) if channels_last else values
        for step in steps:
            out = _run_max_along(out, step)
        return out.permute(back) if channels_last else out
    return plan


def _float_pool_plan(ndim: int, kernel: Sequence[int], strides: Sequence[int],
                     pads: Sequence[int], dilations: Sequence[int], ceil_mode: bool,
                     dtype: torch.dtype) -> Callable[[torch.Tensor], torch.Tensor]:
    """:func:`_max_pool_float` (no indices) with its arguments bound: the 8-bit values in
    float32 (exact), torch's max pooling, back to ``dtype``."""
    pool = getattr(torch, f"max_pool{ndim}d")  # what F.max_poolNd calls without indices
    args = (list(kernel), list(strides), list(pads), list(dilations), ceil_mode)
    return lambda values: pool(values.to(torch.float32), *args).to(dtype)


# The native 2-d max pooling where it applies (False: the torch-op paths, its references; tests)
NATIVE_MAX_POOL = True
_NATIVE_NCHW_MAX_TAPS = 1 << 16  # NCHW inputs pool natively up to this many tap reads

# eager max pooling (no indices) per call signature: (input layout, pooling arguments) -> plan
_EAGER_MAX_POOL_PLANS: dict = {}
_SMALL_NHWC_POOL = 4096  # channels-last inputs up to this many values pool in float


def _max_pool_float(values: torch.Tensor, ndim: int, kernel: Sequence[int],
                    strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                    ceil_mode: bool, return_indices: bool):
    pooled = _MAX_POOL[ndim](_exact_float(values), list(kernel), list(strides), list(pads),
                             list(dilations), ceil_mode, return_indices)
    if return_indices:
        return pooled[0].to(values.dtype), pooled[1]
    return pooled.to(values.dtype)


def _native_max_pool_plan(values: torch.Tensor, ndim: int, kernel: Sequence[int],
                          strides: Sequence[int], pads: Sequence[int],
                          dilations: Sequence[int],
                          ceil_mode: bool) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """The native 2-d max pooling (:func:`torchquant.kernels.native.max_pool2d`, one pass in
    the input's layout) bound for inputs like ``values``, checked as torch's quantized kernel
    checks; None where it does not apply (the separable torch-op path is its reference)."""
    if ndim != 2 or not kernels.native.max_pool2d_applies(values):
        return None
    sizes = _max_pool_sizes(values.shape[2:], ndim, kernel, strides, pads, dilations, ceil_mode)
    if values.is_contiguous() and math.prod(values.shape[:2]) * math.prod(sizes) * math.prod(
            kernel) > _NATIVE_NCHW_MAX_TAPS:
        return None  # the native NCHW loop is scalar: large inputs pool faster separably
    args = (list(kernel), list(strides), list(pads), list(dilations), sizes)
    return lambda v: kernels.native.max_pool2d(v, *args)


def _max_pool(values: torch.Tensor, ndim: int, kernel: Sequence[int], strides: Sequence[int],
              pads: Sequence[int], dilations: Sequence[int], ceil_mode: bool,
              return_indices: bool = False):
    route = _max_pool_route(values, ndim, return_indices)
    if route != "float" and NATIVE_MAX_POOL:
        native = _native_max_pool_plan(values, ndim, kernel, strides, pads, dilations,
                                       ceil_mode)
        if native is not None:
            return native(values)
    if route == "float":
        return _max_pool_float(values, ndim, kernel, strides, pads, dilations, ceil_mode,
                               return_indices)
    return _max_pool_separable(values, ndim, kernel, strides, pads, dilations, ceil_mode,
                               channels_last=route == "nhwc")


def _max_pool_fake(values: torch.Tensor, ndim: int, kernel: Sequence[int],
                   strides: Sequence[int], pads: Sequence[int], dilations: Sequence[int],
                   ceil_mode: bool, return_indices: bool = False):
    route = _max_pool_route(values, ndim, return_indices)
    if route == "float":  # torch's own meta kernel: shapes, checks and strides
        out = _max_pool_float(values, ndim, kernel, strides, pads, dilations, ceil_mode,
                              return_indices)
        if ndim == 1 and not return_indices and values.device.type == "cpu":
            # torch's CPU max_pool1d without indices writes a fresh contiguous tensor (traced,
            # it goes through the with-indices op, which follows the input's layout)
            out = out.new_empty(out.shape)
        return out
    first = 1 if route == "nhwc" else 2
    memory = _channels_last_view(values, ndim) if route == "nhwc" else values
    sizes = _max_pool_sizes(memory.shape[first:first + ndim], ndim, kernel, strides, pads,
                            dilations, ceil_mode)
    out = values.new_empty((*values.shape[:2], *sizes))
    return out.contiguous(memory_format=_CHANNELS_LAST[ndim]) if route == "nhwc" else out


def _register_max_pool(ndim: int) -> None:
    @torch.library.custom_op(f"torchquant::max_pool{ndim}d", mutates_args=())
    def op(values: torch.Tensor, kernel_size: list[int], stride: list[int],
           padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
        return _max_pool(values, ndim, kernel_size, stride, padding, dilation, ceil_mode)

    @op.register_fake
    def _(values, kernel_size, stride, padding, dilation, ceil_mode):
        return _max_pool_fake(values, ndim, kernel_size, stride, padding, dilation, ceil_mode)

    @torch.library.custom_op(f"torchquant::max_pool{ndim}d_with_indices", mutates_args=())
    def op_with_indices(values: torch.Tensor, kernel_size: list[int], stride: list[int],
                        padding: list[int], dilation: list[int],
                        ceil_mode: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return _max_pool(values, ndim, kernel_size, stride, padding, dilation, ceil_mode, True)

    @op_with_indices.register_fake
    def _(values, kernel_size, stride, padding, dilation, ceil_mode):
        return _max_pool_fake(values, ndim, kernel_size, stride, padding, dilation, ceil_mode,
                              True)


for _n in (1, 2, 3):
    _register_max_pool(_n)
del _n


def max_pool(values: torch.Tensor, ndim: int, kernel_size: IntOrTuple,
             stride: Optional[IntOrTuple] = None, padding: IntOrTuple = 0,
             dilation: IntOrTuple = 1, ceil_mode: bool = False, return_indices: bool = False):
    """Max over each window of the integers ``values`` (N, C, *spatial) or (C, *spatial)
    (padding never wins); with ``return_indices`` also the flat spatial index of each max.
    ``stride`` None or empty means the kernel size."""
    key = None
    if not return_indices and type(values) is torch.Tensor and not torch.compiler.is_compiling():
        # eager: a call like an earlier one reruns its plan (checks and slices done)
        key = (values.shape, values.stride(), values.dtype, values.device, ndim, kernel_size,
               stride, padding, dilation, ceil_mode)
        try:
            plan = _EAGER_MAX_POOL_PLANS.get(key)
        except TypeError:  # list arguments: not cached
            key = plan = None
        if plan is not None:
            return plan(values)
    kernel = _tuple(kernel_size, ndim)
    strides = kernel if stride is None or stride == () or stride == [] else _tuple(stride, ndim)
    pads, dilations = _tuple(padding, ndim), _tuple(dilation, ndim)
    if traced(values):
        name = f"max_pool{ndim}d_with_indices" if return_indices else f"max_pool{ndim}d"
        return getattr(torch.ops.torchquant, name)(values, list(kernel), list(strides),
                                                   list(pads), list(dilations), ceil_mode)
    if key is not None:
        route = _max_pool_route(values, ndim, False)
        native = (_native_max_pool_plan(values, ndim, kernel, strides, pads, dilations,
                                        ceil_mode)
                  if route != "float" and NATIVE_MAX_POOL else None)
        if native is not None:
            plan = native
        elif route == "nhwc" and values.numel() <= _SMALL_NHWC_POOL:
            # a few thousand values: torch's float kernel on the exact float copy is three
            # ops where the separable maxima are eight (measured ~3x faster at 32x8x8)
            _max_pool_sizes(_channels_last_view(values, ndim).shape[1:1 + ndim], ndim, kernel,
                            strides, pads, dilations, ceil_mode)  # the quantized checks
            plan = _float_pool_plan(ndim, kernel, strides, pads, dilations, ceil_mode,
                                    values.dtype)
            route = "float-small"
        elif route != "float":
            plan = _separable_plan(values, ndim, kernel, strides, pads, dilations, ceil_mode,
                                   route == "nhwc")
        if route != "float":
            if len(_EAGER_MAX_POOL_PLANS) >= 64:
                _EAGER_MAX_POOL_PLANS.clear()
            _EAGER_MAX_POOL_PLANS[key] = plan
            return plan(values)
    return _max_pool(values, ndim, kernel, strides, pads, dilations, ceil_mode, return_indices)


# ---- average pooling -------------------------------------------------------------------------

def _window_sizes(in_size: int, out_size: int, kernel: int, stride: int, pad: int
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per output position: the window length inside the padded input, and inside the input."""
    start = torch.arange(out_size, dtype=torch.int64) * stride - pad
    end = torch.clamp(start + kernel, max=in_size + pad)
    return end - start, torch.clamp(end, max=in_size) - torch.clamp(start, min=0)


def _outer(per_dim: Sequence[torch.Tensor]) -> torch.Tensor:
    """Product over dims of per-dim sizes, shaped (out_1, ..., out_n)."""
    out = per_dim[0]
    for sizes in per_dim[1:]:
        out = out.unsqueeze(-1) * sizes
    return out


def _requantize_mean(sums: torch.Tensor, valid: torch.Tensor, divisor: torch.Tensor,
                     zero_point: int, qd: _dt.QDType) -> torch.Tensor:
    """``zp + nearbyint((sum - valid * zp) * float32(1 / divisor))`` with mul_add rounding."""
    acc = sums - valid.to(sums.device, sums.dtype) * zero_point
    multiplier = affine.inv_scale_f32(divisor.to(sums.device, torch.float32))
    return ops_quantize.quantize_with_multiplier(acc, multiplier, zero_point, qd.qmin, qd.qmax,
                                                 qd.storage_dtype, affine.MUL_ADD)


def _avg_pool(values: torch.Tensor, zero_point: int, qd: _dt.QDType, ndim: int,
              kernel: Sequence[int], strides: Sequence[int], pads: Sequence[int],
              ceil_mode: bool, count_include_pad: bool,
              divisor_override: Optional[int]) -> torch.Tensor:
    values = _exact_float(values)
    sums = _AVG_POOL[ndim](values, list(kernel), list(strides), list(pads), ceil_mode, True,
                           divisor_override=1)
    valid, divisor = avg_pool_counts(values.shape[-ndim:], sums.shape[-ndim:], kernel, strides,
                                     pads, count_include_pad, divisor_override)
    return _requantize_mean(sums, valid, divisor, zero_point, qd)


def avg_pool_counts(in_sizes: Sequence[int], out_sizes: Sequence[int], kernel: Sequence[int],
                    strides: Sequence[int], pads: Sequence[int], count_include_pad: bool,
                    divisor_override: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input elements in each window, its divisor), shaped like the pooled output's spatial
    dims: what average pooling removes the zero point for and divides by."""
    windows = [_window_sizes(i, o, k, s, p)
               for i, o, k, s, p in zip(in_sizes, out_sizes, kernel, strides, pads)]
    padded = _outer([w[0] for w in windows])
    valid = _outer([w[1] for w in windows])
    if divisor_override:
        return valid, torch.full_like(valid, int(divisor_override))
    return valid, padded if count_include_pad else valid


def _avg_pool_fake(values: torch.Tensor, qd: _dt.QDType, ndim: int, kernel: Sequence[int],
                   strides: Sequence[int], pads: Sequence[int], ceil_mode: bool) -> torch.Tensor:
    sums = _AVG_POOL[ndim](_exact_float(values), list(kernel), list(strides), list(pads),
                           ceil_mode, True, divisor_override=1)
    return torch.empty_like(sums, dtype=qd.storage_dtype)


def _register_avg_pool(ndim: int) -> None:
    @torch.library.custom_op(f"torchquant::avg_pool{ndim}d", mutates_args=())
    def op(values: torch.Tensor, zero_point: int, qdtype: str, kernel_size: list[int],
           stride: list[int], padding: list[int], ceil_mode: bool, count_include_pad: bool,
           divisor_override: Optional[int]) -> torch.Tensor:
        return _avg_pool(values, zero_point, _dt.qdtype_of(qdtype), ndim, kernel_size, stride,
                         padding, ceil_mode, count_include_pad, divisor_override)

    @op.register_fake
    def _(values, zero_point, qdtype, kernel_size, stride, padding, ceil_mode,
          count_include_pad, divisor_override):
        return _avg_pool_fake(values, _dt.qdtype_of(qdtype), ndim, kernel_size, stride,
                              padding, ceil_mode)


for _n in (2, 3):
    _register_avg_pool(_n)
del _n


def avg_pool(values: torch.Tensor, zero_point: int, qdtype: _dt.QDType, ndim: int,
             kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
             padding: IntOrTuple = 0, ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: Optional[int] = None) -> torch.Tensor:
    """Average of each window (zero padding counts as the real value 0) of the integers
    ``values`` quantized with ``zero_point`` in ``qdtype``."""
    kernel = _tuple(kernel_size, ndim)
    strides = _tuple(stride, ndim) if stride else kernel
    pads = _tuple(padding, ndim)
    if traced(values):
        return getattr(torch.ops.torchquant, f"avg_pool{ndim}d")(
            values, zero_point, qdtype.name, list(kernel), list(strides), list(pads),
            ceil_mode, count_include_pad, divisor_override)
    return _avg_pool(values, zero_point, qdtype, ndim, kernel, strides, pads, ceil_mode,
                     count_include_pad, divisor_override)


# ---- adaptive average pooling and means ------------------------------------------------------

def _adaptive_sizes(in_size: int, out_size: int) -> torch.Tensor:
    """Window lengths of adaptive pooling: ``[floor(i*in/out), ceil((i+1)*in/out))``."""
    index = torch.arange(out_size, dtype=torch.int64)
    start = index * in_size // out_size
    end = -((-(index + 1) * in_size) // out_size)
    return end - start


@functools.lru_cache(maxsize=256)
def _inv_count(count: int) -> float:
    """torch's float32 multiplier ``1.0f / count`` as a Python float (exact in float32).

    Below 2**24 the float64 quotient rounded to float32 is that value (no double rounding:
    checked for every count), computed without tensors, so never from fake ones."""
    if 0 < count < (1 << 24):
        return affine.round_to_float32(1.0 / count)
    return torch.reciprocal(torch.tensor(float(count), dtype=torch.float32)).item()


def _requantize_acc(acc: torch.Tensor, multiplier, zero_point: int, qd) -> torch.Tensor:
    """``nearbyint(acc * multiplier + zp)`` (MUL_ADD) for exact integer ``acc``:
    :func:`_requantize_mean` with Python-number qparams."""
    return ops_quantize.quantize_with_multiplier(acc, multiplier, zero_point, qd.qmin, qd.qmax,
                                                 qd.storage_dtype, affine.MUL_ADD)


def _mean_formula(sums: torch.Tensor, count: int, zero_point: int, qd) -> torch.Tensor:
    """:func:`_requantize_mean` of integer ``sums`` over windows of ``count`` elements."""
    return _requantize_acc(sums - count * zero_point, _inv_count(count), zero_point, qd)


_ADAPTIVE_COUNTS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


def _adaptive_counts(in_sizes: tuple, sizes: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Elements per adaptive window (float64) and torch's float32 ``1 / count``, cached: they
    depend on the shapes only and cost more to build than the pooling itself."""
    def build():
        counts = _outer([_adaptive_sizes(i, o) for i, o in zip(in_sizes, sizes)])
        counts = counts.to(torch.float64)
        return counts, affine.inv_scale_f32(counts)
    return _cached(_ADAPTIVE_COUNTS, 64, (in_sizes, sizes), build)


# The native global mean where it applies (False: the torch-op path below, its reference; tests)
NATIVE_GLOBAL_MEAN = True
_TABLE_LIMIT = 1 << 20  # entries; 8-bit sums over windows of up to ~4000 elements
_MEAN_TABLES: dict[tuple, torch.Tensor] = {}


def _mean_table(count: int, zero_point: int, qd) -> torch.Tensor:
    """The requantized mean of every possible window sum ``count * qmin ..``, for lookup:
    a global pool is a handful of elements per channel, where the ~7 eager ops of the
    formula cost more than the sum itself.  Built by the formula, so identical to it."""
    def build():
        sums = torch.arange(count * qd.qmin, count * qd.qmax + 1, dtype=torch.int64)
        return _mean_formula(sums, count, zero_point, qd)
    return _cached(_MEAN_TABLES, 32, (count, zero_point, qd), build)


def _global_mean_layout(values: torch.Tensor, ndim: int, keepdim: bool) -> bool:
    """Whether the global mean reduces the channels-last memory (and returns channels-last)."""
    return keepdim and not values.is_contiguous() and _channels_last_view(values, ndim) is not None


def _global_mean(values: torch.Tensor, zero_point: int, qd: _dt.QDType, ndim: int,
                 keepdim: bool = True) -> torch.Tensor:
    """Mean over the ``ndim`` innermost dims with :func:`_requantize_mean`'s numerics, from
    exact integer sums (no float64 pass, no per-call qparam tensors)."""
    count = math.prod(values.shape[values.dim() - ndim:]) if ndim else 1
    if count == 1 and keepdim and values.element_size() == 1:
        # the mean of one 8-bit element requantized to its own qparams is that element (its
        # code less the zero point is exact in float32): the codes, in the layout the sums
        # would have had
        return values.clone(memory_format=_CHANNELS_LAST[ndim]
                            if _global_mean_layout(values, ndim, keepdim)
                            else torch.contiguous_format)
    if (keepdim and NATIVE_GLOBAL_MEAN and count > 1
            and kernels.native.global_mean_applies(values, ndim)):
        return kernels.native.global_mean(values, ndim, zero_point, qd.qmin, qd.qmax)
    eight_bit = values.element_size() == 1
    # 8-bit sums (and the zero point removed from them) fit int32 below 2**22 elements
    acc_dtype = torch.int32 if eight_bit and count < (1 << 22) else torch.int64
    channels_last = _global_mean_layout(values, ndim, keepdim)
    if channels_last:
        # reduce the (N, *spatial, C) memory; permuted back, the output has torch's
        # channels-last strides
        nhwc = _channels_last_view(values, ndim)
        sums = nhwc.sum(tuple(range(1, ndim + 1)), keepdim=True, dtype=acc_dtype)
    else:
        sums = values.sum(tuple(range(values.dim() - ndim, values.dim())), keepdim=keepdim,
                          dtype=acc_dtype).contiguous()
    if eight_bit and count * (qd.qmax - qd.qmin) < _TABLE_LIMIT and count > 0:
        index = sums.view(-1)
        if qd.qmin:
            index = index - count * qd.qmin
        out = _mean_table(count, zero_point, qd).index_select(0, index).view(sums.shape)
    else:
        out = _mean_formula(sums, count, zero_point, qd)
    if channels_last:
        out = out.permute(0, ndim + 1, *range(1, ndim + 1))
    return out


def _global_mean_fake(values: torch.Tensor, qd: _dt.QDType, ndim: int,
                      keepdim: bool = True) -> torch.Tensor:
    inner = (1,) * ndim if keepdim else ()
    out = values.new_empty((*values.shape[:values.dim() - ndim], *inner), dtype=qd.storage_dtype)
    if _global_mean_layout(values, ndim, keepdim):
        return out.contiguous(memory_format=_CHANNELS_LAST[ndim])
    return out


def _adaptive_output_size(in_sizes: Sequence[int], ndim: int,
                          output_size: Any) -> tuple[int, ...]:
    sizes = (output_size,) * ndim if isinstance(output_size, int) or output_size is None \
        else tuple(output_size)
    return tuple(i if o is None else int(o) for i, o in zip(in_sizes, sizes))


def _adaptive_avg_pool(values: torch.Tensor, zero_point: int, qd: _dt.QDType, ndim: int,
                       sizes: Sequence[int]) -> torch.Tensor:
    sizes = tuple(sizes)
    if all(o == 1 for o in sizes):
        return _global_mean(values, zero_point, qd, ndim)
    counts, multiplier = _adaptive_counts(tuple(values.shape[-ndim:]), sizes)
    counts, multiplier = counts.to(values.device), multiplier.to(values.device)
    means = _ADAPTIVE_AVG_POOL[ndim](values.to(torch.float64), sizes)
    # float64 means: the sums, and the sums less count * zp, are exact integers
    acc = means.mul_(counts).round_().sub_(counts, alpha=zero_point)
    out = _requantize_acc(acc, multiplier, zero_point, qd)
    if _adaptive_3d_channels_last(values, ndim):
        # torch's float 3-D kernel returns contiguous output; its quantized one keeps the layout
        out = out.contiguous(memory_format=torch.channels_last_3d)
    return out


def _adaptive_3d_channels_last(values: torch.Tensor, ndim: int) -> bool:
    return ndim == 3 and not values.is_contiguous() and _channels_last_view(values, 3) is not None


def _adaptive_avg_pool_fake(values: torch.Tensor, qd: _dt.QDType, ndim: int,
                            sizes: Sequence[int]) -> torch.Tensor:
    if all(o == 1 for o in sizes):
        return _global_mean_fake(values, qd, ndim)
    means = _ADAPTIVE_AVG_POOL[ndim](values.to(torch.float64), list(sizes))
    out = torch.empty_like(means, dtype=qd.storage_dtype)
    if _adaptive_3d_channels_last(values, ndim):
        out = out.contiguous(memory_format=torch.channels_last_3d)
    return out


def _register_adaptive_avg_pool(ndim: int) -> None:
    @torch.library.custom_op(f"torchquant::adaptive_avg_pool{ndim}d", mutates_args=())
    def op(values: torch.Tensor, zero_point: int, qdtype: str,
           output_size: list[int]) -> torch.Tensor:
        return _adaptive_avg_pool(values, zero_point, _dt.qdtype_of(qdtype), ndim, output_size)

    @op.register_fake
    def _(values, zero_point, qdtype, output_size):
        return _adaptive_avg_pool_fake(values, _dt.qdtype_of(qdtype), ndim, output_size)


for _n in (2, 3):
    _register_adaptive_avg_pool(_n)
del _n


def adaptive_avg_pool(values: torch.Tensor, zero_point: int, qdtype: _dt.QDType, ndim: int,
                      output_size: Any) -> torch.Tensor:
    """Average over adaptive windows (``None`` in ``output_size`` keeps that input size)."""
    sizes = _adaptive_output_size(values.shape[-ndim:], ndim, output_size)
    if traced(values):
        return getattr(torch.ops.torchquant, f"adaptive_avg_pool{ndim}d")(
            values, zero_point, qdtype.name, list(sizes))
    return _adaptive_avg_pool(values, zero_point, qdtype, ndim, sizes)


@torch.library.custom_op("torchquant::mean_inner_dims", mutates_args=())
def _mean_inner_dims_op(values: torch.Tensor, zero_point: int, qdtype: str, ndim: int,
                        keepdim: bool) -> torch.Tensor:
    return _global_mean(values, zero_point, _dt.qdtype_of(qdtype), ndim, keepdim)


@_mean_inner_dims_op.register_fake
def _(values, zero_point, qdtype, ndim, keepdim):
    return _global_mean_fake(values, _dt.qdtype_of(qdtype), ndim, keepdim)


def mean_inner_dims(values: torch.Tensor, zero_point: int, qdtype: _dt.QDType, ndim: int,
                    keepdim: bool) -> torch.Tensor:
    """Mean over the ``ndim`` innermost dims: the integer kernel torch uses for contiguous
    input (the same numerics as adaptive average pooling to size 1)."""
    if traced(values):
        return torch.ops.torchquant.mean_inner_dims(values, zero_point, qdtype.name, ndim,
                                                    keepdim)
    return _global_mean(values, zero_point, qdtype, ndim, keepdim)


# ---- resampling ------------------------------------------------------------------------------

_aten = torch.ops.aten
_NEAREST = {(1, False): _aten.upsample_nearest1d.default,
            (2, False): _aten.upsample_nearest2d.default,
            (3, False): _aten.upsample_nearest3d.default,
            (1, True): _aten._upsample_nearest_exact1d.default,
            (2, True): _aten._upsample_nearest_exact2d.default,
            (3, True): _aten._upsample_nearest_exact3d.default}


def _upsample_nearest(values: torch.Tensor, output_size: Sequence[int],
                      scales: Sequence[Optional[float]], exact: bool) -> torch.Tensor:
    """torch's nearest (or nearest-exact) kernel on the exact float form of the integers."""
    func = _NEAREST[(len(output_size), exact)]
    return func(_exact_float(values), list(output_size), *scales).to(values.dtype)


@torch.library.custom_op("torchquant::upsample_nearest2d", mutates_args=())
def _upsample_nearest2d_op(values: torch.Tensor, output_size: list[int],
                           scales_h: Optional[float], scales_w: Optional[float],
                           exact: bool) -> torch.Tensor:
    return _upsample_nearest(values, output_size, (scales_h, scales_w), exact)


@_upsample_nearest2d_op.register_fake
def _(values, output_size, scales_h, scales_w, exact):
    return _upsample_nearest(values, output_size, (scales_h, scales_w), exact)


@torch.library.custom_op("torchquant::upsample_nearest3d", mutates_args=())
def _upsample_nearest3d_op(values: torch.Tensor, output_size: list[int],
                           scales_d: Optional[float], scales_h: Optional[float],
                           scales_w: Optional[float], exact: bool) -> torch.Tensor:
    return _upsample_nearest(values, output_size, (scales_d, scales_h, scales_w), exact)


@_upsample_nearest3d_op.register_fake
def _(values, output_size, scales_d, scales_h, scales_w, exact):
    return _upsample_nearest(values, output_size, (scales_d, scales_h, scales_w), exact)


def upsample_nearest(values: torch.Tensor, output_size: Sequence[int],
                     scales: Optional[Sequence[Optional[float]]] = None,
                     exact: bool = False) -> torch.Tensor:
    """Nearest-neighbour resampling of the integers (N, C, *spatial) to ``output_size`` (one
    size per spatial dim); ``scales`` are the optional per-dim scale factors torch's kernel
    maps indices with, ``exact`` selects torch's 'nearest-exact' mode."""
    output_size = [int(s) if not isinstance(s, torch.SymInt) else s for s in output_size]
    scales = (None,) * len(output_size) if scales is None else tuple(
        None if s is None else float(s) for s in scales)
    if traced(values) and len(output_size) in (2, 3):
        name = f"upsample_nearest{len(output_size)}d"
        return getattr(torch.ops.torchquant, name)(values, output_size, *scales, exact)
    return _upsample_nearest(values, output_size, scales, exact)


def _bilinear_axis(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
                   device: torch.device):
    """Source indices and weights along one axis, in float32 as ATen computes them."""
    f32 = torch.float32
    if align_corners:
        ratio = (torch.tensor(in_size - 1, dtype=f32) / (out_size - 1)) if out_size > 1 \
            else torch.tensor(0.0, dtype=f32)
    elif scale is not None and scale > 0:
        ratio = torch.tensor(1.0 / scale, dtype=f32)
    else:
        ratio = torch.tensor(in_size, dtype=f32) / out_size
    dst = torch.arange(out_size, dtype=f32, device=device)
    ratio = ratio.to(device)
    src = ratio * dst if align_corners else torch.clamp(ratio * (dst + 0.5) - 0.5, min=0.0)
    first = src.to(torch.int64)
    second = first + (first < in_size - 1).to(torch.int64)
    weight_second = src - first.to(f32)
    return first, second, 1.0 - weight_second, weight_second


def _upsample_bilinear(values: torch.Tensor, zero_point: int, qd: _dt.QDType,
                       output_size: Sequence[int], align_corners: bool,
                       scales: Sequence[Optional[float]]) -> torch.Tensor:
    device = values.device
    height, width = values.shape[-2:]
    h0, h1, wh0, wh1 = _bilinear_axis(height, int(output_size[0]), align_corners, scales[0], device)
    w0, w1, ww0, ww1 = _bilinear_axis(width, int(output_size[1]), align_corners, scales[1], device)
    rows0 = values.index_select(-2, h0).to(torch.float32)
    rows1 = values.index_select(-2, h1).to(torch.float32)
    wh0, wh1 = wh0.unsqueeze(-1), wh1.unsqueeze(-1)
    top = ww0 * rows0.index_select(-1, w0) + ww1 * rows0.index_select(-1, w1)
    bottom = ww0 * rows1.index_select(-1, w0) + ww1 * rows1.index_select(-1, w1)
    # float32 steps from the zero point; the output keeps the input's scale, so requantizing
    # is rounding these steps (in float64: the zero point is added exactly)
    steps = wh0 * top + wh1 * bottom - float(zero_point)
    return affine.quantize_float64(steps, 1.0, zero_point, qd.qmin, qd.qmax, qd.storage_dtype)


@torch.library.custom_op("torchquant::upsample_bilinear2d", mutates_args=())
def _upsample_bilinear2d_op(values: torch.Tensor, zero_point: int, qdtype: str,
                            output_size: list[int], align_corners: bool,
                            scales_h: Optional[float],
                            scales_w: Optional[float]) -> torch.Tensor:
    return _upsample_bilinear(values, zero_point, _dt.qdtype_of(qdtype), output_size,
                              align_corners, (scales_h, scales_w))


@_upsample_bilinear2d_op.register_fake
def _(values, zero_point, qdtype, output_size, align_corners, scales_h, scales_w):
    # every step is a fresh contiguous tensor (index_select, then elementwise)
    return values.new_empty((*values.shape[:-2], *output_size),
                            dtype=_dt.qdtype_of(qdtype).storage_dtype)


def upsample_bilinear(values: torch.Tensor, zero_point: int, qdtype: _dt.QDType,
                      output_size: Sequence[int], align_corners: bool,
                      scales: Sequence[Optional[float]] = (None, None)) -> torch.Tensor:
    """Bilinear resampling of 4-D (or 3-D) integers to ``output_size`` (height, width)."""
    if traced(values):
        return torch.ops.torchquant.upsample_bilinear2d(
            values, zero_point, qdtype.name, list(output_size), align_corners,
            *(None if s is None else float(s) for s in scales))
    return _upsample_bilinear(values, zero_point, qdtype, output_size, align_corners, scales)


# ---- grid sampling ------------------------------------------------------------------------------
# torch's quantized grid sampler (quint8, bilinear only) interpolates the raw integers: the four
# corner weights in float32, out-of-bounds corners read as the zero point, the four products
# summed in float32 in the order nw, ne, sw, se and rounded half to even (measured).

GRID_PADDING_MODES = ("zeros", "border", "reflection")


def _clip_coordinates(coord: torch.Tensor, size: int) -> torch.Tensor:
    """``min(size - 1, max(coord, 0))`` with C++'s std::min / std::max: NaN becomes size - 1."""
    coord = torch.where(coord < 0, torch.zeros_like(coord), coord)
    return torch.where(coord < size - 1, coord, torch.full_like(coord, float(size - 1)))


def _reflect_coordinates(coord: torch.Tensor, twice_low: int, twice_high: int) -> torch.Tensor:
    """Reflect into [twice_low / 2, twice_high / 2] (float32, as torch's helper)."""
    if twice_low == twice_high:
        return torch.zeros_like(coord)
    low, span = twice_low / 2, (twice_high - twice_low) / 2
    coord = (coord - low).abs()
    extra = torch.fmod(coord, span)
    flips = torch.floor(coord / span)
    return torch.where(torch.remainder(flips, 2) == 0, extra + low, span - extra + low)


def _grid_source_index(coord: torch.Tensor, size: int, padding_mode: str,
                       align_corners: bool) -> torch.Tensor:
    """Pixel coordinate of a normalized grid coordinate, in float32, padding applied."""
    if align_corners:
        coord = ((coord + 1) / 2) * (size - 1)
    else:
        coord = ((coord + 1) * size - 1) / 2
    if padding_mode == "border":
        coord = _clip_coordinates(coord, size)
    elif padding_mode == "reflection":
        if align_corners:
            coord = _reflect_coordinates(coord, 0, 2 * (size - 1))
        else:
            coord = _reflect_coordinates(coord, -1, 2 * size - 1)
        coord = _clip_coordinates(coord, size)
    return coord


def _grid_sample_bilinear(values: torch.Tensor, zero_point: int, grid: torch.Tensor,
                          padding_mode: str, align_corners: bool) -> torch.Tensor:
    n, c, height, width = values.shape
    out_h, out_w = grid.shape[1], grid.shape[2]
    grid = grid.to(torch.float32)
    ix = _grid_source_index(grid[..., 0], width, padding_mode, align_corners)
    iy = _grid_source_index(grid[..., 1], height, padding_mode, align_corners)
    ix_w, iy_n = torch.floor(ix), torch.floor(iy)  # the north-west corner
    ix_e, iy_s = ix_w + 1, iy_n + 1
    weights = ((ix_e - ix) * (iy_s - iy), (ix - ix_w) * (iy_s - iy),  # nw, ne
               (ix_e - ix) * (iy - iy_n), (ix - ix_w) * (iy - iy_n))  # sw, se
    flat = values.reshape(n, c, height * width)
    res = torch.zeros((n, c, out_h * out_w), dtype=torch.float32, device=values.device)
    for (cx, cy), weight in zip(((ix_w, iy_n), (ix_e, iy_n), (ix_w, iy_s), (ix_e, iy_s)), weights):
        inside = (cx >= 0) & (cx < width) & (cy >= 0) & (cy < height)
        index = torch.where(inside, cy * width + cx, torch.zeros_like(cx)).to(torch.int64)
        corner = torch.gather(flat, 2, index.reshape(n, 1, -1).expand(n, c, -1))
        corner = torch.where(inside.reshape(n, 1, -1), corner.to(torch.float32),
                             torch.tensor(float(zero_point), device=values.device))
        res = res + corner * weight.reshape(n, 1, -1)
    return torch.round(res).to(values.dtype).reshape(n, c, out_h, out_w)


@torch.library.custom_op("torchquant::grid_sample_bilinear2d", mutates_args=())
def _grid_sample_bilinear2d_op(values: torch.Tensor, zero_point: int, grid: torch.Tensor,
                               padding_mode: str, align_corners: bool) -> torch.Tensor:
    return _grid_sample_bilinear(values, zero_point, grid, padding_mode, align_corners)


@_grid_sample_bilinear2d_op.register_fake
def _(values, zero_point, grid, padding_mode, align_corners):
    return values.new_empty((values.shape[0], values.shape[1], grid.shape[1], grid.shape[2]))


def grid_sample_bilinear(values: torch.Tensor, zero_point: int, grid: torch.Tensor,
                         padding_mode: str = "zeros", align_corners: bool = False
                         ) -> torch.Tensor:
    """Bilinear grid sampling of 4-D uint8 integers (N, C, H, W) at ``grid`` (N, Ho, Wo, 2),
    normalized x, y in [-1, 1]; ``padding_mode`` one of :data:`GRID_PADDING_MODES`."""
    if padding_mode not in GRID_PADDING_MODES:
        raise ValueError(f"grid_sample: padding_mode must be one of {GRID_PADDING_MODES}, "
                         f"got {padding_mode!r}")
    if traced(values, grid):
        return torch.ops.torchquant.grid_sample_bilinear2d(values, zero_point, grid,
                                                          padding_mode, align_corners)
    return _grid_sample_bilinear(values, zero_point, grid, padding_mode, align_corners)
