"""Matching backend patterns (reversed nested tuple format, ``(relu, (bn, conv))``) on FX graphs.

A pattern element is a module class (a ``call_module`` node of exactly that type), a function
(``call_function`` with that target) or a method name string (``call_method``).  Nodes are
visited last to first and each node belongs to at most one match; patterns with more nodes are
tried first.  Inner nodes of a multi-node match must have a single user.  ``MatchAllNode``
matches any argument (the other operand of conv + add): it stands in the matched node pattern,
so a config's root-node / extra-inputs getters can index it, but it is an input of the match,
not a member.
"""
from __future__ import annotations

import sys
from typing import Any, Iterable, Optional

import torch
from torch.fx import Graph, Node

from ..utils import MatchAllNode

__all__ = ["is_match", "find_matches", "pattern_size", "flatten_node_pattern", "root_node_of",
           "match_members"]


def pattern_size(pattern: Any) -> int:
    if isinstance(pattern, tuple):
        return sum(pattern_size(p) for p in pattern)
    return 1


def _node_is(modules: dict[str, torch.nn.Module], node: Node, element: Any) -> bool:
    if isinstance(element, type) and issubclass(element, torch.nn.Module):
        return node.op == "call_module" and type(modules.get(str(node.target))) is element
    if isinstance(element, str):
        return node.op == "call_method" and node.target == element
    if callable(element):
        return node.op == "call_function" and node.target is element
    return False


def is_match(modules: dict[str, torch.nn.Module], node: Any, pattern: Any,
             max_uses: int = sys.maxsize) -> bool:
    if pattern is MatchAllNode:
        return isinstance(node, Node)
    if isinstance(pattern, tuple):
        self_match, *arg_matches = pattern
    else:
        self_match, arg_matches = pattern, []
    if not isinstance(node, Node) or len(node.users) > max_uses:
        return False
    if not _node_is(modules, node, self_match):
        return False
    if not arg_matches:
        return True
    if len(arg_matches) > len(node.args):
        return False
    return all(is_match(modules, arg, sub, max_uses=1) for arg, sub in zip(node.args, arg_matches))


def node_pattern_of(node: Node, pattern: Any) -> Any:
    """The matched nodes in the pattern's nested structure."""
    if isinstance(pattern, tuple):
        self_match, *arg_matches = pattern
        return (node, *[node_pattern_of(arg, sub) for arg, sub in zip(node.args, arg_matches)])
    return node


def match_members(node_pattern: Any, pattern: Any) -> list[Node]:
    """The nodes of a match (last first), without those ``MatchAllNode`` stood for."""
    if isinstance(pattern, tuple):
        out: list[Node] = []
        for p, n in zip(pattern, node_pattern):
            out.extend(match_members(n, p))
        return out
    return [] if pattern is MatchAllNode else [node_pattern]


def flatten_node_pattern(node_pattern: Any) -> list[Node]:
    if isinstance(node_pattern, tuple):
        out: list[Node] = []
        for p in node_pattern:
            out.extend(flatten_node_pattern(p))
        return out
    return [node_pattern]


def root_node_of(node_pattern: Any) -> Node:
    """The first node executed in the pattern (conv in ``(relu, (bn, conv))``)."""
    while isinstance(node_pattern, tuple):
        node_pattern = node_pattern[-1]
    return node_pattern


def find_matches(graph: Graph, modules: dict[str, torch.nn.Module], patterns: Iterable[Any],
                 skip: Optional[set[str]] = None
                 ) -> dict[str, tuple[Node, Any, Any]]:
    """node name -> (last node, matched node pattern, pattern) for every node of every match."""
    ordered = sorted(patterns, key=pattern_size, reverse=True)
    matches: dict[str, tuple[Node, Any, Any]] = {}
    for node in reversed(graph.nodes):
        if node.name in matches or (skip and node.name in skip):
            continue
        for pattern in ordered:
            if not is_match(modules, node, pattern):
                continue
            node_pattern = node_pattern_of(node, pattern)
            members = match_members(node_pattern, pattern)
            if any(n.name in matches for n in members):
                continue
            for n in members:
                matches[n.name] = (node, node_pattern, pattern)
            break
    return matches
