"""Row-wise quantized embedding lookups (8-bit and 4-bit, float scale and float offset per row).

torch's quantized embedding kernels (fbgemm) do not dequantize with ``(q - zp) * scale``.
Prepacking turns each row's qparams into ``scale`` and ``bias = -(zp * scale)`` (float32
for 8-bit rows; both rounded to float16 for 4-bit rows), and a bag accumulates its rows one
after the other as::

    buf = fma(w * scale, q, buf + w * bias)        # w: per-sample weight, 1 when absent

in float32.  The reference below reproduces that bit for bit; the single-rounding ``fma`` is
emulated in float64, which is exact here because ``q * scale`` (at most 8 + 24 significant
bits) is exact in float64 and the sum is rounded once to float64 and once to float32.
(The two roundings could only differ from one float32 rounding at an exact float32 tie of a
53-bit value, which these operands do not produce in practice.)  The ``cpu_addcmul`` fast
path runs the same code with ``torch.addcmul`` as the fma (one float32 pass instead of three
float64 ones, ~25x faster lookups); it registers itself only if a probe shows that this
machine's ``addcmul`` really rounds once.

Plain integer tensors only: ``values`` are the unpacked row integers, uint8 ``[N, D]``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from .registry import get, register

__all__ = ["PackedEmbeddingWeight", "pack_embedding_weight", "embedding_lookup",
           "embedding_bag", "MODES"]

MODES = ("sum", "mean", "max")


@dataclass
class PackedEmbeddingWeight:
    """An embedding table prepared for lookups: integers plus torch's per-row scale and bias
    (derived), and the per-row qparams they came from (what a graph passes to the op)."""

    values: torch.Tensor      # uint8 [N, D], unpacked (4-bit values lie in 0..15)
    row_scale: torch.Tensor   # float32 [N] (float16-representable for 4-bit)
    row_bias: torch.Tensor    # float32 [N], -(zero_point * scale)
    bits: int
    scale: torch.Tensor       # float32 [N], the qparams as given
    zero_point: torch.Tensor  # float32 [N]

    @property
    def num_embeddings(self) -> int:
        return int(self.values.shape[0])

    @property
    def embedding_dim(self) -> int:
        return int(self.values.shape[1])

    def dequantized_weight(self) -> torch.Tensor:
        """The float table every lookup reads rows from (torch's lookup values)."""
        return _rows(self, torch.arange(self.num_embeddings, device=self.values.device))


def pack_embedding_weight(values: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                          bits: int) -> PackedEmbeddingWeight:
    """Prepare a row-quantized table (``values`` uint8 ``[N, D]``, float ``scale`` and
    ``zero_point`` of length ``N``) the way torch's ``embedding_bag_prepack`` does."""
    if bits not in (8, 4):
        raise ValueError(f"quantized embeddings take 8-bit or 4-bit rows, got {bits} bits")
    if values.dtype != torch.uint8 or values.dim() != 2:
        raise TypeError(f"embedding values must be a 2-D uint8 tensor, got {values.dtype} of "
                        f"shape {tuple(values.shape)}")
    n = values.shape[0]
    scale = scale.detach().reshape(-1).to(device=values.device, dtype=torch.float32)
    zero_point = zero_point.detach().reshape(-1).to(device=values.device, dtype=torch.float32)
    if scale.numel() != n or zero_point.numel() != n:
        raise ValueError(f"an embedding table with {n} rows needs {n} scales and zero points, "
                         f"got {scale.numel()} and {zero_point.numel()}")
    row_scale, row_bias = scale, -(zero_point * scale)  # float32 product, as torch's prepack
    if bits == 4:  # 4-bit rows keep their scale and bias as float16
        row_scale = row_scale.to(torch.float16).to(torch.float32)
        row_bias = row_bias.to(torch.float16).to(torch.float32)
    return PackedEmbeddingWeight(values.detach().contiguous(), row_scale, row_bias, bits, scale,
                                 zero_point)


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 ``a * b + c`` rounded once (see the module docstring)."""
    return (a.to(torch.float64) * b.to(torch.float64) + c.to(torch.float64)).to(torch.float32)


def _addcmul_fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` through ``torch.addcmul``, which torch's vectorised CPU kernels fuse into
    one rounding (checked on this machine by :func:`_addcmul_is_fused` before use)."""
    return torch.addcmul(c, a.to(torch.float32), b.to(torch.float32))


_FUSED: Optional[bool] = None


def _addcmul_is_fused() -> bool:
    """Whether CPU ``addcmul`` rounds once, probed on values where mul-then-add differs."""
    global _FUSED
    if _FUSED is None:
        gen = torch.Generator().manual_seed(0)
        ok = True
        for n in (7, 1031):  # a scalar tail and a vectorised body
            q = torch.randint(0, 256, (n,), generator=gen).float()
            s = torch.rand(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 3)
            b = torch.randn(n, generator=gen) * torch.exp(torch.randn(n, generator=gen) * 3)
            ok = ok and torch.equal(_addcmul_fma(q, s, b), _fma(q, s, b))
        _FUSED = bool(ok)
    return _FUSED


def _rows(packed: PackedEmbeddingWeight, flat_idx: torch.Tensor, fma=_fma) -> torch.Tensor:
    """Lookup values of the rows ``flat_idx`` (1-D), float32 ``[len, D]``."""
    q = packed.values.index_select(0, flat_idx)
    return fma(q, packed.row_scale.index_select(0, flat_idx)[:, None],
               packed.row_bias.index_select(0, flat_idx)[:, None])


def check_indices(indices: torch.Tensor, num_embeddings: int, op: str) -> None:
    """int32/int64 indices inside ``[0, num_embeddings)`` (torch has no negative indexing here)."""
    if not isinstance(indices, torch.Tensor):
        raise TypeError(f"quantized.{op}: indices must be a tensor, got {type(indices).__name__}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"quantized.{op}: indices must be int32 or int64, got {indices.dtype}")
    if indices.numel():
        lo, hi = int(indices.min()), int(indices.max())
        if lo < 0 or hi >= num_embeddings:
            bad = lo if lo < 0 else hi
            raise IndexError(f"quantized.{op}: index {bad} is out of range for a table of "
                             f"{num_embeddings} rows")


def _lookup_formula(packed: PackedEmbeddingWeight, indices: torch.Tensor, fma) -> torch.Tensor:
    flat = indices.reshape(-1).to(torch.int64)
    return _rows(packed, flat, fma).reshape(*indices.shape, packed.embedding_dim)


@register("embedding_lookup", "reference")
def _lookup_reference(packed: PackedEmbeddingWeight, indices: torch.Tensor) -> torch.Tensor:
    return _lookup_formula(packed, indices, _fma)


@register("embedding_lookup", "cpu_addcmul", devices=("cpu",), available=_addcmul_is_fused)
def _lookup_addcmul(packed: PackedEmbeddingWeight, indices: torch.Tensor) -> torch.Tensor:
    return _lookup_formula(packed, indices, _addcmul_fma)


def embedding_lookup(packed: PackedEmbeddingWeight, indices: torch.Tensor) -> torch.Tensor:
    """``out[..., :] = row(indices[...])`` as float32 (torch's ``quantized::embedding_byte`` /
    ``embedding_4bit`` numerics); ``indices`` int32/int64 of any shape."""
    check_indices(indices, packed.num_embeddings, "embedding")
    return get("embedding_lookup", packed.values)(packed, indices)


def _bags(indices: torch.Tensor, offsets: Optional[torch.Tensor], include_last_offset: bool,
          per_sample_weights: Optional[torch.Tensor]):
    """Flatten to (flat indices, bag id per entry, number of bags, flat weights or None)."""
    if indices.dim() == 2:
        if offsets is not None:
            raise ValueError("quantized.embedding_bag: 2-D indices are fixed-length bags (one "
                             "per row); offsets must be None")
        nbags, length = indices.shape
        bag = torch.arange(nbags, device=indices.device).repeat_interleave(length)
    elif indices.dim() == 1:
        if offsets is None:
            raise ValueError("quantized.embedding_bag: 1-D indices need offsets (the start of "
                             "each bag)")
        if not isinstance(offsets, torch.Tensor) or offsets.dim() != 1 or \
                offsets.dtype not in (torch.int32, torch.int64):
            raise TypeError("quantized.embedding_bag: offsets must be a 1-D int32/int64 tensor")
        n = indices.numel()
        offs = offsets.to(torch.int64)
        if offs.numel() and int(offs[0]) != 0:
            # As F.embedding_bag.  (torch's quantized kernels disagree here: the 8-bit one skips
            # the entries before offsets[0], the 4-bit one shifts every bag back by offsets[0].)
            raise ValueError(f"quantized.embedding_bag: offsets[0] has to be 0 (the first bag "
                             f"starts at position 0), got {int(offs[0])}")
        if include_last_offset:
            if offs.numel() == 0:
                raise ValueError("quantized.embedding_bag: include_last_offset needs at least "
                                 "one offset")
            starts, end = offs[:-1], int(offs[-1])
        else:
            starts, end = offs, n
        nbags = starts.numel()
        bounds = torch.cat([starts, starts.new_tensor([end])])
        if bounds.numel() and (int(bounds.min()) < 0 or int(bounds.max()) > n
                               or bool((bounds[1:] < bounds[:-1]).any())):
            raise ValueError(f"quantized.embedding_bag: offsets must be non-decreasing and lie "
                             f"in [0, {n}] (the number of indices), got {offsets.tolist()}")
        lengths = bounds[1:] - bounds[:-1]
        first = int(bounds[0]) if nbags else 0
        last = int(bounds[-1]) if nbags else 0
        bag = torch.arange(nbags, device=indices.device).repeat_interleave(lengths)
        indices = indices[first:last]
        if per_sample_weights is not None:
            if per_sample_weights.shape != (n,):
                raise ValueError(f"quantized.embedding_bag: per_sample_weights must have the "
                                 f"indices' shape ({n},), got {tuple(per_sample_weights.shape)}")
            per_sample_weights = per_sample_weights[first:last]
    else:
        raise ValueError(f"quantized.embedding_bag takes 1-D or 2-D indices, got "
                         f"{indices.dim()}-D")
    if per_sample_weights is not None:
        if indices.dim() == 2 and per_sample_weights.shape != indices.shape:
            raise ValueError(f"quantized.embedding_bag: per_sample_weights must have the "
                             f"indices' shape {tuple(indices.shape)}, got "
                             f"{tuple(per_sample_weights.shape)}")
        per_sample_weights = per_sample_weights.reshape(-1)
    return indices.reshape(-1).to(torch.int64), bag, nbags, per_sample_weights


def _bag_formula(packed: PackedEmbeddingWeight, indices: torch.Tensor,
                 offsets: Optional[torch.Tensor], mode: str,
                 per_sample_weights: Optional[torch.Tensor], include_last_offset: bool,
                 padding_idx: Optional[int], fma) -> torch.Tensor:
    flat, bag, nbags, weights = _bags(indices, offsets, include_last_offset, per_sample_weights)
    if padding_idx is not None:  # padding entries take no part in the reduction (nor the count)
        keep = flat != padding_idx
        flat, bag = flat[keep], bag[keep]
        weights = None if weights is None else weights[keep]
    dim = packed.embedding_dim
    out = torch.zeros(nbags, dim, dtype=torch.float32, device=packed.values.device)
    if flat.numel() == 0:
        return out
    if mode == "max":
        rows = _rows(packed, flat, fma)
        return out.scatter_reduce_(0, bag[:, None].expand(-1, dim), rows, "amax",
                                   include_self=False)
    counts = torch.bincount(bag, minlength=nbags)
    scale = packed.row_scale.index_select(0, flat)
    bias = packed.row_bias.index_select(0, flat)
    if weights is not None:
        w = weights.to(torch.float32)
        scale, bias = w * scale, w * bias
    length = int(counts[0])
    if bool((counts == length).all()):
        # Equal bags (2-D indices, say): entries form a [bags, length] grid; step k adds column k.
        grid = flat.view(nbags, length).t().reshape(-1)  # position-major: step k is contiguous
        q = packed.values.index_select(0, grid).view(length, nbags, dim)
        scale = scale.view(nbags, length, 1).transpose(0, 1).contiguous()
        bias = bias.view(nbags, length, 1).transpose(0, 1).contiguous()
        for k in range(length):
            out = fma(scale[k], q[k], out + bias[k])
    else:
        # Entries are grouped by bag in order; position k of every bag is added in step k.
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(flat.numel(), device=flat.device) - starts[bag]
        order = torch.argsort(pos, stable=True)
        at = 0
        for size in torch.bincount(pos).tolist():
            sel = order[at:at + size]
            at += size
            b = bag[sel]
            q = packed.values.index_select(0, flat[sel])
            acc = out.index_select(0, b) + bias[sel][:, None]
            out.index_copy_(0, b, fma(scale[sel][:, None], q, acc))
    if mode == "mean":
        out = out / counts.clamp(min=1).to(torch.float32)[:, None]
    return out


@register("embedding_bag", "reference")
def _bag_reference(packed, indices, offsets, mode, per_sample_weights, include_last_offset,
                   padding_idx) -> torch.Tensor:
    return _bag_formula(packed, indices, offsets, mode, per_sample_weights, include_last_offset,
                        padding_idx, _fma)


@register("embedding_bag", "cpu_addcmul", devices=("cpu",), available=_addcmul_is_fused)
def _bag_addcmul(packed, indices, offsets, mode, per_sample_weights, include_last_offset,
                 padding_idx) -> torch.Tensor:
    return _bag_formula(packed, indices, offsets, mode, per_sample_weights, include_last_offset,
                        padding_idx, _addcmul_fma)


def embedding_bag(packed: PackedEmbeddingWeight, indices: torch.Tensor,
                  offsets: Optional[torch.Tensor] = None, mode: str = "sum",
                  per_sample_weights: Optional[torch.Tensor] = None,
                  include_last_offset: bool = False,
                  padding_idx: Optional[int] = None) -> torch.Tensor:
    """Bag reductions of quantized rows, float32 ``[num_bags, D]``; empty bags give zeros.

    'sum' reproduces torch's ``quantized::embedding_bag_byte`` / ``_4bit`` bit for bit
    (``per_sample_weights`` scale each row, 'sum' only).  'mean' is that sum divided by the
    bag's length and 'max' the elementwise maximum of the rows; entries equal to
    ``padding_idx`` are skipped and not counted, as ``torch.nn.functional.embedding_bag``.
    """
    if mode not in MODES:
        raise ValueError(f"quantized.embedding_bag: mode must be one of {MODES}, got {mode!r}")
    check_indices(indices, packed.num_embeddings, "embedding_bag")
    if per_sample_weights is not None:
        if mode != "sum":
            raise NotImplementedError(f"quantized.embedding_bag: per_sample_weights is only "
                                      f"supported for mode='sum' (got mode={mode!r})")
        if not isinstance(per_sample_weights, torch.Tensor) or \
                per_sample_weights.dtype != torch.float32:
            got = getattr(per_sample_weights, "dtype", type(per_sample_weights).__name__)
            raise TypeError(f"quantized.embedding_bag: per_sample_weights must be float32, "
                            f"got {got}")
    if padding_idx is not None and not 0 <= padding_idx < packed.num_embeddings:
        raise ValueError(f"padding_idx {padding_idx} is out of range for a table of "
                         f"{packed.num_embeddings} rows")
    return get("embedding_bag", packed.values, mode=mode)(
        packed, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx)
