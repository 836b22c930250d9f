"""Quantized embedding ops: lookups and bag reductions over a row-quantized table.

The table enters as plain integers -- uint8 ``[N, D]`` in the logical shape (4-bit rows
unpacked, values 0..15) -- with one float scale and one float zero point per row (torch's
``per_channel_affine_float_qparams`` along axis 0) and the qdtype's name ("quint8" or
"quint4x2").  The lookup-ready form (torch's per-row scale and bias) is built once per table
(:class:`PackCache`).  Modules holding a :class:`PackedEmbeddingWeight` call :func:`embedding`
and :func:`embedding_bag`: the kernels directly in eager mode, ``torch.ops.torchquant`` while
traced.  Both return float32.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import dtypes as _dt
from ..kernels import embedding as _k
from ..kernels.embedding import MODES, PackedEmbeddingWeight
from ._library import PackCache, traced

__all__ = ["embedding", "embedding_bag", "pack_embedding", "PackedEmbeddingWeight", "MODES"]

_QDTYPES = {4: "quint4x2", 8: "quint8"}


def pack_embedding(weight: torch.Tensor, weight_scale: torch.Tensor,
                   weight_zero_point: torch.Tensor, weight_qdtype: str) -> PackedEmbeddingWeight:
    """The lookup-ready form of a row-quantized table (``weight_qdtype``: "quint8" or
    "quint4x2")."""
    bits = _dt.qdtype_of(weight_qdtype).bits
    return _k.pack_embedding_weight(weight, weight_scale, weight_zero_point, bits)


_PACKS = PackCache(pack_embedding)


def _graph_args(packed: PackedEmbeddingWeight) -> tuple:
    return packed.values, packed.scale, packed.zero_point, _QDTYPES[packed.bits]


# ---- lookup ----------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::embedding", mutates_args=())
def _embedding_op(indices: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                  weight_zero_point: torch.Tensor, weight_qdtype: str) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, weight_qdtype)
    return _k.embedding_lookup(packed, indices)


@_embedding_op.register_fake
def _(indices, weight, weight_scale, weight_zero_point, weight_qdtype):
    return weight.new_empty(*indices.shape, weight.size(1), dtype=torch.float32)


def embedding(indices: torch.Tensor, packed: PackedEmbeddingWeight) -> torch.Tensor:
    """The float32 rows ``indices`` (int32 / int64, any shape) of the table:
    ``indices.shape + (D,)``, torch's ``embedding_byte`` / ``embedding_4bit`` numerics."""
    if traced(indices):
        return torch.ops.torchquant.embedding(indices, *_graph_args(packed))
    return _k.embedding_lookup(packed, indices)


# ---- bags ------------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::embedding_bag", mutates_args=())
def _embedding_bag_op(indices: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                      weight_zero_point: torch.Tensor, weight_qdtype: str,
                      offsets: Optional[torch.Tensor], mode: str,
                      per_sample_weights: Optional[torch.Tensor], include_last_offset: bool,
                      padding_idx: Optional[int]) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, weight_qdtype)
    return _k.embedding_bag(packed, indices, offsets, mode, per_sample_weights,
                            include_last_offset, padding_idx)


def _bag_count(indices: torch.Tensor, offsets: Optional[torch.Tensor],
               include_last_offset: bool) -> int:
    """Bags of a call, from shapes alone: one per row of 2-D indices, else one per offset
    (less the closing one with ``include_last_offset``)."""
    if indices.dim() == 2 or offsets is None:
        return indices.size(0)
    return max(offsets.size(0) - int(include_last_offset), 0)


@_embedding_bag_op.register_fake
def _(indices, weight, weight_scale, weight_zero_point, weight_qdtype, offsets, mode,
      per_sample_weights, include_last_offset, padding_idx):
    return weight.new_empty(_bag_count(indices, offsets, include_last_offset), weight.size(1),
                            dtype=torch.float32)


def embedding_bag(indices: torch.Tensor, packed: PackedEmbeddingWeight,
                  offsets: Optional[torch.Tensor] = None, mode: str = "sum",
                  per_sample_weights: Optional[torch.Tensor] = None,
                  include_last_offset: bool = False,
                  padding_idx: Optional[int] = None) -> torch.Tensor:
    """Bag reductions ('sum', 'mean', 'max') of the table's rows, float32 ``[bags, D]``: 2-D
    ``indices`` are one bag per row, 1-D ones are cut at ``offsets``; ``per_sample_weights``
    ('sum' only) scale the rows; entries equal to ``padding_idx`` take no part (see
    :func:`torchquant.kernels.embedding.embedding_bag`)."""
    if traced(indices, offsets, per_sample_weights):
        return torch.ops.torchquant.embedding_bag(indices, *_graph_args(packed), offsets, mode,
                                                  per_sample_weights, include_last_offset,
                                                  padding_idx)
    return _k.embedding_bag(packed, indices, offsets, mode, per_sample_weights,
                            include_last_offset, padding_idx)
