"""Quantized Linear ops: static (quantized in and out, with a fused post-op: relu, leaky_relu,
tanh, add, add_relu), dynamic (float in and out, the activation quantized per tensor or per
token on each call).

Weights enter as plain int8 tensors with their qparams (0-d per tensor, 1-d per output
channel) and an optional float bias; the packed form the kernels need is built once per weight
(:class:`PackCache`).  Modules that hold a :class:`PackedLinearWeight` call :func:`linear`,
:func:`linear_dynamic` and :func:`linear_per_token_dynamic`, which go straight to the kernels
in eager mode and through the registered ``torch.ops.torchquant`` op while traced.
"""
from __future__ import annotations

from typing import Optional

import torch

from .. import dtypes as _dt
from ..kernels import linear as _k
from ..kernels import onednn_exactness as _exactness
from ..kernels.packed_linear import PackedLinearWeight, pack_linear_weight
from ..kernels.post_ops import DEFAULT_NEGATIVE_SLOPE, POST_OPS
from ._library import PackCache, traced, weight_qparams

__all__ = ["linear", "linear_dynamic", "linear_per_token_dynamic", "pack_linear",
           "pack_linear_weight", "PackedLinearWeight", "POST_OPS", "onednn_u8s8_exact"]


def onednn_u8s8_exact() -> bool:
    """Whether oneDNN's uint8 x int8 products are exact on this CPU (VNNI / AMX; not AVX2,
    whose kernels saturate pairs): decides which compiled lowering a model takes."""
    return _exactness.onednn_u8s8_exact()


def pack_linear(weight: torch.Tensor, weight_scale: torch.Tensor,
                weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor]) -> PackedLinearWeight:
    """The packed form of an int8 ``[out, in]`` weight: per tensor for 0-d qparams, per output
    channel (axis 0) for 1-d ones."""
    axis = None if weight_scale.dim() == 0 else 0
    return pack_linear_weight(weight, weight_scale, weight_zero_point, axis, bias)


_PACKS = PackCache(pack_linear)


def packed_linear_weight(weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_zero_point: torch.Tensor,
                         bias: Optional[torch.Tensor]) -> PackedLinearWeight:
    """:func:`pack_linear` of these tensors, packed once and shared by every op call (and graph
    lowering) that passes the same tensors."""
    return _PACKS.get(weight, weight_scale, weight_zero_point, bias)


def _graph_args(packed: PackedLinearWeight) -> tuple:
    return (packed.weight,
            *weight_qparams(packed.weight_scale, packed.weight_zero_point, packed.axis),
            packed.bias)


# ---- static ----------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::linear", mutates_args=())
def _linear_op(x: torch.Tensor, x_scale: float, x_zero_point: int, weight: torch.Tensor,
               weight_scale: torch.Tensor, weight_zero_point: torch.Tensor,
               bias: Optional[torch.Tensor], out_scale: float, out_zero_point: int,
               out_dtype: torch.dtype, post_op: str = "none",
               negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
               other: Optional[torch.Tensor] = None, other_scale: float = 1.0,
               other_zero_point: int = 0) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias)
    return _k.quantized_linear(x, x_scale, x_zero_point, packed, out_scale, out_zero_point,
                               _dt.to_qdtype(out_dtype), post_op, negative_slope=negative_slope,
                               other=other, other_scale=other_scale,
                               other_zero_point=other_zero_point)


@_linear_op.register_fake
def _(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, bias, out_scale,
      out_zero_point, out_dtype, post_op="none", negative_slope=DEFAULT_NEGATIVE_SLOPE,
      other=None, other_scale=1.0, other_zero_point=0):
    return x.new_empty(*x.shape[:-1], weight.size(0), dtype=out_dtype)


def linear(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: PackedLinearWeight,
           out_scale: float, out_zero_point: int, out_dtype: torch.dtype = torch.uint8,
           post_op: str = "none", negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
           other: Optional[torch.Tensor] = None, other_scale: float = 1.0,
           other_zero_point: int = 0) -> torch.Tensor:
    """``quantize(post_op(linear(x_hat, w_hat, bias)))`` on the integers of a per-tensor
    quantized input ``[..., in]``; ``out_dtype`` is the storage dtype of the result (uint8 for
    quint8, int8 for qint8).

    ``post_op`` (one of :data:`POST_OPS`) is fused before the one requantization: ``relu``,
    ``leaky_relu`` (with ``negative_slope``), ``tanh``, or ``add`` / ``add_relu`` of ``other``,
    the integers of a per-tensor quantized tensor of the output's shape with ``other_scale`` /
    ``other_zero_point``.
    """
    if traced(x, other):
        return torch.ops.torchquant.linear(x, x_scale, x_zero_point, *_graph_args(packed),
                                           out_scale, out_zero_point, out_dtype, post_op,
                                           negative_slope, other, other_scale, other_zero_point)
    return _k.quantized_linear(x, x_scale, x_zero_point, packed, out_scale, out_zero_point,
                               _dt.to_qdtype(out_dtype), post_op, negative_slope=negative_slope,
                               other=other, other_scale=other_scale,
                               other_zero_point=other_zero_point)


def linear_plan(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: PackedLinearWeight,
                out_scale: float, out_zero_point: int, out_dtype: torch.dtype = torch.uint8,
                post_op: str = "none", negative_slope: float = DEFAULT_NEGATIVE_SLOPE):
    """:func:`linear` in eager mode for inputs like ``x`` (shape, dtype, device), checked and
    bound once: ``plan(x_int)`` (:func:`torchquant.kernels.linear.linear_plan`)."""
    return _k.linear_plan(x, x_scale, x_zero_point, packed, out_scale, out_zero_point,
                          _dt.to_qdtype(out_dtype), post_op, negative_slope)


# ---- dynamic ---------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::linear_dynamic", mutates_args=())
def _linear_dynamic_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                       reduce_range: bool, relu: bool) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias)
    return _k.dynamic_linear(x, packed, reduce_range, relu)


@_linear_dynamic_op.register_fake
def _(x, weight, weight_scale, weight_zero_point, bias, reduce_range, relu):
    return x.new_empty(*x.shape[:-1], weight.size(0))


def linear_dynamic(x: torch.Tensor, packed: PackedLinearWeight, reduce_range: bool = True,
                   relu: bool = False) -> torch.Tensor:
    """torch's dynamic quantized Linear: ``x`` quantized per tensor (quint8) from its own
    min/max on each call, int8 GEMM, float output."""
    if traced(x):
        return torch.ops.torchquant.linear_dynamic(x, *_graph_args(packed), reduce_range, relu)
    return _k.dynamic_linear(x, packed, reduce_range, relu)


@torch.library.custom_op("torchquant::linear_per_token_dynamic", mutates_args=())
def _linear_per_token_op(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                         relu: bool) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias)
    return _k.per_token_dynamic_linear(x, packed, relu)


@_linear_per_token_op.register_fake
def _(x, weight, weight_scale, weight_zero_point, bias, relu):
    return x.new_empty(*x.shape[:-1], weight.size(0))


def linear_per_token_dynamic(x: torch.Tensor, packed: PackedLinearWeight,
                             relu: bool = False) -> torch.Tensor:
    """Dynamic Linear with one int8 symmetric activation scale per row (token)."""
    if traced(x):
        return torch.ops.torchquant.linear_per_token_dynamic(x, *_graph_args(packed), relu)
    return _k.per_token_dynamic_linear(x, packed, relu)
