"""Quantized convolution ops (1-3 d, transposed) with a fused post-op (relu, leaky_relu, tanh,
add, add_relu); quint8 activations.

The weight enters as a plain int8 tensor with its qparams (0-d per tensor, 1-d per channel
along ``weight_axis``), an optional float bias and the geometry; the packed (oneDNN-blocked)
form is built once per (weight, qparams, bias, geometry).  Modules holding a
:class:`PackedConvWeight` call :func:`conv` / :func:`conv_transpose`: the kernels directly in
eager mode, the registered ``torch.ops.torchquant`` op while traced.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from ..kernels import conv as _k
from ..kernels.conv import PackedConvWeight, pack_conv_weight
from ..kernels.post_ops import DEFAULT_NEGATIVE_SLOPE, POST_OPS
from . import compile_lowering
from ._library import PackCache, traced, weight_qparams

__all__ = ["conv", "conv_transpose", "PackedConvWeight", "pack_conv_weight", "POST_OPS"]

_FLOAT_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_FLOAT_CONV_TRANSPOSE = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def _pack(weight: torch.Tensor, weight_scale: torch.Tensor, weight_zero_point: torch.Tensor,
          bias: Optional[torch.Tensor], weight_axis: int, stride: tuple, padding: tuple,
          dilation: tuple, groups: int, transposed: bool,
          output_padding: tuple) -> PackedConvWeight:
    axis = None if weight_scale.dim() == 0 else weight_axis
    return _k.pack_conv_weight(weight, weight_scale, weight_zero_point, axis, bias, stride,
                               padding, dilation, groups, transposed, output_padding)


_PACKS = PackCache(_pack)


def packed_conv_weight(weight: torch.Tensor, weight_scale: torch.Tensor,
                       weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                       weight_axis: int, stride: tuple, padding: tuple, dilation: tuple,
                       groups: int, transposed: bool = False,
                       output_padding: Optional[tuple] = None) -> PackedConvWeight:
    """The conv weight packed for this geometry once, shared by every op call (and graph
    lowering) that passes the same tensors; ``output_padding`` defaults to zeros."""
    if output_padding is None:
        output_padding = (0,) * len(stride)
    return _PACKS.get(weight, weight_scale, weight_zero_point, bias, weight_axis, stride,
                      padding, dilation, groups, transposed, output_padding)


def _graph_weight(p: PackedConvWeight) -> tuple:
    return (p.weight, *weight_qparams(p.weight_scale, p.weight_zero_point, p.axis), p.bias,
            0 if p.axis is None else p.axis)


def _graph_format(ndim: int) -> torch.memory_format:
    """The layout of the op's output in a graph: channels-last for 2-d / 3-d convs, as oneDNN
    writes them (the reference path is converted), so the fake kernel can promise it."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(ndim, torch.contiguous_format)


@torch.library.custom_op("torchquant::conv", mutates_args=())
def _conv_op(x: torch.Tensor, x_scale: float, x_zero_point: int, weight: torch.Tensor,
             weight_scale: torch.Tensor, weight_zero_point: torch.Tensor,
             bias: Optional[torch.Tensor], weight_axis: int, stride: list[int],
             padding: list[int], dilation: list[int], groups: int, out_scale: float,
             out_zero_point: int, post_op: str = "none",
             negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
             other: Optional[torch.Tensor] = None, other_scale: float = 1.0,
             other_zero_point: int = 0) -> torch.Tensor:
    geometry = (tuple(stride), tuple(padding), tuple(dilation), groups)
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias, weight_axis, *geometry,
                        False, (0,) * len(stride))
    y = _k.quantized_conv(x, x_scale, x_zero_point, packed, *geometry, out_scale,
                          out_zero_point, post_op, negative_slope=negative_slope, other=other,
                          other_scale=other_scale, other_zero_point=other_zero_point)
    return y.contiguous(memory_format=_graph_format(y.dim()))


@_conv_op.register_fake
def _(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, bias, weight_axis,
      stride, padding, dilation, groups, out_scale, out_zero_point, post_op="none",
      negative_slope=DEFAULT_NEGATIVE_SLOPE, other=None, other_scale=1.0, other_zero_point=0):
    y = _FLOAT_CONV[weight.dim() - 2](torch.empty_like(x, dtype=torch.float32),
                                      torch.empty_like(weight, dtype=torch.float32), None,
                                      stride, padding, dilation, groups)
    return torch.empty(y.shape, dtype=torch.uint8, device=x.device).contiguous(
        memory_format=_graph_format(y.dim()))


@torch.library.custom_op("torchquant::conv_exact_float", mutates_args=())
def _conv_exact_float_op(x: torch.Tensor, x_scale: float, x_zero_point: int,
                         weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                         weight_axis: int, stride: list[int], padding: list[int],
                         dilation: list[int], groups: int) -> torch.Tensor:
    """The float32 result (before requantization) of a quint8 conv on a CPU whose oneDNN
    saturates u8 x s8 pairs: what ``torch.compile`` lowers a conv to there
    (:mod:`.compile_lowering`).  Opaque, so that it can look at the data (one oneDNN call, or
    the split with a sparse or dense high half); the weight's packed form is the one
    ``torchquant::conv`` uses."""
    geometry = (tuple(stride), tuple(padding), tuple(dilation), groups)
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias, weight_axis, *geometry,
                        False, (0,) * len(stride))
    return _k.conv_exact_float(x, x_scale, x_zero_point, packed)


@_conv_exact_float_op.register_fake
def _(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, bias, weight_axis,
      stride, padding, dilation, groups):
    y = _FLOAT_CONV[weight.dim() - 2](torch.empty_like(x, dtype=torch.float32),
                                      torch.empty_like(weight, dtype=torch.float32), None,
                                      stride, padding, dilation, groups)
    return torch.empty(y.shape, dtype=torch.float32, device=x.device).contiguous(
        memory_format=_graph_format(y.dim()))


def conv(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: PackedConvWeight,
         out_scale: float, out_zero_point: int, post_op: str = "none",
         negative_slope: float = DEFAULT_NEGATIVE_SLOPE, other: Optional[torch.Tensor] = None,
         other_scale: float = 1.0, other_zero_point: int = 0) -> torch.Tensor:
    """``quantize(post_op(conv(x_hat, w_hat, bias)))`` with the geometry the weight was packed
    for; ``x`` holds quint8 values ``[N, C, *spatial]``.

    ``post_op`` (one of :data:`POST_OPS`) is fused before the one requantization: ``relu``,
    ``leaky_relu`` (with ``negative_slope``), ``tanh``, or ``add`` / ``add_relu`` of ``other``,
    the integers of a per-tensor quantized tensor of the output's shape with ``other_scale`` /
    ``other_zero_point`` (torch's ConvAdd2d / ConvAddReLU2d).
    """
    if traced(x, other):
        if compile_lowering.active() and post_op in ("none", "relu"):
            lowered = compile_lowering.conv(x, x_scale, x_zero_point, packed, out_scale,
                                            out_zero_point, post_op == "relu")
            if lowered is not None:
                return lowered
        return torch.ops.torchquant.conv(
            x, x_scale, x_zero_point, *_graph_weight(packed), list(packed.stride),
            list(packed.padding), list(packed.dilation), packed.groups, out_scale,
            out_zero_point, post_op, negative_slope, other, other_scale, other_zero_point)
    return _k.quantized_conv(x, x_scale, x_zero_point, packed, packed.stride, packed.padding,
                             packed.dilation, packed.groups, out_scale, out_zero_point, post_op,
                             negative_slope=negative_slope, other=other,
                             other_scale=other_scale, other_zero_point=other_zero_point)


def cached_plan(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: PackedConvWeight,
                out_scale: float, out_zero_point: int, post_op: str = "none"):
    """The bound kernel call (``plan(x, None)``) :func:`conv` made for a call like this one in
    eager mode, or None (another kernel; :func:`torchquant.kernels.conv.cached_conv_plan`)."""
    return _k.cached_conv_plan(x, x_scale, x_zero_point, packed, out_scale, out_zero_point,
                               post_op)


@torch.library.custom_op("torchquant::conv_transpose", mutates_args=())
def _conv_transpose_op(x: torch.Tensor, x_scale: float, x_zero_point: int, weight: torch.Tensor,
                       weight_scale: torch.Tensor, weight_zero_point: torch.Tensor,
                       bias: Optional[torch.Tensor], weight_axis: int, stride: list[int],
                       padding: list[int], output_padding: list[int], dilation: list[int],
                       groups: int, out_scale: float, out_zero_point: int,
                       post_op: str = "none", negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
                       other: Optional[torch.Tensor] = None, other_scale: float = 1.0,
                       other_zero_point: int = 0) -> torch.Tensor:
    packed = _PACKS.get(weight, weight_scale, weight_zero_point, bias, weight_axis,
                        tuple(stride), tuple(padding), tuple(dilation), groups, True,
                        tuple(output_padding))
    return _k.quantized_conv_transpose(x, x_scale, x_zero_point, packed, packed.stride,
                                       packed.padding, packed.output_padding, packed.dilation,
                                       packed.groups, out_scale, out_zero_point, post_op,
                                       negative_slope=negative_slope, other=other,
                                       other_scale=other_scale,
                                       other_zero_point=other_zero_point)


@_conv_transpose_op.register_fake
def _(x, x_scale, x_zero_point, weight, weight_scale, weight_zero_point, bias, weight_axis,
      stride, padding, output_padding, dilation, groups, out_scale, out_zero_point,
      post_op="none", negative_slope=DEFAULT_NEGATIVE_SLOPE, other=None, other_scale=1.0,
      other_zero_point=0):
    y = _FLOAT_CONV_TRANSPOSE[weight.dim() - 2](
        torch.empty_like(x, dtype=torch.float32), torch.empty_like(weight, dtype=torch.float32),
        None, stride, padding, output_padding, groups, dilation)
    return torch.empty_like(y, dtype=torch.uint8)


def conv_transpose(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: PackedConvWeight,
                   out_scale: float, out_zero_point: int, post_op: str = "none",
                   negative_slope: float = DEFAULT_NEGATIVE_SLOPE,
                   other: Optional[torch.Tensor] = None, other_scale: float = 1.0,
                   other_zero_point: int = 0) -> torch.Tensor:
    """Transposed conv with the geometry the weight was packed for; ``post_op`` as in
    :func:`conv`."""
    if traced(x, other):
        return torch.ops.torchquant.conv_transpose(
            x, x_scale, x_zero_point, *_graph_weight(packed), list(packed.stride),
            list(packed.padding), list(packed.output_padding), list(packed.dilation),
            packed.groups, out_scale, out_zero_point, post_op, negative_slope, other,
            other_scale, other_zero_point)
    return _k.quantized_conv_transpose(x, x_scale, x_zero_point, packed, packed.stride,
                                       packed.padding, packed.output_padding, packed.dilation,
                                       packed.groups, out_scale, out_zero_point, post_op,
                                       negative_slope=negative_slope, other=other,
                                       other_scale=other_scale,
                                       other_zero_point=other_zero_point)
