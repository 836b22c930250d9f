"""Reference quantized Embedding / EmbeddingBag: lookups in the quantize-dequantized table."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from .utils import ReferenceQuantizedModule

__all__ = ["Embedding", "EmbeddingBag"]


class Embedding(nn.Embedding, ReferenceQuantizedModule):
    """Reference quantized ``nn.Embedding``: lookups in the quantize-dequantized table
    (typically per-channel float-qparams quint8 / quint4x2 over rows)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight=None, device=None, dtype=None,
                 weight_qparams: Optional[dict] = None) -> None:
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, device=device, dtype=dtype)
        self._init_weight_qparams(weight_qparams, device)

    def _get_name(self) -> str:
        return "QuantizedEmbedding(Reference)"

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.embedding(input, self.get_weight(), self.padding_idx, self.max_norm,
                           self.norm_type, self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_float(cls, mod: nn.Embedding, weight_qparams: dict) -> "Embedding":
        return cls(mod.num_embeddings, mod.embedding_dim, mod.padding_idx, mod.max_norm,
                   mod.norm_type, mod.scale_grad_by_freq, mod.sparse, mod.weight.detach(),
                   mod.weight.device, mod.weight.dtype, weight_qparams)


class EmbeddingBag(nn.EmbeddingBag, ReferenceQuantizedModule):
    """Reference quantized ``nn.EmbeddingBag``: bag reductions over the quantize-dequantized
    table."""

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm=None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = False, _weight=None, include_last_offset: bool = False,
                 padding_idx=None, device=None, dtype=None,
                 weight_qparams: Optional[dict] = None) -> None:
        super().__init__(num_embeddings, embedding_dim, max_norm, norm_type,
                         scale_grad_by_freq, mode, sparse, _weight, include_last_offset,
                         padding_idx, device=device, dtype=dtype)
        self._init_weight_qparams(weight_qparams, device)

    def _get_name(self) -> str:
        # torch's reference EmbeddingBag reports itself as an Embedding; kept for parity
        return "QuantizedEmbedding(Reference)"

    def forward(self, input: torch.Tensor, offsets=None, per_sample_weights=None):
        return F.embedding_bag(input, self.get_weight(), offsets, self.max_norm, self.norm_type,
                               self.scale_grad_by_freq, self.mode, self.sparse,
                               per_sample_weights, self.include_last_offset, self.padding_idx)

    @classmethod
    def from_float(cls, mod: nn.EmbeddingBag, weight_qparams: dict,
                   use_precomputed_fake_quant: bool = False) -> "EmbeddingBag":
        return cls(mod.num_embeddings, mod.embedding_dim, mod.max_norm, mod.norm_type,
                   mod.scale_grad_by_freq, mod.mode, mod.sparse, mod.weight.detach(),
                   mod.include_last_offset, mod.padding_idx, mod.weight.device,
                   mod.weight.dtype, weight_qparams)
