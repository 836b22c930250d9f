"""Graph helpers the ready quantizers need: source-partition sequences and node predicates.

Partitions come from ``torch.fx.passes.utils.source_matcher_utils`` (generic FX, not part of
torch's quantization stack): they group the aten nodes traced from one module or function, read
from ``source_fn_stack`` / ``torch_fn`` or, for non-strict export, the innermost
``nn_module_stack`` entry.
"""
from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, Optional, Sequence

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node
from torch.fx.passes.utils.source_matcher_utils import (SourcePartition,
                                                        check_subgraphs_connected,
                                                        get_source_partitions)


__all__ = ["find_sequential_partitions", "is_conv_node", "is_conv_transpose_node",
           "SourcePartition", "get_source_partitions"]

# Spellings of the same operation: a pattern step written with one of them matches any.
_EQUIVALENT_SOURCES: list[set] = [
    {torch.nn.Conv1d, F.conv1d},
    {torch.nn.Conv2d, F.conv2d},
    {torch.nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d},
    {torch.nn.ReLU, F.relu, F.relu_},
    {torch.nn.BatchNorm2d, F.batch_norm},
    {torch.nn.Hardtanh, F.hardtanh, F.hardtanh_},
    {torch.add, operator.add, operator.iadd, "add", "add_"},
    {torch.mul, operator.mul, operator.imul, "mul", "mul_"},
]


def _equivalents(source: Any) -> list[Any]:
    found = [source]
    for group in _EQUIVALENT_SOURCES:
        if source in group:
            found.extend(group)
    return found


def find_sequential_partitions(gm: GraphModule, partition_types: Sequence[Any],
                               filter_fn: Optional[Callable[[Node], bool]] = None
                               ) -> list[tuple[SourcePartition, ...]]:
    """Every chain of source partitions, one per entry of ``partition_types`` (module types or
    functions, their equivalent spellings included), where each partition feeds the next."""
    seen: set = set()
    for tp in partition_types:
        group = set(_equivalents(tp))
        if seen & group:
            raise ValueError(f"Invalid partition types: {list(partition_types)}. Each type in "
                             "the sequence must be unique")
        seen |= group
    per_step = []
    for tp in partition_types:
        found = get_source_partitions(gm.graph, _equivalents(tp), filter_fn)
        per_step.append(list(itertools.chain.from_iterable(found.values())))
    return [chain for chain in itertools.product(*per_step)
            if all(check_subgraphs_connected(a, b) for a, b in zip(chain, chain[1:]))]


_CONV_TARGETS = (
    torch.ops.aten.conv1d.default, torch.ops.aten.conv1d.padding,
    torch.ops.aten.conv2d.default, torch.ops.aten.conv2d.padding,
    torch.ops.aten.conv3d.default, torch.ops.aten.conv3d.padding,
)
_CONV_TRANSPOSE_TARGETS = (
    torch.ops.aten.conv_transpose1d, torch.ops.aten.conv_transpose1d.default,
    torch.ops.aten.conv_transpose2d, torch.ops.aten.conv_transpose2d.input,
    torch.ops.aten.conv_transpose3d, torch.ops.aten.conv_transpose3d.input,
)


def is_conv_node(n: Node) -> bool:
    return n.op == "call_function" and n.target in _CONV_TARGETS


def is_conv_transpose_node(n: Node) -> bool:
    return n.op == "call_function" and n.target in _CONV_TRANSPOSE_TARGETS


