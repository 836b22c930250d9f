"""Pattern annotators of :class:`~.xnnpack_quantizer.XNNPACKQuantizer` (torchao 0.18's
``_xnnpack_quantizer_utils``), keyed by pattern name in :data:`OP_TO_ANNOTATOR`.

Each annotator walks an exported (aten) graph, finds its pattern, skips matches of which a node
is already claimed (``_annotated``) or rejected by ``filter_fn``, and writes the annotations.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch._subclasses import FakeTensor
from torch.fx import GraphModule, Node

from ..._graph import fresh_attr_name
from ._graph_utils import get_source_partitions, is_conv_node, is_conv_transpose_node
from .quantizer import Q_ANNOTATION_KEY, QuantizationAnnotation, SharedQuantizationSpec
from .utils import (OperatorConfig, OperatorPatternType, QuantizationConfig,
                    annotate_input_qspec_map, annotate_output_qspec, get_bias_qspec,
                    get_input_act_qspec, get_output_act_qspec, get_weight_qspec)

__all__ = [
    "OperatorConfig", "OperatorPatternType", "QuantizationConfig", "get_input_act_qspec",
    "get_output_act_qspec", "get_weight_qspec", "get_bias_qspec", "OP_TO_ANNOTATOR",
    "propagate_annotation",
]

FilterFn = Optional[Callable[[Node], bool]]
AnnotatorType = Callable[[GraphModule, Optional[QuantizationConfig], FilterFn],
                         Optional[list[list[Node]]]]
OP_TO_ANNOTATOR: dict[str, AnnotatorType] = {}

_aten = torch.ops.aten
_RELU = (_aten.relu.default, _aten.relu_.default)
_ADD = (_aten.add.Tensor, _aten.add_.Tensor)
_MUL = (_aten.mul.Tensor, _aten.mul_.Tensor)
_BATCH_NORM = (_aten.batch_norm.default,)
# Scalars above this magnitude overflow the histogram observer's histc.
_HISTC_UPPER_BOUND = 3.4028235e15


def register_annotator(name: str) -> Callable[[AnnotatorType], AnnotatorType]:
    def register(fn: AnnotatorType) -> AnnotatorType:
        OP_TO_ANNOTATOR[name] = fn
        return fn
    return register


def _is_annotated(nodes: list[Node]) -> bool:
    return any(n is not None and Q_ANNOTATION_KEY in n.meta and n.meta[Q_ANNOTATION_KEY]._annotated
               for n in nodes)


def _mark_nodes_as_annotated(nodes: list[Node]) -> None:
    for n in nodes:
        if n is None:
            continue
        n.meta.setdefault(Q_ANNOTATION_KEY, QuantizationAnnotation())._annotated = True


def _rejected(nodes: list[Node], filter_fn: FilterFn) -> bool:
    return filter_fn is not None and not all(filter_fn(n) for n in nodes)


def _is_call(n: object, targets) -> bool:
    return isinstance(n, Node) and n.op == "call_function" and n.target in targets


def _weighted_input_map(op_node: Node, config: Optional[QuantizationConfig]
                        ) -> tuple[dict, list[Node]]:
    """Input specs of a conv / linear node (activation, weight, optional bias) and the
    weight / bias nodes that belong to its partition."""
    act, weight = op_node.args[0], op_node.args[1]
    assert isinstance(act, Node) and isinstance(weight, Node)
    qspec_map = {act: get_input_act_qspec(config), weight: get_weight_qspec(config)}
    params = [weight]
    bias = op_node.args[2] if len(op_node.args) > 2 else None
    if isinstance(bias, Node):
        qspec_map[bias] = get_bias_qspec(config)
        params.append(bias)
    return qspec_map, params


@register_annotator("linear")
def _annotate_linear(gm: GraphModule, config: Optional[QuantizationConfig],
                     filter_fn: FilterFn = None) -> list[list[Node]]:
    partitions = []
    act_qspec, out_qspec = get_input_act_qspec(config), get_output_act_qspec(config)
    weight_qspec, bias_qspec = get_weight_qspec(config), get_bias_qspec(config)
    for node in gm.graph.nodes:
        if not _is_call(node, (_aten.linear.default,)):
            continue
        if filter_fn and not filter_fn(node):
            continue
        if _is_annotated([node]):
            continue
        act, weight = node.args[0], node.args[1]
        bias = node.args[2] if len(node.args) > 2 else None
        annotate_input_qspec_map(node, act, act_qspec)
        annotate_input_qspec_map(node, weight, weight_qspec)
        claimed = [node, weight]
        if bias:
            annotate_input_qspec_map(node, bias, bias_qspec)
            claimed.append(bias)
        annotate_output_qspec(node, out_qspec)
        _mark_nodes_as_annotated(claimed)
        partitions.append(claimed)
    return partitions


def _annotate_weighted_relu(gm: GraphModule, config: Optional[QuantizationConfig],
                            filter_fn: FilterFn, is_op: Callable[[Node], bool]) -> list[list[Node]]:
    """``op -> relu`` where op (conv / conv-transpose / linear) feeds only the relu: inputs
    annotated on op, the output on relu."""
    partitions = []
    for relu in gm.graph.nodes:
        if not _is_call(relu, _RELU):
            continue
        op = relu.args[0]
        if not isinstance(op, Node) or not is_op(op) or len(op.users) > 1:
            continue
        qspec_map, params = _weighted_input_map(op, config)
        partition = [relu, op, *params]
        if _is_annotated(partition) or _rejected(partition, filter_fn):
            continue
        op.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=qspec_map, _annotated=True)
        relu.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            output_qspec=get_output_act_qspec(config), _annotated=True)
        _mark_nodes_as_annotated(partition)
        partitions.append(partition)
    return partitions


@register_annotator("linear_relu")
def _annotate_linear_relu(gm, config, filter_fn=None):
    return _annotate_weighted_relu(gm, config, filter_fn,
                                   lambda n: _is_call(n, (_aten.linear.default,)))


@register_annotator("conv")
def _annotate_conv(gm: GraphModule, config: Optional[QuantizationConfig],
                   filter_fn: FilterFn = None) -> list[list[Node]]:
    partitions = []
    for conv in gm.graph.nodes:
        if not _is_call(conv, (_aten.conv1d.default, _aten.conv2d.default)):
            continue
        qspec_map, params = _weighted_input_map(conv, config)
        partition = [conv, *params]
        if _is_annotated(partition) or _rejected(partition, filter_fn):
            continue
        conv.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=qspec_map, output_qspec=get_output_act_qspec(config), _annotated=True)
        _mark_nodes_as_annotated(partition)
        partitions.append(partition)
    return partitions


@register_annotator("conv_relu")
def _annotate_conv_relu(gm, config, filter_fn=None):
    return _annotate_weighted_relu(gm, config, filter_fn, is_conv_node)


@register_annotator("conv_transpose_relu")
def _annotate_conv_transpose_relu(gm, config, filter_fn=None):
    return _annotate_weighted_relu(gm, config, filter_fn, is_conv_transpose_node)


def _annotate_conv_bn_chain(gm: GraphModule, config: Optional[QuantizationConfig],
                            filter_fn: FilterFn, has_relu: bool,
                            is_conv_transpose: bool = False) -> list[list[Node]]:
    """QAT only (PTQ folds BN first): ``conv -> batch_norm [-> relu]`` where every node but the
    last feeds only the next one.  Inputs on the conv, the output on the last node."""
    is_op = is_conv_transpose_node if is_conv_transpose else is_conv_node
    partitions = []
    for conv in gm.graph.nodes:
        if not is_op(conv) or conv.target not in _ONE_OR_TWO_D[is_conv_transpose]:
            continue
        if len(conv.users) != 1:
            continue
        bn = next(iter(conv.users))
        if not _is_call(bn, _BATCH_NORM) or bn.args[0] is not conv:
            continue
        output = bn
        if has_relu:
            if len(bn.users) != 1:
                continue
            output = next(iter(bn.users))
            if not _is_call(output, _RELU):
                continue
        qspec_map, params = _weighted_input_map(conv, config)
        partition = [conv, *params]
        if _is_annotated(partition) or _rejected(partition, filter_fn):
            continue
        conv.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=qspec_map, _annotated=True)
        output.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            output_qspec=get_output_act_qspec(config), _annotated=True)
        _mark_nodes_as_annotated(partition)
        partitions.append(partition)
    return partitions


# torchao's conv-bn patterns are traced from F.conv{1,2}d / F.conv_transpose{1,2}d only.
_ONE_OR_TWO_D = {
    False: (_aten.conv1d.default, _aten.conv2d.default),
    True: (_aten.conv_transpose1d.default, _aten.conv_transpose2d.input),
}


@register_annotator("conv_bn")
def _annotate_conv_bn(gm, config, filter_fn=None):
    return _annotate_conv_bn_chain(gm, config, filter_fn, has_relu=False)


@register_annotator("conv_bn_relu")
def _annotate_conv_bn_relu(gm, config, filter_fn=None):
    return _annotate_conv_bn_chain(gm, config, filter_fn, has_relu=True)


@register_annotator("conv_transpose_bn")
def _annotate_conv_transpose_bn(gm, config, filter_fn=None):
    return _annotate_conv_bn_chain(gm, config, filter_fn, has_relu=False, is_conv_transpose=True)


@register_annotator("conv_transpose_bn_relu")
def _annotate_conv_transpose_bn_relu(gm, config, filter_fn=None):
    return _annotate_conv_bn_chain(gm, config, filter_fn, has_relu=True, is_conv_transpose=True)


@register_annotator("gru_io_only")
def _annotate_gru_io_only(gm: GraphModule, config: Optional[QuantizationConfig],
                          filter_fn: FilterFn = None) -> list[list[Node]]:
    """Quantize only a GRU's two inputs (at their first user) and two outputs.

    [TQ] torchao takes the inputs in set order and, when both feed the same node (the aten.gru
    op of an exported nn.GRU), the second annotation replaces the first: which input gets
    quantized varies from run to run.  Here the inputs are taken in graph order and both edges
    are annotated.
    """
    found = get_source_partitions(gm.graph, [torch.nn.GRU], filter_fn)
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    partitions = []
    for gru in itertools.chain.from_iterable(found.values()):
        partitions.append(gru.nodes)
        inputs = sorted(gru.input_nodes, key=position.__getitem__)
        outputs = sorted(gru.output_nodes, key=position.__getitem__)
        if _is_annotated(inputs + outputs):
            continue
        fresh: dict[Node, QuantizationAnnotation] = {}
        for value in inputs[:2]:
            first_user = next(iter(value.users))
            annotation = fresh.setdefault(first_user, QuantizationAnnotation(_annotated=True))
            annotation.input_qspec_map[value] = get_input_act_qspec(config)
            first_user.meta[Q_ANNOTATION_KEY] = annotation
        if len(outputs) != 2:
            raise ValueError(f"expected the GRU partition to have two outputs, got {outputs}")
        for out in outputs:
            out.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
                output_qspec=get_output_act_qspec(config), _annotated=True)
        _mark_nodes_as_annotated(list(gru.nodes))
    return partitions


@register_annotator("adaptive_avg_pool2d")
def _annotate_adaptive_avg_pool2d(gm: GraphModule, config: Optional[QuantizationConfig],
                                  filter_fn: FilterFn = None) -> list[list[Node]]:
    """The pool's output shares its input's observer; the input reuses the producer's observer
    when the producer is already quantized."""
    found = get_source_partitions(gm.graph, [torch.nn.AdaptiveAvgPool2d, F.adaptive_avg_pool2d],
                                  filter_fn)
    partitions = []
    for part in itertools.chain.from_iterable(found.values()):
        pool = part.output_nodes[0]
        if not _is_call(pool, (_aten.adaptive_avg_pool2d.default,)):
            raise ValueError(f"{pool} is not an aten adaptive_avg_pool2d operator")
        if _is_annotated([pool]):
            continue
        partitions.append(part.nodes)
        act = pool.args[0]
        assert isinstance(act, Node)
        producer = act.meta.get(Q_ANNOTATION_KEY)
        if producer is None or not producer._annotated or producer.output_qspec is None:
            act_qspec = get_input_act_qspec(config)
        else:
            act_qspec = SharedQuantizationSpec(act)
        pool.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={act: act_qspec}, output_qspec=SharedQuantizationSpec((act, pool)),
            _annotated=True)
    return partitions


def _is_input_large_scalar(node: Node, gm: GraphModule) -> bool:
    if node.op != "get_attr":
        return False
    owner_path, _, name = str(node.target).rpartition(".")
    value = getattr(gm.get_submodule(owner_path), name)
    return value.numel() == 1 and abs(value.item()) > _HISTC_UPPER_BOUND


def _is_input_non_float_tensor(node: Node) -> bool:
    val = node.meta.get("val")
    return not isinstance(val, FakeTensor) or val.dtype != torch.float32


def _binary_input_map(gm: GraphModule, op: Node, config: Optional[QuantizationConfig]
                      ) -> Optional[tuple[dict, list[Node]]]:
    """Input specs of an add / mul; None when an operand must stay float (non-float or a scalar
    too large to observe)."""
    act_qspec = get_input_act_qspec(config)
    qspec_map, operands = {}, []
    for arg in op.args[:2]:
        if isinstance(arg, Node):
            if _is_input_large_scalar(arg, gm) or _is_input_non_float_tensor(arg):
                return None
            qspec_map[arg] = act_qspec
            operands.append(arg)
    return qspec_map, operands


def _annotate_binary_relu(gm: GraphModule, config: Optional[QuantizationConfig],
                          filter_fn: FilterFn, binary_targets) -> list[list[Node]]:
    partitions = []
    for relu in gm.graph.nodes:
        if not _is_call(relu, _RELU):
            continue
        op = relu.args[0]
        if not _is_call(op, binary_targets) or len(op.users) > 1:
            continue
        partition = [relu, op]
        if _is_annotated(partition) or _rejected(partition, filter_fn):
            continue
        inputs = _binary_input_map(gm, op, config)
        if inputs is None:
            continue
        qspec_map, operands = inputs
        op.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(input_qspec_map=qspec_map, _annotated=True)
        relu.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            output_qspec=get_output_act_qspec(config), _annotated=True)
        partitions.append(partition + operands)
    return partitions


def _annotate_binary(gm: GraphModule, config: Optional[QuantizationConfig],
                     filter_fn: FilterFn, binary_targets) -> list[list[Node]]:
    partitions = []
    for op in gm.graph.nodes:
        if not _is_call(op, binary_targets):
            continue
        if _is_annotated([op]) or _rejected([op], filter_fn):
            continue
        inputs = _binary_input_map(gm, op, config)
        if inputs is None:
            continue
        qspec_map, operands = inputs
        op.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=qspec_map, output_qspec=get_output_act_qspec(config), _annotated=True)
        partitions.append([op, *operands])
    return partitions


@register_annotator("add_relu")
def _annotate_add_relu(gm, config, filter_fn=None):
    return _annotate_binary_relu(gm, config, filter_fn, _ADD)


@register_annotator("add")
def _annotate_add(gm, config, filter_fn=None):
    return _annotate_binary(gm, config, filter_fn, _ADD)


@register_annotator("mul_relu")
def _annotate_mul_relu(gm, config, filter_fn=None):
    return _annotate_binary_relu(gm, config, filter_fn, _MUL)


@register_annotator("mul")
def _annotate_mul(gm, config, filter_fn=None):
    return _annotate_binary(gm, config, filter_fn, _MUL)


@register_annotator("cat")
def _annotate_cat(gm: GraphModule, config: Optional[QuantizationConfig],
                  filter_fn: FilterFn = None) -> list[list[Node]]:
    """All inputs and the output of a cat share the observer of its first input edge."""
    found = get_source_partitions(gm.graph, [torch.cat], filter_fn)
    partitions = []
    for part in itertools.chain.from_iterable(found.values()):
        cat = part.output_nodes[0]
        if _is_annotated([cat]):
            continue
        if cat.target != _aten.cat.default:
            raise ValueError(f"Expected cat node: torch.ops.aten.cat.default, but found "
                             f"{cat.target}; was the model captured with torch.export?")
        partitions.append(part.nodes)
        inputs = cat.args[0]
        first = inputs[0]
        qspec_map = {}
        if isinstance(first, Node):
            qspec_map[first] = get_input_act_qspec(config)
        shared = SharedQuantizationSpec((first, cat))
        for other in inputs[1:]:
            if other not in qspec_map:
                qspec_map[other] = shared
        cat.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map=qspec_map, output_qspec=shared, _annotated=True)
    return partitions


# Ops whose output keeps its input's qparams (no arithmetic on values, or a monotone clamp).
_SHARE_OBSERVER_OPS = (
    _aten.relu.default, _aten.hardtanh.default, _aten.hardtanh_.default,
    _aten.max_pool2d.default, _aten.mean.default, _aten.mean.dim,
    _aten.permute.default, _aten.permute_copy.default, _aten.squeeze.dim,
    _aten.squeeze_copy.dim, _aten.adaptive_avg_pool2d.default, _aten.view_copy.default,
    _aten.view.default, _aten.slice_copy.Tensor, _aten.flatten.using_ints,
)


def propagate_annotation(model: GraphModule) -> None:
    """Give each not-yet-claimed shape / pooling op that follows a node with an output spec the
    same observer as that node (input edge and output shared with the producer)."""
    for n in model.graph.nodes:
        if not _is_call(n, _SHARE_OBSERVER_OPS):
            continue
        prev = n.args[0]
        if not isinstance(prev, Node):
            continue
        prev_annotation = prev.meta.get(Q_ANNOTATION_KEY)
        if not prev_annotation or not prev_annotation.output_qspec:
            continue
        if Q_ANNOTATION_KEY in n.meta and n.meta[Q_ANNOTATION_KEY]._annotated:
            continue
        shared = SharedQuantizationSpec(prev)
        n.meta[Q_ANNOTATION_KEY] = QuantizationAnnotation(
            input_qspec_map={prev: shared}, output_qspec=shared, _annotated=True)


def _convert_scalars_to_attrs(model: GraphModule) -> GraphModule:
    """Scalar operands of add / mul become float32 tensor attributes (``_tensor_constant_<i>``)
    so they can be observed and quantized like any input."""
    for n in model.graph.nodes:
        if not _is_call(n, (_aten.add.Tensor, _aten.mul.Tensor)):
            continue
        new_args = []
        for arg in n.args:
            if isinstance(arg, Node):
                new_args.append(arg)
                continue
            name = fresh_attr_name(model, "_tensor_constant_")
            value = torch.tensor(float(arg))
            model.register_buffer(name, value)
            with model.graph.inserting_before(n):
                attr = model.graph.create_node("get_attr", name, (), {})
            attr.meta["val"] = n.meta["val"].fake_mode.from_tensor(value, static_shapes=True)
            new_args.append(attr)
        n.args = tuple(new_args)
    model.recompile()
    return model
