"""Lowering of a converted PT2E graph onto torchquant's fused integer ops.

``convert_pt2e`` leaves a *reference* graph: float convs / linears between
``torchquant.dequantize_*`` and ``torchquant.quantize_per_tensor`` nodes, weights folded to
int8 constants.  :func:`lower_pt2e` rewrites it for speed without new numerics -- every fused
computation is one of the ops layer's (``ops.conv.conv`` / ``ops.linear.linear`` /
``ops.linear.linear_dynamic`` with their ``post_op``):

* ``dequantize(x) -> conv / linear(dequantize(w), b) [-> relu | -> add(., dequantize(o))
  [-> relu]] -> quantize`` becomes one call of a small module holding the weight packed once
  (:class:`LoweredConv`, :class:`LoweredLinear`) that maps input codes (and ``o``'s codes) to
  output codes;
* ``linear(dynamic dequantize(x), dequantize(w), b) [-> relu]`` becomes one dynamic int8
  Linear (:class:`LoweredDynamicLinear`);
* ``quantize(dequantize(q, s, zp), s, zp)`` with the same dtype is ``q`` and disappears;
* ``quantize(max_pool(dequantize(q, s, zp)), s, zp)`` is the max pooling of the codes
  (dequantizing is increasing, and quantizing a dequantized code gives it back): one
  :func:`torchquant.ops.pooling.max_pool` call on the integers;
* a dequantize of a constant weight that stays float is folded into a float constant.

The patterns, and the ops each starts from, are the ``pt2e`` column of
:data:`torchquant.ops.patterns.PATTERNS` (shared with FX convert, the inductor pass and the
reference representation, as are the matchers for their pieces); :data:`EMITTERS` says what
this lowering makes of each.

What is left (elementwise quantize / dequantize around pooling, the float head) stays as
graph ops for inductor.  Patterns the ops do not cover (an output that is not re-quantized,
a narrowed quant range, transposed convs, broadcast adds, qint8 activations into a conv) are
left as they are, so the lowered graph always computes what the reference graph computes:
bit for bit for the static ops on an exact CPU, and up to oneDNN's documented split on
saturating CPUs (the ops are exact either way; tests compare within one step).
"""
from __future__ import annotations

import copy
import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from ... import dtypes as _dt
from ...ops import conv as _ops_conv
from ...ops import linear as _ops_linear
from ...ops import patterns
from ...ops import pooling as _ops_pooling
from ...ops._library import weight_qparams
from ..._graph import drop_unused_attrs, fresh_attr_name, get_attr_tensor, is_call, only_user

__all__ = ["lower_pt2e", "LoweredConv", "LoweredLinear", "LoweredDynamicLinear",
           "lowered_op_counts"]

_tq = torch.ops.torchquant
_aten = torch.ops.aten
_Q = _tq.quantize_per_tensor.default
_DQ = _tq.dequantize_per_tensor.default
_Q_DYN = _tq.quantize_dynamic_per_tensor.default
_CONV_DIMS = {_aten.conv1d.default: 1, _aten.conv2d.default: 2, _aten.conv3d.default: 3}
_LINEAR = _aten.linear.default
_DTYPE_KEY = "torchquant_lowered_dtype"  # a fused node's output dtype (convert sets no "val")
_SHAPE_KEY = "torchquant_lowered_shape"


# ---- the modules the fused nodes call ----------------------------------------------------------

class LoweredConv(torch.nn.Module):
    """``quantize(post_op(conv(dequantize(x), w, b)))`` on quint8 codes: one
    :func:`torchquant.ops.conv.conv` call with the weight packed once."""

    def __init__(self, packed: _ops_conv.PackedConvWeight, x_scale: float, x_zero_point: int,
                 out_scale: float, out_zero_point: int, post_op: str = "none",
                 other_scale: float = 1.0, other_zero_point: int = 0) -> None:
        super().__init__()
        self.packed = packed
        self.x_scale, self.x_zero_point = float(x_scale), int(x_zero_point)
        self.out_scale, self.out_zero_point = float(out_scale), int(out_zero_point)
        self.post_op = post_op
        self.other_scale, self.other_zero_point = float(other_scale), int(other_zero_point)

    def forward(self, x: torch.Tensor, other: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _ops_conv.conv(x, self.x_scale, self.x_zero_point, self.packed, self.out_scale,
                              self.out_zero_point, self.post_op, other=other,
                              other_scale=self.other_scale,
                              other_zero_point=self.other_zero_point)

    def extra_repr(self) -> str:
        return (f"weight={tuple(self.packed.weight.shape)}, post_op={self.post_op!r}, "
                f"out_scale={self.out_scale}, out_zero_point={self.out_zero_point}")


class LoweredLinear(torch.nn.Module):
    """``quantize(post_op(linear(dequantize(x), w, b)))`` on integer codes: one
    :func:`torchquant.ops.linear.linear` call with the weight packed once."""

    def __init__(self, packed: _ops_linear.PackedLinearWeight, x_scale: float,
                 x_zero_point: int, out_scale: float, out_zero_point: int,
                 out_dtype: torch.dtype, post_op: str = "none", other_scale: float = 1.0,
                 other_zero_point: int = 0) -> None:
        super().__init__()
        self.packed = packed
        self.x_scale, self.x_zero_point = float(x_scale), int(x_zero_point)
        self.out_scale, self.out_zero_point = float(out_scale), int(out_zero_point)
        self.out_dtype = out_dtype
        self.post_op = post_op
        self.other_scale, self.other_zero_point = float(other_scale), int(other_zero_point)

    def forward(self, x: torch.Tensor, other: Optional[torch.Tensor] = None) -> torch.Tensor:
        return _ops_linear.linear(x, self.x_scale, self.x_zero_point, self.packed,
                                  self.out_scale, self.out_zero_point, self.out_dtype,
                                  self.post_op, other=other, other_scale=self.other_scale,
                                  other_zero_point=self.other_zero_point)

    def extra_repr(self) -> str:
        return (f"weight={tuple(self.packed.weight.shape)}, post_op={self.post_op!r}, "
                f"out_dtype={self.out_dtype}")


class LoweredDynamicLinear(torch.nn.Module):
    """A Linear whose float input is quantized per tensor (quint8) from its own range on each
    call: one :func:`torchquant.ops.linear.linear_dynamic` call, float output."""

    def __init__(self, packed: _ops_linear.PackedLinearWeight, reduce_range: bool,
                 relu: bool = False) -> None:
        super().__init__()
        self.packed = packed
        self.reduce_range = bool(reduce_range)
        self.relu = bool(relu)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _ops_linear.linear_dynamic(x, self.packed, self.reduce_range, self.relu)

    def extra_repr(self) -> str:
        return (f"weight={tuple(self.packed.weight.shape)}, reduce_range={self.reduce_range}, "
                f"relu={self.relu}")


# ---- graph helpers -------------------------------------------------------------------------------

def _dtype(node: Any) -> Optional[torch.dtype]:
    if not isinstance(node, Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.dtype
    if node.op == "call_function" and node.target is _Q:
        return _dt.qdtype_of(node.args[3]).storage_dtype
    return node.meta.get(_DTYPE_KEY)


def _shape(node: Any) -> Optional[torch.Size]:
    """A node's static shape: its export metadata, else (quantize / dequantize nodes, which
    convert adds without metadata) its input's."""
    if not isinstance(node, Node):
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor):
        return val.shape
    if node.meta.get(_DTYPE_KEY) is not None:  # a node this lowering made
        return node.meta.get(_SHAPE_KEY)
    if is_call(node, (_Q, _DQ)):
        return _shape(node.args[0])
    return None


def _uint8_addend_of_same_shape(root: Node, operand: Node, other: tuple) -> bool:
    """The add the static ops fuse: another quint8 activation of the conv / linear output's
    shape (no broadcast)."""
    shape = _shape(root)
    return shape is not None and _shape(operand) == shape and _dtype(other[0]) == torch.uint8


# ---- the rewrites ----------------------------------------------------------------------------------

def _replace(model: GraphModule, first: Node, last: Node, module: torch.nn.Module,
             prefix: str, args: tuple, dtype: torch.dtype) -> None:
    name = fresh_attr_name(model, prefix)
    model.add_submodule(name, module)
    with model.graph.inserting_before(last):  # after every input (the add's other operand)
        fused = model.graph.call_module(name, args)
    for key in ("nn_module_stack", "stack_trace"):
        if key in first.meta:
            fused.meta[key] = first.meta[key]
    if "val" in last.meta:
        fused.meta["val"] = last.meta["val"]
    fused.meta[_DTYPE_KEY] = dtype
    fused.meta[_SHAPE_KEY] = _shape(last)
    fused.meta["lowered_from"] = last.name  # the reference node whose value it computes
    last.replace_all_uses_with(fused)


def _int8_weight_and_bias(model: GraphModule, w: Any, b: Any
                          ) -> Optional[tuple[tuple, Optional[torch.Tensor]]]:
    """((int8 codes, scale, zero point, axis), bias) of a conv / linear node's weight and bias
    arguments, or None where they are not a constant int8 weight (per tensor, or per output
    channel) and a constant float32 (or no) bias."""
    weight = patterns.constant_dequantize(model, w)
    bias = get_attr_tensor(model, b) if b is not None else None
    if (weight is None or weight[0].dtype != torch.int8 or weight[3] not in (None, 0)
            or (b is not None and (bias is None or bias.dtype != torch.float32))):
        return None
    return weight, bias


def _static_operands(node: Node) -> Optional[tuple]:
    """(x, w, b, conv geometry or None) of a conv / linear node."""
    if node.target is _LINEAR:
        b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
        return node.args[0], node.args[1], b, None
    geometry = patterns.conv_arguments(node, _CONV_DIMS[node.target])
    if geometry is None:
        return None
    x, w, b, *rest = geometry
    return x, w, b, tuple(rest)


def _fuse_static(model: GraphModule, node: Node) -> bool:
    """The ``conv`` / ``linear`` patterns: one :class:`LoweredConv` / :class:`LoweredLinear`."""
    operands = _static_operands(node)
    if operands is None:
        return False
    x, w, b, geometry = operands
    deq = patterns.activation_dequantize(x)
    weight_bias = _int8_weight_and_bias(model, w, b)
    if deq is None or weight_bias is None:
        return False
    weight, bias = weight_bias
    x_dtype = _dtype(deq[0])
    tail = patterns.PostOps(node, addend_ok=_uint8_addend_of_same_shape)
    q = tail.quantize
    if q is None:
        return False
    other = tail.other
    out_qdtype = _dt.qdtype_of(q.args[3])
    out_scale, out_zp = float(q.args[1]), int(q.args[2])
    w_int, w_scale, w_zp, axis = weight
    if geometry is not None:
        if x_dtype != torch.uint8 or out_qdtype.name != "quint8":
            return False
        packed = _ops_conv.packed_conv_weight(w_int, *weight_qparams(w_scale, w_zp, axis),
                                              bias, axis or 0, *geometry)
        module: torch.nn.Module = LoweredConv(packed, deq[1], deq[2], out_scale, out_zp,
                                              tail.post_op, *(other[1:] if other else (1.0, 0)))
        prefix = "lowered_conv_"
    else:
        if x_dtype not in (torch.uint8, torch.int8) or out_qdtype.name not in ("quint8",
                                                                              "qint8"):
            return False
        packed = _ops_linear.packed_linear_weight(w_int, *weight_qparams(w_scale, w_zp, axis), bias)
        module = LoweredLinear(packed, deq[1], deq[2], out_scale, out_zp,
                               out_qdtype.storage_dtype, tail.post_op,
                               *(other[1:] if other else (1.0, 0)))
        prefix = "lowered_linear_"
    args = (deq[0],) if other is None else (deq[0], other[0])
    _replace(model, node, q, module, prefix, args, out_qdtype.storage_dtype)
    return True


def _dynamic_input(node: Any) -> Optional[tuple[Node, bool]]:
    """(float input, reduce_range) of the dequantize ``convert`` writes after a quint8
    dynamic quantize (the codes, scale and zero point are its outputs 0, 1 and 2)."""
    parts = patterns.dynamic_dequantize(node, _aten._to_copy.default)
    if parts is None or not all(is_call(p, operator.getitem) for p in parts):
        return None
    codes, scale, zp = parts
    chosen = codes.args[0]
    if (not is_call(chosen, _Q_DYN) or any(p.args[0] is not chosen for p in parts)
            or [p.args[1] for p in parts] != [0, 1, 2]):
        return None
    x, qdtype = chosen.args[:2]
    reduce_range = bool(chosen.args[2]) if len(chosen.args) > 2 else False
    if _dt.qdtype_of(qdtype).name != "quint8":
        return None
    return x, reduce_range


def _fuse_dynamic(model: GraphModule, node: Node) -> bool:
    """The ``linear_dynamic`` pattern: one :class:`LoweredDynamicLinear` (a ReLU after it
    taken in)."""
    x, w = node.args[:2]
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    dyn = _dynamic_input(x)
    weight_bias = _int8_weight_and_bias(model, w, b)
    if dyn is None or weight_bias is None:
        return False
    (w_int, w_scale, w_zp, axis), bias = weight_bias
    packed = _ops_linear.packed_linear_weight(w_int, *weight_qparams(w_scale, w_zp, axis), bias)
    last = patterns.PostOps(node).last
    _replace(model, node, last, LoweredDynamicLinear(packed, dyn[1], last is not node),
             "lowered_dynamic_linear_", (dyn[0],), torch.float32)
    return True


_MAX_POOL_DIMS = {_aten.max_pool1d.default: 1, _aten.max_pool2d.default: 2,
                  _aten.max_pool3d.default: 3}


def max_pool_codes(values: torch.Tensor, ndim: int, kernel_size: list, stride: list,
                   padding: list, dilation: list, ceil_mode: bool) -> torch.Tensor:
    """Max pooling of quantized codes (what a lowered ``q(max_pool(dq(.)))`` calls)."""
    return _ops_pooling.max_pool(values, ndim, kernel_size, stride, padding, dilation,
                                 ceil_mode)


def _undone_by(dq: Any, q: Any) -> bool:
    """``dq`` is a per-tensor dequantize whose codes the quantize ``q`` gives back."""
    return (is_call(dq, _DQ) and len(dq.args) >= 3
            and patterns.undoes_dequantize(_dtype(dq.args[0]), dq.args[1], dq.args[2], q))


def _pool_codes(model: GraphModule, node: Node) -> bool:
    """The ``max_pool`` pattern: dequantizing is increasing and the quantize after the pool
    gives the codes back, so the pool runs on the codes."""
    dq, q = node.args[0], only_user(node)
    if not _undone_by(dq, q):
        return False
    names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode")
    args = list(node.args) + [None, [], 0, 1, False][len(node.args) - 1:]
    for k, v in node.kwargs.items():
        args[names.index(k)] = v
    with model.graph.inserting_before(q):
        pooled = model.graph.call_function(
            max_pool_codes, (dq.args[0], _MAX_POOL_DIMS[node.target], *args[1:6]))
    pooled.meta[_DTYPE_KEY] = _dtype(dq.args[0])
    pooled.meta[_SHAPE_KEY] = _shape(node)
    q.replace_all_uses_with(pooled)
    return True


def _drop_requantize(model: GraphModule, node: Node) -> bool:
    """The ``requantize`` pattern: ``quantize(dequantize(q, s, zp), s, zp)`` of q's own dtype
    is q."""
    dq = node.args[0]
    if not _undone_by(dq, node):
        return False
    node.replace_all_uses_with(dq.args[0])
    return True


def _fold_weight_dequantize(model: GraphModule, node: Node) -> bool:
    """The ``weight_dequantize`` pattern: a constant weight that stays float is dequantized
    once, into a float constant."""
    const = patterns.fold_constant_dequantize(model, node, "_dequantized_weight_")
    if const is None:
        return False
    if "val" in node.meta:
        const.meta["val"] = node.meta["val"]
    return True


# what this lowering emits for each pattern of the ``pt2e`` use of
# torchquant.ops.patterns.PATTERNS (the table's targets: LoweredConv, LoweredLinear,
# LoweredDynamicLinear, max_pool_codes, the codes themselves, a float constant)
EMITTERS: dict[str, Any] = {
    "conv": _fuse_static,
    "linear": _fuse_static,
    "linear_dynamic": _fuse_dynamic,
    "max_pool": _pool_codes,
    "requantize": _drop_requantize,
    "weight_dequantize": _fold_weight_dequantize,
}


def lower_pt2e(model: GraphModule, inplace: bool = False) -> GraphModule:
    """The lowered form of a ``convert_pt2e`` output (see the module docstring); ``model`` is
    copied unless ``inplace``.  The weights of fused ops are packed here, once."""
    if not isinstance(model, GraphModule):
        raise TypeError(f"lower_pt2e expects the GraphModule convert_pt2e returns, got "
                        f"{type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    graph = model.graph
    # one pass per target, in the table's order: a pattern's nodes are rewritten before the
    # next pass looks (a conv's output quantize is gone before the requantize pass)
    for group in patterns.passes("pt2e"):
        emitters = {op: EMITTERS[name] for name, ops in group for op in ops}
        for node in list(graph.nodes):
            emit = emitters.get(node.target) if node.op == "call_function" else None
            if emit is not None and node.users:
                emit(model, node)
        graph.eliminate_dead_code()
    drop_unused_attrs(model, ("_frozen_param", "_scale_", "_zero_point_"))
    graph.lint()
    model.recompile()
    return model


def lowered_op_counts(model: GraphModule) -> dict[str, int]:
    """How many nodes of each kind a (lowered) graph runs per call: fused modules by class,
    functions by op name -- the profile of where an inference's calls go."""
    counts: dict[str, int] = {}
    modules = dict(model.named_modules())
    for node in model.graph.nodes:
        if node.op == "call_module":
            key = type(modules[str(node.target)]).__name__
        elif node.op == "call_function":
            key = getattr(node.target, "__name__", str(node.target))
        else:
            continue
        counts[key] = counts.get(key, 0) + 1
    return counts
