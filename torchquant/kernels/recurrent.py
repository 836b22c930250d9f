"""Whole-direction loops of the dynamic quantized LSTM / GRU: the plain-torch reference.

``ih`` is a direction's input projections for every step (``[T, B, G * H]``, input bias
included); each step projects the hidden state through the int8 hidden weight (the registry's
dynamic Linear) and applies torch's CPU cell, op for op.  The native kernel
(:mod:`torchquant.kernels.native`) runs the same steps in C++.
"""
from __future__ import annotations

import torch

from .linear import dynamic_linear
from .packed_linear import PackedLinearWeight
from .registry import register

__all__ = ["lstm_sequence_reference", "gru_sequence_reference"]


def _steps(length: int, reverse: bool) -> range:
    return range(length - 1, -1, -1) if reverse else range(length)


@register("lstm_sequence", "reference")
def lstm_sequence_reference(ih: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor,
                            packed: PackedLinearWeight, reduce_range: bool,
                            reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(outputs [T, B, H], h_T, c_T)``: gates ``linear(h) + ih[t]`` (i, f, g, o),
    ``c' = f * c + i * g``, ``h' = o * tanh(c')``."""
    h, c = h0, c0
    outputs: list[torch.Tensor] = [h0] * ih.size(0)
    for t in _steps(ih.size(0), reverse):
        gates = dynamic_linear(h, packed, reduce_range).add_(ih[t])
        i, f, g, o = gates.unsafe_chunk(4, 1)
        i, f, g, o = i.sigmoid_(), f.sigmoid_(), g.tanh_(), o.sigmoid_()
        c = (f * c).add_(i * g)
        h = outputs[t] = o * c.tanh()
    return torch.stack(outputs), h, c


@register("gru_sequence", "reference")
def gru_sequence_reference(ih: torch.Tensor, h0: torch.Tensor, packed: PackedLinearWeight,
                           reduce_range: bool, reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(outputs [T, B, H], h_T)``: ``r, z = sigmoid(hh + ih)``,
    ``n = tanh(ih_n + r * hh_n)``, ``h' = (h - n) * z + n``."""
    h = h0
    outputs: list[torch.Tensor] = [h0] * ih.size(0)
    for t in _steps(ih.size(0), reverse):
        hr, hz, hn = dynamic_linear(h, packed, reduce_range).unsafe_chunk(3, 1)
        ir, iz, inn = ih[t].unsafe_chunk(3, 1)
        r = hr.add_(ir).sigmoid_()
        z = hz.add_(iz).sigmoid_()
        n = inn.add(hn.mul_(r)).tanh_()
        h = outputs[t] = (h - n).mul_(z).add_(n)
    return torch.stack(outputs), h
