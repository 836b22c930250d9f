"""Which elements torch's quantized CPU kernels compute in SIMD lanes and which in the tail.

torch's elementwise quantized kernels (add, leaky_relu, sigmoid, ...) have two code paths that
round differently: full SIMD vectors dequantize with ``fma(scale, q, -zp*scale)`` and requantize
as ``nearbyint(y * inv) + zp``; the other elements run a scalar lambda that dequantizes as
``(q - zp) * scale`` and requantizes as ``nearbyint(y * inv + zp)``.  Values on a rounding tie
come out one step apart, so which path an element takes is part of the result.

Measured on torch 2.13 (x86), this is ATen's TensorIterator loop: it walks the output in memory
order; where every operand is laid out like the output along the innermost dimensions, each
row of those dimensions runs in steps of two vectors (``cpu_kernel_vec``'s
``vectorized_loop``: 2 x 32 bytes, 64 quint8 values) and its remainder in the scalar lambda;
operands laid out differently take the scalar lambda everywhere.  The step is the same on
AVX2 and AVX-512 CPUs: these kernels are registered with ``REGISTER_DISPATCH``, which gives
AVX-512 CPUs their AVX2 build (measured on both: an AMD EPYC with AVX2 only and an AVX-512
Xeon).  Loops of at least 32768 elements are first split into
equal chunks across ``torch.get_num_threads()`` threads, each chunk with its own remainder.
"""
from __future__ import annotations

import functools
import math
import platform
from typing import Callable, Optional, Sequence

import torch

__all__ = ["lane_count", "tail_ranges", "tail_free", "suggested_format",
           "dense_views", "dense_layout", "apply"]

_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_GRAIN_SIZE = 32768  # ATen's grain size for splitting a TensorIterator loop across threads


@functools.lru_cache(maxsize=None)
def lane_count(storage_dtype: torch.dtype) -> int:
    """Values of ``storage_dtype`` in one step of the vectorised loop of torch's quantized
    elementwise kernels: two 32-byte vectors on x86, whatever the CPU capability (the AVX2
    kernel also serves AVX-512 CPUs; the non-AVX2 build emulates 32-byte vectors too), two
    16-byte vectors elsewhere (ARM)."""
    vector_bytes = 32 if platform.machine().lower() in _X86 else 16
    return 2 * vector_bytes // torch.empty((), dtype=storage_dtype).element_size()


def _chunks(numel: int, threads: Optional[int] = None) -> list[tuple[int, int]]:
    """How ATen's parallel_for splits a flat loop of ``numel`` elements across ``threads``
    (default: torch's current number of threads)."""
    threads = torch.get_num_threads() if threads is None else threads
    if numel < _GRAIN_SIZE or threads == 1:
        return [(0, numel)]
    chunk = math.ceil(numel / min(threads, math.ceil(numel / _GRAIN_SIZE)))
    return [(begin, min(begin + chunk, numel)) for begin in range(0, numel, chunk)]


def tail_ranges(numel: int, lanes: int,
                threads: Optional[int] = None) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of one flat loop of ``numel`` elements run by the scalar lambda
    (with ``threads`` threads; default: torch's current number)."""
    ranges = []
    for begin, end in _chunks(numel, threads):
        tail = begin + (end - begin) // lanes * lanes
        if tail < end:
            ranges.append((tail, end))
    return ranges


def tail_free(numel: int, lanes: int, max_threads: int) -> bool:
    """Whether a flat loop of ``numel`` elements has no scalar tail with any of 1..``max_threads``
    threads (its result then does not depend on the thread count).  Integer arithmetic only, so
    dynamo evaluates it on symbolic sizes too (as guards)."""
    if numel % lanes:
        return False
    for threads in range(2, max_threads + 1):
        if numel < _GRAIN_SIZE:
            break
        parts = min(threads, -(-numel // _GRAIN_SIZE))
        chunk = -(-numel // parts)
        if chunk % lanes:  # (then the last chunk, numel minus whole chunks, is whole too)
            return False
    return True


def _tail_mask(numel: int, row: int, lanes: int, device: torch.device) -> torch.Tensor:
    """Scalar-lambda elements of a loop over rows of ``row`` elements each."""
    index = torch.arange(numel, device=device)
    mask = torch.zeros(numel, dtype=torch.bool, device=device)
    for begin, end in _chunks(numel):
        i = index[begin:end]
        seg_begin = torch.clamp(i // row * row, min=begin)
        seg_end = torch.clamp(seg_begin // row * row + row, max=end)
        mask[begin:end] = (i - seg_begin) >= (seg_end - seg_begin) // lanes * lanes
    return mask


def suggested_format(t: torch.Tensor) -> torch.memory_format:
    """ATen's ``suggest_memory_format``: channels-last when the strides order like it."""
    if t.dim() not in (4, 5):
        return torch.contiguous_format
    dims = (1, 3, 2, 0) if t.dim() == 4 else (1, 4, 3, 2, 0)
    if t.stride(1) == 0:
        return torch.contiguous_format
    running = 0
    for d in dims:
        if t.size(d) == 0 or t.stride(d) < running or (d == 0 and running == t.stride(1)):
            return torch.contiguous_format
        running = t.stride(d) * t.size(d) if t.size(d) > 1 else t.stride(d)
    return torch.channels_last if t.dim() == 4 else torch.channels_last_3d


def _order(strides: Sequence[int], sizes: Sequence[int]) -> list[int]:
    return sorted(range(len(sizes)), key=lambda d: (-strides[d], -sizes[d]))


def dense_views(inputs: Sequence[torch.Tensor],
                output_format: torch.memory_format) -> Optional[tuple[Callable, Callable]]:
    """``(to_flat, from_flat)`` views where every operand is dense in ``output_format``
    (contiguous or 4-d channels-last), so one flat loop walks them all in memory order; else
    None."""
    first = inputs[0]
    if output_format == torch.contiguous_format:
        if not all(t.is_contiguous() for t in inputs):
            return None
        shape = first.shape
        to_flat = lambda t: t.view(-1)  # noqa: E731
        from_flat = lambda flat: flat.view(shape)  # noqa: E731
    elif output_format == torch.channels_last and first.dim() == 4:
        if not all(t.is_contiguous(memory_format=torch.channels_last) for t in inputs):
            return None
        n, c, h, w = first.shape
        to_flat = lambda t: t.permute(0, 2, 3, 1).reshape(-1)  # noqa: E731  (a view)
        from_flat = lambda flat: flat.view(n, h, w, c).permute(0, 3, 1, 2)  # noqa: E731
    else:
        return None
    return to_flat, from_flat


def dense_layout(inputs: Sequence[torch.Tensor], lanes: int,
                 output_format: torch.memory_format) -> Optional[tuple[Callable, Callable]]:
    """:func:`dense_views` for the common case -- every operand dense in ``output_format`` and
    no thread chunk with a remainder, so every element takes the vector path -- or None where
    the general walk is needed."""
    views = dense_views(inputs, output_format)
    if views is None or tail_ranges(inputs[0].numel(), lanes):
        return None
    return views


def apply(inputs: Sequence[torch.Tensor], vector_fn: Callable[..., torch.Tensor],
          tail_fn: Callable[..., torch.Tensor], lanes: int,
          output_format: Optional[torch.memory_format] = None) -> torch.Tensor:
    """Evaluate an elementwise op the way torch's kernel splits it between its two paths.

    ``vector_fn`` / ``tail_fn`` map flat integer tensors (one per input, all the same length)
    to the flat output.  The result is laid out in ``output_format`` (default: the format
    suggested by the first input), as torch allocates it."""
    if len(inputs) > 1 and any(t.shape != inputs[0].shape for t in inputs):
        inputs = torch.broadcast_tensors(*inputs)
    first = inputs[0]
    if first.device.type != "cpu":  # no quantized kernels to mimic there: one path
        return vector_fn(*(t.reshape(-1) for t in inputs)).reshape(first.shape)
    if output_format is None:
        output_format = suggested_format(first)
    dense = dense_layout(inputs, lanes, output_format)
    if dense is not None:
        to_flat, from_flat = dense
        return from_flat(vector_fn(*(to_flat(t) for t in inputs)))
    out_strides = torch.empty(first.shape, device="meta", memory_format=output_format).stride()
    order = _order(out_strides, first.shape)
    permuted = [t.permute(order) for t in inputs]
    row = 1  # innermost elements where every operand is laid out like the output
    for d in reversed(range(first.dim())):
        size = permuted[0].size(d)
        if size != 1 and any(p.stride(d) != row for p in permuted):
            break
        row *= size
    flats = [p.reshape(-1) for p in permuted]
    out = vector_fn(*flats)
    if row == first.numel():
        for begin, end in tail_ranges(out.numel(), lanes):
            out[begin:end] = tail_fn(*(f[begin:end] for f in flats))
    else:
        mask = _tail_mask(out.numel(), row, lanes, out.device)
        out[mask] = tail_fn(*(f[mask] for f in flats))
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return out.reshape(permuted[0].shape).permute(inverse)
