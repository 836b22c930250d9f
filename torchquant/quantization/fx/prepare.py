"""``prepare_fx``'s passes: per-node qconfig, pattern matching against the BackendConfig and
observer insertion.

Observers are ``call_module`` nodes named ``activation_post_process_<n>`` inserted in graph order:
for each quantized pattern, first an observer on every float input of its root node that is not
observed yet (a node already observed with the same observer type and dtype is reused), then one
on the output of its last node.  ``OUTPUT_SHARE_OBSERVER_WITH_INPUT`` patterns get an output
node too, but its module attribute is the input's observer instance.  Weights of functional
``F.linear`` / ``F.conv*`` get the qconfig's weight observer on their ``get_attr`` input; weighted
modules are observed at convert time (``module.qconfig.weight()``).  Dynamic patterns observe
only their direct tensor inputs (an RNN's ``(h, c)`` tuple stays float) with the qconfig's
dynamic placeholder observer and have no output observer (their output is float).
"""
from __future__ import annotations

import copy
import re
import warnings
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node
from torch.fx.passes.shape_prop import ShapeProp, TensorMetadata

from ... import dtypes as _dt
from ...nn.intrinsic.modules.fused import _FusedModule
from ..._graph import fresh_attr_name
from ..backend_config import BackendConfig, BackendPatternConfig, DTypeConfig, ObservationType
from ..fake_quantize import FakeQuantizeBase
from ..observer import ObserverBase, ReuseInputObserver, set_observer_owner
from ..qconfig import QConfigAny, QConfigMapping, qconfig_equals, _get_qconfig
from ..utils import Pattern
from .match_utils import find_matches, flatten_node_pattern, root_node_of

__all__ = ["update_qconfig_for_fusion", "generate_node_name_to_qconfig", "insert_observers",
           "is_observer_node", "annotate_tensor_nodes", "dtype_config_for", "needs_observer",
           "plan_custom_modules", "plan_standalone_module"]


def _parent_name(name: str) -> str:
    return name.rpartition(".")[0]


def is_observer_node(node: Any, modules: dict[str, torch.nn.Module]) -> bool:
    return (isinstance(node, Node) and node.op == "call_module"
            and isinstance(modules.get(str(node.target)), (ObserverBase, FakeQuantizeBase)))


def update_qconfig_for_fusion(gm: GraphModule, qconfig_mapping: QConfigMapping) -> QConfigMapping:
    """Give each fused module type the object-type qconfig of its members; members with
    different object-type qconfigs raise ``LookupError`` (torch's behaviour)."""
    object_types = qconfig_mapping.object_type_qconfigs
    if not object_types:
        return qconfig_mapping
    modules = dict(gm.named_modules(remove_duplicate=False))
    for node in gm.graph.nodes:
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        if not isinstance(module, _FusedModule):
            continue
        ops = list(module._modules.values())
        fused_qconfig = object_types.get(type(ops[0]))
        for op in ops[1:]:
            if not qconfig_equals(object_types.get(type(op)), fused_qconfig):
                raise LookupError("During fusion, we need to specify the same qconfigs for all "
                                  f"module types in {type(module)} offending type: {type(op)}")
        if fused_qconfig is not None:
            object_types[type(module)] = fused_qconfig
    return qconfig_mapping


def generate_node_name_to_qconfig(gm: GraphModule, modules: dict[str, torch.nn.Module],
                                  qconfig_mapping: QConfigMapping,
                                  node_name_to_scope: dict[str, tuple[str, Optional[type]]]
                                  ) -> dict[str, QConfigAny]:
    """Resolve every node's qconfig: global < object_type < module_name_regex < module_name
    < module_name_object_type_order (calls counted per enclosing module and object type)."""
    call_counts: dict[tuple[str, Any], int] = {}

    def next_index(scope: str, object_type: Any) -> int:
        index = call_counts.get((scope, object_type), 0)
        call_counts[(scope, object_type)] = index + 1
        return index

    result: dict[str, QConfigAny] = {}
    for node in gm.graph.nodes:
        qconfig: QConfigAny = None
        if node.op == "call_module" and str(node.target) in modules:
            module = modules[str(node.target)]
            if isinstance(module, (ObserverBase, FakeQuantizeBase)):
                continue
            path = str(node.target)
            parent = _parent_name(path)
            qconfig = _get_qconfig(qconfig_mapping, type(module), path,
                                   call_index=next_index(parent, type(module)), call_scope=parent)
            module.qconfig = qconfig
        elif node.op == "call_function":
            scope_path, scope_type = node_name_to_scope.get(node.name, ("", None))
            function_qconfig = qconfig_mapping.object_type_qconfigs.get(
                node.target, qconfig_mapping.global_qconfig)
            qconfig = _scope_qconfig(qconfig_mapping, scope_type, scope_path, function_qconfig)
            key = (scope_path, node.target, next_index(scope_path, node.target))
            qconfig = qconfig_mapping.module_name_object_type_order_qconfigs.get(key, qconfig)
        elif node.op == "call_method":
            scope_path, scope_type = node_name_to_scope.get(node.name, ("", None))
            qconfig = _scope_qconfig(qconfig_mapping, node.target, scope_path,
                                     qconfig_mapping.global_qconfig)
            qconfig = _scope_qconfig(qconfig_mapping, scope_type, scope_path, qconfig)
        result[node.name] = qconfig
    return result


def _scope_qconfig(qconfig_mapping: QConfigMapping, object_type: Any, module_name: str,
                   fallback: QConfigAny) -> QConfigAny:
    """object_type (falling back to ``fallback``) < regex < module name, for the module
    ``module_name`` of type ``object_type``."""
    qconfig = qconfig_mapping.object_type_qconfigs.get(object_type, fallback)
    for regex, regex_qconfig in qconfig_mapping.module_name_regex_qconfigs.items():
        if re.match(regex, module_name):
            qconfig = regex_qconfig
            break
    name = module_name
    while name:
        if name in qconfig_mapping.module_name_qconfigs:
            return qconfig_mapping.module_name_qconfigs[name]
        name = _parent_name(name)
    return qconfig


def annotate_tensor_nodes(gm: GraphModule, example_inputs: tuple[Any, ...]) -> set[str]:
    """Names of the nodes whose value is a tensor, found by running a copy of ``gm``."""
    probe = copy.deepcopy(gm)
    with torch.no_grad():
        ShapeProp(probe).propagate(*example_inputs)
    return {n.name for n in probe.graph.nodes
            if isinstance(n.meta.get("tensor_meta"), TensorMetadata)}


def _is_quantized_dtype(dtype: Any) -> bool:
    return dtype is not None and _dt.is_qdtype_like(dtype) and dtype not in (torch.float16,
                                                                               torch.float32)


def _dtypes_equal(a: Any, b: Any) -> bool:
    if _dt.is_qdtype_like(a) and _dt.is_qdtype_like(b):
        try:
            return _dt.to_qdtype(a) is _dt.to_qdtype(b)
        except TypeError:
            return a == b
    return a == b


def _satisfies(observer: torch.nn.Module, constraints: Any) -> bool:
    """``DTypeWithConstraints`` check on an activation observer / fake quant instance."""
    if constraints is None or constraints.dtype is None:
        return True
    if not _dtypes_equal(observer.dtype, constraints.dtype):
        return False
    quant_min = getattr(observer, "quant_min", None)
    quant_max = getattr(observer, "quant_max", None)
    if constraints.quant_min_lower_bound is not None and quant_min is not None \
            and quant_min < constraints.quant_min_lower_bound:
        return False
    if constraints.quant_max_upper_bound is not None and quant_max is not None \
            and quant_max > constraints.quant_max_upper_bound:
        return False
    eps = getattr(observer, "eps", None)
    if constraints.scale_min_lower_bound is not None and eps is not None \
            and float(eps) < constraints.scale_min_lower_bound:
        return False
    if constraints.scale_exact_match is not None or constraints.zero_point_exact_match is not None:
        if not hasattr(observer, "scale") or not hasattr(observer, "zero_point"):
            return False
        if constraints.scale_exact_match is not None and \
                float(observer.scale) != constraints.scale_exact_match:
            return False
        if constraints.zero_point_exact_match is not None and \
                int(observer.zero_point) != constraints.zero_point_exact_match:
            return False
    return True


def needs_observer(dtype: Any, dynamic: bool = False) -> bool:
    """Whether an edge of this dtype is observed: quantized dtypes, and float16 (dynamic
    activations and float16 weights, which torch marks with a placeholder observer)."""
    return _is_quantized_dtype(dtype) or (dtype is torch.float16 and dynamic)


def dtype_config_for(qconfig: QConfigAny, dtype_configs: list[DTypeConfig],
                     weighted: bool) -> Optional[DTypeConfig]:
    """The first DTypeConfig the qconfig's observers satisfy, else None: static int8 configs,
    dynamic ones (``is_dynamic``: the activation observer is dynamic, same input dtype, same
    weight dtype) and weight-only ones (float activations, quantized weight)."""
    if qconfig is None:
        return None
    activation = qconfig.activation()
    weight = qconfig.weight()
    if getattr(activation, "is_dynamic", False):
        for dc in dtype_configs:
            if not dc.is_dynamic or not _dtypes_equal(dc.input_dtype, activation.dtype):
                continue
            if weighted and dc.weight_dtype is not None and not _dtypes_equal(
                    dc.weight_dtype, getattr(weight, "dtype", None)):
                continue
            return dc
        return None
    for dc in dtype_configs:
        if dc.is_dynamic:
            continue
        if not _is_quantized_dtype(dc.input_dtype) and not _is_quantized_dtype(dc.output_dtype):
            if weighted and _is_quantized_dtype(dc.weight_dtype) and \
                    not _is_quantized_dtype(activation.dtype) and \
                    activation.dtype is not torch.float16 and \
                    _satisfies(weight, dc.weight_dtype_with_constraints):
                return dc                        # weight-only (embeddings)
            continue
        if _is_quantized_dtype(dc.input_dtype) and not _satisfies(
                activation, dc.input_dtype_with_constraints):
            continue
        if _is_quantized_dtype(dc.output_dtype) and not _satisfies(
                activation, dc.output_dtype_with_constraints):
            continue
        if weighted and dc.weight_dtype is not None and not _satisfies(
                weight, dc.weight_dtype_with_constraints):
            continue
        return dc
    return None


def _new_observer_name(gm: GraphModule) -> str:
    return fresh_attr_name(gm, "activation_post_process_")


def _insert_observer_after(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node,
                           observer: torch.nn.Module) -> Node:
    name = _new_observer_name(gm)
    setattr(gm, name, observer)
    modules[name] = observer
    set_observer_owner(observer, node.name, kind="node")  # messages name the observed node
    with gm.graph.inserting_after(node):
        return gm.graph.create_node("call_module", name, (node,), {})


class _PatternPlan:
    """How one matched, quantized pattern is observed."""

    def __init__(self, qconfig: QConfigAny, config: BackendPatternConfig, dtype_config: DTypeConfig,
                 last: Node, root: Node, members: list[Node]):
        self.qconfig = qconfig
        self.config = config
        self.dtype_config = dtype_config
        self.last = last
        self.root = root
        self.members = members

    observation_type: ObservationType = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
    dynamic: bool = False
    only_inputs: Optional[set[int]] = None       # standalone modules: the observed positions
    # each node of a pattern uses its own qconfig (torch's rule): a root whose qconfig is None
    # keeps its inputs (weight included) float; the last node's output is still observed
    observe_inputs: bool = True

    @property
    def share(self) -> bool:
        return self.observation_type == ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT

    @property
    def not_observed(self) -> bool:
        return self.observation_type == ObservationType.INPUT_OUTPUT_NOT_OBSERVED


def plan_patterns(gm: GraphModule, modules: dict[str, torch.nn.Module],
                  node_name_to_qconfig: dict[str, QConfigAny], backend_config: BackendConfig,
                  tensor_nodes: set[str]) -> tuple[dict[str, _PatternPlan], dict[str, str]]:
    """Match the BackendConfig's patterns; returns root/last node name -> plan of every quantized
    pattern, and node name -> why it stays float (for patterns that are skipped)."""
    configs: dict[Pattern, BackendPatternConfig] = backend_config._pattern_complex_format_to_config
    matches = find_matches(gm.graph, modules, [p for p, c in configs.items() if c.dtype_configs])
    plans: dict[str, _PatternPlan] = {}
    float_reasons: dict[str, str] = {}
    seen: set[str] = set()
    for name, (last, node_pattern, pattern) in matches.items():
        if last.name in seen:
            continue
        seen.add(last.name)
        root = root_node_of(node_pattern)
        config = configs[pattern]
        qconfig = node_name_to_qconfig.get(last.name)
        if qconfig is None:
            float_reasons[last.name] = "no qconfig"
            continue
        if not any(isinstance(a, Node) and a.name in tensor_nodes
                   for a in _flat_args(root)):
            continue
        input_type_to_index = _root_input_type_to_index(root, modules, configs, config)
        weighted = input_type_to_index.get("weight") is not None or (
            root.op == "call_module" and hasattr(modules[str(root.target)], "weight"))
        dynamic = bool(getattr(qconfig.activation(), "is_dynamic", False))
        dtype_config = dtype_config_for(qconfig, config.dtype_configs, weighted)
        if dtype_config is None and dynamic:
            # a dynamic qconfig quantizes only the ops with dynamic kernels (Linear, the RNNs):
            # the rest stays float silently, as in torch (convert's summary still lists them)
            float_reasons[last.name] = "no dynamic DTypeConfig for this pattern"
            continue
        if dtype_config is None:
            float_reasons[last.name] = "qconfig does not satisfy any DTypeConfig of the pattern"
            warnings.warn(f"FX prepare: the qconfig of node '{last.name}' (pattern {pattern}) "
                          "matches none of the BackendConfig's dtype configs for this pattern "
                          "(dtype or constraint mismatch); the pattern is left in float",
                          stacklevel=3)
            continue
        plan = _PatternPlan(qconfig, config, dtype_config, last, root,
                            flatten_node_pattern(node_pattern))
        plan.input_type_to_index = input_type_to_index
        plan.dynamic = dynamic
        plan.observation_type = config.observation_type
        by_count = config._num_tensor_args_to_observation_type
        if by_count:
            # binary ops: observation depends on how many operands are tensors (x + 1.0 shares)
            count = sum(1 for a in root.args if isinstance(a, Node) and a.name in tensor_nodes)
            plan.observation_type = by_count.get(count, plan.observation_type)
        if root is not last and node_name_to_qconfig.get(root.name) is None:
            plan.observe_inputs = False
            float_reasons[root.name] = "no qconfig"
        plans[root.name] = plan
        plans[last.name] = plan
    return plans, float_reasons


def _root_input_type_to_index(root: Node, modules: dict[str, torch.nn.Module],
                              configs: dict[Pattern, BackendPatternConfig],
                              matched: BackendPatternConfig) -> dict[str, int]:
    """Weight / bias argument positions, from the config of the root node's own op (a fused
    pattern such as ``(F.relu, F.linear)`` does not list them itself)."""
    if matched._input_type_to_index:
        return matched._input_type_to_index
    key = type(modules.get(str(root.target))) if root.op == "call_module" else root.target
    own = configs.get(key)
    return own._input_type_to_index if own is not None else {}


def _flat_args(node: Node) -> list[Any]:
    out: list[Any] = []
    for a in node.args:
        if isinstance(a, (list, tuple)):
            out.extend(a)
        else:
            out.append(a)
    return out


def _observer_dtype(node: Node, modules: dict[str, torch.nn.Module]) -> Any:
    return modules[str(node.target)].dtype


def plan_custom_modules(gm: GraphModule, modules: dict[str, torch.nn.Module],
                        node_name_to_qconfig: dict[str, QConfigAny],
                        float_to_observed: dict[type, type],
                        plans: dict[str, _PatternPlan]) -> list[str]:
    """Swap each custom module (a ``float_to_observed`` class with a static qconfig) for
    ``observed_class.from_float(module)`` and observe its input and output like any quantized
    op (torch's custom module handling).  Returns the names of the custom module nodes."""
    names = []
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        module = modules.get(str(node.target))
        observed_cls = float_to_observed.get(type(module))
        qconfig = node_name_to_qconfig.get(node.name)
        if observed_cls is None or qconfig is None:
            continue
        activation = qconfig.activation()
        if getattr(activation, "is_dynamic", False) or not _is_quantized_dtype(activation.dtype):
            continue
        observed = observed_cls.from_float(module)
        path = str(node.target)
        parent_path, _, attr = path.rpartition(".")
        setattr(gm.get_submodule(parent_path) if parent_path else gm, attr, observed)
        modules[path] = observed
        dtype_config = DTypeConfig(input_dtype=activation.dtype, output_dtype=activation.dtype)
        plan = _PatternPlan(qconfig, None, dtype_config, node, node, [node])
        plan.input_type_to_index = {}
        plans[node.name] = plan
        names.append(node.name)
    return names


def plan_standalone_module(node: Node, qconfig: QConfigAny, input_indexes: list[int],
                           plans: dict[str, _PatternPlan]) -> None:
    """A standalone module node: the parent observes only the inputs the standalone module
    takes quantized (its ``input_quantized_indexes``), never its output (torch's rule)."""
    plans.pop(node.name, None)
    if qconfig is None or not input_indexes:
        return
    activation = qconfig.activation()
    if getattr(activation, "is_dynamic", False) or not _is_quantized_dtype(activation.dtype):
        return
    plan = _PatternPlan(qconfig, None, DTypeConfig(input_dtype=activation.dtype), node, node,
                        [node])
    plan.input_type_to_index = {}
    plan.only_inputs = set(input_indexes)
    plans[node.name] = plan


def insert_observers(gm: GraphModule, modules: dict[str, torch.nn.Module],
                     plans: dict[str, _PatternPlan], tensor_nodes: set[str],
                     quantized_inputs: frozenset = frozenset()) -> None:
    """``quantized_inputs``: placeholder names the user feeds already quantized
    (``input_quantized_indexes``): never observed."""
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op in ("placeholder", "output", "get_attr") or is_observer_node(node, modules):
            continue
        plan = plans.get(node.name)
        if plan is None or plan.not_observed:
            continue
        if plan.root is node and plan.observe_inputs:
            _insert_input_observers(gm, modules, node, plan, tensor_nodes, quantized_inputs)
        if plan.last is node and _is_quantized_dtype(plan.dtype_config.output_dtype):
            activation = plan.qconfig.activation()
            if isinstance(activation, ReuseInputObserver):
                _reuse_input_observer(gm, modules, plan.root, node)
                continue
            obs_node = _insert_observer_after(gm, modules, node, activation)
            node.replace_all_uses_with(obs_node, delete_user_cb=lambda user: user is not obs_node)
            if plan.share:
                _share_input_observer(gm, modules, plan.root, obs_node)


def _insert_input_observers(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node,
                            plan: _PatternPlan, tensor_nodes: set[str],
                            quantized_inputs: frozenset) -> None:
    index_of = plan.input_type_to_index
    weight_index, bias_index = index_of.get("weight"), index_of.get("bias")
    if plan.share:
        first = next((a for a in node.args if isinstance(a, (Node, list, tuple))), None)
        candidates = list(first) if isinstance(first, (list, tuple)) else [first]
        positions = [(None, a) for a in candidates]
    else:
        positions = []
        for i, a in enumerate(node.args):
            if isinstance(a, (list, tuple)):
                if not plan.dynamic:     # torch leaves an RNN's (h, c) state float
                    positions.extend((None, x) for x in a)
            else:
                positions.append((i, a))
        positions.extend((k, v) for k, v in node.kwargs.items())
    if plan.only_inputs is not None:
        positions = [(i, a) for i, a in positions if i in plan.only_inputs]
    for index, arg in positions:
        if not isinstance(arg, Node) or arg.name in quantized_inputs:
            continue
        if index is not None and (index == bias_index or index == "bias"):
            continue
        if index is not None and (index == weight_index or index == "weight"):
            if not needs_observer(plan.dtype_config.weight_dtype, dynamic=True):
                continue
            make = plan.qconfig.weight
        else:
            if not needs_observer(plan.dtype_config.input_dtype, plan.dynamic):
                continue
            if arg.name not in tensor_nodes and not is_observer_node(arg, modules):
                continue
            make = plan.qconfig.activation
        if is_observer_node(arg, modules):
            continue
        observer = make()
        if isinstance(observer, ReuseInputObserver):
            continue
        existing = next((u for u in arg.users if is_observer_node(u, modules)
                         and type(modules[str(u.target)]) is type(observer)
                         and _dtypes_equal(modules[str(u.target)].dtype, observer.dtype)), None)
        obs_node = existing or _insert_observer_after(gm, modules, arg, observer)
        node.replace_input_with(arg, obs_node)


def _reuse_input_observer(gm: GraphModule, modules: dict[str, torch.nn.Module], root: Node,
                          node: Node) -> None:
    """A reuse-input qconfig (torch.ao's default for ``reshape`` and the like): the output gets
    an observer node of its own that calls the input's observer instance, as torch.ao's prepare
    makes it -- so a QAT fake quant sees the output too (its moving averages move once more per
    forward) and the output is not observed again by a fresh instance; nothing when the input
    is not observed."""
    first = next((a for a in root.args if isinstance(a, Node)), None)
    if first is None or not is_observer_node(first, modules):
        return
    shared = modules[str(first.target)]
    name = _new_observer_name(gm)
    setattr(gm, name, shared)
    modules[name] = shared
    with gm.graph.inserting_after(node):
        obs_node = gm.graph.create_node("call_module", name, (node,), {})
    node.replace_all_uses_with(obs_node, delete_user_cb=lambda user: user is not obs_node)


def _share_input_observer(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node,
                          output_obs_node: Node) -> None:
    """Point every input observer and the output observer of a share op at the first input's
    observer instance."""
    first = next((a for a in node.args if isinstance(a, (Node, list, tuple))), None)
    inputs = list(first) if isinstance(first, (list, tuple)) else [first]
    if not inputs or not is_observer_node(inputs[0], modules):
        return
    shared = modules[str(inputs[0].target)]
    for arg in inputs[1:]:
        if is_observer_node(arg, modules):
            setattr(gm, str(arg.target), shared)
            modules[str(arg.target)] = shared
    setattr(gm, str(output_obs_node.target), shared)
    modules[str(output_obs_node.target)] = shared
