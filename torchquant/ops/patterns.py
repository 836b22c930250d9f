"""The quantized-graph vocabulary, and the one table of patterns every graph lowering reads.

Whatever writes a quantized graph -- ``convert_pt2e``, ``torch.export`` of a converted model,
inductor's decompositions before freezing -- spells a quantized computation the same way:
torchquant's ``dequantize_*`` ops feed a float op, post-ops may follow, and a
``quantize_per_tensor`` ends it.  FX convert's reference graphs spell it with modules (a
reference module between ``dequantize`` and ``quantize``).  This module holds

* :data:`PATTERNS`, one row per quantized pattern: the form it matches and, for each use,
  the ops (or, for FX, the module types) a match starts from and what it becomes --
  ``fx``: the quantized module FX convert produces (torch.ao's ``convert_fx`` types), and
  ``fx_ops``: the modules / functions / methods FX convert lowers to QTensor ops;
  ``pt2e``: the module :func:`torchquant.quantization.pt2e.lower_pt2e` calls;
  ``inductor``: the fused call of the inductor freezing pass (:mod:`.inductor.fusion`);
  ``reference``: torchao's reference representation
  (:mod:`torchquant.quantization.pt2e.reference_representation`).
  Each lowering finds its patterns here (:func:`passes`, :func:`by_root`, :func:`fx_modules`)
  and keeps only its emitters, keyed by pattern name; tests/ops/test_patterns.py checks that
  each lowering has an emitter for every pattern of its use and none for any other;
* the matchers for the pieces of that form, used by the graph lowerings: an activation's
  dequantize, a constant weight's dequantize, a dequantize whose qparams the graph computes
  (dynamic quantization), a conv's arguments, the post-op chain after a conv / linear, a
  quantize that undoes a dequantize, and the folding of a constant's dequantize.

Op names are strings here (``"aten.conv2d.default"``), resolved each time a lowering asks
(once per graph or registration): torchquant's ops register as their modules load,
inductor's prims once inductor does, and ops a torch build lacks are skipped.  FX module
names are paths under ``torchquant.nn``, resolved by FX convert, which imports that layer
(this one cannot); FX function names are ``torch.`` / ``operator.`` paths.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule, Node

from .. import dtypes as _dt
from .._graph import fresh_attr_name, get_attr_tensor, is_call, only_user

__all__ = ["Use", "FxModule", "FxOps", "Pattern", "PATTERNS", "USES", "patterns_of", "passes",
           "by_root", "fx_modules", "fx_ops", "resolve_python", "resolve_op", "conv_arguments",
           "scalar", "activation_dequantize", "constant_dequantize", "dynamic_dequantize",
           "unary_at", "PostOps", "undoes_dequantize", "fold_constant_dequantize"]


# ---- the table ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Use:
    """Where one lowering meets a pattern: the ops a match starts from, and the name of what
    the lowering emits for it (its emitter's key)."""
    roots: tuple[str, ...]
    target: str


@dataclass(frozen=True)
class FxModule:
    """FX convert's form of a pattern: the module ``root`` (a path under ``torchquant.nn``; a
    fused module whose first child is ``inner``) between dequantize and quantize becomes
    ``target``; ``kind`` says how its qparams are found ("static": the quantize after it;
    "two_inputs": the same, the module reading a second dequantized input (conv + add);
    "dynamic" / "weight_only": float in and out, the weight's own; "output_qparams": a
    float module taking the output quantize's qparams)."""
    root: str
    target: str
    kind: str = "static"
    inner: str = ""


@dataclass(frozen=True)
class FxOps:
    """FX convert's form of a pattern rooted at ops rather than reference modules: the module
    types (paths under ``torch.nn``), functions (dotted paths, ``"torch.add"``,
    ``"operator.add"``) and method names a match starts from (what FX convert makes of them:
    the pattern's ``form``)."""
    modules: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    methods: tuple[str, ...] = ()


@dataclass(frozen=True)
class Pattern:
    name: str
    form: str
    fx: tuple[FxModule, ...] = ()
    fx_ops: Optional[FxOps] = None
    pt2e: Optional[Use] = None
    inductor: Optional[Use] = None
    reference: Optional[Use] = None


_CONVS = ("aten.conv1d.default", "aten.conv2d.default", "aten.conv3d.default")
_MAX_POOLS = ("aten.max_pool1d.default", "aten.max_pool2d.default", "aten.max_pool3d.default")
_Q = ("torchquant.quantize_per_tensor.default", "torchquant.quantize_per_channel.default")
_DQ = ("torchquant.dequantize_per_tensor.default", "torchquant.dequantize_per_channel.default")
_REF = "quantized.reference."
_F = "torch.nn.functional."


def _static(*names: str) -> tuple[FxModule, ...]:
    return tuple(FxModule(_REF + n, "quantized." + n) for n in names)


def _fused(outer: str, inner: str, target: str, kind: str = "static") -> FxModule:
    return FxModule("intrinsic." + outer, target, kind, _REF + inner)


PATTERNS: tuple[Pattern, ...] = (
    Pattern("conv",
            "dequantize(x), dequantize(w) -> conv [-> add(., dequantize(o))] "
            "[-> relu | hardtanh] -> quantize",
            fx=(*_static("Conv1d", "Conv2d", "Conv3d"),
                *(_fused(f"ConvReLU{n}d", f"Conv{n}d", f"intrinsic.quantized.ConvReLU{n}d")
                  for n in (1, 2, 3)),
                *(_fused(f"Conv{add}2d", "Conv2d", f"intrinsic.quantized.Conv{add}2d",
                         "two_inputs") for add in ("Add", "AddReLU"))),
            fx_ops=FxOps(functions=tuple(f"{_F}conv{n}d" for n in (1, 2, 3))),
            pt2e=Use(_CONVS, "LoweredConv"),
            inductor=Use(("aten.convolution.default",), "onednn.qconv_pointwise"),
            reference=Use(("aten.convolution.default",), "integer_weighted")),
    Pattern("torchquant_conv",
            "torchquant::conv of frozen weights (an exported eager- / FX-converted model)",
            inductor=Use(("torchquant.conv.default",), "onednn.qconv_pointwise")),
    Pattern("torchquant_linear",
            "torchquant::linear of a frozen weight, in a package (an eager- / FX-converted "
            "model)",
            inductor=Use(("torchquant.linear.default",), "onednn.qlinear_pointwise")),
    Pattern("linear",
            "dequantize(x), dequantize(w) -> linear [-> relu | leaky_relu | tanh (FX)] "
            "-> quantize",
            fx=(*_static("Linear"),
                *(_fused(f"Linear{act}", "Linear", f"intrinsic.quantized.Linear{act}")
                  for act in ("ReLU", "LeakyReLU", "Tanh"))),
            fx_ops=FxOps(functions=(_F + "linear",)),
            pt2e=Use(("aten.linear.default",), "LoweredLinear"),
            inductor=Use(("aten.addmm.default", "aten.mm.default"), "onednn.qlinear_pointwise"),
            reference=Use(("aten.linear.default",), "integer_weighted")),
    Pattern("linear_dynamic",
            "dynamic dequantize(x), dequantize(w) -> linear [-> relu | gelu], float out",
            fx=(FxModule(_REF + "Linear", "quantized.dynamic.Linear", "dynamic"),
                _fused("LinearReLU", "Linear", "intrinsic.quantized.dynamic.LinearReLU",
                       "dynamic")),
            fx_ops=FxOps(functions=(_F + "linear",)),
            pt2e=Use(("aten.linear.default",), "LoweredDynamicLinear"),
            inductor=Use(("aten.addmm.default", "aten.mm.default"),
                         "onednn.qlinear_pointwise.tensor")),
    Pattern("recurrent_dynamic", "dynamic LSTM / GRU / RNN cell, float out",
            fx=tuple(FxModule(_REF + n, "quantized.dynamic." + n, "dynamic")
                     for n in ("LSTM", "GRU", "LSTMCell", "GRUCell", "RNNCell"))),
    Pattern("embedding_weight_only", "embedding of a dequantized weight",
            fx=tuple(FxModule(_REF + n, "quantized." + n, "weight_only")
                     for n in ("Embedding", "EmbeddingBag"))),
    Pattern("output_qparams",
            "dequantize(x) -> normalization / activation / transposed conv -> quantize "
            "(torch's special patterns: the module takes the output's qparams)",
            fx=(*(FxModule(f"torch.{n}", "quantized." + n, "output_qparams")
                  for n in ("BatchNorm2d", "BatchNorm3d", "ELU", "LeakyReLU", "Hardswish",
                            "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LayerNorm",
                            "Dropout", "Softmax", "PReLU")),
                *(FxModule(f"intrinsic.BNReLU{n}d", f"intrinsic.quantized.BNReLU{n}d",
                           "output_qparams") for n in (2, 3)),
                *(FxModule(f"{_REF}ConvTranspose{n}d", f"quantized.ConvTranspose{n}d",
                           "output_qparams") for n in (1, 2, 3)))),
    Pattern("add",
            "dequantize(x), dequantize(y) -> add [-> relu] -> quantize (FX: or x + a number)",
            fx_ops=FxOps(functions=("operator.add", "torch.add")),
            reference=Use(("aten.add.Tensor",), "integer_add")),
    Pattern("mul", "dequantize(x), dequantize(y) -> mul [-> relu] -> quantize (or x * a number)",
            fx_ops=FxOps(functions=("operator.mul", "torch.mul"))),
    Pattern("matmul", "dequantize(x), dequantize(y) -> matmul -> quantize",
            fx_ops=FxOps(functions=("operator.matmul", "torch.matmul"))),
    Pattern("cat", "dequantize(x), ... -> cat -> quantize: the codes concatenated",
            fx_ops=FxOps(functions=("torch.cat",))),
    Pattern("functional_output_qparams",
            "dequantize(x) -> functional hardswish / elu / leaky_relu / layer_norm / "
            "instance_norm / dropout -> quantize: the quantized function with the output's "
            "qparams",
            fx_ops=FxOps(functions=tuple(
                _F + f for f in ("dropout", "hardswish", "elu", "leaky_relu", "layer_norm",
                                 "instance_norm")))),
    Pattern("shares_qparams",
            "dequantize(x) -> an op that keeps x's qparams (pooling, ReLU, shape ops) -> "
            "quantize: the op on the quantized tensor, the quantize dropped",
            fx_ops=FxOps(
                modules=("ReLU", "ReLU6", "Hardtanh", "Identity", "MaxPool1d", "MaxPool2d",
                         "MaxPool3d", "AvgPool1d", "AvgPool2d", "AvgPool3d", "AdaptiveAvgPool1d",
                         "AdaptiveAvgPool2d", "AdaptiveAvgPool3d", "ChannelShuffle"),
                functions=(*(_F + f for f in (
                    "relu", "relu6", "hardtanh", "max_pool1d", "max_pool2d", "max_pool3d",
                    "avg_pool1d", "avg_pool2d", "avg_pool3d", "adaptive_avg_pool1d",
                    "adaptive_avg_pool2d", "adaptive_avg_pool3d", "interpolate")),
                    *("torch." + f for f in ("clamp", "mean", "flatten", "transpose", "squeeze",
                                             "unsqueeze", "repeat_interleave",
                                             "channel_shuffle")),
                    _F + "channel_shuffle"),
                methods=("relu", "relu_", "clamp", "mean", "contiguous", "detach", "detach_",
                         "permute", "repeat", "repeat_interleave", "reshape", "resize_",
                         "squeeze", "squeeze_", "transpose", "unsqueeze", "unsqueeze_",
                         "view"))),
    Pattern("fixed_qparams",
            "dequantize(x) -> sigmoid / tanh / hardsigmoid -> quantize: the op on the "
            "quantized tensor, with its fixed output qparams",
            fx_ops=FxOps(modules=("Sigmoid", "Tanh", "Hardsigmoid"),
                         functions=("torch.sigmoid", "torch.tanh", _F + "hardsigmoid"),
                         methods=("sigmoid", "sigmoid_", "tanh", "tanh_", "hardsigmoid",
                                  "hardsigmoid_"))),
    Pattern("max_pool",
            "dequantize(x) -> max pool -> quantize with x's qparams: the pool of the codes",
            pt2e=Use(_MAX_POOLS, "max_pool_codes"),
            inductor=Use(("aten.max_pool2d_with_indices.default",
                          "prims._low_memory_max_pool_with_offsets.default"), "integer_pool"),
            reference=Use(("aten.max_pool2d_with_indices.default",), "integer_max_pool")),
    Pattern("requantize", "quantize(dequantize(q, s, zp), s, zp) of q's own dtype: q",
            pt2e=Use(("torchquant.quantize_per_tensor.default",), "codes")),
    Pattern("quantize", "a quantize left alone", reference=Use(_Q, "integer_quantize")),
    Pattern("dequantize", "a dequantize left alone", reference=Use(_DQ, "integer_dequantize")),
    Pattern("weight_dequantize", "dequantize of a constant weight left float: folded",
            pt2e=Use(_DQ, "float_constant"),
            inductor=Use(_DQ, "float_constant")),
)

USES = ("pt2e", "inductor", "reference")


def resolve_op(name: str) -> Any:
    """The op a dotted ``namespace.op.overload`` name stands for; None where this torch has
    no such op (or its namespace is not loaded)."""
    value: Any = torch.ops
    for part in name.split("."):
        try:
            value = getattr(value, part)
        except (AttributeError, RuntimeError):
            return None
    return value


def patterns_of(use: str) -> list[tuple[str, tuple[Any, ...]]]:
    """``(pattern name, root ops)`` of every pattern ``use`` lowers, in table order, the ops
    resolved (ones this torch lacks left out): what a lowering's emitters are keyed by."""
    return [(pattern.name, _resolved_roots(use, pattern.name)) for pattern in PATTERNS
            if getattr(pattern, use) is not None]


def passes(use: str) -> list[list[tuple[str, tuple[Any, ...]]]]:
    """:func:`patterns_of` grouped into the passes a lowering makes over a graph: the patterns
    with one target share a pass (torchao's reference representation rewrites linears and
    convs in one), passes in the order of their first pattern in the table."""
    groups: dict[str, list[tuple[str, tuple[Any, ...]]]] = {}
    for name, ops in patterns_of(use):
        groups.setdefault(getattr(_BY_NAME[name], use).target, []).append((name, ops))
    return list(groups.values())


def by_root(use: str) -> dict[Any, list[str]]:
    """For each root op of ``use``, the patterns starting there, in table order (the order a
    lowering tries them in)."""
    found: dict[Any, list[str]] = {}
    for name, ops in patterns_of(use):
        for op in ops:
            found.setdefault(op, []).append(name)
    return found


_BY_NAME = {pattern.name: pattern for pattern in PATTERNS}


def _resolved_roots(use: str, name: str) -> tuple[Any, ...]:
    ops: list[Any] = []
    for root in getattr(_BY_NAME[name], use).roots:
        op = resolve_op(root)
        if op is not None and op not in ops:
            ops.append(op)
    return tuple(ops)


def resolve_python(path: str) -> Any:
    """The object a dotted ``torch.`` / ``operator.`` path names (``"torch.nn.functional.relu"``,
    ``"operator.add"``); ``AttributeError`` where there is none."""
    root, _, rest = path.partition(".")
    value: Any = {"torch": torch, "operator": operator}[root]
    for part in rest.split("."):
        value = getattr(value, part)
    return value


def fx_ops(name: str) -> tuple[tuple[type, ...], tuple[Any, ...], tuple[str, ...]]:
    """(module classes, functions, method names) pattern ``name``'s FX rows start from."""
    ops = _BY_NAME[name].fx_ops
    return (tuple(getattr(torch.nn, m) for m in ops.modules),
            tuple(resolve_python(f) for f in ops.functions), ops.methods)


def fx_modules(kind: str) -> list[FxModule]:
    """FX convert's module rows of one kind ("static", "dynamic", ...), in table order."""
    return [m for pattern in PATTERNS for m in pattern.fx if m.kind == kind]


# ---- the matchers --------------------------------------------------------------------------------

_aten = torch.ops.aten


def _tq_op(name: str) -> Any:
    return getattr(torch.ops.torchquant, name).default


def activation_dequantize(node: Any) -> Optional[tuple[Node, float, int]]:
    """(codes, scale, zero point) of a per-tensor dequantize of a computed value (not a
    constant); None for anything else."""
    if not is_call(node, _tq_op("dequantize_per_tensor")) or len(node.args) < 3:
        return None
    codes = node.args[0]
    if not isinstance(codes, Node) or codes.op == "get_attr":
        return None
    return codes, float(node.args[1]), int(node.args[2])


def constant_dequantize(gm: GraphModule, node: Any
                        ) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                            Optional[int]]]:
    """(codes, scale, zero point, axis) of a dequantize of constants: per channel, the
    tensors and the axis made non-negative; per tensor, the qparams as 0-d float64 / int64
    tensors and axis None.  None for anything else."""
    if is_call(node, _tq_op("dequantize_per_channel")):
        w, scale, zp = (get_attr_tensor(gm, a) for a in node.args[:3])
        axis = node.args[3] if len(node.args) > 3 else node.kwargs.get("axis")
        if w is None or scale is None or zp is None or not isinstance(axis, int):
            return None
        return w, scale, zp, axis % max(w.dim(), 1)
    if is_call(node, _tq_op("dequantize_per_tensor")) and len(node.args) >= 3:
        w = get_attr_tensor(gm, node.args[0])
        if w is None:
            return None
        return (w, torch.tensor(float(node.args[1]), dtype=torch.float64),
                torch.tensor(int(node.args[2]), dtype=torch.int64), None)
    return None


def dynamic_dequantize(node: Any, casts: Any) -> Optional[tuple[Any, Any, Any]]:
    """(codes, scale, zero point) of a dequantize whose qparams the graph computes (dynamic
    quantization), spelt ``mul(sub(cast(codes), zero_point), cast(scale))`` with ``casts`` the
    dtype conversion op(s) of the graph's level (``_to_copy`` exported, inductor's
    ``convert_element_type``); None for anything else."""
    if not (is_call(node, _aten.mul.Tensor) and len(node.args) == 2):
        return None
    shifted, scale = node.args
    if not (is_call(shifted, _aten.sub.Tensor) and len(shifted.args) == 2 and not shifted.kwargs
            and is_call(scale, casts) and is_call(shifted.args[0], casts)):
        return None
    return shifted.args[0].args[0], scale.args[0], shifted.args[1]


_CONV_ARGUMENTS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")
_CONV_DEFAULTS = {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1}


def conv_arguments(node: Node, ndim: int) -> Optional[tuple]:
    """(input, weight, bias, stride, padding, dilation, groups) of a conv call as
    ``aten.conv<n>d`` and ``F.conv<n>d`` spell it (one signature; a None or absent argument
    takes its default), stride / padding / dilation as tuples of ``ndim`` ints; None where the
    padding is a string ('same', 'valid') or the geometry is not made of constant ints."""
    values = {**dict(zip(_CONV_ARGUMENTS, node.args)), **node.kwargs}
    for name, default in _CONV_DEFAULTS.items():
        if values.get(name) is None:
            values[name] = default

    def ints(value: Any) -> Optional[tuple[int, ...]]:
        items = list(value) if isinstance(value, (list, tuple)) else [value]
        if not items or not all(type(i) is int for i in items):
            return None
        return tuple(items * ndim if len(items) == 1 else items)

    geometry = [ints(values[name]) for name in ("stride", "padding", "dilation")]
    if any(g is None for g in geometry) or type(values["groups"]) is not int:
        return None
    return (values.get("input"), values.get("weight"), values["bias"], *geometry,
            values["groups"])


def scalar(value: Any) -> Optional[float]:
    """A graph argument as a float where it is a plain int / float (not a bool, not a node)."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def unary_at(node: Any) -> Optional[tuple[str, list[float], Node]]:
    """The ReLU / hardtanh (ReLU6) starting at ``node``: (its name, its bounds for hardtanh,
    the node that ends it).  Inductor's decompositions spell hardtanh as ``clamp_min`` then
    ``clamp_max``, and ReLU as ``clamp_min(x, 0)`` after some passes."""
    if is_call(node, (_aten.relu.default, _aten.relu_.default)):
        return "relu", [], node
    if is_call(node, _aten.hardtanh.default):
        lo, hi = (list(node.args[1:3]) + [-1.0, 1.0][len(node.args) - 1:])[:2]
        return "hardtanh", [float(lo), float(hi)], node
    if is_call(node, _aten.clamp.default) and len(node.args) == 3 and not node.kwargs:
        lo, hi = scalar(node.args[1]), scalar(node.args[2])
        if lo is not None and hi is not None and lo <= hi:
            return "hardtanh", [lo, hi], node
        return None
    first, second = (_aten.clamp_min.default, _aten.clamp_max.default)
    for a, b in ((first, second), (second, first)):
        if is_call(node, a) and len(node.args) == 2 and not node.kwargs:
            bound = scalar(node.args[1])
            if bound is None:
                return None
            nxt = only_user(node)
            if is_call(nxt, b) and len(nxt.args) == 2 and not nxt.kwargs:
                other = scalar(nxt.args[1])
                if other is None:
                    return None
                lo, hi = (bound, other) if a is first else (other, bound)
                return ("hardtanh", [lo, hi], nxt) if lo <= hi else None
            if a is first and bound == 0.0:
                return "relu", [], node
            return None
    return None


AddendCheck = Callable[[Node, Node, tuple[Node, float, int]], bool]


class PostOps:
    """The chain after a conv / linear output ``node`` that a fused call can take in: an add
    of another per-tensor-dequantized activation (where ``addend_ok(node, operand, (codes,
    scale, zero point))`` accepts it; no add where ``addend_ok`` is None), then a ReLU or
    another of ``unaries`` (after an add, ReLU only), then the per-tensor quantize reading the
    chain's last node, if any.  ``last``: the chain's last node before that quantize."""

    def __init__(self, node: Node, addend_ok: Optional[AddendCheck] = None,
                 unaries: tuple[str, ...] = ("relu",)) -> None:
        self.last = node
        self.other: Optional[tuple[Node, float, int]] = None
        self.unary, self.scalars = "none", []
        self.quantize: Optional[Node] = None
        user = only_user(node)
        if (addend_ok is not None and is_call(user, (_aten.add.Tensor, _aten.add_.Tensor))
                and len(user.args) == 2 and not user.kwargs):
            a, b = user.args
            operand = b if a is node else a
            other = activation_dequantize(operand) if operand is not node else None
            if other is not None and addend_ok(node, operand, other):
                self.last, self.other = user, other
                user = only_user(user)
        unary = unary_at(user)
        if unary is not None and unary[0] in unaries and (self.other is None
                                                          or unary[0] == "relu"):
            self.unary, self.scalars, self.last = unary
            user = only_user(self.last)
        if is_call(user, _tq_op("quantize_per_tensor")) and len(user.args) >= 4:
            self.quantize = user

    @property
    def post_op(self) -> str:
        """The ops layer's name for the chain before the quantize ("none", "relu", "add",
        "add_relu"; a hardtanh has its own name)."""
        if self.other is not None:
            return "add_relu" if self.unary == "relu" else "add"
        return self.unary


def undoes_dequantize(codes_dtype: Optional[torch.dtype], scale: Any, zero_point: Any,
                      quantize: Node) -> bool:
    """Whether the per-tensor ``quantize`` gives back the codes a dequantize with ``scale``
    and ``zero_point`` read (of ``codes_dtype``): the same qparams, a dtype of those codes'
    storage and full range, and a scale of normal float32 magnitude (where dequantizing and
    quantizing again is the identity on the integers)."""
    if not is_call(quantize, _tq_op("quantize_per_tensor")) or len(quantize.args) < 4:
        return False
    s = scalar(scale)
    if s is None or not 1e-30 < s < 1e30 or not isinstance(zero_point, int):
        return False
    if float(quantize.args[1]) != s or quantize.args[2] != zero_point:
        return False
    qdtype = _dt.qdtype_of(quantize.args[3])
    if codes_dtype is None or qdtype.storage_dtype != codes_dtype or codes_dtype.is_floating_point:
        return False
    info = torch.iinfo(codes_dtype)
    return qdtype.qmin == info.min and qdtype.qmax == info.max


def fold_constant_dequantize(gm: GraphModule, node: Node, prefix: str,
                             persistent: bool = True) -> Optional[Node]:
    """Replace a dequantize of constants by its float value, a new buffer of ``gm`` named
    ``prefix<i>``; returns the ``get_attr`` node reading it (None, graph unchanged, where an
    argument is not a constant tensor)."""
    args = [get_attr_tensor(gm, a) if isinstance(a, Node) else a for a in node.args]
    if any(a is None for a, raw in zip(args, node.args) if isinstance(raw, Node)):
        return None
    name = fresh_attr_name(gm, prefix)
    gm.register_buffer(name, node.target(*args), persistent=persistent)
    with gm.graph.inserting_before(node):
        const = gm.graph.get_attr(name)
    node.replace_all_uses_with(const)
    return const
