"""``convert_pt2e(..., use_reference_representation=True)``: the quantize / dequantize patterns
of a converted graph rewritten into plain torch integer arithmetic (no ``torchquant`` q/dq op
left in a rewritten pattern), the semantics of torchao 0.18's reference representation.

Rewritten, for int8 codes (torchao's patterns are int8 only; uint8 q/dq stay torchquant ops,
as torchao leaves its uint8 ``quantized_decomposed`` ops):

* ``dq(x) , dq(w) -> linear -> q`` with per-tensor weights: an int32 linear of the
  zero-point-shifted codes, the bias quantized with ``x_scale * w_scale`` (truncating), the
  accumulator requantized by ``x_scale * w_scale / out_scale`` (truncating) plus the output zero
  point, clamped to the output range;
* ``dq(x) , dq(w) -> convolution -> q`` the same (``aten.convolution`` only: torchao's pattern
  is written for it, and ``torch.export`` emits ``aten.conv2d``, which neither rewrites);
* ``dq(x) , dq(y) -> add [-> relu] -> q`` with one code range: each input rescaled to the
  output scale (rounded for add, truncated for add + relu, as torchao), summed in int32;
* ``dq(x) -> max_pool2d_with_indices -> getitem 0 -> q`` (torchao's pattern, likewise not
  emitted by ``torch.export`` any more);
* every remaining quantize (``round(x / scale) + zero_point``, clamped) and dequantize
  (``(codes - zero_point) * scale``), per tensor and per channel.

The arithmetic reproduces torchao's op for op (its scale products are float32 0-d tensors; its
``out_dtype`` products are computed in float32 and truncated to int32), so the rewritten graph is
bit-exact with torchao's.  Unlike torchao, a linear without bias is rewritten into a graph that
runs (torchao's feeds ``None`` to a division).  Dynamic quantization stays as convert wrote it.
"""
from __future__ import annotations

import copy
import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from ... import dtypes as _dt
from ..._graph import erase_unused, is_call, only_user
from ...ops import patterns

__all__ = ["reference_representation_rewrite"]

_aten = torch.ops.aten
_tq = torch.ops.torchquant
_Q_TENSOR = _tq.quantize_per_tensor.default
_Q_CHANNEL = _tq.quantize_per_channel.default
_DQ_TENSOR = _tq.dequantize_per_tensor.default
_DQ_CHANNEL = _tq.dequantize_per_channel.default
_PORTED_META = ("nn_module_stack", "stack_trace", "custom")
_CODES = torch.int8


def _f32(value: torch.Tensor) -> float:
    """A float32 0-d result as a Python float (exact: float32 values are doubles)."""
    return float(value.item())


def _scale_product(a: float, b: float) -> float:
    """``a * b`` as torchao's graph computes it at run time (``aten.mul`` of two Python floats:
    a float32 0-d tensor)."""
    return _f32(_aten.mul.Tensor(a, b))


def _scale_ratio(a: float, b: float) -> float:
    return _f32(_aten.div.Tensor(a, b))


class _Codes:
    """Where an integer-code tensor comes from: its node (after any narrowing clamp), storage
    dtype and code range."""

    def __init__(self, node: Node, dtype: torch.dtype, qmin: int, qmax: int) -> None:
        self.node, self.dtype, self.qmin, self.qmax = node, dtype, qmin, qmax


def _qdtype_of_quantize(node: Node) -> _dt.QDType:
    """The qdtype a quantize op names (per tensor: after scale / zero point, before the
    optional rounding; per channel: after the axis)."""
    return _dt.qdtype_of(node.args[3] if node.target == _Q_TENSOR else node.args[4])


def _quantize_info(node: Node) -> Optional[tuple[Node, _dt.QDType, int, int]]:
    """For a quantize op, or the clamp narrowing its range: (the quantize op, its qdtype,
    qmin, qmax)."""
    if node.op != "call_function":
        return None
    if node.target in (_aten.clamp.default, _aten.clamp) and isinstance(node.args[0], Node):
        inner = node.args[0]
        if inner.op == "call_function" and inner.target in (_Q_TENSOR, _Q_CHANNEL) \
                and len(inner.users) == 1 and len(node.args) == 3:
            qdtype = _qdtype_of_quantize(inner)
            return inner, qdtype, int(node.args[1]), int(node.args[2])
        return None
    if node.target in (_Q_TENSOR, _Q_CHANNEL):
        qdtype = _qdtype_of_quantize(node)
        return node, qdtype, qdtype.qmin, qdtype.qmax
    return None


def _with_narrowing_clamp(q: Node, qdtype: _dt.QDType) -> tuple[Node, int, int]:
    """(the last node of quantize ``q``, its qmin, qmax): ``q`` itself with its dtype's range,
    or the clamp that narrows its codes when that is ``q``'s only user."""
    user = only_user(q)
    if user is not None:
        info = _quantize_info(user)
        if info is not None and info[0] is q:
            return user, info[2], info[3]
    return q, qdtype.qmin, qdtype.qmax


def _codes_of(model: GraphModule, node: Any) -> Optional[_Codes]:
    """The dtype / range of the codes ``node`` holds, None when unknown."""
    if not isinstance(node, Node):
        return None
    info = _quantize_info(node)
    if info is not None:
        _, qdtype, qmin, qmax = info
        return _Codes(node, qdtype.storage_dtype, qmin, qmax)
    if node.op == "get_attr":
        value = getattr(model, str(node.target), None)
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            info_ = torch.iinfo(value.dtype)
            return _Codes(node, value.dtype, info_.min, info_.max)
        return None
    val = node.meta.get("val")
    if isinstance(val, torch.Tensor) and not val.is_floating_point() and val.dtype != torch.bool:
        info_ = torch.iinfo(val.dtype)
        return _Codes(node, val.dtype, info_.min, info_.max)
    return None


class _Rewriter:
    def __init__(self, model: GraphModule) -> None:
        self.model = model
        self.graph = model.graph
        self.meta_source: Optional[Node] = None
        self.erased: set[Node] = set()
        self.produced: dict[Node, _Codes] = {}  # int8 results of rewritten patterns

    def _codes_of(self, node: Any) -> Optional[_Codes]:
        if isinstance(node, Node) and node in self.produced:
            return self.produced[node]
        return _codes_of(self.model, node)

    # -- node building -----------------------------------------------------------------------

    def _call(self, op: Any, *args: Any, **kwargs: Any) -> Node:
        node = self.graph.call_function(op, args, kwargs)
        if self.meta_source is not None:
            for key in _PORTED_META:
                if key in self.meta_source.meta:
                    node.meta[key] = copy.copy(self.meta_source.meta[key])
        return node

    def _to(self, x: Node, dtype: torch.dtype) -> Node:
        return self._call(_aten._to_copy.default, x, dtype=dtype)

    def _clamp(self, x: Node, lo: Any, hi: Any) -> Node:
        return self._call(_aten.clamp.default, x, lo, hi)

    def _replace(self, old: Node, new: Node, qmin: Optional[int] = None,
                 qmax: Optional[int] = None) -> None:
        if qmin is not None:
            self.produced[new] = _Codes(new, _CODES, qmin, qmax)
        old.replace_all_uses_with(new)
        self.erased.update(erase_unused(old))

    # -- pattern helpers ---------------------------------------------------------------------

    def _dq_per_tensor(self, node: Any, user: Node) -> Optional[tuple[_Codes, float, int]]:
        """(codes, scale, zero point) of an int8 per-tensor dequantize used only by ``user``."""
        if not (isinstance(node, Node) and node.op == "call_function"
                and node.target == _DQ_TENSOR and list(node.users) == [user]):
            return None
        codes = self._codes_of(node.args[0])
        if codes is None or codes.dtype != _CODES:
            return None
        return codes, float(node.args[1]), int(node.args[2])

    def _q_per_tensor_user(self, node: Node) -> Optional[tuple[Node, float, int, int, int]]:
        """When ``node``'s only user is an int8 per-tensor quantize (optionally narrowed by a
        clamp): (the node whose output the rewrite replaces, scale, zero point, qmin, qmax)."""
        q = only_user(node)
        if not is_call(q, _Q_TENSOR):
            return None
        qdtype = _dt.qdtype_of(q.args[3])
        if qdtype.storage_dtype != _CODES:
            return None
        last, qmin, qmax = _with_narrowing_clamp(q, qdtype)
        return last, float(q.args[1]), int(q.args[2]), qmin, qmax

    def _shifted_i32(self, codes: _Codes, zero_point: int) -> Node:
        """``(clamp(codes) as int16 - zero_point)`` as int32, as torchao's linear / conv."""
        x = self._clamp(codes.node, codes.qmin, codes.qmax)
        x = self._call(_aten.sub.Tensor, self._to(x, torch.int16), zero_point)
        return self._to(x, torch.int32)

    def _requantize(self, acc: Node, multiplier: float, zero_point: int, qmin: int,
                    qmax: int) -> Node:
        """``trunc(acc * multiplier) + zero_point`` (float32 product), clamped, as int8."""
        scaled = self._call(_aten.mul.Tensor, self._to(acc, torch.float32), multiplier)
        out = self._call(_aten.add.Tensor, self._to(scaled, torch.int32), zero_point)
        return self._to(self._clamp(out, qmin, qmax), _CODES)

    # -- fused patterns ----------------------------------------------------------------------

    def weighted(self, node: Node) -> bool:
        """linear / convolution between int8 per-tensor dq's and an int8 per-tensor q."""
        is_linear = node.target == _aten.linear.default
        if not (is_linear or node.target == _aten.convolution.default):
            return False
        if len(node.args) < 2 or node.kwargs:
            return False
        x = self._dq_per_tensor(node.args[0], node)
        w = self._dq_per_tensor(node.args[1], node)
        out = self._q_per_tensor_user(node)
        bias = node.args[2] if len(node.args) > 2 else None
        if x is None or w is None or out is None or (bias is not None and not
                                                     isinstance(bias, Node)):
            return False
        (x_codes, xs, xzp), (w_codes, ws, wzp) = x, w
        last, os_, ozp, oqmin, oqmax = out
        self.meta_source = node
        with self.graph.inserting_before(last):
            xi = self._shifted_i32(x_codes, xzp)
            wi = self._shifted_i32(w_codes, wzp)
            if is_linear:
                acc = self._call(_aten.linear.default, xi, wi, None)
            else:
                acc = self._call(_aten.convolution.default, xi, wi, None, *node.args[3:])
            bias_scale = _scale_product(xs, ws)
            if bias is not None:
                b = self._to(self._call(_aten.div.Tensor, bias, bias_scale), torch.int32)
                if not is_linear:  # per output channel: broadcast over the spatial dims
                    for _ in range(len(node.args[3])):
                        b = self._call(_aten.unsqueeze.default, b, -1)
                acc = self._call(_aten.add.Tensor, acc, b)
            result = self._requantize(acc, _scale_ratio(bias_scale, os_), ozp, oqmin, oqmax)
        self._replace(last, result, oqmin, oqmax)
        return True

    def add(self, node: Node) -> bool:
        """add (or add + relu) of two int8 per-tensor dq's into an int8 per-tensor q, all with
        one code range (torchao's pattern shares quant_min / quant_max)."""
        if node.target != _aten.add.Tensor or len(node.args) != 2 or node.kwargs:
            return False
        user = only_user(node)
        relu = user if is_call(user, _aten.relu.default) else None
        x = self._dq_per_tensor(node.args[0], node)
        y = self._dq_per_tensor(node.args[1], node)
        out = self._q_per_tensor_user(relu if relu is not None else node)
        if x is None or y is None or out is None:
            return False
        (x_codes, xs, xzp), (y_codes, ys, yzp) = x, y
        last, os_, ozp, oqmin, oqmax = out
        if not ((x_codes.qmin, x_codes.qmax) == (y_codes.qmin, y_codes.qmax) == (oqmin, oqmax)):
            return False
        self.meta_source = node
        with self.graph.inserting_before(last):
            terms = []
            for codes, scale, zp in ((x_codes, xs, xzp), (y_codes, ys, yzp)):
                shifted = self._call(_aten.sub.Tensor, self._to(codes.node, torch.int32), zp)
                ratio = _scale_ratio(scale, os_)
                if relu is not None:  # torchao: out_dtype(mul) -> float32 product, truncated
                    scaled = self._call(_aten.mul.Tensor, self._to(shifted, torch.float32),
                                        ratio)
                else:  # torchao: round(ratio * shifted)
                    scaled = self._call(_aten.round.default,
                                        self._call(_aten.mul.Tensor, shifted, ratio))
                terms.append(self._to(scaled, torch.int32))
            total = self._call(_aten.add.Tensor, terms[0], terms[1])
            total = self._call(_aten.add.Tensor, total, ozp)
            # torchao clamps add + relu to [out_zero_point, quant_max], add to int8's range
            lo, hi = (ozp, oqmax) if relu is not None else (-128, 127)
            result = self._to(self._clamp(total, lo, hi), _CODES)
        self._replace(last, result, oqmin, oqmax)
        return True

    def max_pool(self, node: Node) -> bool:
        """getitem(max_pool2d_with_indices(dq(x)), 0) -> q: max pool on shifted int32 codes."""
        if node.target != _aten.max_pool2d_with_indices.default:
            return False
        getters = list(node.users)
        if len(getters) != 1 or getters[0].target != operator.getitem or getters[0].args[1] != 0:
            return False
        x = self._dq_per_tensor(node.args[0], node)
        out = self._q_per_tensor_user(getters[0])
        if x is None or out is None:
            return False
        (codes, xs, xzp) = x
        last, os_, ozp, oqmin, oqmax = out
        self.meta_source = node
        with self.graph.inserting_before(last):
            xi = self._to(self._clamp(codes.node, codes.qmin, codes.qmax), torch.int32)
            xi = self._call(_aten.sub.Tensor, xi, xzp)
            pooled = self._call(_aten.max_pool2d_with_indices.default, xi, *node.args[1:])
            pooled = self._call(operator.getitem, pooled, 0)
            scaled = self._call(_aten.add.Tensor,
                                self._call(_aten.mul.Tensor, pooled, _scale_ratio(xs, os_)), ozp)
            result = self._to(self._clamp(scaled, oqmin, oqmax), _CODES)
        self._replace(last, result, oqmin, oqmax)
        return True

    # -- standalone q / dq -------------------------------------------------------------------

    def quantize(self, node: Node) -> bool:
        if node.target not in (_Q_TENSOR, _Q_CHANNEL):
            return False
        qdtype = _qdtype_of_quantize(node)
        if qdtype.storage_dtype != _CODES:
            return False
        last, qmin, qmax = _with_narrowing_clamp(node, qdtype)
        self.meta_source = node
        x = node.args[0]
        with self.graph.inserting_before(last):
            if node.target == _Q_TENSOR:
                scale, zp = float(node.args[1]), int(node.args[2])
                codes = self._to(self._call(_aten.round.default,
                                            self._call(_aten.div.Tensor, x, scale)), torch.int32)
                codes = self._clamp(self._call(_aten.add.Tensor, codes, zp), qmin, qmax)
            else:
                scales, zps, axis = node.args[1], node.args[2], int(node.args[3])
                moved = self._call(_aten.transpose.int, x, axis, -1)
                codes = self._to(self._call(_aten.round.default,
                                            self._call(_aten.div.Tensor, moved, scales)),
                                 torch.int32)
                codes = self._clamp(self._call(_aten.add.Tensor, codes, zps), qmin, qmax)
                codes = self._call(_aten.transpose.int, codes, axis, -1)
            result = self._to(codes, _CODES)
        self._replace(last, result, qmin, qmax)
        return True

    def dequantize(self, node: Node) -> bool:
        if node.target not in (_DQ_TENSOR, _DQ_CHANNEL):
            return False
        codes = self._codes_of(node.args[0])
        if codes is None or codes.dtype != _CODES:
            return False
        self.meta_source = node
        with self.graph.inserting_before(node):
            x = self._clamp(codes.node, codes.qmin, codes.qmax)
            if node.target == _DQ_TENSOR:
                scale, zp = float(node.args[1]), int(node.args[2])
                shifted = self._call(_aten.sub.Tensor, self._to(x, torch.float32), zp)
                result = self._to(self._call(_aten.mul.Tensor, shifted, scale), torch.float32)
            else:
                scales, zps, axis = node.args[1], node.args[2], int(node.args[3])
                moved = self._to(self._call(_aten.transpose.int, x, axis, -1), torch.int32)
                shifted = self._to(self._call(_aten.sub.Tensor, moved, zps), torch.float32)
                result = self._call(_aten.transpose.int,
                                    self._call(_aten.mul.Tensor, shifted, scales), axis, -1)
        self._replace(node, result)
        return True


# the _Rewriter method emitting each pattern of the ``reference`` use of
# torchquant.ops.patterns.PATTERNS
_EMITTERS = {"conv": "weighted", "linear": "weighted", "add": "add", "max_pool": "max_pool",
             "quantize": "quantize", "dequantize": "dequantize"}


def reference_representation_rewrite(model: GraphModule) -> GraphModule:
    """Rewrite (in place) the int8 q/dq patterns of a converted graph into integer arithmetic
    (see the module docstring); returns ``model``."""
    rewriter = _Rewriter(model)
    # one pass per target of the table's ``reference`` use (linears and convs share one), in
    # its order: fused patterns first, then the quantizes and dequantizes left alone
    for group in patterns.passes("reference"):
        steps = {op: getattr(rewriter, _EMITTERS[name]) for name, ops in group for op in ops}
        for node in list(model.graph.nodes):
            step = steps.get(node.target) if node.op == "call_function" else None
            if step is not None and node not in rewriter.erased:
                step(node)
    model.graph.lint()
    model.recompile()
    return model
