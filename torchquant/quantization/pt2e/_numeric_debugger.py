"""The PT2E numeric debugger: integer handles on the nodes of an exported program, loggers that
record what each handle's node produced, and a comparison of two runs handle by handle
(semantics of torchao 0.18's ``torchao.quantization.pt2e._numeric_debugger``, keyed by the
integer handles the reference documentation describes rather than by node provenance).

    ep = torch.export.export(model, args)
    generate_numeric_debug_handle(ep)                 # before prepare_pt2e
    float_gm = ep.module()
    quant_gm = convert_pt2e(calibrate(prepare_pt2e(ep.module(), quantizer)))
    ref = prepare_for_propagation_comparison(float_gm); ref(*args)
    act = prepare_for_propagation_comparison(quant_gm); act(*args)
    summary = compare_results(extract_results_from_loggers(ref), extract_results_from_loggers(act))

Handles live in ``node.meta["custom"]["numeric_debug_handle"]``; ``prepare_pt2e`` gives an
output observer the handle of the node it observes and an input-edge observer (activations,
weights) the handle of its consumer (:func:`inherit_debug_handle`); ``convert_pt2e`` gives the
quantize / dequantize nodes replacing an observer the observer's handle
(:func:`debug_handle_from_observer`).  Input-edge q / dq come before their consumer, so the
last node of a handle's group, the one logged, is the op itself or the dequantize of its
output: the node torchao 0.18 logs for it.
"""
from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ..._graph import read_attr

__all__ = ["CUSTOM_KEY", "NUMERIC_DEBUG_HANDLE_KEY", "FROM_NODE_KEY",
           "generate_numeric_debug_handle", "prepare_for_propagation_comparison", "OutputLogger",
           "extract_results_from_loggers", "compare_results", "QuantizationComparisonResult",
           "NodeAccuracySummary", "NodeSourceDebugInfo", "get_debug_handle",
           "get_debug_info", "inherit_debug_handle",
           "debug_handle_from_observer", "compute_sqnr"]

CUSTOM_KEY = "custom"
NUMERIC_DEBUG_HANDLE_KEY = "numeric_debug_handle"
FROM_NODE_KEY = "from_node"

# where a handle came from: the node of the exported program it was generated for, and the
# index of that node's graph (0: the top graph, then its subgraphs breadth first)
_SOURCE_NAME_KEY = "numeric_debug_source_name"
_SOURCE_GRAPH_KEY = "numeric_debug_source_graph"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSourceDebugInfo:
    """torchao's key for a logged value: ``name`` is the node of the exported program the
    debug handle was generated for, ``graph_id`` the index of its graph (0: the top graph;
    deterministic, so programs saved and loaded again compare).  ``handle`` is torchquant's
    integer handle of it, kept available; it takes no part in equality or hashing, so
    ``NodeSourceDebugInfo(name=..., graph_id=...)`` looks results up as in torchao."""
    name: str
    graph_id: int
    handle: Optional[int] = field(default=None, compare=False)


Results = dict[NodeSourceDebugInfo, tuple[Optional[str], object, list[object]]]


def get_debug_handle(node: Node) -> Optional[int]:
    """The numeric debug handle of ``node``, None when it has none."""
    custom = node.meta.get(CUSTOM_KEY)
    if not isinstance(custom, dict):
        return None
    return custom.get(NUMERIC_DEBUG_HANDLE_KEY)


def get_debug_info(node: Node) -> Optional[NodeSourceDebugInfo]:
    """The :class:`NodeSourceDebugInfo` of ``node``'s handle, None when it has no handle (a
    handle given without its source -- by hand -- is named ``handle_<n>`` in graph 0)."""
    handle = get_debug_handle(node)
    if handle is None:
        return None
    custom = node.meta[CUSTOM_KEY]
    name = custom.get(_SOURCE_NAME_KEY)
    if name is None:
        return NodeSourceDebugInfo(f"handle_{handle}", 0, handle)
    return NodeSourceDebugInfo(str(name), int(custom.get(_SOURCE_GRAPH_KEY, 0)), handle)


def inherit_debug_handle(source: Node, new: Node) -> None:
    """Give ``new`` (an observer, quantize or dequantize node) the handle of ``source``, the op
    it serves (and where that handle came from); no-op when ``source`` has none."""
    handle = get_debug_handle(source)
    if handle is None:
        return
    custom = new.meta.get(CUSTOM_KEY)
    new.meta[CUSTOM_KEY] = dict(custom) if isinstance(custom, dict) else {}
    new.meta[CUSTOM_KEY][NUMERIC_DEBUG_HANDLE_KEY] = handle
    for key in (_SOURCE_NAME_KEY, _SOURCE_GRAPH_KEY):
        if key in source.meta[CUSTOM_KEY]:
            new.meta[CUSTOM_KEY][key] = source.meta[CUSTOM_KEY][key]
        else:
            new.meta[CUSTOM_KEY].pop(key, None)


def debug_handle_from_observer(observer: Node, new: Node) -> None:
    """A quantize / dequantize node replacing ``observer`` carries the observer's handle (that
    of the op it serves), none when the observer has none."""
    handle = get_debug_handle(observer)
    custom = new.meta.get(CUSTOM_KEY)
    if handle is not None:
        inherit_debug_handle(observer, new)
    elif isinstance(custom, dict) and NUMERIC_DEBUG_HANDLE_KEY in custom:
        new.meta[CUSTOM_KEY] = {k: v for k, v in custom.items() if k not in
                                (NUMERIC_DEBUG_HANDLE_KEY, _SOURCE_NAME_KEY, _SOURCE_GRAPH_KEY)}


def _subgraph_modules(gm: torch.nn.Module) -> list[GraphModule]:
    """The control-flow subgraphs (cond / map / while bodies) the graph of ``gm`` reads."""
    found = []
    for node in gm.graph.nodes:
        if node.op != "get_attr":
            continue
        target = read_attr(gm, str(node.target), None)
        if isinstance(target, GraphModule):
            found.append(target)
    return found


def _nodes_bfs(gm: torch.nn.Module) -> Iterator[tuple[int, Node]]:
    """``(graph index, node)`` for every node but placeholders / outputs of ``gm`` and its
    subgraphs, breadth first (graph 0 is ``gm``'s)."""
    queue = [gm]
    index = 0
    while queue:
        current = queue.pop(0)
        for node in current.graph.nodes:
            if node.op not in ("placeholder", "output"):
                yield index, node
        index += 1
        queue.extend(_subgraph_modules(current))


def generate_numeric_debug_handle(ep: torch.export.ExportedProgram) -> None:
    """In place: give every node of ``ep`` (all subgraphs, breadth first) except placeholders a
    unique integer handle in ``node.meta["custom"]["numeric_debug_handle"]``; nodes that have
    one keep it, new handles count on from the largest existing one."""
    if not isinstance(ep, torch.export.ExportedProgram):
        raise ValueError(f"generate_numeric_debug_handle expects an ExportedProgram "
                         f"(torch.export.export(...)), got {type(ep).__name__}")
    largest = 0
    for _, node in _nodes_bfs(ep.graph_module):
        handle = get_debug_handle(node)
        if handle is not None:
            largest = max(largest, int(handle))
    next_handle = largest + 1
    for graph_index, node in _nodes_bfs(ep.graph_module):
        custom = node.meta.setdefault(CUSTOM_KEY, {})
        if NUMERIC_DEBUG_HANDLE_KEY not in custom:
            custom[NUMERIC_DEBUG_HANDLE_KEY] = next_handle
            custom[_SOURCE_NAME_KEY] = node.name
            custom[_SOURCE_GRAPH_KEY] = graph_index
            next_handle += 1


def _detach(x: object) -> object:
    if isinstance(x, torch.Tensor):
        return x.detach()
    if isinstance(x, (list, tuple)):
        return type(x)(_detach(e) for e in x)
    if isinstance(x, dict):
        return {k: _detach(v) for k, v in x.items()}
    return x


class OutputLogger(torch.nn.Module):
    """Records (detached) every value that flows through it into ``stats`` and returns it."""

    _is_impure = True  # keep dead-code elimination from removing the call

    def __init__(self, debug_info: Union[NodeSourceDebugInfo, int],
                 node_name: Optional[str] = None,
                 nn_module_stack: Optional[object] = None) -> None:
        super().__init__()
        if not isinstance(debug_info, NodeSourceDebugInfo):  # an integer handle
            debug_info = NodeSourceDebugInfo(f"handle_{debug_info}", 0, int(debug_info))
        self.debug_info = debug_info
        self.node_name = node_name
        self.nn_module_stack = nn_module_stack
        self.stats: list[object] = []

    @property
    def debug_handle(self) -> Optional[int]:
        return self.debug_info.handle

    def forward(self, x: object) -> object:
        self.stats.append(_detach(x))
        return x

    def extra_repr(self) -> str:
        return (f"debug_info={self.debug_info}, node_name={self.node_name}, "
                f"num_stats={len(self.stats)}")


def _unique_child_name(model: torch.nn.Module, prefix: str) -> str:
    name, i = prefix, 0
    while hasattr(model, name):
        i += 1
        name = f"{prefix}_{i}"
    return name


def prepare_for_propagation_comparison(model: GraphModule) -> GraphModule:
    """A copy of ``model`` with an :class:`OutputLogger` after the last node (in graph order)
    of each group of nodes sharing a debug handle; run it, then read the loggers with
    :func:`extract_results_from_loggers`."""
    if not isinstance(model, GraphModule):
        raise TypeError(f"prepare_for_propagation_comparison expects a GraphModule, got "
                        f"{type(model).__name__}")
    model = copy.deepcopy(model)
    last_of_handle: dict[int, Node] = {}
    for node in model.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        handle = get_debug_handle(node)
        if handle is not None:
            last_of_handle[handle] = node
    for handle, node in last_of_handle.items():
        name = _unique_child_name(model, f"{node.name}_logger")
        model.add_module(name, OutputLogger(get_debug_info(node), node.name,
                                            node.meta.get("nn_module_stack")))
        with model.graph.inserting_after(node):
            logger_node = model.graph.call_module(name, (node,))
        for user in list(node.users):
            if user is not logger_node:
                user.replace_input_with(node, logger_node)
    model.recompile()
    return model


def extract_results_from_loggers(model: GraphModule) -> Results:
    """``{NodeSourceDebugInfo: (node_name, nn_module_stack, [one recorded value per forward
    call])}`` (torchao's shape; each key's ``.handle`` is the integer handle) for every logger
    of ``model`` that recorded something."""
    results: Results = {}
    for _, module in model.named_children():
        if isinstance(module, OutputLogger) and module.stats:
            results[module.debug_info] = (module.node_name, module.nn_module_stack,
                                          module.stats)
    return results


def _plain(x: object) -> object:
    """QTensors (eager-converted models) compare by their dequantized values."""
    if isinstance(x, torch.Tensor) and hasattr(x, "int_repr") and hasattr(x, "q_scale") \
            and type(x) is not torch.Tensor:
        return x.dequantize()
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(e) for e in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _shapes_match(x: object, y: object) -> bool:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return x.shape == y.shape
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return all(_shapes_match(a, b) for a, b in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return all(k in y and _shapes_match(v, y[k]) for k, v in x.items())
    return type(x) is type(y) and x == y


def _structured_loss(fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], x: object,
                     y: object) -> object:
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return fn(x.to(torch.float32), y.to(torch.float32))
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return type(x)(_structured_loss(fn, a, b) for a, b in zip(x, y))
    if isinstance(x, dict) and isinstance(y, dict):
        return {k: _structured_loss(fn, v, y[k]) for k, v in x.items()}
    return None


def compute_sqnr(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``20 * log10(||x|| / ||x - y||)`` in dB (the signal is the first argument)."""
    return 20 * torch.log10(torch.linalg.norm(x) / torch.linalg.norm(x - y))


@dataclass(frozen=True)
class QuantizationComparisonResult:
    """One recorded value of a handle in the actual (e.g. quantized) and the reference run.
    Losses are called as ``loss_function(actual, ref)`` (torchao's order, so ``sqnr`` uses the
    actual value as the signal) on float32 copies; non-tensor values give None."""
    actual: object
    ref: object

    def __post_init__(self) -> None:
        for what in ("actual", "ref"):
            if not isinstance(getattr(self, what), (torch.Tensor, list, tuple, dict)):
                raise ValueError(f"`{what}` must be a Tensor, list, tuple or dict, got "
                                 f"{type(getattr(self, what)).__name__}")
        object.__setattr__(self, "actual", _plain(self.actual))
        object.__setattr__(self, "ref", _plain(self.ref))
        if not _shapes_match(self.ref, self.actual):
            raise ValueError("cannot compare values of different shapes: ref "
                             f"{_shape_text(self.ref)} vs actual {_shape_text(self.actual)}")

    @property
    def mse_loss(self) -> object:
        return self.loss(F.mse_loss)

    @property
    def sqnr(self) -> object:
        return self.loss(compute_sqnr)

    def loss(self, loss_function: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> object:
        return _structured_loss(loss_function, self.actual, self.ref)

    def __repr__(self) -> str:  # the tensors themselves are too large to print
        return f"QuantizationComparisonResult(mse_loss={self.mse_loss}, sqnr={self.sqnr})"


def _shape_text(x: object) -> str:
    if isinstance(x, torch.Tensor):
        return str(tuple(x.shape))
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_shape_text(e) for e in x) + "]"
    if isinstance(x, dict):
        return "{" + ", ".join(f"{k}: {_shape_text(v)}" for k, v in x.items()) + "}"
    return repr(x)


@dataclass(frozen=True)
class NodeAccuracySummary:
    """torchao's shape (``debug_info`` first); ``handle`` gives the integer handle."""
    debug_info: NodeSourceDebugInfo
    actual_node_name: str
    actual_module_stack: str
    ref_node_name: str
    ref_module_stack: str
    results: Sequence[QuantizationComparisonResult]

    @property
    def handle(self) -> Optional[int]:
        return self.debug_info.handle


def module_stack_to_str(module_stack: object) -> str:
    """The innermost module path of an ``nn_module_stack`` (``"layer1.0.conv1"``)."""
    if not isinstance(module_stack, dict) or not module_stack:
        return str(module_stack)
    innermost = list(module_stack.values())[-1]
    return str(innermost[0] if isinstance(innermost, (tuple, list)) else innermost)


def compare_results(ref_results: dict, actual_results: dict) -> dict:
    """For each key recorded in both runs, pair the recorded values call by call into
    :class:`QuantizationComparisonResult` s; keys recorded on one side only are skipped.
    Keyed as the inputs are: :class:`NodeSourceDebugInfo` (what
    :func:`extract_results_from_loggers` gives, as torchao) or integer handles."""
    comparisons: dict = {}
    for handle, (ref_name, ref_stack, ref_stats) in ref_results.items():
        if handle not in actual_results:
            log.debug("numeric debugger: handle %s (%s) is not in the actual results", handle,
                      ref_name)
            continue
        actual_name, actual_stack, actual_stats = actual_results[handle]
        try:
            results = [QuantizationComparisonResult(actual=a, ref=r)
                       for a, r in zip(actual_stats, ref_stats)]
        except ValueError as e:
            raise ValueError(f"handle {handle}: ref node {ref_name} vs actual node "
                             f"{actual_name}: {e}") from e
        debug_info = handle if isinstance(handle, NodeSourceDebugInfo) else \
            NodeSourceDebugInfo(ref_name or "", 0, int(handle))
        comparisons[handle] = NodeAccuracySummary(
            debug_info=debug_info, actual_node_name=actual_name or "",
            actual_module_stack=module_stack_to_str(actual_stack), ref_node_name=ref_name or "",
            ref_module_stack=module_stack_to_str(ref_stack), results=results)
    for handle in actual_results.keys() - ref_results.keys():
        log.debug("numeric debugger: handle %s is not in the reference results", handle)
    return comparisons
