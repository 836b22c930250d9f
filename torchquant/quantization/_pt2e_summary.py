"""Coverage of a PT2E (exported) model: for each op of the exported graph, whether it is
quantized (a dequantize feeds it or a quantize reads it), observed (prepared, not converted yet)
or float, and why it stayed float -- so a quantizer that silently annotated nothing, or an
annotation that produced no quantize / dequantize, shows.

:func:`node_coverage` returns plain tuples; ``torchquant.quantization.summary.summary`` wraps
them for exported models, and ``prepare_pt2e`` / ``convert_pt2e`` warn with
:func:`annotated_but_float`.
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from .pt2e.convert import DEQUANTIZE_OPS, QUANTIZE_OPS
from .pt2e.utils import is_observer_node
from .quantizer.quantizer import Q_ANNOTATION_KEY

__all__ = ["node_coverage", "annotated_but_float", "ANNOTATED_NO_QDQ", "ANNOTATED_NO_OBSERVER"]

ANNOTATED_NO_QDQ = "annotated, but no quantize / dequantize was inserted around it"
ANNOTATED_NO_OBSERVER = "annotated, but no observer was inserted around it"
NOT_ANNOTATED = "not annotated by the quantizer (no pattern / config of it covers this op)"
ANNOTATED_FLOAT = "annotated to stay float (its annotation has no quantization spec)"
_SKIPPED = (operator.getitem,)


def _has_spec(node: Node) -> bool:
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    if annotation is None:
        return False
    return (any(spec is not None for spec in annotation.input_qspec_map.values())
            or annotation.output_qspec is not None)


def _inserted_by_convert(node: Node) -> bool:
    """A quantize / dequantize op, or a call convert added around one (those carry no export
    ``val`` metadata: dynamic-quantization arithmetic, float16 casts, reference arithmetic)."""
    if node.op != "call_function":
        return False
    return node.target in QUANTIZE_OPS or node.target in DEQUANTIZE_OPS or "val" not in node.meta


def _listed(node: Node) -> bool:
    if node.op != "call_function" or node.target in _SKIPPED:
        return False
    if node.target in QUANTIZE_OPS or node.target in DEQUANTIZE_OPS:
        return False
    return isinstance(node.meta.get("val"), torch.Tensor)


def node_coverage(model: GraphModule, prepared: Optional[bool] = None
                  ) -> list[tuple[str, str, str, Optional[str]]]:
    """``(node name, op, state, reason)`` for each tensor-producing op of the exported graph
    (q/dq ops and nodes convert inserted are not listed).  State: "quantized" (annotated with a
    spec, and a dequantize feeds it or a quantize reads it), "observed" (the same with
    observers, before convert) or "float", with the reason.  An op that only passes along
    dequantized values without an annotation (a transpose after a quantized linear) is float:
    it computes in float.  ``prepared`` (default: the graph has observers) picks the reason
    given to annotated ops without any.  An op fused into the quantized op before it (the
    ReLU of conv + ReLU) is "fused"."""
    modules = dict(model.named_modules(remove_duplicate=False))
    if prepared is None:
        prepared = any(is_observer_node(n, modules) for n in model.graph.nodes)
    rows = []
    for node in model.graph.nodes:
        if not _listed(node):
            continue
        neighbours = list(node.all_input_nodes) + list(node.users)
        state, reason = "float", None
        if Q_ANNOTATION_KEY not in node.meta:
            reason = NOT_ANNOTATED
        elif not _has_spec(node):
            reason = ANNOTATED_FLOAT
        elif any(_inserted_by_convert(n) for n in neighbours):
            state = "quantized"
        elif any(is_observer_node(n, modules) for n in neighbours):
            state = "observed"
        else:
            reason = ANNOTATED_NO_OBSERVER if prepared else ANNOTATED_NO_QDQ
        rows.append((node.name, _op_name(node.target), state, reason))
    return _mark_fused(model, rows)


def _mark_fused(model: GraphModule, rows: list[tuple[str, str, str, Optional[str]]]
                ) -> list[tuple[str, str, str, Optional[str]]]:
    """An op annotated without a spec right after a quantized / observed op (the ReLU of a
    conv + ReLU pattern) is part of that pattern: state "fused", naming the op it is fused
    into, not "float"."""
    state_of = {name: state for name, _, state, _ in rows}
    nodes = {n.name: n for n in model.graph.nodes}
    marked = []
    for name, op, state, reason in rows:
        if reason == ANNOTATED_FLOAT:
            producer = _producer(nodes[name])
            if producer is not None and state_of.get(producer.name) in ("quantized", "observed") \
                    and len(producer.users) == 1:
                state, reason = "fused", f"fused into {producer.name}"
        marked.append((name, op, state, reason))
    return marked


def _producer(node: Node) -> Optional[Node]:
    """The op computing ``node``'s first input, looking through observers / q / dq nodes."""
    args = [a for a in node.args if isinstance(a, Node)]
    current = args[0] if args else None
    while current is not None and (current.op == "call_module" or (
            current.op == "call_function" and (current.target in QUANTIZE_OPS
                                               or current.target in DEQUANTIZE_OPS))):
        inputs = [a for a in current.args if isinstance(a, Node)]
        current = inputs[0] if inputs else None
    return current


def _op_name(target: Any) -> str:
    name = str(target)
    return name[len("aten."):] if name.startswith("aten.") else name


def annotated_but_float(model: GraphModule, prepared: bool) -> list[str]:
    """``name (op)`` of every op a quantizer gave a quantization spec that ended up with no
    observer (``prepared``) / quantize / dequantize around it."""
    return [f"{name} ({op})" for name, op, _, reason in node_coverage(model, prepared)
            if reason in (ANNOTATED_NO_QDQ, ANNOTATED_NO_OBSERVER)]
