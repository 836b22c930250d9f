"""Small FX graph helpers shared by every graph rewrite (FX convert, PT2E prepare / convert /
lowering and reference representation, the quantizers, the numeric debugger, the inductor
freezing pass): fresh attribute names, reading the value behind a dotted ``get_attr`` target,
matching call_function nodes and their one user, and dropping attributes the graph no longer
reads.  A helper every layer may use (torch only)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

__all__ = ["fresh_attr_name", "read_attr", "get_attr_value", "get_attr_tensor",
           "optional_attr_value", "is_call", "only_user", "erase_unused", "drop_unused_attrs"]

_MISSING = object()


def fresh_attr_name(module: torch.nn.Module, prefix: str) -> str:
    """The first ``prefix<i>`` (i = 0, 1, ...) that is not an attribute of ``module`` (dots in
    ``prefix``, as in a qualified node name, become underscores)."""
    prefix = prefix.replace(".", "_")
    i = 0
    while hasattr(module, f"{prefix}{i}"):
        i += 1
    return f"{prefix}{i}"


def read_attr(module: torch.nn.Module, target: str, default: Any = _MISSING) -> Any:
    """``module.<target>`` for a dotted ``target``; ``default`` where a part is missing (an
    AttributeError without it)."""
    value: Any = module
    for part in target.split("."):
        try:
            value = getattr(value, part)
        except AttributeError:
            if default is _MISSING:
                raise
            return default
    return value


def get_attr_value(module: torch.nn.Module, node: Any) -> Any:
    """What a ``get_attr`` node reads from ``module``; None for anything else."""
    if not (isinstance(node, Node) and node.op == "get_attr"):
        return None
    return read_attr(module, str(node.target), None)


def get_attr_tensor(module: torch.nn.Module, node: Any) -> Optional[torch.Tensor]:
    """The tensor a ``get_attr`` node reads from ``module``; None for anything else (another
    node, a non-tensor attribute, a missing one)."""
    value = get_attr_value(module, node)
    return value if isinstance(value, torch.Tensor) else None


def optional_attr_value(module: torch.nn.Module, node: Any) -> Any:
    """What the ``get_attr`` node ``node`` reads from ``module``, None where ``node`` is None
    (an absent optional operand such as a bias); ``ValueError`` for any other argument and
    ``AttributeError`` where the attribute is missing."""
    if node is None:
        return None
    if not (isinstance(node, Node) and node.op == "get_attr"):
        raise ValueError(f"expected a get_attr node for a constant operand, got {node}")
    return read_attr(module, str(node.target))


def is_call(node: Any, targets: Any) -> bool:
    """``node`` is a call_function node calling ``targets`` (one callable, compared by
    identity) or one of them (a tuple, list, set or dict of callables)."""
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    if isinstance(targets, (tuple, list, set, frozenset, dict)):
        return node.target in targets
    return node.target is targets


def only_user(node: Node) -> Optional[Node]:
    """The one node that uses ``node``; None where it has no user or several."""
    return next(iter(node.users)) if len(node.users) == 1 else None


def erase_unused(node: Node, ops: tuple[str, ...] = ("call_function",)) -> list[Node]:
    """Erase ``node`` if nothing uses it, then, transitively, each of its inputs left without a
    user -- nodes whose op is in ``ops``; impure calls stay.  Returns the erased nodes."""
    erased: list[Node] = []
    stack = [node]
    while stack:
        n = stack.pop()
        if n in erased or n.users or n.op not in ops or (n.op == "call_function"
                                                         and n.is_impure()):
            continue
        inputs = list(n.all_input_nodes)
        n.graph.erase_node(n)
        erased.append(n)
        stack.extend(inputs)
    return erased


def drop_unused_attrs(model: GraphModule, prefixes: tuple[str, ...], *,
                      children: bool = False) -> None:
    """Delete ``model``'s own buffers (with ``children``, its direct submodules instead) whose
    name starts with one of ``prefixes`` and that no ``get_attr`` / ``call_module`` node of its
    graph names."""
    used = {str(n.target) for n in model.graph.nodes if n.op in ("get_attr", "call_module")}
    owned = model.named_children() if children else model.named_buffers(recurse=False)
    for name in [n for n, _ in owned]:
        if name not in used and name.startswith(prefixes):
            delattr(model, name)
