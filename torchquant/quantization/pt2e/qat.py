"""Conv + BatchNorm in PT2E QAT (torchao 0.18's ``_fuse_conv_bn_qat`` / ``_fold_conv_bn_qat``,
written as direct graph edits).

prepare: ``conv(x, w, b) -> batch_norm`` becomes::

    scale_factor = bn_weight / sqrt(running_var + eps)
    y = conv(x, w * scale_factor (per out channel), zeros_like(b))
    y = y / scale_factor (per channel) [+ b]
    batch_norm(y, ...)                      # unchanged (batch statistics in training)

so the weight fake quant sees the weight BN will fold into, while the forward stays the float
conv + BN.  convert: before the observers are rewritten, the weight is replaced by the BN-folded
weight (running statistics), the bias by the folded bias, and the division / bias add / BN are
removed; the weight's fake quant then quantizes the folded weight with its trained qparams.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from ..quantizer.quantizer import Q_ANNOTATION_KEY
from ..._graph import read_attr
from .utils import _CONV_OPS, _fused_weights, set_tensor_attr

__all__ = ["fuse_conv_bn_for_qat", "fold_conv_bn_after_qat"]

_META = "_torchquant_qat_conv_bn"
aten = torch.ops.aten


def _single_bn_user(node: Node) -> Optional[Node]:
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op == "call_function" and user.target is aten.batch_norm.default:
        return user
    return None


def fuse_conv_bn_for_qat(model: GraphModule) -> None:
    """In place: rewrite every conv -> batch_norm (constant weights) into the QAT pattern and
    move the conv's weight annotation to the scaled weight."""
    graph = model.graph
    for conv in list(graph.nodes):
        if conv.op != "call_function" or conv.target not in _CONV_OPS:
            continue
        bn = _single_bn_user(conv)
        weight = conv.args[1]
        if bn is None or not isinstance(weight, Node) or weight.op != "get_attr":
            continue
        transpose = _CONV_OPS[conv.target]
        bias = conv.args[2] if len(conv.args) > 2 else None
        bn_weight, running_var, eps = bn.args[1], bn.args[4], bn.args[7]
        if not isinstance(bn_weight, Node) or not isinstance(running_var, Node):
            continue
        rank = read_attr(model, str(weight.target)).dim()
        weight_shape = [1] * rank
        weight_shape[1 if transpose else 0] = -1
        out_shape = [1] * rank
        out_shape[1] = -1
        with graph.inserting_before(conv):
            std = graph.call_function(aten.sqrt.default,
                                      (graph.call_function(aten.add.Tensor,
                                                           (running_var, eps)),))
            factor = graph.call_function(aten.div.Tensor, (bn_weight, std))
            scaled = graph.call_function(
                aten.mul.Tensor,
                (weight, graph.call_function(aten.reshape.default, (factor, weight_shape))))
            zero_bias = (graph.call_function(aten.zeros_like.default, (bias,))
                         if isinstance(bias, Node) else None)
        args = list(conv.args)
        args[1] = scaled
        if len(args) > 2:
            args[2] = zero_bias
        conv.args = tuple(args)
        with graph.inserting_before(bn):  # creation order = graph order
            unscaled = graph.call_function(
                aten.div.Tensor,
                (conv, graph.call_function(aten.reshape.default, (factor, out_shape))))
            out = unscaled
            if isinstance(bias, Node):
                reshaped_bias = graph.call_function(aten.reshape.default, (bias, out_shape))
                out = graph.call_function(aten.add.Tensor, (unscaled, reshaped_bias))
        bn.replace_input_with(conv, out)
        annotation = conv.meta.get(Q_ANNOTATION_KEY)
        if annotation is not None:
            qspecs = annotation.input_qspec_map
            if weight in qspecs:
                qspecs[scaled] = qspecs.pop(weight)
            if isinstance(bias, Node) and bias in qspecs:
                qspecs[zero_bias] = qspecs.pop(bias)
        conv.meta[_META] = {"weight": weight, "bias": bias, "bn": bn, "scaled": scaled,
                            "out": out}
    graph.lint()
    model.recompile()


def fold_conv_bn_after_qat(model: GraphModule) -> None:
    """In place, on a prepared QAT model: fold each rewritten conv's BN (running statistics)
    into its weight and bias and drop the QAT scaling nodes and the BN."""
    graph = model.graph
    for conv in list(graph.nodes):
        info: Optional[dict[str, Any]] = conv.meta.get(_META)
        if info is None or info["bn"] not in graph.nodes:
            continue
        weight, bias, bn, scaled, out = (info[k] for k in ("weight", "bias", "bn", "scaled",
                                                           "out"))
        transpose = _CONV_OPS[conv.target]
        w = read_attr(model, str(weight.target))
        b = read_attr(model, str(bias.target)) if isinstance(bias, Node) else None

        def const(n: Any) -> Optional[torch.Tensor]:
            return read_attr(model, str(n.target)) if isinstance(n, Node) else None

        fused_w, fused_b = _fused_weights(w.detach(), None if b is None else b.detach(),
                                          const(bn.args[3]).detach(), const(bn.args[4]).detach(),
                                          bn.args[7], const(bn.args[1]).detach(),
                                          const(bn.args[2]).detach(), 1 if transpose else 0)
        set_tensor_attr(model, str(weight.target), fused_w, as_parameter=True)
        bias_name = str(bias.target) if isinstance(bias, Node) else str(weight.target) + "_bias"
        set_tensor_attr(model, bias_name, fused_b, as_parameter=True)
        scaled.replace_all_uses_with(weight)
        args = list(conv.args)
        if len(args) < 3:
            args.append(None)
        with graph.inserting_before(conv):
            args[2] = graph.get_attr(bias_name) if not isinstance(bias, Node) else bias
        # an observer may sit on the bias edge (zeros_like); the folded bias replaces it
        conv.args = tuple(args)
        # the BN output (and its users / observers) now reads the conv directly
        bn.replace_all_uses_with(conv)
        graph.erase_node(bn)
        del conv.meta[_META]
    graph.eliminate_dead_code()
    graph.lint()
    model.recompile()
