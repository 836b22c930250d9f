"""The high-bit half of the saturating-CPU split, computed from its few nonzero inputs.

Where oneDNN's u8 x s8 kernels saturate int16 pairs of products (AVX2 without VNNI, see
:func:`.linear.onednn_u8_exact_max`), an input with values above 128 runs as two exact oneDNN
calls on ``lo = x & 127`` and ``hi = x >> 7`` whose float outputs are summed.  ``hi`` is a 0/1
tensor, and with calibrated activations it is almost all zero: only the values the observer
clipped exceed 127 (0.002 % - 0.02 % of each conv input of the ResNet-18-shaped benchmark).
The second oneDNN call then costs a whole conv / GEMM for a handful of products.

Here that half is computed from the ``P`` nonzero positions of ``hi`` alone: every nonzero
input ``(n, c, s)`` adds the weight taps ``w[:, c, k]`` to the output positions it reaches
(stride, padding, dilation and groups honoured), a scatter of ``P * K`` rows of ``C_out /
groups`` integers.  Exactness and bit-identity with the dense split:

* the integer sums are accumulated in float32 only where every partial sum is an integer below
  2^24 in magnitude (``128 * C_in/groups * K`` bounds it), else in int32;
* oneDNN's float output of the high half is ``float32(acc)`` times the float32 scales, in an
  order that depends on the kernel oneDNN picks for the shape: ``acc * (s_x * s_w)`` for most,
  ``(acc * s_x) * s_w`` for some grouped convs (``s_x = float32(128 * x_scale)``).  The order
  is found once per weight and input shape by one probe (:func:`matching_scale_order`: a dense
  random 0/1 input through oneDNN against exact integer sums); where neither order
  reproduces oneDNN's bits the dense second call stays;
* each touched output element receives that value in one float add, as the dense split's
  ``y_lo + y_hi`` does (untouched elements add 0).

The sparse form replaces the dense second call where both hold (measured on the AVX2 machine
of BENCHMARKS.md, "2026-12-03 (night 2)", ResNet-18 conv shapes at batch 1):

* at most :data:`SPARSE_MAX_DENSITY` (0.2 %) of the input exceeds 127.  The sparse half
  scatters ``P * K`` rows (and sorts their destinations), the dense call is a whole conv; the
  two cross between 0.15 % (64 channels at 56x56) and 0.5 % (512 channels at 7x7), and the
  calibrated ResNet-18 convs see 0.002 % - 0.02 %, 10x below the limit.  One ``max`` and a
  column-wise search decide it (:func:`high_bits`), no full ``nonzero``.
* the dense call has at least :data:`SPARSE_MIN_MACS` (2^24) multiply-adds.  The sparse half
  costs ~40 small torch ops whatever ``P``; a smaller conv (the 1x1 stride-2 downsample at
  56x56: 6.4 M) is as cheap on oneDNN.
"""
from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import torch

__all__ = ["SPARSE_MAX_DENSITY", "SPARSE_MIN_MACS", "SCALE_ORDERS", "HighBits", "memory_flat",
           "high_bits", "coordinates", "conv_tap_rows", "ConvScatter", "conv_scatter",
           "scaled_high", "HighScale", "exact_sums_dtype", "matching_scale_order",
           "conv_correction_", "linear_correction_"]

# When the sparse half replaces the dense second oneDNN call: see the module docstring.
SPARSE_MAX_DENSITY = 0.002
SPARSE_MIN_MACS = 1 << 24
_HIGH_BIT = 127
_F32_EXACT = 1 << 24


class HighBits(NamedTuple):
    """Where a uint8 tensor's values above 127 are (:func:`high_bits`)."""

    top: int  # the largest value
    # their indices in the tensor's memory order, or None: none above 127, or too many
    flat: Optional[torch.Tensor]
    channels_last: bool  # memory order [N, *spatial, C] (else the logical order)


_ROWS = 64  # high bits are searched column-wise in a [64, numel / 64] view (see below)


def _high_flat(flat: torch.Tensor, limit: int) -> Optional[torch.Tensor]:
    """Flat indices of the values above 127 in contiguous 1-d uint8 ``flat``, or None where
    there are more than ``limit``.  Viewed as ``[rows, numel / rows]`` its column maxima are
    one vectorised reduction (as fast as ``max``); only the few columns holding a high value
    are searched element-wise (a plain ``nonzero`` of the whole input costs ~100x ``max``)."""
    rows = math.gcd(flat.numel(), _ROWS)
    grid = flat.view(rows, -1)
    columns = torch.nonzero(torch.gt(grid.amax(0), _HIGH_BIT)).view(-1)
    if columns.numel() > limit:
        return None
    starts = torch.arange(0, flat.numel(), grid.size(1), device=flat.device)
    found = (starts[:, None] + columns)[torch.gt(grid[:, columns], _HIGH_BIT)]
    return None if found.numel() > limit else found


def memory_flat(x: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """``x`` as a 1-d tensor in its memory order (a view where ``x`` is contiguous or
    channels-last, else a contiguous copy), and whether that order is channels-last."""
    if x.is_contiguous():
        return x.view(-1), False
    if x.dim() > 2:
        moved = x.movedim(1, -1)
        if moved.is_contiguous():
            return moved.view(-1), True
    return x.contiguous().view(-1), False


def high_bits(x: torch.Tensor, listed: bool = True) -> HighBits:
    """The largest value of uint8 ``x`` and, where it exceeds 127 and the values above 127
    are few enough for the sparse high half (at most :data:`SPARSE_MAX_DENSITY` of ``x``),
    their flat indices in ``x``'s memory order (contiguous, or channels-last for a
    channels-last ``x``; other layouts are searched in a contiguous copy).  One ``max`` where
    no value exceeds 127 or ``listed`` is False (the caller will not use a sparse half)."""
    flat, channels_last = memory_flat(x)
    if flat.numel() == 0:
        return HighBits(0, None, channels_last)
    top = int(flat.max())
    if top <= _HIGH_BIT or not listed:
        return HighBits(top, None, channels_last)
    return HighBits(top, _high_flat(flat, int(SPARSE_MAX_DENSITY * flat.numel())),
                    channels_last)


def coordinates(shape: Sequence[int], bits: HighBits) -> torch.Tensor:
    """``[P, len(shape)]`` logical coordinates of the flat indices in ``bits`` (listed)."""
    if bits.channels_last:
        physical = [shape[0], *shape[2:], shape[1]]
        coords = torch.stack(torch.unravel_index(bits.flat, physical), 1)
        return coords[:, [0, len(shape) - 1, *range(1, len(shape) - 1)]]
    return torch.stack(torch.unravel_index(bits.flat, tuple(shape)), 1)


def _accumulator_dtype(fan_in: int) -> torch.dtype:
    """float32 where every partial sum of up to ``fan_in`` int8 weights is exact in it."""
    return torch.float32 if 128 * fan_in < _F32_EXACT else torch.int32


def conv_tap_rows(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """``[C_in * (K + 1), C_out / groups]``: row ``c * (K + 1) + k`` holds the taps
    ``w[:, c, k]`` of input channel ``c`` (global index) over its group's output channels, in
    the accumulator dtype; row ``c * (K + 1) + K`` is zero (taps that reach no output)."""
    c_out, c_in_g = weight.shape[:2]
    taps = math.prod(weight.shape[2:])
    rows = weight.reshape(groups, c_out // groups, c_in_g, taps).permute(0, 2, 3, 1)
    rows = torch.cat([rows, rows.new_zeros(groups, c_in_g, 1, c_out // groups)], 2)
    return rows.reshape(-1, c_out // groups).to(_accumulator_dtype(c_in_g * taps)).contiguous()


class ConvScatter(NamedTuple):
    """Where each input position's taps land, for one conv geometry and input size."""

    out_row: torch.Tensor  # [S_in, K]: output spatial row (row-major) of input s via tap k
    tap: torch.Tensor  # [S_in, K]: k where that tap reaches an output, else K (a zero row)
    out_size: int  # S_out


def conv_scatter(in_spatial: Sequence[int], out_spatial: Sequence[int], kernel: Sequence[int],
                 stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int]) -> ConvScatter:
    """The :class:`ConvScatter` of a conv geometry: input ``s`` meets tap ``k`` at output
    ``o`` where ``s + padding - k * dilation == o * stride``."""
    grids = torch.meshgrid(*(torch.arange(k) for k in kernel), indexing="ij")
    offsets = torch.stack([g.reshape(-1) for g in grids], 1) * torch.tensor(dilation)  # [K, D]
    grids = torch.meshgrid(*(torch.arange(n) for n in in_spatial), indexing="ij")
    positions = torch.stack([g.reshape(-1) for g in grids], 1)  # [S_in, D]
    t = positions[:, None, :] + torch.tensor(padding) - offsets  # [S_in, K, D]
    stride_t = torch.tensor(stride)
    out = torch.div(t, stride_t, rounding_mode="floor")
    reaches = ((t >= 0) & (t == out * stride_t) & (out < torch.tensor(out_spatial))).all(-1)
    row = torch.zeros(reaches.shape, dtype=torch.int64)
    for d, size in enumerate(out_spatial):
        row = row * size + out[:, :, d]
    taps = len(offsets)
    return ConvScatter(torch.where(reaches, row, 0),
                       torch.where(reaches, torch.arange(taps), taps), math.prod(out_spatial))


SCALE_ORDERS = ("joint", "sequential")


def scaled_high(acc: torch.Tensor, x_scale: float, channel_scale: torch.Tensor,
                order: str) -> torch.Tensor:
    """float32 ``acc`` (integer sums of the high half) times ``128 * x_scale`` and the
    per-output-channel weight scales (broadcast against ``acc``), rounded as oneDNN does for
    ``order`` (one of :data:`SCALE_ORDERS`)."""
    return HighScale.of(x_scale, channel_scale, order).apply(acc)


class HighScale(NamedTuple):
    """The float32 factors of :func:`scaled_high`, formed once per (scale, order)."""

    order: str
    high: torch.Tensor  # 0-d float32(128 * x_scale)
    channel: torch.Tensor  # per-output-channel weight scales, float32
    joint: torch.Tensor  # high * channel, float32

    @staticmethod
    def of(x_scale: float, channel_scale: torch.Tensor, order: str) -> "HighScale":
        high = torch.tensor(float(x_scale) * 128.0, dtype=torch.float32,
                            device=channel_scale.device)
        channel = channel_scale.float()
        return HighScale(order, high, channel, high * channel)

    def apply(self, acc: torch.Tensor, rows: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``acc`` scaled; ``rows`` picks a row of 2-d factors per row of ``acc`` (groups)."""
        if self.order == "joint":
            return acc * (self.joint if rows is None else self.joint[rows])
        return acc * self.high * (self.channel if rows is None else self.channel[rows])


def exact_sums_dtype(fan_in: int) -> torch.dtype:
    """A float dtype in which a float conv / matmul of 0/1 inputs with int8 weights of this
    fan-in gives the exact integer sums (float32 below 2^24, else float64)."""
    return torch.float32 if _accumulator_dtype(fan_in) == torch.float32 else torch.float64


def matching_scale_order(onednn_high: torch.Tensor, exact_sums: torch.Tensor, x_scale: float,
                         channel_scale: torch.Tensor) -> Optional[str]:
    """The order in which oneDNN scaled ``onednn_high`` (its float output for a 0/1 input at
    ``128 * x_scale``, zero point 0, no bias) from the exact integer ``exact_sums``, or None
    where no order of :data:`SCALE_ORDERS` gives its bits."""
    acc = exact_sums.float()
    for order in SCALE_ORDERS:
        if torch.equal(scaled_high(acc, x_scale, channel_scale, order), onednn_high):
            return order
    return None


def _scatter_rows(dest: torch.Tensor, rows: torch.Tensor, width: int,
                  dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(unique destinations, their summed rows) of ``rows[i]`` sent to ``dest[i]``."""
    unique, inverse = torch.unique(dest, return_inverse=True)
    acc = torch.zeros(unique.numel(), width, dtype=dtype, device=rows.device)
    return unique, acc.index_add_(0, inverse, rows)


def conv_correction_(y: torch.Tensor, bits: HighBits, in_channels: int,
                     tap_rows: torch.Tensor, scatter: ConvScatter, scale: HighScale,
                     groups: int) -> torch.Tensor:
    """Add to the float conv output ``y`` ``[N, C_out, *O]`` (in place) the high half
    ``conv(hi, w) * 128 * x_scale * w_scale`` of an input whose ``hi`` is 1 exactly at the
    listed ``bits``; ``tap_rows`` from :func:`conv_tap_rows`, ``scatter`` from
    :func:`conv_scatter`, ``scale`` of this call (its factors ``[groups, C_out / groups]``).
    Taps that reach no output add a zero row to some row of the same image."""
    flat = bits.flat
    if flat.numel() == 0:
        return y
    in_size, taps = scatter.out_row.shape
    if bits.channels_last:  # [N, *S, C]
        pixel = torch.div(flat, in_channels, rounding_mode="floor")
        channel = torch.remainder(flat, in_channels)
        if y.size(0) == 1:
            position, batch = pixel, None
        else:
            batch = torch.div(pixel, in_size, rounding_mode="floor")
            position = torch.remainder(pixel, in_size)
    else:  # [N, C, *S]
        plane = torch.div(flat, in_size, rounding_mode="floor")
        position = torch.remainder(flat, in_size)
        batch = torch.div(plane, in_channels, rounding_mode="floor")
        channel = torch.remainder(plane, in_channels)
    dest = scatter.out_row[position]  # [P, K]
    if batch is not None:
        dest = dest + (batch * scatter.out_size)[:, None]
    if groups > 1:
        group = torch.div(channel, in_channels // groups, rounding_mode="floor")
        dest = dest * groups + group[:, None]
    source = scatter.tap[position] + (channel * (taps + 1))[:, None]
    c_out_g = tap_rows.size(1)
    unique, acc = _scatter_rows(dest.view(-1), tap_rows[source.view(-1)], c_out_g,
                                tap_rows.dtype)
    correction = scale.apply(acc.float(), None if groups == 1 else unique % groups)
    grouped = y.movedim(1, -1)
    if grouped.is_contiguous():  # oneDNN's channels-last output: one row per (n, o, group)
        grouped.view(-1, c_out_g).index_add_(0, unique, correction)
    else:
        grouped = grouped.unflatten(-1, (groups, c_out_g))
        grouped.index_put_(torch.unravel_index(unique, grouped.shape[:-1]), correction,
                           accumulate=True)
    return y


def linear_correction_(y: torch.Tensor, bits: HighBits, x_scale: float, order: str,
                       weight: torch.Tensor, channel_scale: torch.Tensor) -> torch.Tensor:
    """Add to the float ``[M, N]`` linear output ``y`` (in place) the high half
    ``(hi @ w.T) * 128 * x_scale * w_scale`` (scaled in ``order``) of a contiguous ``[M, K]``
    input whose ``hi`` is 1 exactly at the listed ``bits``; ``weight`` is the int8 ``[N, K]``
    weight."""
    flat = bits.flat
    if flat.numel() == 0:
        return y
    k = weight.size(1)
    row = torch.div(flat, k, rounding_mode="floor")
    dtype = _accumulator_dtype(k)
    columns = weight.index_select(1, flat - row * k).t().to(dtype)  # [P, N]: w[:, k] each
    unique, acc = _scatter_rows(row, columns, weight.size(0), dtype)
    correction = scaled_high(acc.float(), x_scale, channel_scale, order)
    y.index_add_(0, unique, correction)
    return y

