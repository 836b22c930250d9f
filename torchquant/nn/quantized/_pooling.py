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


def max_pool(q: QTensor, ndim: int, kernel_size: IntOrTuple, stride: Optional[IntOrTuple] = None,
             padding: IntOrTuple = 0, dilation: IntOrTuple = 1, ceil_mode: bool = False,
             return_indices: bool = False):
    """Max over each window of the integers (padding never wins)."""
    values = q._values()
    if (ndim == 2 and not return_indices and values.dim() == 4 and values.is_contiguous()
            and values.dtype in (torch.uint8, torch.int8) and values.device.type == "cpu"):
        # torch pools 8-bit NCHW integers natively (about 2x the float round trip); the max
        # of integers is exact either way.  Its channels-last 8-bit kernel is broken, so
        # other layouts keep the float path.
        return q._with(_MAX_POOL[2](values, kernel_size, stride or None, padding, dilation,
                                    ceil_mode))
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


def adaptive_avg_pool(q: QTensor, ndim: int, output_size: IntOrTuple) -> QTensor:
    """Average over adaptive windows (``None`` in ``output_size`` keeps that input size)."""
    values = q._values()
    in_sizes = values.shape[-ndim:]
    sizes = (output_size,) * ndim if isinstance(output_size, int) or output_size is None \
        else tuple(output_size)
    sizes = tuple(i if o is None else int(o) for i, o in zip(in_sizes, sizes))
    counts = _outer([_adaptive_sizes(i, o) for i, o in zip(in_sizes, sizes)]).to(torch.float64)
    means = _ADAPTIVE_AVG_POOL[ndim](values.to(torch.float64), sizes)
    sums = torch.round(means * counts.to(means.device))  # float64 means: the sums are exact
    return _requantize_mean(q, sums, counts, counts)


def mean_inner_dims(q: QTensor, ndim: int, keepdim: bool) -> QTensor:
    """Mean over the ``ndim`` innermost dims: the integer kernel torch uses for contiguous
    input (the same numerics as adaptive average pooling to size 1)."""
    dims = list(range(q.dim() - ndim, q.dim()))
    values = q._values()
    sums = values.to(torch.int64).sum(dims, keepdim=keepdim)
    count = torch.tensor(math.prod(values.shape[-ndim:]) if ndim else 1, dtype=torch.int64)
    return _requantize_mean(q, sums.to(torch.float64), count, count)


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
