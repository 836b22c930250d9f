"""PT2E ``convert``: each observer / fake-quant call in a prepared graph becomes quantize ->
dequantize on torchquant's registered ops.

* static per tensor: ``torchquant.quantize_per_tensor(x, scale, zp, qdtype)`` ->
  ``dequantize_per_tensor(q, scale, zp)`` (qparams as graph constants); per channel: the
  ``_per_channel`` ops with the qparams as buffers of the model;
* a quant range narrower than the dtype's (e.g. weights in -127..127): a ``clamp`` on the codes
  after the quantize op (torchquant's ops quantize to a dtype's full range; clamping twice is
  clamping once to the narrower range);
* dynamic: ``torchquant.quantize_dynamic_per_tensor`` (qparams chosen from the running input)
  and the dequantize as ``(codes - zero_point) * scale`` on the returned 0-d qparams;
* float16: a cast to float16 and back;
* observers of float dtypes that are neither (PlaceholderObserver(float32), ...): removed.

``fold_quantize`` then replaces every quantize whose inputs are all constants (weights) by the
integer tensor it computes, so the graph holds integer weights feeding a dequantize.
"""
from __future__ import annotations

import copy
import operator
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node
from torch.fx.node import map_arg

from ... import dtypes as _dt
from ...ops import quantize as ops_quantize
from ..._graph import drop_unused_attrs, fresh_attr_name
from ..quantizer.quantizer import Q_ANNOTATION_KEY
from ..quantizer.utils import is_valid_annotation
from ._numeric_debugger import debug_handle_from_observer
from .utils import is_observer_node, set_tensor_attr

__all__ = ["convert", "QUANTIZE_OPS", "DEQUANTIZE_OPS", "fold_quantize_constants",
           "duplicate_dequantize"]

_tq = torch.ops.torchquant
QUANTIZE_OPS = (_tq.quantize_per_tensor.default, _tq.quantize_per_channel.default,
                _tq.quantize_dynamic_per_tensor.default)
DEQUANTIZE_OPS = (_tq.dequantize_per_tensor.default, _tq.dequantize_per_channel.default)
_PORTED_META = ("nn_module_stack", "stack_trace", "custom")
_QSCHEME_NAMES_DYNAMIC_OK = ("per_tensor_affine", "per_tensor_symmetric")
_OBSERVER_PREFIXES = ("activation_post_process_",)  # the observer modules prepare inserted


def _qdtype(dtype: Any) -> Optional[_dt.QDType]:
    """The byte-sized torchquant dtype an observer's dtype names, None for float / other."""
    if not _dt.is_qdtype_like(dtype):
        return None
    qdtype = _dt.to_qdtype(dtype)
    return None if qdtype.is_sub_byte else qdtype


def _qscheme_name(qscheme: Any) -> str:
    if qscheme is None:
        return "per_tensor_affine"
    return _dt.to_qscheme(qscheme).name


def _range(obs: Any, qdtype: _dt.QDType) -> tuple[int, int]:
    qmin = getattr(obs, "quant_min", None)
    qmax = getattr(obs, "quant_max", None)
    return (qdtype.qmin if qmin is None else int(qmin), qdtype.qmax if qmax is None else int(qmax))


class _Rewriter:
    def __init__(self, model: GraphModule) -> None:
        self.model = model
        self.graph = model.graph
        self.modules = dict(model.named_modules(remove_duplicate=False))

    def _get_attr(self, prefix: str, value: torch.Tensor) -> Node:
        name = fresh_attr_name(self.model, prefix)
        set_tensor_attr(self.model, name, value.detach().clone(), as_parameter=False)
        return self.graph.get_attr(name)

    def _narrow(self, q: Node, qdtype: _dt.QDType, qmin: int, qmax: int) -> Node:
        if (qmin, qmax) == (qdtype.qmin, qdtype.qmax):
            return q
        if not qdtype.qmin <= qmin <= qmax <= qdtype.qmax:
            raise ValueError(f"quant range [{qmin}, {qmax}] does not fit {qdtype.name}")
        return self.graph.call_function(torch.ops.aten.clamp.default, (q, qmin, qmax))

    def _finish(self, node: Node, out: Node) -> None:
        node.replace_all_uses_with(out)
        self.graph.erase_node(node)

    def rewrite(self, node: Node) -> None:
        before = set(self.graph.nodes)
        source = self._meta_source(node)
        self._rewrite(node)
        if source is None:
            return
        for new in self.graph.nodes:
            if new not in before:
                for key in _PORTED_META:
                    if key in source.meta:
                        new.meta[key] = copy.copy(source.meta[key])
                debug_handle_from_observer(node, new)

    @staticmethod
    def _meta_source(node: Node) -> Optional[Node]:
        """The node whose provenance (module stack, stack trace, custom meta such as numeric
        debug handles) the new q / dq nodes take: the op producing the observed value, or for
        a placeholder / constant the op consuming it."""
        x = node.args[0]
        if isinstance(x, Node) and x.op == "call_function":
            return x
        users = [u for u in node.users if u.op == "call_function"]
        return users[0] if users else None

    def _rewrite(self, node: Node) -> None:
        obs = self.modules[str(node.target)]
        x = node.args[0]
        if hasattr(obs, "convert"):  # affine-quantized observers rewrite themselves
            obs.convert(self.model, node)
            return
        dtype = getattr(obs, "dtype", None)
        is_dynamic = bool(getattr(obs, "is_dynamic", False))
        qdtype = _qdtype(dtype)
        with self.graph.inserting_before(node):
            if qdtype is not None and not is_dynamic:
                self._static(node, obs, x, qdtype)
            elif qdtype is not None and is_dynamic:
                self._dynamic(node, obs, x, qdtype)
            elif dtype == torch.float16:
                half = self.graph.call_function(torch.ops.aten._to_copy.default, (x,),
                                                {"dtype": torch.float16})
                back = self.graph.call_function(torch.ops.aten._to_copy.default, (half,),
                                                {"dtype": torch.float32})
                self._finish(node, back)
            else:  # nothing to quantize (float placeholder observers): drop the call
                self._finish(node, x)

    def _static(self, node: Node, obs: Any, x: Node, qdtype: _dt.QDType) -> None:
        scale, zero_point = obs.calculate_qparams()
        qmin, qmax = _range(obs, qdtype)
        if _qscheme_name(getattr(obs, "qscheme", None)).startswith("per_channel"):
            axis = int(obs.ch_axis)
            scale_node = self._get_attr("_scale_", torch.as_tensor(scale).to(torch.float32))
            zp_node = self._get_attr("_zero_point_", torch.as_tensor(zero_point))
            q = self.graph.call_function(_tq.quantize_per_channel.default,
                                         (x, scale_node, zp_node, axis, qdtype.name))
            q = self._narrow(q, qdtype, qmin, qmax)
            dq = self.graph.call_function(_tq.dequantize_per_channel.default,
                                          (q, scale_node, zp_node, axis))
        else:
            s, zp = float(scale), int(zero_point)
            # torchao's rounding (round, then add the zero point), not torch's eager one
            q = self.graph.call_function(_tq.quantize_per_tensor.default,
                                         (x, s, zp, qdtype.name, ops_quantize.DECOMPOSED))
            q = self._narrow(q, qdtype, qmin, qmax)
            dq = self.graph.call_function(_tq.dequantize_per_tensor.default, (q, s, zp))
        self._finish(node, dq)

    def _dynamic(self, node: Node, obs: Any, x: Node, qdtype: _dt.QDType) -> None:
        if qdtype.name not in ("quint8", "qint8"):
            raise ValueError(f"dynamic quantization supports quint8 / qint8, got {qdtype.name}")
        qscheme = _qscheme_name(getattr(obs, "qscheme", None))
        if qscheme not in _QSCHEME_NAMES_DYNAMIC_OK:
            raise ValueError(f"dynamic quantization is per tensor, got qscheme {qscheme}")
        qmin, qmax = _range(obs, qdtype)
        # [TQ] one op picks the qparams and quantizes, by torchao's rule (choose_qparams.tensor
        # then quantize_per_tensor.tensor: the observer's float32 qparams for [qmin, qmax],
        # the decomposed rounding)
        eps = float(getattr(obs, "eps", torch.finfo(torch.float32).eps))
        chosen = self.graph.call_function(_tq.quantize_dynamic_per_tensor.default,
                                          (x, qdtype.name, False, qmin, qmax, eps))
        q = self.graph.call_function(operator.getitem, (chosen, 0))
        scale = self.graph.call_function(operator.getitem, (chosen, 1))
        zp = self.graph.call_function(operator.getitem, (chosen, 2))
        aten = torch.ops.aten
        qf = self.graph.call_function(aten._to_copy.default, (q,), {"dtype": torch.float32})
        shifted = self.graph.call_function(aten.sub.Tensor, (qf, zp))
        scale32 = self.graph.call_function(aten._to_copy.default, (scale,),
                                           {"dtype": torch.float32})
        dq = self.graph.call_function(aten.mul.Tensor, (shifted, scale32))
        self._finish(node, dq)


def duplicate_dequantize(model: GraphModule) -> None:
    """One dequantize per annotated user (torchao's ``DuplicateDQPass``), so each quantized op
    sees its own q -> dq pattern."""
    graph = model.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in DEQUANTIZE_OPS:
            continue
        users = [u for u in node.users if u.target is not torch.ops.aten.sym_size.int]
        if len(users) <= 1:
            continue
        for user in users:
            if not is_valid_annotation(user.meta.get(Q_ANNOTATION_KEY)):
                continue
            with graph.inserting_after(node):
                copy = graph.node_copy(node)

            def swap(n: Node, old: Node = node, new: Node = copy) -> Node:
                return new if n is old else n

            user.args = map_arg(user.args, swap)
            user.kwargs = map_arg(user.kwargs, swap)
    graph.eliminate_dead_code()


def _constant_inputs(node: Node, memo: dict[Node, bool]) -> bool:
    if node in memo:
        return memo[node]
    if node.op == "get_attr":
        result = True
    elif node.op == "call_function":
        result = all(_constant_inputs(a, memo) for a in node.all_input_nodes)
        if node.target in DEQUANTIZE_OPS:
            result = False
    else:
        result = False
    memo[node] = result
    return result


def fold_quantize_constants(model: GraphModule) -> None:
    """Replace each quantize (and the clamp narrowing it) whose inputs are all constants by the
    integer tensor it computes: a buffer ``_frozen_param<N>`` read by the dequantize."""
    graph = model.graph
    memo: dict[Node, bool] = {}
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in QUANTIZE_OPS[:2]:
            continue
        if not _constant_inputs(node, memo):
            continue
        last = node
        users = list(node.users)
        if len(users) == 1 and users[0].target is torch.ops.aten.clamp.default:
            last = users[0]
        # evaluate the constant subgraph ending at `last`
        sub = torch.fx.Graph()
        env: dict[Node, Node] = {}
        order = [n for n in graph.nodes if n is last or (memo.get(n) and n.op != "placeholder")]
        needed = set()

        def collect(n: Node) -> None:
            if n in needed:
                return
            needed.add(n)
            for a in n.all_input_nodes:
                collect(a)

        collect(last)
        for n in order:
            if n in needed:
                env[n] = sub.node_copy(n, lambda a: env[a])
        sub.output(env[last])
        value = GraphModule(model, sub)()
        name = fresh_attr_name(model, "_frozen_param")
        set_tensor_attr(model, name, value, as_parameter=False)
        with graph.inserting_before(last):
            frozen = graph.get_attr(name)
        frozen.meta.update({k: v for k, v in last.meta.items() if k == "val"})
        last.replace_all_uses_with(frozen)
    graph.eliminate_dead_code()
    drop_unused_attrs(model, _OBSERVER_PREFIXES, children=True)  # observers no node calls


def convert(model: GraphModule) -> GraphModule:
    """Rewrite every observer call of ``model``'s graph (in place) into quantize / dequantize."""
    rewriter = _Rewriter(model)
    for node in list(model.graph.nodes):
        if is_observer_node(node, rewriter.modules):
            rewriter.rewrite(node)
    drop_unused_attrs(model, _OBSERVER_PREFIXES, children=True)  # observers no node calls
    model.graph.lint()
    model.recompile()
    return model
