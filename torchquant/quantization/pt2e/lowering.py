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
from ...ops import pooling as _ops_pooling
from ...ops._library import weight_qparams
from ..._graph import drop_unused_attrs, fresh_attr_name, get_attr_tensor, is_call, only_user

__all__ = ["lower_pt2e", "LoweredConv", "LoweredLinear", "LoweredDynamicLinear",
           "lowered_op_counts"]

_tq = torch.ops.torchquant
_aten = torch.ops.aten
_Q = _tq.quantize_per_tensor.default
_DQ = _tq.dequantize_per_tensor.default
_DQ_CH = _tq.dequantize_per_channel.default
_Q_DYN = _tq.quantize_dynamic_per_tensor.default
_RELU = (_aten.relu.default, _aten.relu_.default)
_ADD = (_aten.add.Tensor, _aten.add_.Tensor)
_CONV = {_aten.conv1d.default: 1, _aten.conv2d.default: 2, _aten.conv3d.default: 3}
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


def _act_dq(node: Any) -> Optional[tuple[Node, float, int]]:
    """(codes, scale, zero_point) of a per-tensor activation dequantize."""
    if not is_call(node, _DQ) or len(node.args) < 3:
        return None
    codes = node.args[0]
    if not isinstance(codes, Node) or codes.op == "get_attr":
        return None
    return codes, float(node.args[1]), int(node.args[2])


def _weight(model: GraphModule, node: Any) -> Optional[tuple]:
    """(int8 weight, scale, zero_point, axis) of a dequantized constant weight; per-tensor
    qparams as 0-d tensors."""
    if is_call(node, _DQ_CH):
        w, s, zp = (get_attr_tensor(model, a) for a in node.args[:3])
        axis = int(node.args[3])
        if w is None or s is None or zp is None or axis != 0:
            return None
        return w, s, zp, axis
    if is_call(node, _DQ):
        w = get_attr_tensor(model, node.args[0])
        if w is None:
            return None
        return (w, torch.tensor(float(node.args[1]), dtype=torch.float64),
                torch.tensor(int(node.args[2]), dtype=torch.int64), None)
    return None


def _bias(model: GraphModule, node: Any) -> tuple[bool, Optional[torch.Tensor]]:
    if node is None:
        return True, None
    b = get_attr_tensor(model, node)
    return (b is not None and b.dtype == torch.float32), b


def _tail(root: Node) -> Optional[tuple[list[Node], str, Optional[tuple], Node]]:
    """The fusable chain after a conv / linear: (nodes fused, post_op, other activation
    (codes, scale, zp) or None, the per-tensor quantize ending it)."""
    chain: list[Node] = []
    post_op, other = "none", None
    cur = root
    nxt = only_user(cur)
    if is_call(nxt, _RELU):
        chain.append(nxt)
        post_op, cur = "relu", nxt
    elif is_call(nxt, _ADD) and len(nxt.args) == 2 and not nxt.kwargs:
        a, b = nxt.args
        operand = b if a is cur else a
        deq = _act_dq(operand)
        shape = _shape(cur)
        if deq is None or operand is cur or shape is None or _shape(operand) != shape \
                or _dtype(deq[0]) != torch.uint8:
            return None
        chain.append(nxt)
        post_op, other, cur = "add", deq, nxt
        after = only_user(cur)
        if is_call(after, _RELU):
            chain.append(after)
            post_op, cur = "add_relu", after
    q = only_user(cur)
    if not is_call(q, _Q) or len(q.args) < 4:
        return None
    return chain, post_op, other, q


def _conv_geometry(node: Node, n: int) -> Optional[tuple]:
    names = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
    defaults = (None, None, None, [1] * n, [0] * n, [1] * n, 1)
    args = list(node.args) + list(defaults[len(node.args):])
    for k, v in node.kwargs.items():
        args[names.index(k)] = v
    stride, padding, dilation, groups = args[3:7]
    if isinstance(padding, str):
        return None

    def tup(v: Any) -> tuple:
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        return tuple(int(i) for i in (v * n if len(v) == 1 else v))

    return args[0], args[1], args[2], tup(stride), tup(padding), tup(dilation), int(groups)


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
    arguments, or None where they are not a constant int8 weight and a constant (or no) bias."""
    weight = _weight(model, w)
    ok_bias, bias = _bias(model, b)
    if weight is None or not ok_bias or weight[0].dtype != torch.int8:
        return None
    return weight, bias


def _fuse_static(model: GraphModule, node: Node) -> bool:
    is_conv = node.target in _CONV
    if is_conv:
        geometry = _conv_geometry(node, _CONV[node.target])
        if geometry is None:
            return False
        x, w, b, stride, padding, dilation, groups = geometry
    else:
        x, w = node.args[:2]
        b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    deq = _act_dq(x)
    weight_bias = _int8_weight_and_bias(model, w, b)
    if deq is None or weight_bias is None:
        return False
    weight, bias = weight_bias
    x_dtype = _dtype(deq[0])
    tail = _tail(node)
    if tail is None:
        return False
    chain, post_op, other, q = tail
    out_qdtype = _dt.qdtype_of(q.args[3])
    out_scale, out_zp = float(q.args[1]), int(q.args[2])
    w_int, w_scale, w_zp, axis = weight
    if is_conv:
        if x_dtype != torch.uint8 or out_qdtype.name != "quint8":
            return False
        packed = _ops_conv.packed_conv_weight(w_int, *weight_qparams(w_scale, w_zp, axis),
                                              bias, axis or 0, stride, padding, dilation,
                                              groups)
        module: torch.nn.Module = LoweredConv(packed, deq[1], deq[2], out_scale, out_zp,
                                              post_op, *(other[1:] if other else (1.0, 0)))
        prefix = "lowered_conv_"
    else:
        if x_dtype not in (torch.uint8, torch.int8) or out_qdtype.name not in ("quint8",
                                                                              "qint8"):
            return False
        packed = _ops_linear.packed_linear_weight(w_int, *weight_qparams(w_scale, w_zp, axis), bias)
        module = LoweredLinear(packed, deq[1], deq[2], out_scale, out_zp,
                               out_qdtype.storage_dtype, post_op,
                               *(other[1:] if other else (1.0, 0)))
        prefix = "lowered_linear_"
    args = (deq[0],) if other is None else (deq[0], other[0])
    _replace(model, node, q, module, prefix, args, out_qdtype.storage_dtype)
    return True


def _dynamic_input(node: Any) -> Optional[tuple[Node, bool]]:
    """(float input, reduce_range) of the dequantize ``convert`` writes after a dynamic
    quantize: ``mul(sub(float(codes), zp), float(scale))``."""
    if not is_call(node, (_aten.mul.Tensor,)):
        return None
    shifted, scale = node.args
    if not is_call(shifted, (_aten.sub.Tensor,)) or not is_call(scale, (_aten._to_copy.default,)):
        return None
    qf, zp = shifted.args
    if not is_call(qf, (_aten._to_copy.default,)):
        return None
    parts = (qf.args[0], zp, scale.args[0])
    if not all(is_call(p, (operator.getitem,)) for p in parts):
        return None
    chosen = parts[0].args[0]
    if not is_call(chosen, _Q_DYN) or any(p.args[0] is not chosen for p in parts) \
            or [p.args[1] for p in parts] != [0, 2, 1]:
        return None
    x, qdtype = chosen.args[:2]
    reduce_range = bool(chosen.args[2]) if len(chosen.args) > 2 else False
    if _dt.qdtype_of(qdtype).name != "quint8":
        return None
    return x, reduce_range


def _fuse_dynamic(model: GraphModule, node: Node) -> bool:
    x, w = node.args[:2]
    b = node.args[2] if len(node.args) > 2 else node.kwargs.get("bias")
    dyn = _dynamic_input(x)
    weight_bias = _int8_weight_and_bias(model, w, b)
    if dyn is None or weight_bias is None:
        return False
    (w_int, w_scale, w_zp, axis), bias = weight_bias
    packed = _ops_linear.packed_linear_weight(w_int, *weight_qparams(w_scale, w_zp, axis), bias)
    relu = only_user(node)
    last = relu if is_call(relu, _RELU) else node
    _replace(model, node, last, LoweredDynamicLinear(packed, dyn[1], last is not node),
             "lowered_dynamic_linear_", (dyn[0],), torch.float32)
    return True


_MAX_POOL = {_aten.max_pool1d.default: 1, _aten.max_pool2d.default: 2,
             _aten.max_pool3d.default: 3}


def max_pool_codes(values: torch.Tensor, ndim: int, kernel_size: list, stride: list,
                   padding: list, dilation: list, ceil_mode: bool) -> torch.Tensor:
    """Max pooling of quantized codes (what a lowered ``q(max_pool(dq(.)))`` calls)."""
    return _ops_pooling.max_pool(values, ndim, kernel_size, stride, padding, dilation,
                                 ceil_mode)


def _same_qparams(dq: Node, q: Node) -> bool:
    codes = dq.args[0]
    return (float(dq.args[1]) == float(q.args[1]) and int(dq.args[2]) == int(q.args[2])
            and _dtype(codes) == _dt.qdtype_of(q.args[3]).storage_dtype)


def _lower_max_pool(model: GraphModule) -> int:
    lowered = 0
    for node in list(model.graph.nodes):
        if not is_call(node, _MAX_POOL) or not is_call(node.args[0], _DQ):
            continue
        q = only_user(node)
        if not is_call(q, _Q) or not _same_qparams(node.args[0], q) or float(q.args[1]) <= 0:
            continue
        ndim = _MAX_POOL[node.target]
        names = ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode")
        args = list(node.args) + [None, [], 0, 1, False][len(node.args) - 1:]
        for k, v in node.kwargs.items():
            args[names.index(k)] = v
        with model.graph.inserting_before(q):
            pooled = model.graph.call_function(
                max_pool_codes, (node.args[0].args[0], ndim, *args[1:6]))
        pooled.meta[_DTYPE_KEY] = _dtype(node.args[0].args[0])
        pooled.meta[_SHAPE_KEY] = _shape(node)
        q.replace_all_uses_with(pooled)
        lowered += 1
    return lowered


def _drop_requantize(model: GraphModule) -> int:
    """``quantize(dequantize(q, s, zp), s, zp, dtype)`` of q's own dtype is q."""
    dropped = 0
    for node in list(model.graph.nodes):
        if not is_call(node, _Q) or not is_call(node.args[0], _DQ):
            continue
        dq = node.args[0]
        if _same_qparams(dq, node):
            node.replace_all_uses_with(dq.args[0])
            dropped += 1
    return dropped


def _fold_weight_dequantize(model: GraphModule) -> None:
    """Dequantize constant weights that stay float once, into float constants."""
    graph = model.graph
    for node in list(graph.nodes):
        if not is_call(node, (_DQ, _DQ_CH)) or not node.users:
            continue
        if not all(a.op == "get_attr" for a in node.all_input_nodes):
            continue
        args = tuple(get_attr_tensor(model, a) if isinstance(a, Node) else a for a in node.args)
        value = node.target(*args)
        name = fresh_attr_name(model, "_dequantized_weight_")
        model.register_buffer(name, value)
        with graph.inserting_before(node):
            const = graph.get_attr(name)
        const.meta.update({k: v for k, v in node.meta.items() if k == "val"})
        node.replace_all_uses_with(const)


def lower_pt2e(model: GraphModule, inplace: bool = False) -> GraphModule:
    """The lowered form of a ``convert_pt2e`` output (see the module docstring); ``model`` is
    copied unless ``inplace``.  The weights of fused ops are packed here, once."""
    if not isinstance(model, GraphModule):
        raise TypeError(f"lower_pt2e expects the GraphModule convert_pt2e returns, got "
                        f"{type(model).__name__}")
    if not inplace:
        model = copy.deepcopy(model)
    graph = model.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or not node.users:
            continue
        if node.target in _CONV or node.target is _LINEAR:
            if not _fuse_static(model, node) and node.target is _LINEAR:
                _fuse_dynamic(model, node)
    graph.eliminate_dead_code()
    _lower_max_pool(model)
    graph.eliminate_dead_code()
    _drop_requantize(model)
    graph.eliminate_dead_code()
    _fold_weight_dequantize(model)
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
