"""Observer insertion of PT2E ``prepare``: the annotations a quantizer wrote on an exported graph
become observer / fake-quant submodules (``activation_post_process_<n>``) on the annotated
edges and node outputs.

Which edges share one observer is a union-find over edges / nodes (torchao 0.18's rules):
``SharedQuantizationSpec`` joins its edge with the target, and, when the consumer allows
implicit sharing, an input edge joins the producer's output (or another edge leaving the same
producer) whose root spec has the same dtype / range / qscheme / ch_axis / is_dynamic /
fixed qparams.  One observer is built per group.
"""
from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule, Node

from ..fake_quantize import FixedQParamsFakeQuantize
from ..observer import FixedQParamsObserver, ObserverBase, set_observer_owner
from ..quantizer.quantizer import (DerivedQuantizationSpec, EdgeOrNode,
                                   FixedQParamsQuantizationSpec, ObserverOrFakeQuantize,
                                   Q_ANNOTATION_KEY, QuantizationSpec, QuantizationSpecBase,
                                   SharedQuantizationSpec)
from ._numeric_debugger import inherit_debug_handle
from .utils import is_observer_node

__all__ = ["DerivedObserverOrFakeQuantize", "prepare", "OBSERVER_PREFIX"]

OBSERVER_PREFIX = "activation_post_process_"

_SHARING_ATTRS = ("dtype", "is_dynamic", "quant_min", "quant_max", "qscheme", "ch_axis",
                  "scale", "zero_point")


class DerivedObserverOrFakeQuantize(ObserverBase):
    """Observes nothing: its qparams are ``derive_qparams_fn(obs_or_fqs)`` of other observers
    (e.g. an int32 bias with scale = input scale * weight scale)."""

    def __init__(self, dtype: Any, obs_or_fqs: list, derive_qparams_fn: Callable,
                 quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                 qscheme: Any = None, ch_axis: Optional[int] = None) -> None:
        super().__init__(dtype)
        self.obs_or_fqs = obs_or_fqs
        self.derive_qparams_fn = derive_qparams_fn
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.qscheme = qscheme
        self.ch_axis = ch_axis

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.derive_qparams_fn(self.obs_or_fqs)


def _ctr_class(ctr: Any) -> Any:
    """The class a constructor (class or ``with_args`` partial wrapper) builds."""
    p = getattr(ctr, "p", None)
    return p.func if p is not None else ctr


def _build(qspec: Optional[QuantizationSpecBase],
           obs_map: dict[EdgeOrNode, ObserverOrFakeQuantize], is_qat: bool
           ) -> Optional[ObserverOrFakeQuantize]:
    if qspec is None:
        return None
    if isinstance(qspec, SharedQuantizationSpec):
        target = qspec.edge_or_node
        if target not in obs_map:
            raise ValueError(f"SharedQuantizationSpec points at {target!r}, which has no "
                             "observer: it must name an annotated edge (producer, consumer) "
                             "or an annotated node output.")
        return obs_map[target]
    if isinstance(qspec, DerivedQuantizationSpec):
        missing = [k for k in qspec.derived_from if k not in obs_map]
        if missing:
            raise ValueError(f"DerivedQuantizationSpec derives from {missing!r}, which have no "
                             "observer.")
        return DerivedObserverOrFakeQuantize(
            qspec.dtype, [obs_map[k] for k in qspec.derived_from], qspec.derive_qparams_fn,
            qspec.quant_min, qspec.quant_max, qspec.qscheme, qspec.ch_axis)
    if isinstance(qspec, FixedQParamsQuantizationSpec):
        kwargs = {f.name: getattr(qspec, f.name) for f in dataclasses.fields(qspec)}
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        observer_ctr = FixedQParamsObserver.with_args(**kwargs)
        if is_qat:
            return FixedQParamsFakeQuantize.with_args(observer=observer_ctr)()
        return observer_ctr()
    if not isinstance(qspec, QuantizationSpec):
        raise TypeError(f"unsupported quantization spec {type(qspec).__name__}: {qspec!r}")
    kwargs = {f.name: getattr(qspec, f.name) for f in dataclasses.fields(qspec)
              if f.name != "observer_or_fake_quant_ctr"}
    cls = _ctr_class(qspec.observer_or_fake_quant_ctr)
    if "PerChannel" not in getattr(cls, "__name__", ""):
        kwargs.pop("ch_axis")
    kwargs = {k: v for k, v in kwargs.items() if v is not None or k == "ch_axis"}
    if kwargs.get("ch_axis", 0) is None:
        kwargs.pop("ch_axis")
    return qspec.observer_or_fake_quant_ctr.with_args(**kwargs)()


class _SharingGroups:
    """Union-find over edges / nodes, keyed by the annotated spec of each."""

    def __init__(self, qspecs: dict[EdgeOrNode, QuantizationSpecBase]) -> None:
        self.qspecs = qspecs
        self.parent: dict[EdgeOrNode, EdgeOrNode] = {k: k for k in qspecs}

    def root(self, x: EdgeOrNode) -> EdgeOrNode:
        path = []
        while self.parent[x] != x:
            path.append(x)
            x = self.parent[x]
        for p in path:
            self.parent[p] = x
        return x

    def union(self, parent: EdgeOrNode, child: EdgeOrNode) -> None:
        if parent not in self.parent:
            raise ValueError(f"SharedQuantizationSpec points at {parent!r}, which is not "
                             "annotated: share with an annotated edge or node output.")
        root_parent, root_child = self.root(parent), self.root(child)
        parent_spec = self.qspecs[root_parent]
        # keep the direction that does not make a shared spec the root of its own target
        if (isinstance(parent_spec, SharedQuantizationSpec)
                and parent_spec.edge_or_node == root_child):
            self.parent[root_parent] = root_child
        else:
            self.parent[root_child] = root_parent

    def root_spec(self, qspec: QuantizationSpecBase) -> QuantizationSpecBase:
        seen = 0
        while isinstance(qspec, SharedQuantizationSpec):
            target = qspec.edge_or_node
            if target not in self.parent:
                raise ValueError(f"SharedQuantizationSpec points at {target!r}, which is not "
                                 "annotated: share with an annotated edge or node output.")
            qspec = self.qspecs[self.root(target)]
            seen += 1
            if seen > len(self.qspecs):
                raise ValueError("SharedQuantizationSpecs form a cycle with no real spec")
        return qspec


def _same_attrs(a: Any, b: Any) -> bool:
    for attr in _SHARING_ATTRS:
        has_a, has_b = hasattr(a, attr), hasattr(b, attr)
        if has_a != has_b or (has_a and getattr(a, attr) != getattr(b, attr)):
            return False
    return True


def _edge_or_node_to_qspec(model: GraphModule) -> dict[EdgeOrNode, QuantizationSpecBase]:
    qspecs: dict[EdgeOrNode, QuantizationSpecBase] = {}
    for n in model.graph.nodes:
        annotation = n.meta.get(Q_ANNOTATION_KEY)
        if annotation is None:
            continue
        for inp, qspec in annotation.input_qspec_map.items():
            qspecs[(inp, n)] = qspec
        if annotation.output_qspec is not None:
            qspecs[n] = annotation.output_qspec
    return qspecs


def _check_targets_in_graph(model: GraphModule,
                            qspecs: dict[EdgeOrNode, QuantizationSpecBase]) -> None:
    """Shared / derived specs must point at nodes of this graph (an edge or node from another
    graph, or one erased since annotation, would otherwise fail obscurely or be ignored)."""
    in_graph = set(model.graph.nodes)
    for key, qspec in qspecs.items():
        if isinstance(qspec, SharedQuantizationSpec):
            targets = [qspec.edge_or_node]
        elif isinstance(qspec, DerivedQuantizationSpec):
            targets = list(qspec.derived_from)
        else:
            continue
        owner = key[1] if isinstance(key, tuple) else key
        for target in targets:
            nodes = target if isinstance(target, tuple) else (target,)
            missing = [n for n in nodes if n not in in_graph]
            if missing:
                raise ValueError(
                    f"{type(qspec).__name__} in the annotation of node {owner.name!r} points at "
                    f"{_describe(target)}, but {', '.join(repr(_name(n)) for n in missing)} "
                    "is not a node of the model's graph")
            if isinstance(target, tuple) and target[0] not in target[1].all_input_nodes:
                raise ValueError(
                    f"{type(qspec).__name__} in the annotation of node {owner.name!r} points at "
                    f"{_describe(target)}, which is not an edge of the graph ({target[0].name!r} "
                    f"is not an input of {target[1].name!r})")


def _name(n: Any) -> str:
    return getattr(n, "name", repr(n))


def _describe(target: EdgeOrNode) -> str:
    if isinstance(target, tuple):
        return f"edge ({_name(target[0])}, {_name(target[1])})"
    return f"node {_name(target)}"


def _group_ids(qspecs: dict[EdgeOrNode, QuantizationSpecBase]) -> dict[EdgeOrNode, int]:
    groups = _SharingGroups(qspecs)
    for key, qspec in qspecs.items():
        if isinstance(key, tuple):
            arg, consumer = key
            if consumer.meta[Q_ANNOTATION_KEY].allow_implicit_sharing:
                own_root = groups.root_spec(qspec) if qspec is not None else None
                candidates: list[EdgeOrNode] = [(arg, u) for u in arg.users if u is not consumer]
                candidates.append(arg)
                for other in candidates:
                    other_spec = qspecs.get(other)
                    if other_spec is None:
                        continue
                    other_root = groups.root_spec(other_spec)
                    if own_root is not None and _same_attrs(other_root, own_root):
                        groups.union(other, key)
        if isinstance(qspec, SharedQuantizationSpec):
            groups.union(qspec.edge_or_node, key)
    ids: dict[EdgeOrNode, int] = {}
    root_ids: dict[EdgeOrNode, int] = {}
    for key in qspecs:
        root = groups.root(key)
        if root not in root_ids:
            root_ids[root] = len(root_ids)
        ids[key] = root_ids[root]
    return ids


def _observer_map(qspecs: dict[EdgeOrNode, QuantizationSpecBase], ids: dict[EdgeOrNode, int],
                  is_qat: bool) -> dict[EdgeOrNode, Optional[ObserverOrFakeQuantize]]:
    by_group: dict[int, Optional[ObserverOrFakeQuantize]] = {}
    obs_map: dict[EdgeOrNode, Any] = {}
    for key, qspec in qspecs.items():
        gid = ids[key]
        if gid not in by_group:
            by_group[gid] = _build(qspec, obs_map, is_qat)
        obs_map[key] = by_group[gid]
    return obs_map


def _model_device(model: torch.nn.Module) -> Optional[torch.device]:
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    if len(devices) > 1:
        raise ValueError(f"prepare_pt2e expects the model on one device, found {devices}")
    return next(iter(devices)) if devices else None


class _Inserter:
    def __init__(self, model: GraphModule, obs_map: dict) -> None:
        self.model = model
        self.obs_map = obs_map
        self.named_modules = dict(model.named_modules(remove_duplicate=False))
        self.device = _model_device(model)
        self.counter = 0
        self.unobserved: list[str] = []

    def _new_name(self) -> str:
        while hasattr(self.model, f"{OBSERVER_PREFIX}{self.counter}"):
            self.counter += 1
        name = f"{OBSERVER_PREFIX}{self.counter}"
        self.counter += 1
        return name

    def insert_after(self, node: Node, obs: ObserverOrFakeQuantize) -> Node:
        if self.device is not None:
            obs.to(self.device)
        name = self._new_name()
        setattr(self.model, name, obs)
        self.named_modules[name] = obs
        set_observer_owner(obs, node.name, kind="node")  # messages name the observed node
        with self.model.graph.inserting_after(node):
            new = self.model.graph.create_node("call_module", name, (node,), {})
        if "val" in node.meta:
            new.meta["val"] = node.meta["val"]
        return new

    def input_arg(self, node: Node, arg: Any) -> Any:
        if isinstance(arg, (list, tuple)):
            return type(arg)(self.input_arg(node, a) for a in arg)
        if not isinstance(arg, Node):
            return arg
        original = arg
        while is_observer_node(original, self.named_modules):
            original = original.args[0]
        edge = (original, node)
        obs = self.obs_map.get(edge)
        if obs is None:
            return arg
        if self.obs_map.get(original) is obs:
            return arg  # the producer's output observer already is this edge's
        for user in arg.users:
            if (is_observer_node(user, self.named_modules)
                    and self.named_modules[str(user.target)] is obs):
                return user
        new = self.insert_after(arg, obs)
        inherit_debug_handle(node, new)  # an input-edge observer serves its consumer
        return new

    def _observed_inputs(self, node: Node) -> set[Node]:
        found: set[Node] = set()

        def visit(a: Any) -> None:
            if isinstance(a, (list, tuple)):
                for b in a:
                    visit(b)
            elif isinstance(a, Node) and is_observer_node(a, self.named_modules):
                original = a
                while is_observer_node(original, self.named_modules):
                    original = original.args[0]
                found.add(original)

        visit(node.args)
        return found

    def _check_edges_observed(self, node: Node) -> None:
        """Remember annotated input edges that got no observer (an input_qspec_map key that is
        not an argument of the node): they would silently stay float."""
        annotation = node.meta[Q_ANNOTATION_KEY]
        observed = self._observed_inputs(node)
        for inp, qspec in annotation.input_qspec_map.items():
            if qspec is None or self.obs_map.get((inp, node)) is None:
                continue
            if inp not in observed:
                self.unobserved.append(f"{node.name} (input {getattr(inp, 'name', inp)})")

    def observe(self, node: Node) -> None:
        if Q_ANNOTATION_KEY not in node.meta:
            return
        for key, value in node.kwargs.items():
            if isinstance(value, Node):
                raise ValueError(f"{node.name}: keyword argument {key!r} is a graph value; "
                                 "annotated nodes take tensors positionally")
        node.args = tuple(self.input_arg(node, a) for a in node.args)
        self._check_edges_observed(node)
        val = node.meta.get("val")
        if not isinstance(val, torch.Tensor) or node not in self.obs_map:
            return
        obs = self.obs_map[node]
        if obs is None:
            return
        out = self.insert_after(node, obs)
        inherit_debug_handle(node, out)  # an output observer serves the node it observes
        for user in list(node.users):
            if user is not out:
                user.replace_input_with(node, out)


def prepare(model: GraphModule, is_qat: bool,
            obs_or_fq_callback: Optional[Callable[..., None]] = None) -> GraphModule:
    """Insert observers / fake quants for every annotation of ``model`` (in place on its graph);
    returns a new GraphModule over that graph."""
    nodes = list(model.graph.nodes)
    qspecs = _edge_or_node_to_qspec(model)
    _check_targets_in_graph(model, qspecs)
    obs_map = _observer_map(qspecs, _group_ids(qspecs), is_qat)
    if obs_or_fq_callback is not None:
        obs_or_fq_callback(model, obs_map)
    inserter = _Inserter(model, obs_map)
    for node in nodes:
        inserter.observe(node)
    if inserter.unobserved:
        warnings.warn("prepare_pt2e: annotated input edges got no observer and stay float "
                      "(the annotation names a node that is not a positional argument): "
                      + ", ".join(inserter.unobserved), UserWarning, stacklevel=5)
    return GraphModule(model, model.graph)
