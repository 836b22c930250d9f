"""Quantized pooling and resampling with torch's numerics; outputs keep the input's qparams.

* Max pooling and nearest resampling select integers, so they run torch's float kernels on the
  integer values (exact: 8-bit values in float32, 32-bit ones in float64).
* Average pooling sums the integers of each window exactly, removes the zero point once per
  valid element and requantizes with the float32 multiplier ``1 / divisor``
  (``nearbyint(acc * m + zp)``, the ``mul_add`` rounding; measured).
* Bilinear resampling interpolates the raw integers in float32 exactly as torch's kernel orders
  the operations and rounds the result (measured).
"""
from __future__ import annotations

import functools
import math
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from ... import affine
from ...qtensor import QTensor

__all__ = ["max_pool", "avg_pool", "adaptive_avg_pool", "mean_inner_dims", "upsample_nearest",
           "upsample_bilinear"]

IntOrTuple = Union[int, Sequence[int]]

_MAX_POOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_AVG_POOL = {2: F.avg_pool2d, 3: F.avg_pool3d}
_ADAPTIVE_AVG_POOL = {2: F.adaptive_avg_pool2d, 3: F.adaptive_avg_pool3d}


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
    size = x.shape[dim]
    head = (slice(None),) * dim
    taps = []  # (first output, past the last output, input slice) of each tap inside the input
    for tap in range(kernel):
        offset = tap * dilation - pad  # output j reads input j * stride + offset
        lo = max(0, -(offset // stride))
        hi = min(out_size, (size - 1 - offset) // stride + 1)
        if lo < hi:
            start = lo * stride + offset
            taps.append((lo, hi, x[head + (slice(start, start + (hi - lo - 1) * stride + 1,
                                                    stride),)]))
    # Start from the taps that cover every output (one fused op, no fill), then fold the rest
    # in place: each pass over the data costs about as much as the op itself.
    full = [src for lo, hi, src in taps if lo == 0 and hi == out_size]
    if len(full) >= 2:
        out = torch.maximum(full[0], full[1])
        full = full[2:]
    elif full:
        out = full.pop().clone()
    else:
        shape = list(x.shape)
        shape[dim] = out_size
        out = x.new_full(shape, lowest)
    rest = [(0, out_size, src) for src in full]
    rest += [(lo, hi, src) for lo, hi, src in taps if lo > 0 or hi < out_size]
    for lo, hi, src in rest:
        dst = out[head + (slice(lo, hi),)]
        torch.maximum(dst, src, out=dst)
    return out


def _max_pool_separable(q: QTensor, nhwc: torch.Tensor, ndim: int, kernel_size: IntOrTuple,
                        stride: Optional[IntOrTuple], padding: IntOrTuple,
                        dilation: IntOrTuple, ceil_mode: bool,
                        channels_last: bool = True) -> QTensor:
    """Separable max pooling on the (N, *spatial, C) memory: torch's own 8-bit channels-last
    kernel is broken and the float round trip costs ~6x; the result stays channels-last, as
    torch's quantized max pooling keeps it."""
    kernel = _tuple(kernel_size, ndim)
    # None or () means "the kernel size"; 0 is an error, as in torch
    strides = kernel if stride is None or stride == () or stride == [] else _tuple(stride, ndim)
    pads, dilations = _tuple(padding, ndim), _tuple(dilation, ndim)
    # the checks of torch's quantized kernel (its padding bound ignores dilation)
    if min(kernel) <= 0 or min(strides) <= 0 or min(dilations) <= 0:
        raise RuntimeError(f"max_pool{ndim}d: kernel_size, stride and dilation should be "
                           f"greater than zero, got {kernel}, {strides}, {dilations}")
    if any(p < 0 or p > k // 2 for p, k in zip(pads, kernel)):
        raise RuntimeError(f"max_pool{ndim}d: padding should be smaller than half of "
                           f"kernel_size, got padding={pads}, kernel_size={kernel}")
    first = 1 if channels_last else 2  # where the spatial dims start
    spatial = nhwc.shape[first:first + ndim]
    sizes = [_pool_out_size(i, k, s, p, d, ceil_mode)
             for i, k, s, p, d in zip(spatial, kernel, strides, pads, dilations)]
    if min(sizes) <= 0:
        raise RuntimeError(f"max_pool{ndim}d: given input size {tuple(spatial)}, "
                           f"calculated output size {tuple(sizes)}: output size is too small")
    lowest = torch.iinfo(nhwc.dtype).min
    out = nhwc
    for axis in reversed(range(ndim)):  # innermost spatial dim first: it shrinks the most data
        out = _max_along(out, axis + first, kernel[axis], strides[axis], pads[axis],
                         dilations[axis], sizes[axis], lowest)
    if not channels_last:
        return q._with(out)
    return q._with(out.permute(0, ndim + 1, *range(1, ndim + 1)))


def max_pool(q: QTensor, ndim: int, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
             padding: IntOrTuple = 0, dilation: IntOrTuple = 1, ceil_mode: bool = False,
             return_indices: bool = False):
    """Max over each window of the integers (padding never wins)."""
    values = q._values()
    fast = (not return_indices and values.dtype in (torch.uint8, torch.int8)
            and values.device.type == "cpu")
    if fast and ndim in (2, 3) and values.dim() == ndim + 2 and values.is_contiguous():
        # The same separable maxima on NCHW memory: ~10x torch's own 8-bit NCHW kernel and
        # ~3x torch's quantized one on (8, 64, 56, 56) (measured).
        return _max_pool_separable(q, values, ndim, kernel_size, stride, padding, dilation,
                                   ceil_mode, channels_last=False)
    nhwc = _channels_last_view(values, ndim) if fast and ndim in (2, 3) else None
    if nhwc is not None:
        return _max_pool_separable(q, nhwc, ndim, kernel_size, stride, padding, dilation,
                                   ceil_mode)
    pooled = _MAX_POOL[ndim](_exact_float(values), kernel_size, stride or None, padding,
                             dilation, ceil_mode, return_indices)
    if return_indices:
        values, indices = pooled
        return q._with(values.to(q.qdtype.storage_dtype)), indices
    return q._with(pooled.to(q.qdtype.storage_dtype))


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


def _requantize_mean(q: QTensor, sums: torch.Tensor, valid: torch.Tensor,
                     divisor: torch.Tensor) -> QTensor:
    """``zp + nearbyint((sum - valid * zp) * float32(1 / divisor))`` with mul_add rounding."""
    qd = q.qdtype
    zero_point = int(q.zero_point)
    acc = sums - valid.to(sums.device, sums.dtype) * zero_point
    multiplier = affine.inv_scale_f32(divisor.to(sums.device, torch.float32))
    out = affine.quantize_with_multiplier(acc, multiplier, zero_point, qd.qmin, qd.qmax,
                                          qd.storage_dtype, affine.MUL_ADD)
    return q._with(out)


def avg_pool(q: QTensor, ndim: int, kernel_size: IntOrTuple,
             stride: Optional[IntOrTuple] = None, padding: IntOrTuple = 0,
             ceil_mode: bool = False, count_include_pad: bool = True,
             divisor_override: Optional[int] = None) -> QTensor:
    """Average of each window (zero padding counts as the real value 0)."""
    kernel = _tuple(kernel_size, ndim)
    strides = _tuple(stride, ndim) if stride else kernel
    pads = _tuple(padding, ndim)
    values = _exact_float(q._values())
    sums = _AVG_POOL[ndim](values, kernel, strides, pads, ceil_mode, True, divisor_override=1)
    in_sizes, out_sizes = values.shape[-ndim:], sums.shape[-ndim:]
    windows = [_window_sizes(i, o, k, s, p)
               for i, o, k, s, p in zip(in_sizes, out_sizes, kernel, strides, pads)]
    padded = _outer([w[0] for w in windows])
    valid = _outer([w[1] for w in windows])
    if divisor_override:
        divisor = torch.full_like(valid, int(divisor_override))
    else:
        divisor = padded if count_include_pad else valid
    return _requantize_mean(q, sums, valid, divisor)


def _adaptive_sizes(in_size: int, out_size: int) -> torch.Tensor:
    """Window lengths of adaptive pooling: ``[floor(i*in/out), ceil((i+1)*in/out))``."""
    index = torch.arange(out_size, dtype=torch.int64)
    start = index * in_size // out_size
    end = -((-(index + 1) * in_size) // out_size)
    return end - start


@functools.lru_cache(maxsize=256)
def _inv_count(count: int) -> float:
    """torch's float32 multiplier ``1.0f / count`` as a Python float (exact in float32)."""
    return torch.reciprocal(torch.tensor(float(count), dtype=torch.float32)).item()


def _requantize_acc(acc: torch.Tensor, multiplier, zero_point: int, qd) -> torch.Tensor:
    """``nearbyint(acc * multiplier + zp)`` (MUL_ADD) for exact integer ``acc``:
    :func:`_requantize_mean` with Python-number qparams."""
    return affine.quantize_with_multiplier(acc, multiplier, zero_point, qd.qmin, qd.qmax,
                                           qd.storage_dtype, affine.MUL_ADD)


def _mean_formula(sums: torch.Tensor, count: int, zero_point: int, qd) -> torch.Tensor:
    """:func:`_requantize_mean` of integer ``sums`` over windows of ``count`` elements."""
    return _requantize_acc(sums - count * zero_point, _inv_count(count), zero_point, qd)


@functools.lru_cache(maxsize=64)
def _adaptive_counts(in_sizes: tuple, sizes: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Elements per adaptive window (float64) and torch's float32 ``1 / count``, cached: they
    depend on the shapes only and cost more to build than the pooling itself."""
    counts = _outer([_adaptive_sizes(i, o) for i, o in zip(in_sizes, sizes)]).to(torch.float64)
    return counts, affine.inv_scale_f32(counts)


_TABLE_LIMIT = 1 << 20  # entries; 8-bit sums over windows of up to ~4000 elements


@functools.lru_cache(maxsize=32)
def _mean_table(count: int, zero_point: int, qd) -> torch.Tensor:
    """The requantized mean of every possible window sum ``count * qmin ..``, for lookup:
    a global pool is a handful of elements per channel, where the ~7 eager ops of the
    formula cost more than the sum itself.  Built by the formula, so identical to it."""
    sums = torch.arange(count * qd.qmin, count * qd.qmax + 1, dtype=torch.int64)
    return _mean_formula(sums, count, zero_point, qd)


def _global_mean(q: QTensor, ndim: int, keepdim: bool = True) -> QTensor:
    """Mean over the ``ndim`` innermost dims with :func:`_requantize_mean`'s numerics, from
    exact integer sums (no float64 pass, no per-call qparam tensors)."""
    values = q._values()
    qd = q.qdtype
    count = math.prod(values.shape[values.dim() - ndim:]) if ndim else 1
    zero_point = int(q.zero_point)
    eight_bit = values.element_size() == 1
    # 8-bit sums (and the zero point removed from them) fit int32 below 2**22 elements
    acc_dtype = torch.int32 if eight_bit and count < (1 << 22) else torch.int64
    nhwc = _channels_last_view(values, ndim) if keepdim and not values.is_contiguous() else None
    if nhwc is not None:
        # reduce the (N, *spatial, C) memory; permuted back, the output has torch's
        # channels-last strides
        sums = nhwc.sum(tuple(range(1, ndim + 1)), keepdim=True, dtype=acc_dtype)
    else:
        sums = values.sum(tuple(range(values.dim() - ndim, values.dim())), keepdim=keepdim,
                          dtype=acc_dtype)
    if eight_bit and count * (qd.qmax - qd.qmin) < _TABLE_LIMIT and count > 0:
        index = sums.view(-1)
        if qd.qmin:
            index = index - count * qd.qmin
        out = _mean_table(count, zero_point, qd).index_select(0, index).view(sums.shape)
    else:
        out = _mean_formula(sums, count, zero_point, qd)
    if nhwc is not None:
        out = out.permute(0, ndim + 1, *range(1, ndim + 1))
    return q._with(out)


def adaptive_avg_pool(q: QTensor, ndim: int, output_size: IntOrTuple) -> QTensor:
    """Average over adaptive windows (``None`` in ``output_size`` keeps that input size)."""
    values = q._values()
    in_sizes = values.shape[-ndim:]
    sizes = (output_size,) * ndim if isinstance(output_size, int) or output_size is None \
        else tuple(output_size)
    sizes = tuple(i if o is None else int(o) for i, o in zip(in_sizes, sizes))
    if all(o == 1 for o in sizes):
        return _global_mean(q, ndim)
    counts, multiplier = _adaptive_counts(tuple(in_sizes), sizes)
    counts, multiplier = counts.to(values.device), multiplier.to(values.device)
    means = _ADAPTIVE_AVG_POOL[ndim](values.to(torch.float64), sizes)
    # float64 means: the sums, and the sums less count * zp, are exact integers
    zero_point = int(q.zero_point)
    acc = means.mul_(counts).round_().sub_(counts, alpha=zero_point)
    out = _requantize_acc(acc, multiplier, zero_point, q.qdtype)
    if ndim == 3 and not values.is_contiguous() and _channels_last_view(values, 3) is not None:
        # torch's float 3-D kernel returns contiguous output; its quantized one keeps the layout
        out = out.contiguous(memory_format=torch.channels_last_3d)
    return q._with(out)


def mean_inner_dims(q: QTensor, ndim: int, keepdim: bool) -> QTensor:
    """Mean over the ``ndim`` innermost dims: the integer kernel torch uses for contiguous
    input (the same numerics as adaptive average pooling to size 1)."""
    return _global_mean(q, ndim, keepdim)


def upsample_nearest(q: QTensor, func, *args) -> QTensor:
    """Nearest-neighbour resampling: ``func`` (a torch upsample op) run on the integers."""
    return q._with(func(_exact_float(q._values()), *args).to(q.qdtype.storage_dtype))


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


def upsample_bilinear(q: QTensor, output_size: Sequence[int], align_corners: bool,
                      scales: Sequence[Optional[float]] = (None, None)) -> QTensor:
    """Bilinear resampling of a 4-D (or 3-D) QTensor to ``output_size`` (height, width)."""
    values = q._values()
    device = values.device
    height, width = values.shape[-2:]
    h0, h1, wh0, wh1 = _bilinear_axis(height, int(output_size[0]), align_corners, scales[0], device)
    w0, w1, ww0, ww1 = _bilinear_axis(width, int(output_size[1]), align_corners, scales[1], device)
    rows0 = values.index_select(-2, h0).to(torch.float32)
    rows1 = values.index_select(-2, h1).to(torch.float32)
    wh0, wh1 = wh0.unsqueeze(-1), wh1.unsqueeze(-1)
    top = ww0 * rows0.index_select(-1, w0) + ww1 * rows0.index_select(-1, w1)
    bottom = ww0 * rows1.index_select(-1, w0) + ww1 * rows1.index_select(-1, w1)
    zero_point = int(q.zero_point)
    # float32 steps from the zero point; the output keeps the input's scale, so requantizing
    # is rounding these steps (in float64: the zero point is added exactly)
    steps = wh0 * top + wh1 * bottom - float(zero_point)
    qd = q.qdtype
    out = affine.quantize_float64(steps, 1.0, zero_point, qd.qmin, qd.qmax, qd.storage_dtype)
    return q._with(out)
