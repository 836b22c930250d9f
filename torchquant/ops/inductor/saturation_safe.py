"""In AOTInductor packages built where oneDNN's u8 x s8 products saturate (AVX2, AVX-512
without VNNI): eager- / FX-converted int8 convs and Linears as the eager kernels' exact split.

There the eager kernels split an input with values above 128 into ``lo = x & 127`` and
``hi = x >> 7`` (:func:`torchquant.kernels.conv._halves_float`,
:func:`torchquant.kernels.linear.onednn_split_linear`): oneDNN is exact on both, and
``(x - zp) . w = (lo - zp) . w + 128 * hi . w``.  Its two float32-output calls (the bias with
``lo``) summed, then the eager requantization
(:func:`torchquant.kernels.post_ops.quantize_post_op`: the add of a quint8 addend
``(float(q) - zp) * scale``, ReLU, ``round(fma(y, 1 / out_scale, zp))`` clamped), emitted here
as nodes of the frozen graph: every call is oneDNN's or inductor's generated code, so the
package runs without torchquant, and it gives the integers of the eager split on every CPU
(a VNNI / AMX CPU computes the two halves exactly too).  A package cannot look at the data:
it always splits, which gives the floats of eager's one float call where no input exceeds
127; eager takes oneDNN's fused requantization for an input whose maximum is at most 128,
which can round a tie one step apart.  1x1 convs with a stride run on the subsampled input at
stride 1, as eager does on these CPUs (:func:`torchquant.kernels.conv._unit_stride_twin`).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import fx

from ... import affine

__all__ = ["conv", "linear"]

aten = torch.ops.aten
prims = torch.ops.prims

_HIGH_SHIFT = 7  # hi = x >> 7, lo = x & 127: both halves at most 127
_LOW_MASK = 127
_INT64_MAX = 2 ** 63 - 1


class _Emitter:
    """Nodes inserted before ``before``, each with the fake value later passes read."""

    def __init__(self, g: Any, before: fx.Node) -> None:
        self.g, self.before = g, before

    def call(self, target: Any, args: tuple, val: Any, kwargs: Optional[dict] = None) -> fx.Node:
        with self.before.graph.inserting_before(self.before):
            node = self.before.graph.call_function(target, args, kwargs or {})
        node.meta["val"] = val
        return node

    def constant(self, value: torch.Tensor, hint: str) -> fx.Node:
        return self.g.constant(value, self.before, hint)

    def scalar(self, value: float) -> fx.Node:
        """A float32 0-d constant (``prims.fma`` takes tensors)."""
        return self.constant(torch.tensor(affine.round_to_float32(value), dtype=torch.float32),
                             "split_scalar")


def _halves(e: _Emitter, x: fx.Node) -> tuple[fx.Node, fx.Node]:
    val = x.meta["val"]
    lo = e.call(aten.bitwise_and.Scalar, (x, _LOW_MASK), torch.empty_like(val))
    hi = e.call(aten.bitwise_right_shift.Tensor_Scalar, (x, _HIGH_SHIFT), torch.empty_like(val))
    return lo, hi


def _requantize(e: _Emitter, y: fx.Node, post_op: str, other: Optional[tuple],
                out_scale: float, out_zp: int, layout: torch.memory_format) -> fx.Node:
    """quantize_post_op's integers: the addend, ReLU, ``round(fma(y, inv, zp))`` clamped."""
    fval = y.meta["val"]
    if post_op in ("add", "add_relu"):
        q_other, other_scale, other_zp = other
        o = e.call(prims.convert_element_type.default, (q_other, torch.float32),
                   torch.empty_like(q_other.meta["val"], dtype=torch.float32))
        o = e.call(aten.sub.Tensor, (o, float(other_zp)), o.meta["val"])
        o = e.call(aten.mul.Tensor, (o, affine.round_to_float32(other_scale)), o.meta["val"])
        y = e.call(aten.add.Tensor, (y, o), fval)
    if post_op in ("relu", "add_relu"):
        y = e.call(aten.relu.default, (y,), fval)
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma)
    q = e.call(prims.fma.default, (y, e.scalar(affine.inv_scale_float32(out_scale)),
                                   e.scalar(float(out_zp))), fval)
    q = e.call(aten.round.default, (q,), fval)
    q = e.call(aten.clamp_min.default, (q, 0.0), fval)  # (inductor lowers these, not clamp)
    q = e.call(aten.clamp_max.default, (q, 255.0), fval)
    q = e.call(prims.convert_element_type.default, (q, torch.uint8),
               torch.empty_like(fval, dtype=torch.uint8))
    if layout != torch.contiguous_format:
        q = e.call(aten.clone.default, (q,), torch.empty_like(q.meta["val"],
                                                               memory_format=layout),
                   {"memory_format": layout})
    return q


def _subsampled(e: _Emitter, x: fx.Node, stride: list[int]) -> fx.Node:
    """Every ``stride``-th spatial position, channels-last (eager's ``_subsampled``)."""
    for dim, s in enumerate(stride, start=2):
        val = x.meta["val"]
        index = [slice(None)] * val.dim()
        index[dim] = slice(None, None, s)
        x = e.call(aten.slice.Tensor, (x, dim, 0, _INT64_MAX, s), val[tuple(index)])
    val = x.meta["val"].contiguous(memory_format=torch.channels_last)
    return e.call(aten.clone.default, (x,), val, {"memory_format": torch.channels_last})


def conv(g: Any, node: fx.Node, x: fx.Node, x_scale: float, x_zp: int, w: torch.Tensor,
         w_scale: torch.Tensor, bias: Optional[torch.Tensor], geometry: tuple, post_op: str,
         other: Optional[tuple], out_scale: float, out_zp: int,
         x_shape: Optional[list[int]]) -> None:
    """Replace ``torchquant::conv`` ``node`` (a 2-d quint8 conv, frozen int8 weight with zero
    zero points) by the split of eager's kernel on these CPUs and its requantization."""
    stride, padding, dilation, groups = geometry
    e = _Emitter(g, node)
    if all(k == 1 for k in w.shape[2:]) and any(s != 1 for s in stride) and not any(padding):
        x = _subsampled(e, x, list(stride))
        stride = [1] * len(stride)
        x_shape = None if x_shape is None else list(x.meta["val"].shape)
    geometry = (list(stride), list(padding), list(dilation), groups)
    w_zp = e.constant(torch.zeros(w.size(0), dtype=torch.int64), "weight_zp")
    w_scale_node = e.constant(w_scale, "weight_scale")
    bias_node = None if bias is None else e.constant(bias.to(torch.float32), "bias")
    fval = torch.empty_like(node.meta["val"], dtype=torch.float32,
                            memory_format=torch.channels_last)
    lo, hi = _halves(e, x)
    hi_scale = x_scale * 128.0
    calls = []
    for half, scale, zp, b in ((lo, x_scale, x_zp, bias_node), (hi, hi_scale, 0, None)):
        packed = torch.ops.onednn.qconv_prepack(w.contiguous(), w_scale, scale, zp, *geometry,
                                                x_shape)
        calls.append(e.call(torch.ops.onednn.qconv_pointwise.default,
                            (half, scale, zp, e.constant(packed, "packed_conv_weight"),
                             w_scale_node, w_zp, b, *geometry, 1.0, 0, torch.float32, "none",
                             [], ""), fval))
    y = e.call(aten.add.Tensor, tuple(calls), fval)
    node.replace_all_uses_with(_requantize(e, y, post_op, other, out_scale, out_zp,
                                           torch.channels_last))


def linear(g: Any, node: fx.Node, x: fx.Node, x_scale: float, x_zp: int, w: torch.Tensor,
           w_scale: torch.Tensor, bias: Optional[torch.Tensor], post_op: str,
           out_scale: float, out_zp: int) -> None:
    """Replace ``torchquant::linear`` ``node`` (2-d quint8 input, frozen int8 weight with zero
    zero points, quint8 output, no post-op or ReLU) by eager's split and requantization."""
    e = _Emitter(g, node)
    packed = e.constant(torch.ops.onednn.qlinear_prepack(w.contiguous(), None),
                        "packed_linear_weight")
    w_zp = e.constant(torch.zeros(w.size(0), dtype=torch.int64), "weight_zp")
    w_scale_node = e.constant(w_scale, "weight_scale")
    bias_node = None if bias is None else e.constant(bias.to(torch.float32), "bias")
    fval = torch.empty_like(node.meta["val"], dtype=torch.float32)
    lo, hi = _halves(e, x)
    calls = [e.call(torch.ops.onednn.qlinear_pointwise.default,
                    (half, scale, zp, packed, w_scale_node, w_zp, b, 1.0, 0, torch.float32,
                     "none", [], ""), fval)
             for half, scale, zp, b in ((lo, x_scale, x_zp, bias_node),
                                        (hi, x_scale * 128.0, 0, None))]
    y = e.call(aten.add.Tensor, tuple(calls), fval)
    node.replace_all_uses_with(_requantize(e, y, post_op, None, out_scale, out_zp,
                                           torch.contiguous_format))
