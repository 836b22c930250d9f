"""QAT ``Embedding`` / ``EmbeddingBag``: lookups in the fake-quantized table.

The table is quantized per row with float zero points (``per_channel_affine_float_qparams``),
the only scheme the quantized embedding kernels take, so other weight qschemes are refused.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from .... import dtypes as _dt
from ._common import check_float_module, require_qconfig

__all__ = ["Embedding", "EmbeddingBag"]


def _check_weight_qscheme(qconfig: Any, what: str) -> None:
    qscheme = qconfig.weight().qscheme
    if qscheme != _dt.per_channel_affine_float_qparams:
        raise AssertionError(f"{what} weights requires a qscheme of "
                             f"torch.per_channel_affine_float_qparams Got {qscheme}")


class Embedding(nn.Embedding):
    """``nn.Embedding`` looking up rows of ``weight_fake_quant(weight)``."""

    _FLOAT_MODULE: type = nn.Embedding

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: Optional[torch.Tensor] = None, device: Any = None, dtype: Any = None,
                 qconfig: Any = None) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, **factory_kwargs)
        require_qconfig(qconfig)
        _check_weight_qscheme(qconfig, "Embedding")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight(factory_kwargs=factory_kwargs)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return F.embedding(input, self.weight_fake_quant(self.weight), self.padding_idx,
                           self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "Embedding":
        check_float_module(cls, mod, cls._FLOAT_MODULE, type(mod))
        _check_weight_qscheme(mod.qconfig, "Embedding")
        return cls(mod.num_embeddings, mod.embedding_dim, mod.padding_idx, mod.max_norm,
                   mod.norm_type, mod.scale_grad_by_freq, mod.sparse, mod.weight,
                   qconfig=mod.qconfig)

    def to_float(self) -> nn.Embedding:
        emb = nn.Embedding(self.num_embeddings, self.embedding_dim, self.padding_idx,
                           self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse,
                           None)
        emb.weight = nn.Parameter(self.weight.detach())
        emb.train(self.training)
        return emb


class EmbeddingBag(nn.EmbeddingBag):
    """``nn.EmbeddingBag`` reducing rows of ``weight_fake_quant(weight)``."""

    _FLOAT_MODULE: type = nn.EmbeddingBag

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "mean",
                 sparse: bool = False, _weight: Optional[torch.Tensor] = None,
                 include_last_offset: bool = False, padding_idx: Optional[int] = None,
                 qconfig: Any = None, device: Any = None, dtype: Any = None) -> None:
        factory_kwargs = {"device": device, "dtype": dtype}
        super().__init__(num_embeddings, embedding_dim, max_norm, norm_type, scale_grad_by_freq,
                         mode, sparse, _weight, include_last_offset, padding_idx,
                         **factory_kwargs)
        require_qconfig(qconfig)
        _check_weight_qscheme(qconfig, "Embedding Bag")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight(factory_kwargs=factory_kwargs)

    def forward(self, input: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None) -> torch.Tensor:
        return F.embedding_bag(input, self.weight_fake_quant(self.weight), offsets,
                               self.max_norm, self.norm_type, self.scale_grad_by_freq, self.mode,
                               self.sparse, per_sample_weights, self.include_last_offset,
                               self.padding_idx)

    @classmethod
    def from_float(cls, mod: nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "EmbeddingBag":
        check_float_module(cls, mod, cls._FLOAT_MODULE, type(mod))
        _check_weight_qscheme(mod.qconfig, "Embedding Bag")
        return cls(mod.num_embeddings, mod.embedding_dim, mod.max_norm, mod.norm_type,
                   mod.scale_grad_by_freq, mod.mode, mod.sparse, mod.weight,
                   mod.include_last_offset, mod.padding_idx, qconfig=mod.qconfig)

    def to_float(self) -> nn.EmbeddingBag:
        bag = nn.EmbeddingBag(self.num_embeddings, self.embedding_dim, self.max_norm,
                              self.norm_type, self.scale_grad_by_freq, self.mode, self.sparse,
                              None, self.include_last_offset, self.padding_idx)
        bag.weight = nn.Parameter(self.weight.detach())
        bag.train(self.training)
        return bag
