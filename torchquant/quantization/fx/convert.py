"""``convert_fx``'s passes: observers -> quantize/dequantize nodes and weighted modules ->
reference modules (the reference model), then lowering of ``dequantize -> float op -> quantize``
patterns to torchquant's quantized modules and ops.

Reference representation: an observed edge ``x`` becomes ``quantize_per_tensor(x, _scale_<n>,
_zero_point_<n>, "<qdtype name>")`` (qparams are GraphModule buffers read by ``get_attr``
nodes) followed by one ``dequantize`` per use.  ``quantize_per_tensor`` / ``quantize_per_channel``
here are thin graph functions taking the qdtype by name so the generated code needs no
torchquant globals.
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node
from torch.fx.operator_schemas import normalize_function

from ... import dtypes as _dt
from ...tensor.functions import quantize_per_channel as _quantize_per_channel
from ...tensor.functions import quantize_per_tensor as _quantize_per_tensor
from ...tensor.functions import quantize_per_tensor_dynamic as _quantize_per_tensor_dynamic
from ...nn.intrinsic import quantized as nniq
from ...nn import quantized as nnq
from ...nn.quantized import _binary
from ...nn.quantized import _normalization
from ...nn.quantized import functional as qF
from ...nn.quantized.dynamic.modules.linear import to_float16_weight
from ...nn.quantized.modules.utils import as_output_scale as _as_output_scale
from ...nn.quantized.modules.utils import as_output_zero_point as _as_output_zero_point
from ... import nn as _tq_nn
# the packages the pattern table's FX rows name, loaded for _nn_class
from ...nn import intrinsic as _nni  # noqa: F401
from ...nn.intrinsic.quantized import dynamic as _nniqd  # noqa: F401
from ...nn.quantized import dynamic as _nnqd  # noqa: F401
from ...nn.quantized import reference as _nnqr  # noqa: F401
from ...ops import patterns as _patterns
from ...ops._library import weight_qparams
from ..._graph import fresh_attr_name, only_user, optional_attr_value
from ..backend_config import BackendConfig
from ..backend_config.utils import get_root_module_to_quantized_reference_module
from ..fake_quantize import FakeQuantizeBase
from ..observer import ObserverBase
from ..utils import get_qparam_dict, is_per_channel
from .fuse import _set_module

__all__ = ["quantize_per_tensor", "quantize_per_channel", "quantize_per_tensor_dynamic",
           "round_to_float16", "convert_to_reference", "lower_to_torchquant", "remove_qconfigs",
           "mark_quantized_inputs", "swap_custom_modules", "keep_quantized_outputs",
           "rewire_standalone_module", "activation_qparams", "ORIGINAL_WEIGHTS_LOOKUP",
           "read_qparams_from_buffers", "drop_unread_attributes", "run_weight_observers",
           "refresh_qparam_literals", "unlowered_reference_modules"]


def quantize_per_tensor(x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                        qdtype_name: str) -> torch.Tensor:
    """Graph form of :func:`torchquant.quantize_per_tensor` (qdtype by name)."""
    return _quantize_per_tensor(x, float(scale), int(zero_point), _dt.qdtype_of(qdtype_name))


def quantize_per_channel(x: torch.Tensor, scales: torch.Tensor, zero_points: torch.Tensor,
                         axis: int, qdtype_name: str) -> torch.Tensor:
    """Graph form of :func:`torchquant.quantize_per_channel` (qdtype by name)."""
    return _quantize_per_channel(x, scales, zero_points, axis, _dt.qdtype_of(qdtype_name))


def quantize_per_tensor_dynamic(x: torch.Tensor, qdtype_name: str, reduce_range: bool
                                ) -> torch.Tensor:
    """Graph form of :func:`torchquant.quantize_per_tensor_dynamic` (qdtype by name)."""
    return _quantize_per_tensor_dynamic(x, _dt.qdtype_of(qdtype_name), reduce_range)


def round_to_float16(x: torch.Tensor) -> torch.Tensor:
    """float16 "quantization" of a float32 value: the float16 rounding, back in float32 (the
    reference form of torch's ``x.to(torch.float16).dequantize()``)."""
    return x.to(torch.float16).to(x.dtype)


_QUANTIZE_FUNCTIONS = (quantize_per_tensor, quantize_per_channel)
# GraphModule attribute (torch.ao's name): quantized weight holder -> [float weight, bias]
ORIGINAL_WEIGHTS_LOOKUP = "original_weights_lookup"


def _keep_original_weights(gm: GraphModule, holder: str, weight: torch.Tensor,
                           bias: Optional[torch.Tensor]) -> None:
    lookup = gm.__dict__.setdefault(ORIGINAL_WEIGHTS_LOOKUP, {})
    lookup[holder] = [weight.detach().clone(), None if bias is None else bias.detach().clone()]
# dynamic activations quantize with reduce_range as torch's fbgemm / x86 engines do
_DYNAMIC_REDUCE_RANGE = True


def _is_observer(module: Any) -> bool:
    return isinstance(module, (ObserverBase, FakeQuantizeBase))


def _get_attr_node(gm: GraphModule, prefix: str, value: torch.Tensor) -> Node:
    name = fresh_attr_name(gm, prefix)
    gm.register_buffer(name, value)
    return gm.graph.create_node("get_attr", name, (), {})


def _qparam_buffer_prefix(node: Node, scopes: dict[str, tuple[str, Any]],
                          qconfigs: dict[str, Any]) -> str:
    """Where an observer's qparam buffers are named after, as torch.ao's convert names them
    (so state_dict keys are the same): the module path of the observed node's scope, or, for
    an observer that only quantizes an input of the next op (the observed node has no qconfig:
    a model input, a float op's output), the path of its first user (its first ``F.linear``
    user if any) followed by ``_input``."""
    observed = node.args[0]
    # a weight read by get_attr counts as its module's (torch.ao gives it that qconfig)
    input_only = (isinstance(observed, Node) and observed.op != "get_attr"
                  and observed.name in qconfigs and qconfigs[observed.name] is None)
    if input_only:
        users = list(node.users)
        named = next((u for u in users if u.op == "call_function"
                      and u.target is torch.nn.functional.linear), users[0] if users else None)
        suffix = "_input"
    else:
        named, suffix = observed, ""
    path = scopes[named.name][0] if isinstance(named, Node) and named.name in scopes else ""
    return (path + suffix).replace(".", "_")


def _replace_observer(gm: GraphModule, node: Node, observer: torch.nn.Module,
                      buffer_prefix: str = "") -> None:
    """observer node -> quantize node + one dequantize per use (or nothing for float).  The
    qparams go into buffers ``<buffer_prefix>_scale_<n>`` / ``<buffer_prefix>_zero_point_<n>``."""
    graph = gm.graph
    source = node.args[0]
    dtype = observer.dtype
    if dtype is torch.float16:
        with graph.inserting_before(node):
            rounded = graph.call_function(round_to_float16, (source,))
        node.replace_all_uses_with(rounded)
        graph.erase_node(node)
        return
    if getattr(observer, "is_dynamic", False):
        qdtype = _dt.to_qdtype(dtype)
        with graph.inserting_before(node):
            quant = graph.call_function(quantize_per_tensor_dynamic,
                                        (source, qdtype.name, _DYNAMIC_REDUCE_RANGE))
        for user in list(node.users):
            with graph.inserting_before(user):
                dequant = graph.call_method("dequantize", (quant,))
            user.replace_input_with(node, dequant)
        graph.erase_node(node)
        return
    if not _dt.is_qdtype_like(dtype) or dtype in (torch.float16, torch.float32):
        node.replace_all_uses_with(source)
        graph.erase_node(node)
        return
    qdtype = _dt.to_qdtype(dtype)
    scale, zero_point = observer.calculate_qparams()
    with graph.inserting_before(node):
        if is_per_channel(getattr(observer, "qscheme", None)):
            scale_node = _get_attr_node(gm, buffer_prefix + "_scale_", scale.detach().clone())
            zp_node = _get_attr_node(gm, buffer_prefix + "_zero_point_",
                                     zero_point.detach().clone())
            quant = graph.call_function(quantize_per_channel,
                                        (source, scale_node, zp_node, int(observer.ch_axis),
                                         qdtype.name))
        else:
            scale_node = _get_attr_node(gm, buffer_prefix + "_scale_",
                                        torch.tensor(float(scale), dtype=torch.float32))
            zp_node = _get_attr_node(gm, buffer_prefix + "_zero_point_",
                                     torch.tensor(int(zero_point), dtype=torch.int64))
            quant = graph.call_function(quantize_per_tensor,
                                        (source, scale_node, zp_node, qdtype.name))
    for user in list(node.users):
        with graph.inserting_before(user):
            dequant = graph.call_method("dequantize", (quant,))
        user.replace_input_with(node, dequant)
    graph.erase_node(node)


_QAT_TO_FLOAT_NEEDED = "to_float"


def _rnn_weight_qparams(module: torch.nn.Module, qconfig: Any) -> dict[str, Any]:
    """``weight_qparams_dict`` of a reference RNN cell / LSTM / GRU: one fresh weight observer
    per weight matrix (only int8 observers see the weight, as in torch)."""
    if isinstance(module, torch.nn.RNNCellBase):
        names = ["weight_ih", "weight_hh"]
    else:
        names = [n for n in module._flat_weights_names if n.startswith("weight")]
    result: dict[str, Any] = {"is_decomposed": False}
    for name in names:
        observer = qconfig.weight()
        if _dt.is_qdtype_like(observer.dtype) and observer.dtype not in (torch.float16,
                                                                         torch.float32):
            observer(getattr(module, name))
        result[name] = get_qparam_dict(observer)
    return result


def _reference_for(module: torch.nn.Module, qconfig: Any, root_to_ref: dict[type, type]
                   ) -> Optional[torch.nn.Module]:
    """The reference module for a float / fused / QAT weighted module (fused: element 0 is
    replaced, the container stays); None when the backend config has no reference module."""
    weight_post_process = None
    if hasattr(module, "weight_fake_quant") and hasattr(module, "to_float"):
        weight_post_process = module.weight_fake_quant
        module = module.to_float()
    float_module = module[0] if isinstance(module, torch.nn.Sequential) else module
    ref_cls = root_to_ref.get(type(float_module))
    if ref_cls is None:
        return None
    if isinstance(float_module, (torch.nn.RNNCellBase, torch.nn.RNNBase)):
        return ref_cls.from_float(float_module, _rnn_weight_qparams(float_module, qconfig))
    if not hasattr(float_module, "weight"):
        return None
    if weight_post_process is None:
        weight_post_process = qconfig.weight()
    weight_post_process(float_module.weight)
    ref = ref_cls.from_float(float_module, get_qparam_dict(weight_post_process))
    if isinstance(module, torch.nn.Sequential):
        module[0] = ref
        return module
    return ref


def run_weight_observers(gm: GraphModule, backend_config: BackendConfig) -> None:
    """Observe each functional op's weight once more, as torch.ao's convert does before it
    reads any qparams: for a QAT fake quant (moving averages) this moves the qparams to the
    trained weight (the step a module's ``from_float`` takes with its own weight observer); for
    PTQ observers it changes nothing (the same weight again)."""
    configs = backend_config._pattern_complex_format_to_config
    modules = dict(gm.named_modules(remove_duplicate=False))
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in configs:
            continue
        index = configs[node.target]._input_type_to_index.get("weight")
        if index is None or index >= len(node.args):
            continue
        observer_node = node.args[index]
        if not (isinstance(observer_node, Node) and observer_node.op == "call_module"
                and _is_observer(modules.get(str(observer_node.target)))):
            continue
        weight = observer_node.args[0]
        if isinstance(weight, Node) and weight.op == "get_attr":
            with torch.no_grad():
                modules[str(observer_node.target)](optional_attr_value(gm, weight))


def remove_qconfigs(gm: GraphModule) -> None:
    for name, module in list(gm.named_modules(remove_duplicate=False)):
        if hasattr(module, "qconfig"):
            try:
                del module.qconfig
            except AttributeError:
                pass


def convert_to_reference(gm: GraphModule, backend_config: BackendConfig,
                         quantized_roots: dict[str, Any], remove_qconfig: bool = True,
                         node_name_to_scope: dict[str, tuple[str, Any]] | None = None,
                         node_name_to_qconfig: dict[str, Any] | None = None) -> GraphModule:
    """Reference model, in place on ``gm`` (already a copy).  ``remove_qconfig=False`` keeps
    the modules' qconfigs for the lowering (a quantized PReLU observes its weight then).  The
    prepare step's scopes and qconfigs name the qparam buffers as torch.ao does."""
    scopes, qconfigs = node_name_to_scope or {}, node_name_to_qconfig or {}
    modules = dict(gm.named_modules(remove_duplicate=False))
    root_to_ref = get_root_module_to_quantized_reference_module(backend_config)
    for node in list(gm.graph.nodes):
        if node.op != "call_module":
            continue
        module = modules[str(node.target)]
        if _is_observer(module):
            _replace_observer(gm, node, module, _qparam_buffer_prefix(node, scopes, qconfigs))
        elif node.name in quantized_roots:
            qconfig = getattr(module, "qconfig", None)
            if qconfig is None:
                continue
            ref = _reference_for(module, qconfig, root_to_ref)
            if ref is not None:
                _set_module(gm, str(node.target), ref)
    if remove_qconfig:
        remove_qconfigs(gm)
    gm.graph.eliminate_dead_code()
    for name, module in list(gm._modules.items()):
        if _is_observer(module):
            delattr(gm, name)
    gm.delete_all_unused_submodules()
    gm.graph.lint()
    gm.recompile()
    return gm


# ---------------------------------------------------------------------------------------------
# lowering

def _nn_class(path: str) -> type:
    """The module class a pattern-table path names: ``torch.<Name>`` in ``torch.nn``, anything
    else a path under ``torchquant.nn``."""
    if path.startswith("torch."):
        return getattr(torch.nn, path[len("torch."):])
    value: Any = _tq_nn
    for part in path.split("."):
        value = getattr(value, part)
    return value


def _fx_lowerings(kind: str) -> tuple[dict[type, type], dict[type, tuple[type, type]]]:
    """FX convert's rows of one kind in torchquant.ops.patterns.PATTERNS: (reference / float
    module -> quantized module, fused module -> (its first child's type, quantized module))."""
    plain: dict[type, type] = {}
    fused: dict[type, tuple[type, type]] = {}
    for row in _patterns.fx_modules(kind):
        if row.inner:
            fused[_nn_class(row.root)] = (_nn_class(row.inner), _nn_class(row.target))
        else:
            plain[_nn_class(row.root)] = _nn_class(row.target)
    return plain, fused


# reference module -> quantized module, its qparams from the quantize after it
_LOWER_MODULES, _LOWER_FUSED_MODULES = _fx_lowerings("static")
# the same for fused modules reading a second quantized input (conv + add)
_, _LOWER_TWO_INPUT_FUSED_MODULES = _fx_lowerings("two_inputs")
# float modules between dequantize and quantize that become quantized modules taking the
# output qparams (torch's "special pattern" lowering for the native / x86 backends)
_LOWER_OUTPUT_QPARAMS_MODULES, _ = _fx_lowerings("output_qparams")
# reference module -> dynamic quantized module (float in, float out; the input observer's
# quantize_per_tensor_dynamic / float16 rounding is folded into the module)
_DYNAMIC_LOWER_MODULES, _DYNAMIC_LOWER_FUSED_MODULES = _fx_lowerings("dynamic")
# weight-only: float in, float out, quantized weight
_WEIGHT_ONLY_LOWER_MODULES, _ = _fx_lowerings("weight_only")
# ops that run on a QTensor and keep its qparams: a dequantize -> op -> quantize island around
# them is removed whatever the backend config says (torch's lowering does the same, for these
# exact lists: ``torch.relu`` and the ``.flatten()`` method are not among them there, so they
# stay float between dequantize and quantize, requantized to their own observer's qparams)
_COPY_MODULES, _COPY_FUNCTIONS, _COPY_METHODS = _patterns.fx_ops("shares_qparams")
# fixed-qparams ops: the QTensor op produces its fixed output qparams
_FIXED_QPARAMS_MODULES, _FIXED_QPARAMS_FUNCTIONS, _FIXED_QPARAMS_METHODS = \
    _patterns.fx_ops("fixed_qparams")
_ADD_OPS, _MUL_OPS = _patterns.fx_ops("add")[1], _patterns.fx_ops("mul")[1]
_MATMUL_OPS = _patterns.fx_ops("matmul")[1]
_CAT_OPS = _patterns.fx_ops("cat")[1]
_WEIGHTED_FUNCTIONS = _patterns.fx_ops("conv")[1] + _patterns.fx_ops("linear")[1]
_DYNAMIC_FUNCTIONS = _patterns.fx_ops("linear_dynamic")[1]
_RELU_FUNCTIONS = (F.relu, torch.relu)


def _is_quantize(node: Any) -> bool:
    return isinstance(node, Node) and node.op == "call_function" and \
        node.target in _QUANTIZE_FUNCTIONS


def _is_dequantize(node: Any) -> bool:
    """A ``dequantize`` of a value whose quantization parameters are known (a quantize node or
    an already lowered quantized node)."""
    return isinstance(node, Node) and node.op == "call_method" and node.target == "dequantize" \
        and isinstance(node.args[0], Node) and "torchquant_qparams" in node.args[0].meta


def _qparams(gm: GraphModule, node: Node) -> tuple[float, int]:
    """Output qparams of a quantize node or of a lowered quantized node."""
    return node.meta["torchquant_qparams"]


def _record_quantize_qparams(gm: GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is quantize_per_tensor:
            _, scale_node, zp_node, _ = node.args
            node.meta["torchquant_qparams"] = (float(getattr(gm, str(scale_node.target))),
                                               int(getattr(gm, str(zp_node.target))))


def _single_quantize_user(node: Node) -> Optional[Node]:
    """``node``'s one user where it is a per-tensor quantize; None otherwise."""
    user = only_user(node)
    if user is not None and _is_quantize(user) and user.target is quantize_per_tensor:
        return user
    return None


def _between_dequantize_and_quantize(node: Node) -> Optional[tuple[Node, Node]]:
    """(the dequantize ``node`` reads first, the one quantize that reads ``node``) where
    ``node`` sits between the two; None otherwise."""
    if not node.args or not _is_dequantize(node.args[0]):
        return None
    quant_out = _single_quantize_user(node)
    return None if quant_out is None else (node.args[0], quant_out)


def _quantized_output(gm: GraphModule, node: Node, modules: dict[str, torch.nn.Module]
                      ) -> Optional[tuple[bool, Node, Node, float, int]]:
    """How ``node``'s result leaves the quantized region: ``(relu, tail, quantize_node, scale,
    zero_point)`` where it feeds one per-tensor quantize, directly or through one ReLU (which
    the lowered op fuses; ``tail`` is the last node replaced); None otherwise."""
    relu, tail = False, node
    users = list(node.users)
    if len(users) == 1 and _is_relu(users[0], modules):
        relu, tail = True, users[0]
    quant_out = _single_quantize_user(tail)
    if quant_out is None:
        return None
    return (relu, tail, quant_out, *_qparams(gm, quant_out))


def _is_relu(node: Node, modules: dict[str, torch.nn.Module]) -> bool:
    return ((node.op == "call_module" and type(modules.get(str(node.target))) is torch.nn.ReLU)
            or (node.op == "call_function" and node.target in _RELU_FUNCTIONS)
            or (node.op == "call_method" and node.target == "relu"))


# GraphModule attribute: {node name: (arg index of the scale, scale buffer, zero point buffer,
# qdtype name)} for every lowered node whose output qparams are literal arguments
_QPARAM_LITERALS = "_torchquant_qparam_literals"


def _record_qparam_literals(gm: GraphModule, lowered: Node, quant_args: tuple,
                            qparams: tuple[float, int]) -> None:
    """Remember that ``lowered`` carries, as adjacent literal arguments, the (scale, zero point)
    ``qparams`` of the per-tensor quantize whose arguments were ``quant_args`` (and whose
    buffers they come from)."""
    _, scale_node, zp_node, qdtype_name = quant_args
    if not (isinstance(scale_node, Node) and scale_node.op == "get_attr"
            and isinstance(zp_node, Node) and zp_node.op == "get_attr"):
        return
    scale, zero_point = qparams
    args = lowered.args
    for i in range(len(args) - 1):
        if type(args[i]) is float and type(args[i + 1]) is int and args[i] == scale \
                and args[i + 1] == zero_point:
            literals = gm.__dict__.setdefault(_QPARAM_LITERALS, {})
            literals[lowered.name] = (i, str(scale_node.target), str(zp_node.target),
                                      qdtype_name)
            return


def activation_qparams(scale: torch.Tensor, zero_point: torch.Tensor, qdtype_name: str,
                       traced_scale: float, traced_zero_point: int) -> tuple[float, int]:
    """Graph form: an activation's (scale, zero point) buffers as Python numbers.  Eager reads
    the buffers (so ``load_state_dict`` or an in-place change is seen at once, as with torch.ao's
    ``get_attr`` nodes); under ``torch.export`` / ``torch.compile`` the numbers last read from
    them stand in (:func:`refresh_qparam_literals` keeps them current; ``load_state_dict`` calls
    it), so tracing sees constants, not data-dependent reads."""
    if torch.compiler.is_compiling():
        return traced_scale, traced_zero_point
    return float(scale), int(zero_point)


def read_qparams_from_buffers(gm: GraphModule) -> None:
    """Last convert step: each lowered node's literal output qparams become
    ``activation_qparams(<_scale_n buffer>, <_zero_point_n buffer>, ...)``."""
    literals = gm.__dict__.pop(_QPARAM_LITERALS, None)
    if not literals:
        return
    graph = gm.graph
    for node in list(graph.nodes):
        if node.name not in literals or node.op not in ("call_function", "call_module",
                                                         "call_method"):
            continue
        i, scale_attr, zp_attr, qdtype_name = literals[node.name]
        scale, zero_point = node.args[i], node.args[i + 1]
        with graph.inserting_before(node):
            qparams = graph.call_function(activation_qparams, (
                graph.get_attr(scale_attr), graph.get_attr(zp_attr), qdtype_name, scale,
                zero_point))
            args = list(node.args)
            args[i] = graph.call_function(operator.getitem, (qparams, 0))
            args[i + 1] = graph.call_function(operator.getitem, (qparams, 1))
        node.args = tuple(args)
    if _refresh_after_load not in gm._load_state_dict_post_hooks.values():
        gm.register_load_state_dict_post_hook(_refresh_after_load)
    graph.lint()
    gm.recompile()


def refresh_qparam_literals(gm: GraphModule) -> bool:
    """Re-read the numbers that stand in for the activation qparam buffers under
    ``torch.export`` / ``torch.compile`` (validated: a non-positive scale or a zero point outside
    its dtype raises ``ValueError`` naming the buffer).  ``load_state_dict`` calls it; call it
    after changing a buffer in place and before exporting.  Returns whether anything changed."""
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is not activation_qparams:
            continue
        scale_node, zp_node, qdtype_name, old_scale, old_zero_point = node.args
        scale_attr, zp_attr = str(scale_node.target), str(zp_node.target)
        scale = _as_output_scale(optional_attr_value(gm, scale_node), scale_attr)
        zero_point = _as_output_zero_point(optional_attr_value(gm, zp_node),
                                           (_dt.qdtype_of(qdtype_name),), zp_attr)
        if (scale, zero_point) != (old_scale, old_zero_point):
            node.args = (scale_node, zp_node, qdtype_name, scale, zero_point)
            changed = True
    if changed:
        gm.recompile()
    return changed


def _refresh_after_load(module: torch.nn.Module, incompatible_keys: Any) -> None:
    """``load_state_dict`` post-hook of a converted GraphModule."""
    if isinstance(module, GraphModule):
        refresh_qparam_literals(module)


def drop_unread_attributes(gm: GraphModule) -> None:
    """Parameters and buffers that the lowered graph no longer reads (an activation qparam
    buffer whose quantize was folded into a module holding its own qparams; a functional
    linear's float weight, now quantized into its own holder) leave the model, as torch.ao's
    convert rebuilds its GraphModule from what the graph uses: neither a ``get_attr`` target
    nor inside a module the graph calls."""
    read = {str(n.target) for n in gm.graph.nodes if n.op == "get_attr"}
    called = {str(n.target) for n in gm.graph.nodes if n.op == "call_module"}

    def used(name: str) -> bool:
        return name in read or any(name.startswith(path + ".") for path in called)

    for kind in ("_parameters", "_buffers"):
        for name, _ in list(getattr(gm, "named_" + kind[1:])()):
            if used(name):
                continue
            owner_path, _, attr = name.rpartition(".")
            owner = gm.get_submodule(owner_path) if owner_path else gm
            getattr(owner, kind).pop(attr, None)


def _finish(gm: GraphModule, lowered: Node, quant_out: Node, dropped: list[Node]) -> None:
    if quant_out.target is quantize_per_tensor:
        _record_qparam_literals(gm, lowered, quant_out.args, _qparams(gm, quant_out))
    quant_out.replace_all_uses_with(lowered)
    graph = gm.graph
    graph.erase_node(quant_out)
    for node in dict.fromkeys(dropped):  # (x + x reads one dequantize twice)
        if not node.users:
            graph.erase_node(node)


def lower_to_torchquant(gm: GraphModule, backend_config: BackendConfig) -> GraphModule:
    """Replace quantizable ``dequantize -> op -> quantize`` islands by torchquant quantized
    modules / QTensor ops, in place."""
    graph = gm.graph
    modules = dict(gm.named_modules(remove_duplicate=False))
    _record_quantize_qparams(gm)
    for node in list(graph.nodes):
        if getattr(node, "_erased", False) or node.op not in ("call_module", "call_function",
                                                       "call_method"):
            continue
        if node.op == "call_module":
            module = modules.get(str(node.target))
            lowered_cls, inputs = None, 1
            if type(module) in _LOWER_MODULES:
                lowered_cls = _LOWER_MODULES[type(module)]
            for fused, count in ((_LOWER_FUSED_MODULES, 1), (_LOWER_TWO_INPUT_FUSED_MODULES, 2)):
                if type(module) in fused and type(module[0]) is fused[type(module)][0]:
                    lowered_cls, inputs = fused[type(module)][1], count
            if _lower_dynamic_or_weight_only_module(gm, modules, node, module):
                continue
            if type(module) in _LOWER_OUTPUT_QPARAMS_MODULES:
                _lower_output_qparams_module(gm, modules, node, module)
                continue
            if lowered_cls is not None:
                quant_out = _single_quantize_user(node)
                if len(node.args) == inputs and all(_is_dequantize(a) for a in node.args) \
                        and not node.kwargs and quant_out is not None:
                    scale, zp = _qparams(gm, quant_out)
                    qmod = lowered_cls.from_reference(module, scale, zp)
                    _set_module(gm, str(node.target), qmod)
                    modules[str(node.target)] = qmod
                    dqs = list(dict.fromkeys(node.args))
                    node.args = tuple(dq.args[0] for dq in node.args)
                    node.meta["torchquant_qparams"] = (scale, zp)
                    _finish(gm, node, quant_out, dqs)
                continue
        if node.op == "call_function" and node.target in _ADD_OPS + _MUL_OPS + _MATMUL_OPS:
            _lower_binary(gm, modules, node)
            continue
        if node.op == "call_function" and node.target in _DYNAMIC_FUNCTIONS and \
                _lower_dynamic_functional_linear(gm, modules, node):
            continue
        if node.op == "call_function" and node.target in _WEIGHTED_FUNCTIONS:
            _lower_functional_weighted(gm, modules, node)
            continue
        if node.op == "call_function" and node.target in _LOWER_FUNCTIONALS:
            _lower_functional(gm, node)
            continue
        if node.op == "call_function" and node.target in _CAT_OPS:
            _lower_cat(gm, node)
            continue
        if (node.op == "call_module" and type(modules.get(str(node.target))) in _COPY_MODULES) or (
                node.op == "call_function" and node.target in _COPY_FUNCTIONS) or (
                node.op == "call_method" and node.target in _COPY_METHODS):
            _lower_share(gm, node)
        elif (node.op == "call_module" and type(modules.get(str(node.target))) in
              _FIXED_QPARAMS_MODULES) or (
                node.op == "call_function" and node.target in _FIXED_QPARAMS_FUNCTIONS) or (
                node.op == "call_method" and node.target in _FIXED_QPARAMS_METHODS):
            _lower_share(gm, node, keep_output_qparams=True)
    _inline_quantize_qparams(gm)
    graph.eliminate_dead_code()
    gm.delete_all_unused_submodules()
    graph.lint()
    gm.recompile()
    return gm


def unlowered_reference_modules(gm: GraphModule) -> dict[str, str]:
    """Module path -> why, for each module a lowered graph still runs as its reference module
    (float math between quantize and dequantize): its pattern was quantized at prepare, but
    the quantize / dequantize around it are not what its quantized form needs (a missing
    input or output quantize, another dtype)."""
    roots = {*_LOWER_MODULES, *_DYNAMIC_LOWER_MODULES, *_WEIGHT_ONLY_LOWER_MODULES}
    fused = {**_LOWER_FUSED_MODULES, **_LOWER_TWO_INPUT_FUSED_MODULES,
             **_DYNAMIC_LOWER_FUSED_MODULES}
    modules = dict(gm.named_modules(remove_duplicate=False))
    reasons = {}
    for node in gm.graph.nodes:
        module = modules.get(str(node.target)) if node.op == "call_module" else None
        if type(module) in roots or (type(module) in fused
                                     and type(module[0]) is fused[type(module)][0]):
            reasons[str(node.target)] = ("the quantize / dequantize around it do not fit its "
                                         "quantized module: it runs as its reference module, "
                                         "in float")
    return reasons


def _inline_quantize_qparams(gm: GraphModule) -> None:
    """Remaining per-tensor quantize nodes take their qparams as constants (no tensor ``.item()``
    in the lowered graph, so torch.export / torch.compile see no data-dependent values).  The
    buffers stay in the state dict as the source of those constants
    (:func:`refresh_qparam_literals` re-reads them after ``load_state_dict``)."""
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target is quantize_per_tensor and \
                "torchquant_qparams" in node.meta:
            x, scale_node, zp_node, name = node.args
            if not isinstance(scale_node, Node):
                continue
            scale, zero_point = node.meta["torchquant_qparams"]
            quant_args = node.args
            node.args = (x, scale, zero_point, name)
            _record_qparam_literals(gm, node, quant_args, (scale, zero_point))
            for attr in (scale_node, zp_node):
                if isinstance(attr, Node) and not attr.users:
                    gm.graph.erase_node(attr)


def _lower_binary(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node) -> None:
    if len(node.args) != 2 or node.kwargs:
        return
    a, b = node.args
    if isinstance(a, (int, float)) and node.target in _ADD_OPS + _MUL_OPS:
        a, b = b, a
    if _is_dequantize(a) and isinstance(b, (int, float)) and not isinstance(b, bool):
        _lower_binary_scalar(gm, modules, node, a, float(b))
        return
    if not (_is_dequantize(a) and _is_dequantize(b)):
        return
    output = _quantized_output(gm, node, modules)
    if output is None:
        return
    relu, tail, quant_out, scale, zp = output
    if node.target in _MATMUL_OPS:
        if relu:   # torch's quantized matmul has no fused ReLU: matmul and ReLU stay float
            return
        op = _binary.matmul
    else:
        op = _binary.add if node.target in _ADD_OPS else _binary.mul
    with gm.graph.inserting_before(node):
        lowered = gm.graph.call_function(op, (a.args[0], b.args[0], scale, zp),
                                         {"relu": True} if relu else {})
    lowered.meta["torchquant_qparams"] = (scale, zp)
    _finish(gm, lowered, quant_out, ([tail] if relu else []) + [node, a, b])


def _lower_binary_scalar(gm: GraphModule, modules: dict[str, torch.nn.Module], node: Node,
                         dq: Node, other: float) -> None:
    """``dequantize(x) + c`` / ``* c`` -> quantized add_scalar / mul_scalar (the output qparams
    follow from the input's, as in torch's quantized ops)."""
    relu = False
    tail = node
    users = list(node.users)
    if len(users) == 1 and _is_relu(users[0], modules):
        relu, tail = True, users[0]
    quant_out = _single_quantize_user(tail)
    if quant_out is None:
        return
    with gm.graph.inserting_before(node):
        if node.target in _ADD_OPS:
            lowered = gm.graph.call_function(_binary.add_scalar, (dq.args[0], other),
                                             {"relu": True} if relu else {})
        else:
            lowered = gm.graph.call_function(_binary.mul_scalar, (dq.args[0], other))
            if relu:
                lowered = gm.graph.call_function(torch.relu, (lowered,))
    lowered.meta["torchquant_qparams"] = _qparams(gm, dq.args[0])
    _finish(gm, lowered, quant_out, ([tail] if relu else []) + [node, dq])


def _lower_cat(gm: GraphModule, node: Node) -> None:
    tensors = node.args[0]
    dim = node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)
    if not isinstance(tensors, (list, tuple)) or not all(_is_dequantize(t) for t in tensors):
        return
    quant_out = _single_quantize_user(node)
    if quant_out is None:
        return
    # the output takes the first input's qparams at run time, as torch.ao's lowered
    # torch.cat does (its observer is shared with the inputs: the same values at convert), so a
    # loaded state dict moves both together and the output's own buffers are not read
    with gm.graph.inserting_before(node):
        lowered = gm.graph.call_function(_binary.cat, ([t.args[0] for t in tensors], dim, None,
                                                       None))
    lowered.meta["torchquant_qparams"] = _qparams(gm, quant_out)
    _finish(gm, lowered, quant_out, [node, *tensors])


def _lower_share(gm: GraphModule, node: Node, keep_output_qparams: bool = False) -> None:
    """A copy / shape op (pooling, relu, flatten, view ...) between dequantize and quantize runs
    directly on the QTensor and keeps its input's qparams; the quantize after it is dropped even
    when its qparams differ (torch's lowering does the same: the op's output inherits the
    input's scale and zero point)."""
    between = _between_dequantize_and_quantize(node)
    if between is None:
        return
    dq, quant_out = between
    node.args = (dq.args[0], *node.args[1:])
    node.meta["torchquant_qparams"] = _qparams(gm, quant_out if keep_output_qparams
                                               else dq.args[0])
    _finish(gm, node, quant_out, [dq])


_FUNCTIONAL_CONVS = {
    F.conv1d: (nnq.Conv1d, nniq.ConvReLU1d),
    F.conv2d: (nnq.Conv2d, nniq.ConvReLU2d),
    F.conv3d: (nnq.Conv3d, nniq.ConvReLU3d),
}


def _quantized_module_for_functional(node: Node, weight: torch.Tensor, bias: Any, relu: bool
                                     ) -> Optional[torch.nn.Module]:
    if node.target is F.linear:
        cls = nniq.LinearReLU if relu else nnq.Linear
        return cls(weight.shape[1], weight.shape[0], bias is not None)
    arguments = _patterns.conv_arguments(node, weight.dim() - 2)
    if arguments is None:
        return None                      # dynamic or 'same'/'valid' padding: keep float
    stride, padding, dilation, groups = arguments[3:]
    cls = _FUNCTIONAL_CONVS[node.target][1 if relu else 0]
    return cls(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]),
               stride=stride, padding=padding, dilation=dilation, groups=groups,
               bias=bias is not None)


def _lower_functional_weighted(gm: GraphModule, modules: dict[str, torch.nn.Module],
                               node: Node) -> None:
    """``dequantize(x), dequantize(quantize(w)) -> F.linear / F.conv* (-> relu) -> quantize``
    becomes a quantized Linear / Conv (or its ReLU-fused form) submodule holding the quantized
    weight."""
    args = list(node.args) + [None] * (3 - len(node.args))
    x_dq, w_dq, bias_node = args[:3]
    bias_node = node.kwargs.get("bias", bias_node)
    if not (_is_dequantize(x_dq) and isinstance(w_dq, Node) and w_dq.op == "call_method"
            and w_dq.target == "dequantize" and _is_quantize(w_dq.args[0])):
        return
    w_quant = w_dq.args[0]
    try:
        weight = optional_attr_value(gm, w_quant.args[0])
        bias = optional_attr_value(gm, bias_node)
    except ValueError:
        return
    output = _quantized_output(gm, node, modules)
    if output is None:
        return
    relu, tail, quant_out, scale, zp = output
    if w_quant.target is quantize_per_channel:
        _, scales, zps, axis, name = w_quant.args
        w_q = _quantize_per_channel(weight.detach(), optional_attr_value(gm, scales),
                                    optional_attr_value(gm, zps), axis, _dt.qdtype_of(name))
    else:
        _, w_scale, w_zp, name = w_quant.args
        w_q = _quantize_per_tensor(weight.detach(), float(optional_attr_value(gm, w_scale)),
                                   int(optional_attr_value(gm, w_zp)), _dt.qdtype_of(name))
    qlinear = _quantized_module_for_functional(node, weight, bias, relu)
    if qlinear is None:
        return
    qlinear.set_weight_bias(w_q, None if bias is None else bias.detach())
    qlinear.scale, qlinear.zero_point = scale, zp
    module_name = fresh_attr_name(gm, f"{node.name}_quantized_")
    gm.add_submodule(module_name, qlinear)
    _keep_original_weights(gm, module_name, weight, bias)
    modules[module_name] = qlinear
    with gm.graph.inserting_before(node):
        lowered = gm.graph.call_module(module_name, (x_dq.args[0],))
    lowered.meta["torchquant_qparams"] = (scale, zp)
    _finish(gm, lowered, quant_out, ([tail] if relu else []) + [node, x_dq, w_dq])


# ---------------------------------------------------------------------------------------------
# dynamic and weight-only lowering

def _dynamic_source(node: Any) -> Optional[Node]:
    """``x`` when ``node`` is the reference form of a dynamically quantized activation:
    ``dequantize(quantize_per_tensor_dynamic(x))`` or ``round_to_float16(x)``."""
    if not isinstance(node, Node):
        return None
    if node.op == "call_function" and node.target is round_to_float16:
        return node.args[0]
    if node.op == "call_method" and node.target == "dequantize" and \
            isinstance(node.args[0], Node) and node.args[0].op == "call_function" and \
            node.args[0].target is quantize_per_tensor_dynamic:
        return node.args[0].args[0]
    return None


def _drop_if_unused(gm: GraphModule, nodes: list[Node]) -> None:
    for node in nodes:
        if not getattr(node, "_erased", False) and not node.users:
            gm.graph.erase_node(node)


def _lower_dynamic_or_weight_only_module(gm: GraphModule, modules: dict[str, torch.nn.Module],
                                         node: Node, module: torch.nn.Module) -> bool:
    """Reference Linear / LinearReLU / RNN fed by a dynamically quantized activation ->
    torchquant's dynamic module; reference Embedding(Bag) -> quantized Embedding(Bag)."""
    if type(module) in _WEIGHT_ONLY_LOWER_MODULES:
        qmod = _WEIGHT_ONLY_LOWER_MODULES[type(module)].from_reference(module)
        _set_module(gm, str(node.target), qmod)
        modules[str(node.target)] = qmod
        return True
    lowered_cls = _DYNAMIC_LOWER_MODULES.get(type(module))
    if type(module) in _DYNAMIC_LOWER_FUSED_MODULES and \
            type(module[0]) is _DYNAMIC_LOWER_FUSED_MODULES[type(module)][0]:
        lowered_cls = _DYNAMIC_LOWER_FUSED_MODULES[type(module)][1]
    if lowered_cls is None or not node.args:
        return False
    source = _dynamic_source(node.args[0])
    if source is None:
        return False
    qmod = lowered_cls.from_reference(module)
    _set_module(gm, str(node.target), qmod)
    modules[str(node.target)] = qmod
    old_input = node.args[0]
    node.args = (source, *node.args[1:])
    _drop_if_unused(gm, [old_input] + ([old_input.args[0]] if old_input.op == "call_method"
                                       else []))
    return True


def _lower_dynamic_functional_linear(gm: GraphModule, modules: dict[str, torch.nn.Module],
                                     node: Node) -> bool:
    """``F.linear(dynamic(x), dequantize(quantize(w)) or round_to_float16(w), b)`` (-> relu)
    -> a functional ``torch.ops.torchquant.linear_dynamic`` (``linear_dynamic_fp16``) call, as
    torch.ao keeps ``torch.ops.quantized.linear(_relu)_dynamic(_fp16)``.  The int8 weight, its
    qparams (0-d per tensor, 1-d per channel) and the bias (float16 weight and bias for fp16)
    become ``_packed_weight_<n>`` / ``_packed_weight_<n>_scale`` / ``_zero_point`` / ``_bias``
    buffers read by ``get_attr`` nodes; the op packs them once (repacking after
    ``load_state_dict`` changes them)."""
    args = list(node.args) + [None] * (3 - len(node.args))
    x_node, w_node, bias_node = args[:3]
    bias_node = node.kwargs.get("bias", bias_node)
    source = _dynamic_source(x_node)
    if source is None or not isinstance(w_node, Node):
        return False
    try:
        if w_node.op == "call_function" and w_node.target is round_to_float16:
            weight = optional_attr_value(gm, w_node.args[0])
            w_q = None
            w_nodes = [w_node]
        elif w_node.op == "call_method" and w_node.target == "dequantize" and \
                _is_quantize(w_node.args[0]):
            w_quant = w_node.args[0]
            weight = optional_attr_value(gm, w_quant.args[0])
            w_q = _quantized_weight(gm, w_quant, weight)
            w_nodes = [w_node, w_quant]
        else:
            return False
        bias = optional_attr_value(gm, bias_node)
    except ValueError:
        return False
    users = list(node.users)
    relu = len(users) == 1 and _is_relu(users[0], modules)
    holder = fresh_attr_name(gm, "_packed_weight_")
    if w_q is None:
        buffers = [("", to_float16_weight(weight))]
    else:
        scale, zero_point = weight_qparams(torch.as_tensor(w_q.scale),
                                           torch.as_tensor(w_q.zero_point), w_q.axis)
        buffers = [("", w_q.int_data), ("_scale", scale), ("_zero_point", zero_point)]
    if bias is not None:
        buffers.append(("_bias", bias.detach().float()))
    graph = gm.graph
    attrs = []
    with graph.inserting_before(node):
        for suffix, value in buffers:
            gm.register_buffer(holder + suffix, value.detach().clone().contiguous())
            attrs.append(graph.get_attr(holder + suffix))
        if w_q is None:
            op, op_args = torch.ops.torchquant.linear_dynamic_fp16.default, (
                source, attrs[0], attrs[1] if bias is not None else None, relu)
        else:
            op, op_args = torch.ops.torchquant.linear_dynamic.default, (
                source, *attrs[:3], attrs[3] if bias is not None else None,
                _DYNAMIC_REDUCE_RANGE, relu)
        lowered = graph.call_function(op, op_args)
    _keep_original_weights(gm, holder, weight, bias)
    tail = users[0] if relu else node
    tail.replace_all_uses_with(lowered)
    if relu:
        graph.erase_node(tail)
    graph.erase_node(node)
    _drop_if_unused(gm, [x_node] + ([x_node.args[0]] if x_node.op == "call_method" else [])
                    + w_nodes)
    return True


def _quantized_weight(gm: GraphModule, w_quant: Node, weight: torch.Tensor) -> Any:
    """The QTensor weight of a reference ``quantize_per_tensor`` / ``_per_channel`` node."""
    if w_quant.target is quantize_per_channel:
        _, scales, zps, axis, name = w_quant.args
        return _quantize_per_channel(weight.detach(), optional_attr_value(gm, scales),
                                     optional_attr_value(gm, zps), axis, _dt.qdtype_of(name))
    _, w_scale, w_zp, name = w_quant.args
    return _quantize_per_tensor(weight.detach(), float(optional_attr_value(gm, w_scale)),
                                int(optional_attr_value(gm, w_zp)), _dt.qdtype_of(name))


# ---------------------------------------------------------------------------------------------
# ops with their own output qparams (torch's "special pattern" lowering)

def _lower_output_qparams_module(gm: GraphModule, modules: dict[str, torch.nn.Module],
                                 node: Node, module: torch.nn.Module) -> None:
    """``dequantize -> module -> quantize`` -> the quantized module with the quantize's
    qparams as its output qparams."""
    between = _between_dequantize_and_quantize(node)
    if between is None:
        return
    dq, quant_out = between
    scale, zp = _qparams(gm, quant_out)
    qmod = _LOWER_OUTPUT_QPARAMS_MODULES[type(module)].from_reference(module, scale, zp)
    _set_module(gm, str(node.target), qmod)
    modules[str(node.target)] = qmod
    node.args = (dq.args[0], *node.args[1:])
    node.meta["torchquant_qparams"] = (scale, zp)
    _finish(gm, node, quant_out, [dq])


def _hardswish(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    return qF.hardswish, (kw["input"], scale, zp), {}


def _elu(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    return qF.elu, (kw["input"], scale, zp, kw["alpha"]), {}


def _leaky_relu(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    return qF.leaky_relu, (kw["input"], kw["negative_slope"], False, scale, zp), {}


def _layer_norm(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    return _normalization.layer_norm, (kw["input"], kw["normalized_shape"], kw["weight"],
                                       kw["bias"], kw["eps"], scale, zp), {}


def _instance_norm(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    if not kw["use_input_stats"]:
        return None
    return _normalization.instance_norm, (kw["input"], kw["weight"], kw["bias"], kw["eps"],
                                          scale, zp), {}


def _dropout(kw: dict, scale: float, zp: int) -> Optional[tuple[Any, tuple, dict]]:
    """Eval-mode dropout is the identity (its output observer is shared with its input)."""
    if kw["training"]:
        return None
    return None, (kw["input"],), {}


# the quantized function for each function of the table's "functional_output_qparams" row
_FUNCTIONAL_EMITTERS = {"dropout": _dropout, "hardswish": _hardswish, "elu": _elu,
                        "leaky_relu": _leaky_relu, "layer_norm": _layer_norm,
                        "instance_norm": _instance_norm}
_LOWER_FUNCTIONALS = {fn: _FUNCTIONAL_EMITTERS[fn.__name__]
                      for fn in _patterns.fx_ops("functional_output_qparams")[1]}


def _lower_functional(gm: GraphModule, node: Node) -> None:
    """``dequantize -> F.hardswish / elu / leaky_relu / layer_norm / instance_norm ->
    quantize`` -> the QTensor function with the quantize's output qparams."""
    normalized = normalize_function(node.target, tuple(node.args), dict(node.kwargs),
                                    normalize_to_only_use_kwargs=True)
    if normalized is None:
        return
    kwargs = dict(normalized.kwargs)
    dq = kwargs.get("input")
    if not _is_dequantize(dq):
        return
    quant_out = _single_quantize_user(node)
    if quant_out is None:
        return
    scale, zp = _qparams(gm, quant_out)
    kwargs["input"] = dq.args[0]
    replacement = _LOWER_FUNCTIONALS[node.target](kwargs, scale, zp)
    if replacement is None:
        return
    target, args, extra = replacement
    if target is None:                  # identity on the QTensor
        quant_out.replace_all_uses_with(args[0])
        gm.graph.erase_node(quant_out)
        for dropped in (node, dq):
            if not dropped.users:
                gm.graph.erase_node(dropped)
        return
    with gm.graph.inserting_before(node):
        lowered = gm.graph.call_function(target, args, extra)
    lowered.meta["torchquant_qparams"] = (scale, zp)
    _finish(gm, lowered, quant_out, [node, dq])


# ---------------------------------------------------------------------------------------------
# quantized graph inputs / outputs and custom modules (PrepareCustomConfig /
# ConvertCustomConfig)

def _quantize_node_qparams(gm: GraphModule, node: Node) -> Optional[tuple[float, int]]:
    """(scale, zero_point) of a per-tensor quantize node (buffers or inlined numbers)."""
    if not (isinstance(node, Node) and node.op == "call_function"
            and node.target is quantize_per_tensor):
        return None
    _, scale, zero_point, _ = node.args
    if isinstance(scale, Node):
        scale, zero_point = optional_attr_value(gm, scale), optional_attr_value(gm, zero_point)
    return float(scale), int(zero_point)


def mark_quantized_inputs(gm: GraphModule, indexes: list[int]) -> None:
    """The placeholders at ``indexes`` receive QTensors: each use gets a ``dequantize`` (as in
    torch), which the lowering then folds into the quantized op that consumes it."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in indexes:
        if i >= len(placeholders):
            continue
        _dequantize_uses(gm, placeholders[i])
    gm.graph.lint()
    gm.recompile()


def _dequantize_uses(gm: GraphModule, node: Node) -> None:
    """``node`` yields a QTensor whose qparams are known only at run time: each use gets a
    ``dequantize``."""
    node.meta["torchquant_qparams"] = None
    for user in list(node.users):
        with gm.graph.inserting_before(user):
            dequant = gm.graph.call_method("dequantize", (node,))
        user.replace_input_with(node, dequant)


def rewire_standalone_module(gm: GraphModule, node_name: str, input_indexes: list[int],
                             output_quantized: bool) -> None:
    """Around a converted standalone module: its quantized inputs are passed as QTensors (the
    dequantize before them is dropped) and a quantized output is dequantized for its users."""
    node = next(n for n in gm.graph.nodes if n.name == node_name)
    args = list(node.args)
    for i in input_indexes:
        arg = args[i] if i < len(args) else None
        if isinstance(arg, Node) and arg.op == "call_method" and arg.target == "dequantize":
            args[i] = arg.args[0]
    old_args = node.args
    node.args = tuple(args)
    for arg in old_args:
        if isinstance(arg, Node) and arg.op == "call_method" and not arg.users:
            gm.graph.erase_node(arg)
    if output_quantized:
        _dequantize_uses(gm, node)
    gm.graph.lint()
    gm.recompile()


def swap_custom_modules(gm: GraphModule, node_names: list[str],
                        observed_to_quantized: dict[type, type]) -> None:
    """Observed custom modules -> ``quantized_class.from_observed(module)``, taking the
    quantized input and producing the quantized output directly (the dequantize before and
    the quantize after them are removed, as in torch)."""
    wanted = set(node_names)
    modules = dict(gm.named_modules(remove_duplicate=False))
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or node.name not in wanted:
            continue
        observed = modules[str(node.target)]
        quantized_cls = observed_to_quantized.get(type(observed))
        if quantized_cls is None:
            raise ValueError(f"convert: no observed_to_quantized mapping for the custom module "
                             f"'{node.target}' ({type(observed).__name__}); add one with "
                             "ConvertCustomConfig().set_observed_to_quantized_mapping")
        _set_module(gm, str(node.target), quantized_cls.from_observed(observed))
        dq = node.args[0] if node.args else None
        if isinstance(dq, Node) and dq.op == "call_method" and dq.target == "dequantize":
            node.args = (dq.args[0], *node.args[1:])
            if not dq.users:
                gm.graph.erase_node(dq)
        users = list(node.users)
        qparams = _quantize_node_qparams(gm, users[0]) if len(users) == 1 else None
        if qparams is not None:
            quant = users[0]
            quant.replace_all_uses_with(node)
            gm.graph.erase_node(quant)
            node.meta["torchquant_qparams"] = qparams
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()


def keep_quantized_outputs(gm: GraphModule, indexes: list[int]) -> None:
    """Graph outputs at ``indexes`` (of the output tuple / list, or 0 for a single output) are
    returned quantized: their final ``dequantize`` is dropped."""
    if not indexes:
        return
    output = next(n for n in gm.graph.nodes if n.op == "output")
    value = output.args[0]

    def strip(v: Any) -> Any:
        if isinstance(v, Node) and v.op == "call_method" and v.target == "dequantize" and \
                isinstance(v.args[0], Node) and ("torchquant_qparams" in v.args[0].meta
                                                 or _is_quantize(v.args[0])):
            return v.args[0]
        return v

    if isinstance(value, (tuple, list)):
        value = type(value)(strip(v) if i in indexes else v for i, v in enumerate(value))
    elif 0 in indexes:
        value = strip(value)
    output.args = (value,)
    gm.graph.eliminate_dead_code()
    gm.graph.lint()
    gm.recompile()
