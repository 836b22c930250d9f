"""``fuse_fx``'s pass: replace fusable node patterns by the BackendConfig's fused modules."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ..backend_config import BackendConfig
from ..backend_config.utils import (get_fuser_method_mapping,
                                    get_fusion_pattern_to_extra_inputs_getter,
                                    get_fusion_pattern_to_root_node_getter)
from ..utils import MatchAllNode
from .match_utils import find_matches, match_members, root_node_of

__all__ = ["fuse_graph_module"]

_FUNCTIONAL_RELUS = (F.relu, torch.relu)


def _module_of(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node,
               root: torch.nn.Module) -> Any:
    """What a fuser method gets for one matched node: its module, a ReLU module for a
    functional ReLU, the function itself for another function (``torch.add`` of conv + add)."""
    if node.op == "call_module":
        return modules[str(node.target)]
    if (node.op == "call_function" and node.target in _FUNCTIONAL_RELUS) or (
            node.op == "call_method" and node.target == "relu"):
        relu = torch.nn.ReLU()
        relu.training = root.training
        return relu
    if node.op == "call_function":
        return node.target
    raise RuntimeError(f"FX fusion: cannot turn node {node.format_node()} into a module")


def _modules_of(gm, modules, node_pattern: Any, pattern: Any, root: torch.nn.Module) -> Any:
    if pattern is MatchAllNode:  # an input of the match (conv + add's other operand)
        return MatchAllNode
    if isinstance(node_pattern, tuple):
        return tuple(_modules_of(gm, modules, n, p, root) for n, p in zip(node_pattern, pattern))
    return _module_of(gm, modules, node_pattern, root)


def _set_module(gm: torch.nn.Module, path: str, module: torch.nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = gm.get_submodule(parent_path) if parent_path else gm
    setattr(parent, name, module)


def fuse_graph_module(gm: GraphModule, backend_config: BackendConfig, is_qat: bool) -> GraphModule:
    """Fuse in place (the root node keeps its name and module path) and recompile."""
    fusers = get_fuser_method_mapping(backend_config)
    root_getters = get_fusion_pattern_to_root_node_getter(backend_config)
    extra_inputs_getters = get_fusion_pattern_to_extra_inputs_getter(backend_config)
    modules = dict(gm.named_modules(remove_duplicate=False))
    matches = find_matches(gm.graph, modules, fusers.keys())
    done = set()
    dropped: set[str] = set()
    for name, (last, node_pattern, pattern) in list(matches.items()):
        if last.name in done:
            continue
        done.add(last.name)
        getter = root_getters.get(pattern)
        root = getter(node_pattern) if getter is not None else root_node_of(node_pattern)
        members = match_members(node_pattern, pattern)
        extra_getter = extra_inputs_getters.get(pattern)
        extra_inputs = list(extra_getter(node_pattern)) if extra_getter is not None else []
        if root.op != "call_module" or any(n in members for n in extra_inputs):
            continue
        root_module = modules[str(root.target)]
        pattern_modules = _modules_of(gm, modules, node_pattern, pattern, root_module)
        if not isinstance(pattern_modules, tuple):
            pattern_modules = (pattern_modules,)
        fused = fusers[pattern](is_qat, *pattern_modules)
        _set_module(gm, str(root.target), fused)
        if extra_inputs:
            # the fused module also reads the match's other inputs: it runs where the match
            # ended, after all of them
            root.args = (*root.args, *extra_inputs)
            last.prepend(root)
        if last is not root:
            last.replace_all_uses_with(root)
            for node in members:
                if node is not root:
                    gm.graph.erase_node(node)
                    if node.op == "call_module":
                        dropped.add(str(node.target))
    still_used = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}
    for path in dropped - still_used:
        parent_path, _, name = path.rpartition(".")
        parent = gm.get_submodule(parent_path) if parent_path else gm
        delattr(parent, name)
    gm.graph.lint()
    gm.recompile()
    gm.delete_all_unused_submodules()
    return gm
