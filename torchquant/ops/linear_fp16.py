"""Dynamic Linear with float16 weights (torch's ``linear_dynamic_fp16``): float in, float out.

The weight is stored rounded to float16 (saturated at float16's range when it was converted);
the product runs in float32 on the weight widened back to float32 -- fbgemm's fp16 GEMM
accumulates in float32 too.  Weights enter as the plain float16 ``[out, in]`` tensor and an
optional float32 bias; the widened copy is made once per weight
(:class:`PackedLinearFp16Weight`, kept by eager modules and by a :class:`PackCache` for
graphs).  Modules call :func:`linear_dynamic_fp16`: the computation directly in eager mode,
``torch.ops.torchquant.linear_dynamic_fp16`` while traced.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F

from ._library import PackCache, traced

__all__ = ["PackedLinearFp16Weight", "pack_linear_fp16", "linear_dynamic_fp16"]


@dataclass(frozen=True, eq=False)
class PackedLinearFp16Weight:
    """A float16 Linear weight and its float32 bias; the float32 widening of the weight (what
    the matmul reads) is made on first use and kept."""

    weight: torch.Tensor            # float16 [out, in]
    bias: Optional[torch.Tensor]    # float32 [out]

    @functools.cached_property
    def weight32(self) -> torch.Tensor:
        return self.weight.float()

    @property
    def in_features(self) -> int:
        return self.weight.size(1)

    @property
    def out_features(self) -> int:
        return self.weight.size(0)


def pack_linear_fp16(weight: torch.Tensor,
                     bias: Optional[torch.Tensor] = None) -> PackedLinearFp16Weight:
    """Pack a float16 ``[out, in]`` weight (round a float weight to float16 first, saturating
    as the module's conversion does) and an optional float bias.  Runs no tensor op on a
    detached float32 bias (so a module may pack while it is traced: the graph sees its
    tensors as they are)."""
    if not isinstance(weight, torch.Tensor) or weight.dtype != torch.float16 or weight.dim() != 2:
        raise TypeError(f"linear_dynamic_fp16: the weight must be a 2-D float16 tensor, got "
                        f"{getattr(weight, 'dtype', type(weight).__name__)} of shape "
                        f"{tuple(getattr(weight, 'shape', ()))}")
    if bias is not None:
        if bias.shape != (weight.size(0),):
            raise ValueError(f"linear_dynamic_fp16: bias of shape {tuple(bias.shape)} does not "
                             f"fit a weight of shape {tuple(weight.shape)}")
        if bias.dtype != torch.float32 or bias.requires_grad:
            bias = bias.detach().float()
    if weight.requires_grad:
        weight = weight.detach()
    return PackedLinearFp16Weight(weight, bias)


def _compute(x: torch.Tensor, weight32: torch.Tensor, bias: Optional[torch.Tensor],
             relu: bool) -> torch.Tensor:
    y = F.linear(x.float(), weight32, bias)
    return (torch.relu(y) if relu else y).to(x.dtype)


_PACKS = PackCache(pack_linear_fp16)


def packed_linear_fp16_weight(weight: torch.Tensor,
                              bias: Optional[torch.Tensor]) -> PackedLinearFp16Weight:
    """:func:`pack_linear_fp16` of these tensors, packed once and shared by every call that
    passes the same tensors."""
    return _PACKS.get(weight, bias)


@torch.library.custom_op("torchquant::linear_dynamic_fp16", mutates_args=())
def _linear_dynamic_fp16_op(x: torch.Tensor, weight: torch.Tensor,
                            bias: Optional[torch.Tensor], relu: bool) -> torch.Tensor:
    packed = _PACKS.get(weight, bias)
    return _compute(x, packed.weight32, packed.bias, relu)


@_linear_dynamic_fp16_op.register_fake
def _(x, weight, bias, relu):
    return x.new_empty(*x.shape[:-1], weight.size(0))


def linear_dynamic_fp16(x: torch.Tensor, packed: PackedLinearFp16Weight,
                        relu: bool = False) -> torch.Tensor:
    """``relu?(linear(x, w16, bias))`` computed in float32, returned in ``x``'s dtype."""
    if traced(x):
        return torch.ops.torchquant.linear_dynamic_fp16(x, packed.weight, packed.bias, relu)
    return _compute(x, packed.weight32, packed.bias, relu)
