"""``X86InductorQuantizer``: u8 activations / s8 per-channel weights for x86 CPUs through
inductor (torchao 0.18's ``X86InductorQuantizer``).

Recipe, per config stage (module name, then operator type, then global; a stage never
re-annotates a node claimed earlier):
1. conv2d (QAT: conv+bn first) with binary (add [+relu]) and unary (relu, hardtanh, hardswish,
   relu6, silu) post-ops; linear with add [+relu] and unary (relu, leaky_relu, tanh, gelu)
   post-ops; matmul; same-shape tensor mul.  Only the inputs of a fused pattern are quantized;
   its last node is marked as the output of a quantized pattern.
2. max_pool2d / cat / avg_pool2d / adaptive_avg_pool2d / flatten whose inputs come from
   quantized patterns take int8 in as well.
After all stages, those int8-in-int8-out ops get an output spec shared with their input edge.
A config of ``None`` claims the matching nodes so later stages leave them float.
"""
from __future__ import annotations

import functools
import itertools
import operator
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx import GraphModule, Node

from ...dtypes import per_channel_symmetric, per_tensor_affine
from ..fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from ..observer import (HistogramObserver, MovingAverageMinMaxObserver,
                        MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver,
                        PlaceholderObserver)
from ._graph_utils import SourcePartition, find_sequential_partitions, get_source_partitions
from .quantizer import Q_ANNOTATION_KEY, QuantizationAnnotation, QuantizationSpec, Quantizer, SharedQuantizationSpec
from .utils import (QuantizationConfig, get_bias_qspec, get_input_act_qspec,
                    get_module_name_filter, get_output_act_qspec, get_weight_qspec)

__all__ = ["X86InductorQuantizer", "get_default_x86_inductor_quantization_config",
           "get_x86_inductor_linear_dynamic_fp16_config"]

FilterFn = Callable[[list[Node]], bool]
_aten = torch.ops.aten
_EPS = 2**-12


@dataclass
class _X86InductorQuantizationAnnotation(QuantizationAnnotation):
    #: the node ends a quantized pattern: its output may be int8 for a following int8 op
    _is_output_of_quantized_pattern: bool = False


int8_in_int8_out_ops: set = {
    _aten.max_pool2d.default, _aten.cat.default, _aten.avg_pool2d.default,
    _aten.adaptive_avg_pool2d.default, _aten.flatten.using_ints,
}
propagation_quantizable_ops = int8_in_int8_out_ops
default_quantizable_ops = propagation_quantizable_ops | {
    _aten.conv1d.default, _aten.conv2d.default, _aten.linear.default, _aten.mul.Tensor,
}
quantizable_ops = default_quantizable_ops | {_aten.matmul.default}

# Module / function a user names in set_module_type_qconfig / set_function_type_qconfig ->
# the aten op whose config it sets.
_MODULE_FUNCTION_TO_ATEN_OP: dict[Any, Any] = {
    torch.nn.Conv2d: _aten.conv2d.default,  # torchao maps nn.Conv2d to conv2d (not conv1d)
    F.conv1d: _aten.conv1d.default,
    F.conv2d: _aten.conv2d.default,
    torch.nn.Linear: _aten.linear.default, F.linear: _aten.linear.default,
    torch.nn.MaxPool2d: _aten.max_pool2d.default, F.max_pool2d: _aten.max_pool2d.default,
    torch.cat: _aten.cat.default,
    torch.nn.AvgPool2d: _aten.avg_pool2d.default, F.avg_pool2d: _aten.avg_pool2d.default,
    torch.nn.AdaptiveAvgPool2d: _aten.adaptive_avg_pool2d.default,
    F.adaptive_avg_pool2d: _aten.adaptive_avg_pool2d.default,
    torch.flatten: _aten.flatten.using_ints,
    torch.matmul: _aten.matmul.default,
    torch.mul: _aten.mul.Tensor,
}


# --------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------

@functools.lru_cache
def get_default_x86_inductor_quantization_config(is_qat: bool = False, is_dynamic: bool = False,
                                                 reduce_range: bool = False) -> QuantizationConfig:
    """u8 [0, 255] (``reduce_range``: [0, 127], for CPUs without VNNI) affine activations and
    s8 [-128, 127] per-channel symmetric weights; input and output specs are one object."""
    act_args: dict[str, Any] = {"eps": _EPS}
    if is_qat and is_dynamic:
        act_ctr: Any = FakeQuantize
        act_args["observer"] = MovingAverageMinMaxObserver.with_args(averaging_constant=1)
    elif is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize
    elif is_dynamic:
        act_ctr = PlaceholderObserver
    else:
        act_ctr = HistogramObserver
    act_spec = QuantizationSpec(
        dtype=torch.uint8, quant_min=0, quant_max=127 if reduce_range else 255,
        qscheme=per_tensor_affine, is_dynamic=is_dynamic,
        observer_or_fake_quant_ctr=act_ctr.with_args(**act_args))
    # torchao builds the weight's arguments on top of the activation's (an activation
    # ``observer`` of QAT+dynamic is then replaced by the per-channel one).
    weight_args = dict(act_args)
    if is_qat:
        weight_args["observer"] = MovingAveragePerChannelMinMaxObserver
    weight_ctr: Any = FusedMovingAvgObsFakeQuantize if is_qat else PerChannelMinMaxObserver
    weight_spec = QuantizationSpec(
        dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=per_channel_symmetric,
        ch_axis=0, is_dynamic=False, observer_or_fake_quant_ctr=weight_ctr.with_args(**weight_args))
    return QuantizationConfig(act_spec, act_spec, weight_spec, None, is_qat)


@functools.lru_cache
def get_x86_inductor_linear_dynamic_fp16_config() -> QuantizationConfig:
    """float16 weights (``fp32 input x fp16->fp32 weight``) for linear; activations stay float."""
    weight_spec = QuantizationSpec(dtype=torch.float16, observer_or_fake_quant_ctr=PlaceholderObserver)
    return QuantizationConfig(None, None, weight_spec, None)


# --------------------------------------------------------------------------------------------
# Annotation state helpers and filters
# --------------------------------------------------------------------------------------------

def _is_node_annotated(node: Node) -> bool:
    return Q_ANNOTATION_KEY in node.meta and node.meta[Q_ANNOTATION_KEY]._annotated


def _is_any_annotated(nodes: list[Node]) -> bool:
    return any(_is_node_annotated(n) for n in nodes)


def _is_all_annotated(nodes: list[Node]) -> bool:
    return all(_is_node_annotated(n) for n in nodes)


def _skip_annotate(nodes: list[Node], filter_fn: Optional[FilterFn] = None) -> bool:
    """Skip a match when a node is already claimed or the stage's filter rejects it."""
    if _is_any_annotated(nodes):
        return True
    return not (filter_fn and filter_fn(nodes))


def _mark_nodes_as_annotated(nodes: list[Node]) -> None:
    for n in nodes:
        if n is not None:
            n.meta.setdefault(Q_ANNOTATION_KEY, _X86InductorQuantizationAnnotation())._annotated = True


def _annotate_nodes_not_quantize(nodes: Union[Node, list[Node]]) -> None:
    """Claim nodes for a ``None`` config: later stages must leave them float."""
    for n in (nodes if isinstance(nodes, list) else [nodes]):
        n.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(_annotated=True)


def _is_quantized_op_pt2e(node: Node) -> bool:
    """The node ends a quantized pattern (its output can feed int8 ops)."""
    if not _is_any_annotated([node]):
        return False
    annotation = node.meta.get(Q_ANNOTATION_KEY)
    return bool(getattr(annotation, "_is_output_of_quantized_pattern", False))


def _create_module_name_filter(module_name: str) -> FilterFn:
    node_filter = get_module_name_filter(module_name)
    return lambda nodes: all(node_filter(n) for n in nodes)


def _create_operator_type_filter(operator_type: Any) -> FilterFn:
    def operator_type_filter(nodes: list[Node]) -> bool:
        count = sum(n.target == operator_type for n in nodes)
        if count > 1:
            raise NotImplementedError(f"Several nodes within a single pattern are {operator_type}.")
        return count == 1
    return operator_type_filter


def _global_config_filter(nodes: list[Node]) -> bool:
    count = sum(n.target in default_quantizable_ops for n in nodes)
    if count > 1:
        raise NotImplementedError("Several nodes within a single pattern are default quantizable "
                                  "operations.")
    return count == 1


def _config_checker(method: Callable) -> Callable:
    """Drop (with a warning) a config that would mix QAT with PTQ or dynamic with static."""
    @functools.wraps(method)
    def wrapper(quantizer: "X86InductorQuantizer", name: Any,
                quantization_config: Optional[QuantizationConfig]) -> "X86InductorQuantizer":
        if quantizer._need_skip_config(quantization_config):
            warnings.warn(f"Skip the quantization config for {name}.")
            return quantizer
        return method(quantizer, name, quantization_config)
    return wrapper


@dataclass
class _CurrentQuantizationMode:
    """``qat_state`` / ``dynamic_state``: None until a config fixes it."""
    qat_state: Optional[bool]
    dynamic_state: Optional[bool]


def _live_sequential_partitions(gm: Any, partition_types: Sequence[Any]) -> list:
    """:func:`find_sequential_partitions` without the chains that end in dead code (a partition
    whose output nobody reads has no output node).  [TQ] torchao's quantizer raises IndexError
    on them (e.g. the unused pooler Linear + Tanh of a HF BertModel); there is nothing to
    quantize there, so they are skipped."""
    return [chain for chain in find_sequential_partitions(gm, partition_types)
            if all(p.output_nodes for p in chain)]


def _single_output(partitions: Sequence[SourcePartition]) -> list[Node]:
    outputs = []
    for p in partitions:
        if len(p.output_nodes) > 1:
            raise ValueError("Input partition has more than one output node")
        outputs.append(p.output_nodes[0])
    return outputs


def _binary_input_indices(producer: Node, binary: Node) -> tuple[Optional[int], Optional[int]]:
    """(index of ``producer`` among the binary op's args, index of the other operand)."""
    a, b = binary.args[0], binary.args[1]
    if isinstance(a, Node) and a.op == "call_function" and a == producer:
        return 0, 1
    if isinstance(b, Node) and b.op == "call_function" and b == producer:
        return 1, 0
    return None, None


# --------------------------------------------------------------------------------------------
# The quantizer
# --------------------------------------------------------------------------------------------

class X86InductorQuantizer(Quantizer):
    """Annotates an exported model for x86 inductor's int8 kernels (see the module docstring)."""

    module_function_to_aten_operator_type = _MODULE_FUNCTION_TO_ATEN_OP

    def __init__(self) -> None:
        super().__init__()
        self.global_config: Optional[QuantizationConfig] = None
        self.operator_type_qconfig: dict[Any, Optional[QuantizationConfig]] = {}
        self.module_name_qconfig: dict[str, Optional[QuantizationConfig]] = {}

    # ---- configuration ----------------------------------------------------------------------

    def _get_current_quantization_mode(self) -> _CurrentQuantizationMode:
        qat_state = dynamic_state = None
        for config in [*self.module_name_qconfig.values(), *self.operator_type_qconfig.values(),
                       self.global_config]:
            if config is None:
                continue
            if qat_state is None:
                qat_state = config.is_qat
            elif qat_state != config.is_qat:
                raise ValueError("All non-None quantization configs should have the same is_qat, "
                                 f"but got {qat_state} and {config.is_qat}.")
            act = config.input_activation
            if act is not None:
                if dynamic_state is None:
                    dynamic_state = act.is_dynamic
                elif dynamic_state != act.is_dynamic:
                    raise ValueError("All non-None input_activation specs should have the same "
                                     f"is_dynamic, but got {dynamic_state} and {act.is_dynamic}.")
        return _CurrentQuantizationMode(qat_state, dynamic_state)

    def _need_skip_config(self, quantization_config: Optional[QuantizationConfig]) -> bool:
        if quantization_config is None:
            return False
        skip = False
        mode = self._get_current_quantization_mode()
        if mode.qat_state is not None and mode.qat_state != quantization_config.is_qat:
            warnings.warn("Mixed QAT and Non-QAT quantization config is not supported.")
            skip = True
        act = quantization_config.input_activation
        if mode.dynamic_state is not None and act is not None and mode.dynamic_state != act.is_dynamic:
            warnings.warn("Mixed dynamic and static quantization config is not supported.")
            skip = True
        return skip

    def set_global(self, quantization_config: QuantizationConfig) -> "X86InductorQuantizer":
        if self._need_skip_config(quantization_config):
            warnings.warn("Skip the global quantization config.")
            return self
        self.global_config = quantization_config
        return self

    def get_global_quantization_config(self) -> Optional[QuantizationConfig]:
        if not isinstance(self.global_config, QuantizationConfig):
            warnings.warn("The global_config for X86InductorQuantizer is currently invalid. "
                          "Please ensure that you use set_global to establish the global "
                          "quantization configuration.")
        return self.global_config

    @_config_checker
    def set_function_type_qconfig(self, function_type: Callable,
                                  quantization_config: Optional[QuantizationConfig]
                                  ) -> "X86InductorQuantizer":
        """Config for every call of ``function_type`` (``F.conv2d``, ``torch.matmul`` ...)."""
        if function_type in _MODULE_FUNCTION_TO_ATEN_OP:
            self._set_aten_operator_qconfig(_MODULE_FUNCTION_TO_ATEN_OP[function_type],
                                            quantization_config)
        else:
            warnings.warn(f"function: Unable to customize quantization config for {function_type} "
                          "by X86InductorQuantizer.")
        return self

    @_config_checker
    def set_module_type_qconfig(self, module_type: type,
                                quantization_config: Optional[QuantizationConfig]
                                ) -> "X86InductorQuantizer":
        """Config for the aten op of ``module_type`` (``nn.Conv2d``, ``nn.Linear`` ...); shares
        one table with :meth:`set_function_type_qconfig`, the later call wins."""
        if module_type in _MODULE_FUNCTION_TO_ATEN_OP:
            self._set_aten_operator_qconfig(_MODULE_FUNCTION_TO_ATEN_OP[module_type],
                                            quantization_config)
        else:
            warnings.warn(f"Module: Unable to customize quantization config for {module_type} "
                          "by X86InductorQuantizer.")
        return self

    @_config_checker
    def set_module_name_qconfig(self, module_name: str,
                                quantization_config: Optional[QuantizationConfig]
                                ) -> "X86InductorQuantizer":
        """Config for every supported pattern all of whose nodes lie inside ``module_name``."""
        self.module_name_qconfig[module_name] = quantization_config
        return self

    def _set_aten_operator_qconfig(self, operator_type: Any,
                                   quantization_config: Optional[QuantizationConfig]) -> "X86InductorQuantizer":
        if operator_type in quantizable_ops:
            self.operator_type_qconfig[operator_type] = quantization_config
        else:
            warnings.warn(f"operator: Unable to quantize {operator_type} by X86InductorQuantizer.")
        return self

    # ---- entry points -----------------------------------------------------------------------

    def annotate(self, model: GraphModule) -> GraphModule:
        for module_name, config in self.module_name_qconfig.items():
            self._annotate_with_config(model, config, _create_module_name_filter(module_name))
        for operator_type, config in self.operator_type_qconfig.items():
            self._annotate_with_config(model, config, _create_operator_type_filter(operator_type))
        if self.global_config:
            self._annotate_with_config(model, self.global_config, _global_config_filter)
        for node in model.graph.nodes:
            self._annotate_output_for_int8_in_int8_out_pattern(node)
        return model

    def validate(self, model: GraphModule) -> None:
        pass

    def _annotate_with_config(self, model: GraphModule, config: Optional[QuantizationConfig],
                              filter_fn: FilterFn) -> None:
        self._annotate_conv2d_fusion_pattern(model, config, filter_fn)
        self._annotate_linear_fusion_pattern(model, config, filter_fn)
        self._annotate_matmul(model, config, filter_fn)
        self._annotate_mul_tensor(model, config, filter_fn)
        for node in model.graph.nodes:
            self._annotate_propagation_quantizable_pattern(node, config, filter_fn)

    # ---- conv / linear node helpers ---------------------------------------------------------

    def _annotate_weighted_node(self, node: Node, annotate_output: bool,
                                config: Optional[QuantizationConfig]) -> None:
        """Input / weight / bias specs on a conv or linear; ``annotate_output`` marks it as the
        end of its (single-node) pattern."""
        if config is None:
            _annotate_nodes_not_quantize(node)
            return
        act, weight = node.args[0], node.args[1]
        assert isinstance(act, Node) and isinstance(weight, Node)
        qspec_map = {act: get_input_act_qspec(config), weight: get_weight_qspec(config)}
        bias = node.args[2] if len(node.args) > 2 else None
        if isinstance(bias, Node):
            qspec_map[bias] = get_bias_qspec(config)
        node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
            input_qspec_map=qspec_map, _annotated=True,
            _is_output_of_quantized_pattern=annotate_output)

    # ---- conv2d ----------------------------------------------------------------------------

    def _annotate_conv2d_fusion_pattern(self, model: GraphModule,
                                        config: Optional[QuantizationConfig],
                                        filter_fn: Optional[FilterFn] = None) -> None:
        if config is None or config.is_qat:
            self._annotate_qat_conv2d_bn_binary_unary(model, config, filter_fn)
            self._annotate_qat_conv2d_bn_binary(model, config, filter_fn)
            self._annotate_qat_conv2d_bn_unary(model, config, filter_fn)
            self._annotate_qat_conv2d_bn(model, config, filter_fn)
        self._annotate_conv2d_binary_unary(model, config, filter_fn)
        self._annotate_conv2d_binary(model, config, filter_fn)
        self._annotate_conv2d_unary(model, config, filter_fn)
        self._annotate_conv2d(model, config, filter_fn)

    def _binary_post_op(self, producer: Node, binary: Node) -> Optional[Node]:
        """The binary op's other operand when ``producer`` (used only there) is one operand and
        the other is a tensor (a Python number, ``conv + 0.5``, is no conv-binary pattern:
        torchao's quantizer fails an assertion there; the conv and the add are then annotated
        on their own)."""
        if len(producer.users) != 1:
            return None
        mine, other = _binary_input_indices(producer, binary)
        if mine is None or other is None:
            return None
        if binary.args[mine] != producer:
            raise ValueError(f"{producer} doesn't match input of binary node")
        extra = binary.args[other]
        return extra if isinstance(extra, Node) else None

    def _annotate_qat_conv2d_bn_binary_unary(self, gm, config, filter_fn=None) -> None:
        for chain in _live_sequential_partitions(
                gm, [torch.nn.Conv2d, torch.nn.BatchNorm2d, operator.add, torch.nn.ReLU]):
            conv, bn, binary, unary = _single_output(chain)
            extra = self._binary_post_op(bn, binary)
            if extra is None or not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([unary, binary, bn, conv], filter_fn):
                continue
            self._annotate_weighted_node(conv, False, config)
            if config is not None:
                binary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={extra: get_input_act_qspec(config)}, _annotated=True)
                unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    output_qspec=get_output_act_qspec(config), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            else:
                _annotate_nodes_not_quantize([binary, unary])
            _mark_nodes_as_annotated([n for p in chain for n in p.nodes])

    def _annotate_qat_conv2d_bn_binary(self, gm, config, filter_fn=None) -> None:
        for chain in _live_sequential_partitions(
                gm, [torch.nn.Conv2d, torch.nn.BatchNorm2d, operator.add]):
            conv, bn, binary = _single_output(chain)
            extra = self._binary_post_op(bn, binary)
            if extra is None or not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([binary, bn, conv], filter_fn):
                continue
            self._annotate_weighted_node(conv, False, config)
            if config is not None:
                binary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={extra: get_input_act_qspec(config)},
                    output_qspec=get_output_act_qspec(config), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            else:
                _annotate_nodes_not_quantize(binary)
            _mark_nodes_as_annotated([n for p in chain for n in p.nodes])

    def _annotate_qat_conv2d_bn_unary(self, gm, config, filter_fn=None) -> None:
        chains = []
        for unary_type in (torch.nn.ReLU, torch.nn.Hardtanh, torch.nn.Hardswish, torch.nn.ReLU6,
                           torch.nn.SiLU):
            chains.extend(_live_sequential_partitions(
                gm, [torch.nn.Conv2d, torch.nn.BatchNorm2d, unary_type]))
        for chain in chains:
            conv, bn, unary = _single_output(chain)
            if not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([unary, bn, conv], filter_fn):
                continue
            self._annotate_weighted_node(conv, False, config)
            if config is not None:
                unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    output_qspec=get_output_act_qspec(config), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            else:
                _annotate_nodes_not_quantize(unary)
            _mark_nodes_as_annotated([n for p in chain for n in p.nodes])

    def _annotate_qat_conv2d_bn(self, gm, config, filter_fn=None) -> None:
        for chain in _live_sequential_partitions(gm, [torch.nn.Conv2d, torch.nn.BatchNorm2d]):
            conv, bn = _single_output(chain)
            if not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([bn, conv], filter_fn):
                continue
            self._annotate_weighted_node(conv, False, config)
            if config is not None:
                bn.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    output_qspec=get_output_act_qspec(config), _annotated=True,
                    _is_output_of_quantized_pattern=True)
            else:
                _annotate_nodes_not_quantize(bn)
            _mark_nodes_as_annotated([n for p in chain for n in p.nodes])

    def _annotate_conv2d_binary_unary(self, gm, config, filter_fn=None) -> None:
        for chain in _live_sequential_partitions(gm, [torch.nn.Conv2d, operator.add, torch.nn.ReLU]):
            conv, binary, unary = _single_output(chain)
            extra = self._binary_post_op(conv, binary)
            if extra is None or not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([unary, binary, conv], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize([conv, binary, unary])
                continue
            self._annotate_weighted_node(conv, False, config)
            binary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                input_qspec_map={extra: get_input_act_qspec(config)}, _annotated=True)
            unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                _annotated=True, _is_output_of_quantized_pattern=True)

    def _annotate_conv2d_binary(self, gm, config, filter_fn=None) -> None:
        for chain in _live_sequential_partitions(gm, [torch.nn.Conv2d, operator.add]):
            conv, binary = _single_output(chain)
            extra = self._binary_post_op(conv, binary)
            if extra is None or not _is_call_to(conv, _aten.conv2d.default):
                continue
            if _skip_annotate([binary, conv], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize([conv, binary])
                continue
            self._annotate_weighted_node(conv, False, config)
            binary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                input_qspec_map={extra: get_input_act_qspec(config)}, _annotated=True,
                _is_output_of_quantized_pattern=True)

    def _annotate_conv2d_unary(self, gm, config, filter_fn=None) -> None:
        chains = []
        for pattern in ([torch.nn.Conv2d, torch.nn.ReLU], [torch.nn.Conv2d, torch.nn.Hardtanh],
                        [torch.nn.Conv2d, torch.nn.Hardswish], [torch.nn.Conv2d, torch.nn.ReLU6],
                        [torch.nn.Conv2d, torch.nn.SiLU], [torch.nn.Conv1d, torch.nn.ReLU]):
            chains.extend(_live_sequential_partitions(gm, pattern))
        for chain in chains:
            conv, unary = _single_output(chain)
            if not _is_call_to(conv, _aten.conv2d.default, _aten.conv1d.default):
                continue
            if _skip_annotate([unary, conv], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize([conv, unary])
                continue
            self._annotate_weighted_node(conv, False, config)
            unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                _annotated=True, _is_output_of_quantized_pattern=True)

    def _annotate_conv2d(self, gm, config, filter_fn=None) -> None:
        found = get_source_partitions(gm.graph, [torch.nn.Conv2d, F.conv2d])
        for part in itertools.chain.from_iterable(found.values()):
            if len(part.output_nodes) > 1:
                raise ValueError("conv partition has more than one output node")
            conv = part.output_nodes[0]
            if not _is_call_to(conv, _aten.conv2d.default):
                raise ValueError(f"{conv} is not an aten conv2d operator")
            if _skip_annotate([conv], filter_fn):
                continue
            self._annotate_weighted_node(conv, True, config)

    # ---- linear ----------------------------------------------------------------------------

    def _annotate_linear_fusion_pattern(self, model, config, filter_fn=None) -> None:
        self._annotate_linear_binary_unary(model, config, filter_fn)
        self._annotate_linear_unary(model, config, filter_fn)
        self._annotate_linear(model, config, filter_fn)

    def _annotate_linear(self, gm, config, filter_fn=None) -> None:
        found = get_source_partitions(gm.graph, [torch.nn.Linear, F.linear])
        for part in itertools.chain.from_iterable(found.values()):
            for linear in part.output_nodes:
                if not _is_call_to(linear, _aten.linear.default):
                    raise ValueError(f"{linear} is not an aten linear operator")
                if _skip_annotate([linear], filter_fn):
                    continue
                self._annotate_weighted_node(linear, True, config)

    def _annotate_linear_unary(self, gm, config, filter_fn=None) -> None:
        chains = []
        for post_op in (torch.nn.ReLU, torch.nn.LeakyReLU, torch.nn.Tanh, torch.nn.GELU):
            chains = chains + _live_sequential_partitions(gm, [torch.nn.Linear, post_op])
        for chain in chains:
            if any(len(p.output_nodes) > 1 for p in chain):
                continue
            linear, unary = _single_output(chain)
            if not _is_call_to(linear, _aten.linear.default):
                continue
            if _skip_annotate([unary, linear], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize([linear, unary])
                continue
            self._annotate_weighted_node(linear, False, config)
            unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                _annotated=True, _is_output_of_quantized_pattern=True)

    def _annotate_linear_binary_unary(self, gm, config, filter_fn=None) -> None:
        for unary_type in (torch.nn.ReLU, None):
            pattern = [torch.nn.Linear, operator.add] + ([unary_type] if unary_type else [])
            for chain in _live_sequential_partitions(gm, pattern):
                if any(len(p.output_nodes) > 1 for p in chain):
                    continue
                outputs = _single_output(chain)
                linear, binary = outputs[0], outputs[1]
                unary = outputs[2] if unary_type else None
                if len(linear.users) != 1:
                    continue
                mine, other = _binary_input_indices(linear, binary)
                if mine is None or other is None:
                    continue
                if binary.args[mine] != linear:
                    raise ValueError(f"{linear} doesn't match input of binary node")
                if not _is_call_to(linear, _aten.linear.default):
                    continue
                nodes = [binary, linear] if unary is None else [unary, binary, linear]
                if _skip_annotate(nodes, filter_fn):
                    continue
                if config is None:
                    _annotate_nodes_not_quantize(nodes)
                    continue
                self._annotate_weighted_node(linear, False, config)
                # The extra operand stays float: inductor fuses it as a float post-op sum.
                binary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                    input_qspec_map={}, _annotated=True,
                    _is_output_of_quantized_pattern=unary is None)
                if unary is not None:
                    unary.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                        _annotated=True, _is_output_of_quantized_pattern=True)

    # ---- matmul / mul ----------------------------------------------------------------------

    def _annotate_matmul(self, model, config, filter_fn=None) -> None:
        for node in model.graph.nodes:
            if node.target != _aten.matmul.default or _skip_annotate([node], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize(node)
                continue
            node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                input_qspec_map={arg: get_input_act_qspec(config) for arg in node.args},
                _annotated=True, _is_output_of_quantized_pattern=True)

    def _annotate_mul_tensor(self, model, config, filter_fn=None) -> None:
        """Only a mul of two tensors of one shape (no broadcasting) is quantized."""
        def is_tensor(n: Any) -> bool:
            return isinstance(n, Node) and isinstance(n.meta.get("val"), FakeTensor)

        for node in model.graph.nodes:
            if node.target != _aten.mul.Tensor or _skip_annotate([node], filter_fn):
                continue
            if config is None:
                _annotate_nodes_not_quantize(node)
                continue
            if len(node.args) != 2:
                continue
            a, b = node.args
            if not (is_tensor(a) and is_tensor(b)) or a.meta["val"].shape != b.meta["val"].shape:
                continue
            node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                input_qspec_map={arg: get_input_act_qspec(config) for arg in node.args},
                _annotated=True, _is_output_of_quantized_pattern=True)

    # ---- int8 propagation ------------------------------------------------------------------

    def _annotate_propagation_quantizable_pattern(self, node: Node,
                                                  config: Optional[QuantizationConfig],
                                                  filter_fn: FilterFn) -> None:
        if (node.target not in propagation_quantizable_ops or _is_any_annotated([node])
                or node.op != "call_function"):
            return
        if _skip_annotate([node], filter_fn):
            return
        if config is None:
            _annotate_nodes_not_quantize(node)
            return

        def all_from_quantized(inputs: list[Node]) -> bool:
            return all(_is_quantized_op_pt2e(n) for n in inputs)

        if node.target is _aten.max_pool2d.default:
            if not all_from_quantized([node.all_input_nodes[0]]):
                warnings.warn("The input of maxpool2d is not quantized, skip annotate maxpool2d "
                              f"with config {config}.")
                return
            act = node.args[0]
            assert isinstance(act, Node)
            node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
                input_qspec_map={act: get_input_act_qspec(config)}, _annotated=True,
                _is_output_of_quantized_pattern=True)
            return
        if node.target is _aten.cat.default:
            if all_from_quantized(node.all_input_nodes):
                self._annotate_cat(node, config)
            return
        if (node.target is _aten.flatten.using_ints and len(node.users) > 0
                and not any(user.target in quantizable_ops for user in node.users)):
            return  # a flatten feeding only float ops stays float
        act = node.all_input_nodes[0]
        if not all_from_quantized([act]):
            return
        node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
            input_qspec_map={act: get_input_act_qspec(config)}, _annotated=True,
            _is_output_of_quantized_pattern=True)

    def _annotate_cat(self, node: Node, config: QuantizationConfig) -> None:
        """Inputs after the first share the first input edge's observer."""
        inputs = node.args[0]
        assert isinstance(inputs, Sequence)
        first = inputs[0]
        assert isinstance(first, Node)
        qspec_map = {first: get_input_act_qspec(config)}
        shared = SharedQuantizationSpec((first, node))
        for other in inputs[1:]:
            if other not in qspec_map:
                qspec_map[other] = shared
        node.meta[Q_ANNOTATION_KEY] = _X86InductorQuantizationAnnotation(
            input_qspec_map=qspec_map, _annotated=True, _is_output_of_quantized_pattern=True)

    def _annotate_output_for_int8_in_int8_out_pattern(self, node: Node) -> None:
        """An int8-in op that is quantized gets an output spec shared with its first input edge
        (the observer the inductor int8 kernel keeps)."""
        if node.target not in int8_in_int8_out_ops or not _is_any_annotated([node]):
            return
        annotation = node.meta.get(Q_ANNOTATION_KEY)
        if not getattr(annotation, "_is_output_of_quantized_pattern", False):
            return
        first_input = node.args[0] if node.target == _aten.max_pool2d.default else node.all_input_nodes[0]
        assert isinstance(first_input, Node)
        annotation.output_qspec = SharedQuantizationSpec((first_input, node))


def _is_call_to(node: Node, *targets: Any) -> bool:
    return node.op == "call_function" and node.target in targets
