"""Inductor freezing pass: dequantize -> conv / linear -> quantize as one oneDNN int8 call.

A ``convert_pt2e`` graph spells an int8 conv as float math between torchquant's quantize /
dequantize ops.  Under ``torch.compile`` with inductor freezing this pass finds, in the frozen
graph,

    dequantize_per_tensor(x_u8) ─┐
    dequantize_per_channel(w_s8) ┴─ convolution (+ bias) [-> add(dequantize(other_u8))]
                                    [-> relu | hardtanh] [-> quantize_per_tensor]

(and ``addmm`` / ``mm`` of a transposed dequantized weight for Linear, without the add) and
replaces it with ``onednn.qconv_pointwise`` / ``qconv2d_pointwise.binary`` (the add as oneDNN's
in-place sum into a copy of the other addend; not where that addend is the conv's own input,
which oneDNN would overwrite while reading) / ``qlinear_pointwise`` on the integers, the weight
prepacked here, once, from the frozen constants.  Without a quantize after it the call writes
float32.  ``torchquant::conv`` nodes whose weights are frozen constants (an exported eager- or
FX-converted model) become the oneDNN call their eager kernel makes (1-d convs, in packages, as
the 2-d call on their height-1 view).  Small 2-d convs (static
shapes; :func:`torchquant.kernels.native.conv_preferred`) call torchquant's native conv
instead, same integers without oneDNN's per-call set-up; with a symbolic batch, a conv the
native kernel wins at small batches calls ``qconv2d_or_onednn``, which chooses per call by the
batch (where the graph's batches can be that small).  Never in an AOTInductor package, which
must run without torchquant.  The weight dequantizes left unfused are folded to float
constants (torch's own folding is told to leave them, so the int8 weights are still there when
the pass runs).

Only where oneDNN's u8 x s8 products are exact on this CPU
(:func:`torchquant.kernels.onednn_exactness.onednn_u8s8_exact`, decided when the graph is
compiled).  On CPUs whose oneDNN saturates (AVX2, AVX-512 without VNNI) a PT2E graph's
conv becomes torchquant's native conv, exact there too
(:func:`torchquant.kernels.native.split_conv_applies`: depthwise convs, and plain convs through
the high-bit split); other convs keep their float conv on dequantized values, which is what the
eager ``convert_pt2e`` model computes, and Linears stay float there.  oneDNN requantizes its int32
accumulator in float32 with its own operation order, so a fused output can differ from the
eager graph's (float conv, then quantize) by one step where the float result lies within
rounding of a half-integer (bounded in the tests); it equals torchquant's own fused ops, which
call the same oneDNN kernels.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable, Optional

import torch
from torch import fx

from ..._graph import erase_unused, fresh_attr_name, get_attr_tensor, is_call, only_user
from ...kernels import onednn_exactness as _exactness
from ...kernels import native as _native
from .. import patterns
from ..patterns import scalar
from . import saturation_safe
from .packaging_state import is_packaging, native_allowed

__all__ = ["register", "aoti_c_shims", "frozen_op_weight"]

aten = torch.ops.aten
prims = torch.ops.prims


def _tq():
    return torch.ops.torchquant


def _activation(node: Any) -> Optional[tuple]:
    """(uint8 integers node, scale, zero point) of a per-tensor dequantize of quint8 values."""
    act = patterns.activation_dequantize(node)
    val = act[0].meta.get("val") if act is not None else None
    if val is None or val.dtype != torch.uint8:
        return None
    return act


def _weight(gm: fx.GraphModule, node: Any, axis_wanted: int) -> Optional[tuple]:
    """(int8 weight, float32 per-channel scales, int64 zero points) of a dequantized frozen
    int8 weight (per tensor, or per channel along ``axis_wanted``) with zero zero points."""
    if is_call(node, aten.clone.default):  # the frozen conv weight's layout change
        node = node.args[0]
    weight = patterns.constant_dequantize(gm, node)
    if weight is None:
        return None
    w, scale, zp, axis = weight
    if axis is not None and (axis != axis_wanted or zp.dtype.is_floating_point):
        return None
    if w.dtype != torch.int8 or w.device.type != "cpu" or bool(zp.ne(0).any()):
        return None
    channels = w.size(axis_wanted)
    scale = scale.to(torch.float32).reshape(-1).expand(channels).contiguous()
    zp = zp.to(torch.int64).reshape(-1).expand(channels).contiguous()
    return w.contiguous(), scale, zp


def _gelu_after(node: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
    """The exact GELU a float linear output feeds alone (maybe through one view), as inductor's
    decomposition spells it before freezing runs -- ``(y * 0.5) * (1 + erf(y * M_SQRT1_2))``:
    (its input, its last node)."""
    y = node
    if len(y.users) == 1 and (is_call(only_user(y), aten.view.default)
                              or is_call(only_user(y), aten.reshape.default)):
        y = only_user(y)
    users = list(y.users)
    if len(users) != 2 or not all(is_call(u, aten.mul.Tensor) and len(u.args) == 2 for u in users):
        return None
    factors = {scalar(u.args[1]) if u.args[0] is y else None: u for u in users}
    half, root = factors.get(0.5), factors.get(0.7071067811865476)
    if half is None or root is None:
        return None
    erf = only_user(root)
    one = only_user(erf) if is_call(erf, aten.erf.default) else None
    if not (is_call(one, aten.add.Tensor) and one.args[0] is erf and scalar(one.args[1]) == 1.0):
        return None
    last = only_user(one)
    if not (is_call(last, aten.mul.Tensor) and set(last.args) == {half, one}
            and only_user(half) is last):
        return None
    return y, last


def _same_shape_uint8_addend(root: fx.Node, operand: fx.Node, other: tuple) -> bool:
    """The add oneDNN's conv sums in: another quint8 activation of the conv output's shape."""
    val = other[0].meta.get("val")
    return (val is not None and val.dtype == torch.uint8
            and operand.meta["val"].shape == root.meta["val"].shape)


class _Tail:
    """What follows a conv / linear, replaced with it (:class:`torchquant.ops.patterns.PostOps`
    with oneDNN's unary post-ops): an optional add of another quint8 activation (convs), an
    optional ReLU / hardtanh, an optional quint8 quantize (``out``: its scale and zero point;
    None for a float32 output)."""

    def __init__(self, node: fx.Node, allow_add: bool) -> None:
        chain = patterns.PostOps(node, _same_shape_uint8_addend if allow_add else None,
                                 unaries=("relu", "hardtanh"))
        self.last, self.other = chain.last, chain.other
        self.unary, self.scalars = chain.unary, chain.scalars
        self.out: Optional[tuple[float, int]] = None
        q = chain.quantize
        if q is not None and q.args[3] == "quint8":
            self.last, self.out = q, (float(q.args[1]), int(q.args[2]))


class _Graph:
    """The frozen graph module, gaining constants (prepacked weights, per-channel qparams)."""

    def __init__(self, gm: fx.GraphModule) -> None:
        self.gm = gm

    def constant(self, value: torch.Tensor, before: fx.Node, hint: str) -> fx.Node:
        name = fresh_attr_name(self.gm, f"_torchquant_{hint}_")
        self.gm.register_buffer(name, value, persistent=False)
        with self.gm.graph.inserting_before(before):
            return self.gm.graph.get_attr(name)


def _replace(old: fx.Node, target: Any, args: tuple, example: torch.Tensor) -> fx.Node:
    with old.graph.inserting_before(old):
        new = old.graph.call_function(target, args)
    new.meta.update(old.meta)
    new.meta["val"] = example
    # the replaced op's recorded eager inputs would be matched against the new op's schema
    new.meta.pop("eager_input_vals", None)
    old.replace_all_uses_with(new)
    return new


def _fake_like(meta_val: Any, dtype: torch.dtype, memory_format: torch.memory_format) -> Any:
    return torch.empty_like(meta_val, dtype=dtype, memory_format=memory_format)


def _static_shape(node: Any) -> Optional[list[int]]:
    """The activation's shape when the graph has it in plain integers (a static compile):
    oneDNN then prepacks the weight in the layout its kernel for that shape reads, instead of
    a generic one it would reorder from on every call.  None where a dimension is symbolic."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if val is None or not all(isinstance(d, int) for d in val.shape):
        return None
    return [int(d) for d in val.shape]


def _image_shape(node: Any) -> Optional[list[int]]:
    """(channels, height, width) of a 4-d activation whose batch alone may be symbolic."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if val is None or val.dim() != 4 or not all(isinstance(d, int) for d in val.shape[1:]):
        return None
    return [int(d) for d in val.shape[1:]]


def _least_batch(node: Any) -> int:
    """The smallest batch a graph compiled for a symbolic batch serves (torch's fake conv splits
    batches below 16 from the rest, so a graph often starts at 16); 0 where unknown."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if val is None or val.dim() == 0:
        return 0
    batch = val.shape[0]
    if isinstance(batch, int):
        return batch
    try:
        lower = batch.node.shape_env.bound_sympy(batch.node.expr).lower
        return max(0, int(lower))
    except (AttributeError, TypeError, ValueError, OverflowError):
        return 0


def _live_taps(size: int, kernel: int, stride: int, padding: int,
               dilation: int) -> Optional[tuple[int, int]]:
    """The first and last kernel tap along one spatial dimension that reads an input pixel
    (not padding) for some output position; None if none does."""
    outputs = _native.conv_output_size(size, kernel, stride, padding, dilation)
    live = [tap for tap in range(kernel)
            if any(0 <= o * stride - padding + tap * dilation < size for o in range(outputs))]
    return (live[0], live[-1]) if live else None


def _trim_padding_taps(spatial: Optional[list[int]], w: torch.Tensor,
                       geometry: tuple) -> tuple[torch.Tensor, tuple]:
    """Drop the kernel rows / columns that only ever read padding (a 3x3 conv over a 1x1
    image reads only its centre): padding holds the input's zero point, so those taps add
    exactly zero to the int32 accumulator and the smaller conv gives the same integers.  Only
    where the trimmed conv keeps symmetric padding and the output size."""
    stride, padding, dilation, groups = geometry
    if spatial is None or len(spatial) != 2 or w.dim() != 4:
        return w, geometry
    bounds, trimmed_padding = [], []
    for dim, size in enumerate(spatial):
        kernel, s, p, d = int(w.shape[2 + dim]), stride[dim], padding[dim], dilation[dim]
        taps = _live_taps(size, kernel, s, p, d)
        if taps is None:
            return w, geometry
        first, last = taps
        new_padding = p - first * d
        if new_padding < 0 or (_native.conv_output_size(size, last - first + 1, s, new_padding, d)
                               != _native.conv_output_size(size, kernel, s, p, d)):
            return w, geometry
        bounds.append((first, last))
        trimmed_padding.append(new_padding)
    if all(bounds[dim] == (0, w.shape[2 + dim] - 1) for dim in range(2)):
        return w, geometry
    (r0, r1), (c0, c1) = bounds
    return (w[:, :, r0:r1 + 1, c0:c1 + 1].contiguous(),
            (stride, trimmed_padding, dilation, groups))


def _emit_conv(g: _Graph, node: fx.Node, last: fx.Node, q_x: fx.Node, x_scale: float,
               x_zp: int, w: torch.Tensor, w_scale: torch.Tensor, w_zp: torch.Tensor,
               bias: Optional[torch.Tensor], geometry: tuple, other: Optional[tuple],
               unary: str, scalars: list, out: Optional[tuple[float, int]],
               out_val: Optional[torch.Tensor] = None) -> fx.Node:
    """Replace ``node`` .. ``last`` by one int8 conv call: torchquant's native conv where it is
    faster (:func:`torchquant.kernels.native.conv_preferred`, or ``conv_preferred_any_batch``
    for a symbolic batch; never in a package, which must run without torchquant), else
    oneDNN's with the weight prepacked here.  ``other``: the
    (uint8 node, scale, zero point) added before ``unary``; ``out``: the output's quint8
    qparams, None for float32; ``out_val``: the call's output value where it is not
    ``last``'s shape (default).  Returns the call."""
    x_shape = _static_shape(q_x)
    image = _image_shape(q_x)
    w, geometry = _trim_padding_taps(image and image[1:], w, geometry)
    stride, padding, dilation, groups = geometry
    out_scale, out_zp, out_dtype = (*out, torch.uint8) if out else (1.0, 0, torch.float32)
    fake = _fake_like(last.meta["val"] if out_val is None else out_val, out_dtype,
                      torch.channels_last)
    bias_node = None if bias is None else g.constant(bias.to(torch.float32), node, "bias")
    native_ok = native_allowed() and not bool(w_zp.any())

    def native_args() -> tuple:
        addend = (None, 1.0, 0) if other is None else other
        return (q_x, x_scale, x_zp, g.constant(w.contiguous(), node, "conv_weight"),
                g.constant(w_scale, node, "weight_scale"), bias_node, *geometry, *addend,
                unary, scalars, out_scale, out_zp, out_dtype)

    if not _exactness.onednn_u8s8_exact():  # _saturating_split_ok said the native conv does it
        return _replace(last, torch.ops.torchquant_native.qconv2d.default, native_args(), fake)
    if native_ok and (_native.conv_preferred(x_shape, w.shape, stride, padding, dilation, groups,
                                             x_zp)
                      if x_shape is not None else
                      image is not None and _native.conv_preferred_any_batch(
                          image, w.shape, stride, padding, dilation, groups, x_zp)):
        return _replace(last, torch.ops.torchquant_native.qconv2d.default, native_args(), fake)
    packed = torch.ops.onednn.qconv_prepack(w.contiguous(), w_scale, x_scale, x_zp, *geometry,
                                            x_shape)
    max_batch = (_native.native_max_batch(image, w.shape, stride, padding, dilation, groups, x_zp)
                 if native_ok and x_shape is None and image is not None else 0)
    if max_batch and max_batch >= _least_batch(q_x):
        # a symbolic batch: the native conv up to max_batch, oneDNN's beyond, in one call
        args = (*native_args(), max_batch, g.constant(packed, node, "packed_conv_weight"),
                g.constant(w_zp, node, "weight_zp"))
        return _replace(last, torch.ops.torchquant_native.qconv2d_or_onednn.default, args, fake)
    head = (q_x, x_scale, x_zp, g.constant(packed, node, "packed_conv_weight"),
            g.constant(w_scale, node, "weight_scale"), g.constant(w_zp, node, "weight_zp"))
    if other is None:
        args = (*head, bias_node, *geometry, out_scale, out_zp, out_dtype, unary, scalars, "")
        return _replace(last, torch.ops.onednn.qconv_pointwise.default, args, fake)
    # oneDNN sums into its accumulator operand in place: give it a channels-last copy of the
    # other addend's integers (as the eager op does), the graph's tensor stays unchanged
    q_other, other_scale, other_zp = other
    with node.graph.inserting_before(last):
        accum = node.graph.call_function(aten.clone.default, (q_other,),
                                         {"memory_format": torch.channels_last})
    accum.meta["val"] = _fake_like(q_other.meta["val"], torch.uint8, torch.channels_last)
    args = (*head, accum, bias_node, *geometry, out_scale, out_zp, out_dtype, other_scale,
            other_zp, "sum", 1.0, unary, scalars, "")
    return _replace(last, torch.ops.onednn.qconv2d_pointwise.binary, args, fake)


def _saturating_split_ok(weight: tuple, groups: int) -> bool:
    """Where oneDNN's u8 x s8 products saturate: whether torchquant's native conv computes this
    conv exactly (:func:`torchquant.kernels.native.split_conv_applies`) in code that may call
    it; else the graph keeps its float conv."""
    w, _, w_zp = weight
    return (native_allowed() and not bool(w_zp.any())
            and _native.split_conv_applies(w.shape, groups))


def _fuse_conv(g: _Graph, node: fx.Node) -> bool:
    x_arg, w_arg, b_arg, stride, padding, dilation, transposed, _, groups = node.args[:9]
    if transposed or len(stride) != 2:
        return False
    act = _activation(x_arg)
    weight = _weight(g.gm, w_arg, 0)
    bias = get_attr_tensor(g.gm, b_arg) if b_arg is not None else None
    if act is None or weight is None or (b_arg is not None and bias is None):
        return False
    q_x, x_scale, x_zp = act
    if not _exactness.onednn_u8s8_exact() and not _saturating_split_ok(weight, groups):
        return False
    tail = _Tail(node, allow_add=True)
    if tail.other is not None and (tail.out is None or tail.other[0] is q_x):
        # a float add, or the sum's accumulator would be the conv's own input (inductor
        # reuses the accumulator's copy in place once its source is dead): fuse the conv only
        tail = _Tail(node, allow_add=False)
    geometry = (list(stride), list(padding), list(dilation), groups)
    _emit_conv(g, node, tail.last, q_x, x_scale, x_zp, *weight, bias, geometry, tail.other,
               tail.unary, tail.scalars, tail.out)
    return True


def _op_arguments(node: fx.Node) -> dict[str, Any]:
    """A custom-op node's arguments by name, defaults filled in."""
    schema = node.target._schema
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            bound[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            bound[arg.name] = node.kwargs[arg.name]
        else:
            bound[arg.name] = arg.default_value
    return bound


def frozen_op_weight(g: _Graph, a: dict[str, Any]) -> Optional[tuple]:
    """The frozen weight operands of a ``torchquant::conv`` / ``linear`` node (its arguments by
    name, :func:`_op_arguments`): ``(int8 weight, float32 per-channel scale, float bias or
    None)`` where they are frozen constants with zero zero points, the form oneDNN's int8
    calls take; None otherwise."""
    w = get_attr_tensor(g.gm, a["weight"])
    scale = get_attr_tensor(g.gm, a["weight_scale"])
    zp = get_attr_tensor(g.gm, a["weight_zero_point"])
    bias = get_attr_tensor(g.gm, a["bias"]) if a["bias"] is not None else None
    if (w is None or scale is None or zp is None or w.dtype != torch.int8
            or bool(zp.ne(0).any()) or (a["bias"] is not None and bias is None)):
        return None
    return w, scale.to(torch.float32).reshape(-1).expand(w.size(0)).contiguous(), bias


def _fuse_torchquant_conv(g: _Graph, node: fx.Node) -> bool:
    """``torchquant::conv`` (what eager- and FX-converted modules, and lowered PT2E graphs,
    call) as the int8 call its eager kernel makes, the weight prepacked at freezing; in a
    package built where oneDNN saturates, the eager kernel's split there
    (:mod:`.saturation_safe`)."""
    a = _op_arguments(node)
    x = a["x"]
    frozen = frozen_op_weight(g, a)
    val = x.meta.get("val") if isinstance(x, fx.Node) else None
    post_op, other = a["post_op"], a["other"]
    if (val is None or val.dtype != torch.uint8 or val.dim() not in (3, 4) or frozen is None
            or post_op not in ("none", "relu", "add", "add_relu")
            or (other is not None and (other is x or other.meta["val"].dtype != torch.uint8))):
        return False
    w, w_scale, bias = frozen
    w_zp = torch.zeros(w.size(0), dtype=torch.int64)
    geometry = (list(a["stride"]), list(a["padding"]), list(a["dilation"]), a["groups"])
    addend = (None if other is None
              else (other, float(a["other_scale"]), int(a["other_zero_point"])))
    if val.dim() == 3:
        # a 1-d conv: only packages need it in C++ (torch.compile runs the op), and only where
        # oneDNN is exact; as the 2-d conv of height 1 that oneDNN's 1-d conv is
        if native_allowed() or not _exactness.onednn_u8s8_exact():
            return False
        _emit_conv1d(g, node, x, a, w, w_scale, w_zp, bias, geometry, addend)
        return True
    if not _exactness.onednn_u8s8_exact():
        if native_allowed():  # torch.compile: the op runs its eager kernel, exact here
            return False
        saturation_safe.conv(g, node, x, float(a["x_scale"]), int(a["x_zero_point"]), w,
                             w_scale, bias, geometry, post_op, addend, float(a["out_scale"]),
                             int(a["out_zero_point"]), _static_shape(x))
        return True
    unary = "relu" if post_op in ("relu", "add_relu") else "none"
    _emit_conv(g, node, node, x, float(a["x_scale"]), int(a["x_zero_point"]), w, w_scale, w_zp,
               bias, geometry, addend, unary, [],
               (float(a["out_scale"]), int(a["out_zero_point"])))
    return True


_ONEDNN_LINEAR_POST_OPS = ("none", "relu", "leaky_relu", "tanh")


def _fuse_torchquant_linear(g: Any, node: Any) -> bool:
    """``torchquant::linear`` with a frozen weight (eager- and FX-converted Linear layers) as
    ``onednn.qlinear_pointwise`` with the weight prepacked at freezing: the call the eager
    kernel makes on CPUs where oneDNN's u8 x s8 products are exact, so the same integers;
    where they saturate, the eager kernel's split there (:mod:`.saturation_safe`)."""
    if not is_packaging():
        return False
    a = _op_arguments(node)
    x, post_op = a["x"], a["post_op"]
    frozen = frozen_op_weight(g, a)
    val = x.meta.get("val") if hasattr(x, "meta") else None
    if (val is None or val.dtype != torch.uint8 or val.dim() != 2 or frozen is None
            or a["out_dtype"] != torch.uint8 or post_op not in _ONEDNN_LINEAR_POST_OPS
            or a["other"] is not None):
        return False
    w, w_scale, bias = frozen
    if not _exactness.onednn_u8s8_exact():
        if native_allowed() or post_op not in ("none", "relu"):
            return False  # in process the op runs its eager kernel, exact here
        saturation_safe.linear(g, node, x, float(a["x_scale"]), int(a["x_zero_point"]), w,
                               w_scale, bias, post_op, float(a["out_scale"]),
                               int(a["out_zero_point"]))
        return True
    w_zp = torch.zeros(w.size(0), dtype=torch.int64)
    packed = torch.ops.onednn.qlinear_prepack(w.contiguous(), None)
    args = (x, float(a["x_scale"]), int(a["x_zero_point"]),
            g.constant(packed, node, "packed_linear_weight"),
            g.constant(w_scale, node, "weight_scale"), g.constant(w_zp, node, "weight_zp"),
            None if bias is None else g.constant(bias.to(torch.float32), node, "bias"),
            float(a["out_scale"]), int(a["out_zero_point"]), torch.uint8, post_op,
            [float(a["negative_slope"])] if post_op == "leaky_relu" else [], "")
    _replace(node, torch.ops.onednn.qlinear_pointwise.default, args,
                    torch.empty_like(node.meta["val"]))
    return True


def _emit_conv1d(g: _Graph, node: fx.Node, x: fx.Node, a: dict, w: torch.Tensor,
                 w_scale: torch.Tensor, w_zp: torch.Tensor, bias: Optional[torch.Tensor],
                 geometry: tuple, addend: Optional[tuple]) -> None:
    """``torchquant::conv`` of a 3-d input as the 2-d int8 call on its height-1 view, the
    output viewed back and made contiguous (the eager op's layout)."""
    graph = node.graph

    def height_one(n: fx.Node) -> fx.Node:
        with graph.inserting_before(node):
            view = graph.call_function(aten.unsqueeze.default, (n, 2))
        view.meta["val"] = n.meta["val"].unsqueeze(2)
        return view

    stride, padding, dilation, groups = geometry
    addend4 = None if addend is None else (height_one(addend[0]), *addend[1:])
    post_op = a["post_op"]
    call = _emit_conv(g, node, node, height_one(x), float(a["x_scale"]),
                      int(a["x_zero_point"]), w.unsqueeze(2), w_scale, w_zp, bias,
                      ([1, *stride], [0, *padding], [1, *dilation], groups), addend4,
                      "relu" if post_op in ("relu", "add_relu") else "none", [],
                      (float(a["out_scale"]), int(a["out_zero_point"])),
                      out_val=node.meta["val"].unsqueeze(2))
    with graph.inserting_after(call):
        flat = graph.call_function(aten.squeeze.dim, (call, 2))
    flat.meta["val"] = call.meta["val"].squeeze(2)
    with graph.inserting_after(flat):
        out = graph.call_function(aten.clone.default, (flat,),
                                  {"memory_format": torch.contiguous_format})
    out.meta["val"] = flat.meta["val"].contiguous()
    call.replace_all_uses_with(out, delete_user_cb=lambda user: user is not flat)


def _linear_operands(node: fx.Node) -> Optional[tuple]:
    """(x, transposed weight, bias or None) of an ``addmm`` / ``mm`` node."""
    if is_call(node, aten.addmm.default) and len(node.args) == 3 and not node.kwargs:
        return node.args[1], node.args[2], node.args[0]
    if is_call(node, aten.mm.default):
        return node.args[0], node.args[1], None
    return None


def _dynamic_activation(node: Any) -> Optional[tuple]:
    """(uint8 integers, scale, zero point) nodes of a dequantize with qparams computed in the
    graph (dynamic quantization) as inductor decomposes it
    (:func:`torchquant.ops.patterns.dynamic_dequantize`), ``scale`` / ``zp`` 0-d float /
    integer tensors."""
    parts = patterns.dynamic_dequantize(node, prims.convert_element_type.default)
    if parts is None:
        return None
    q, scale, zp = parts
    vals = [n.meta.get("val") if isinstance(n, fx.Node) else None for n in (q, scale, zp)]
    if any(v is None for v in vals):
        return None
    q_val, scale_val, zp_val = vals
    if not (q_val.dtype == torch.uint8 and scale_val.dim() == 0 and zp_val.dim() == 0
            and scale_val.dtype.is_floating_point and not zp_val.dtype.is_floating_point
            and not zp_val.dtype == torch.bool):
        return None
    return q, scale, zp


def _dynamic_source(x: Any) -> Optional[tuple]:
    """:func:`_dynamic_activation` of a linear's input, seen through the view to 2-D that
    inductor puts between them for a 3-D input."""
    if is_call(x, aten.view.default) or is_call(x, aten.reshape.default):
        x = x.args[0]
    return _dynamic_activation(x)


def _fuse_linear(g: _Graph, node: fx.Node, dynamic: bool) -> bool:
    """``addmm`` / ``mm`` of a quantized activation and a frozen int8 weight -> one oneDNN int8
    linear.  A static activation (constant qparams; the ``linear`` pattern) takes the quantize
    after the linear into the call; a dynamic one (qparams computed in the graph, the input
    maybe viewed to 2-D; ``linear_dynamic``) gives a float output, oneDNN reading the qparams
    as tensors (as torchao's dynamic X86 flow lowers), with an exact GELU after it fused as
    oneDNN's post-op (its GELU agrees with ATen's to float32 rounding)."""
    operands = _linear_operands(node)
    if operands is None:
        return False
    x_arg, wt_arg, b_arg = operands
    static = None if dynamic else _activation(x_arg)
    if static is None and not dynamic:
        return False
    if not (is_call(wt_arg, aten.permute.default) and list(wt_arg.args[1]) == [1, 0]):
        return False
    weight = _weight(g.gm, wt_arg.args[0], 0)
    bias = get_attr_tensor(g.gm, b_arg) if b_arg is not None else None
    if weight is None or (b_arg is not None and (bias is None or bias.dim() != 1)):
        return False
    w, w_scale, w_zp = weight
    tail = _Tail(node, allow_add=False)
    if static is not None:
        (q_x, x_scale, x_zp), x_shape = static, _static_shape(static[0])
        target = torch.ops.onednn.qlinear_pointwise.default
    else:
        dynamic = _dynamic_source(x_arg)
        if dynamic is None or tail.out is not None:  # (no static quantize after a dynamic one)
            return False
        # the shape where the graph has it: oneDNN packs the weight in the layout its kernel for
        # that shape reads (a generic layout costs a reorder in every call)
        (q_x, x_scale, x_zp), x_shape = dynamic, _static_shape(x_arg)
        target = torch.ops.onednn.qlinear_pointwise.tensor
        if x_arg.target in (aten.view.default, aten.reshape.default):
            with node.graph.inserting_before(node):
                q_x = node.graph.call_function(x_arg.target, (q_x, x_arg.args[1]))
            q_x.meta["val"] = q_x.args[0].meta["val"].view(x_arg.meta["val"].shape)
    algorithm = ""
    if static is None and tail.unary == "none":
        gelu = _gelu_after(node)
        if gelu is not None:  # oneDNN's GELU post-op (torchao's dynamic flow fuses it too)
            tail.unary, algorithm = "gelu", "none"
            y, last = gelu
            if y is not node:   # gelu(view(x)) == view(gelu(x)): the view now reads the call
                last.replace_all_uses_with(y)
                _erase_dead(last)
            else:
                tail.last = last
    packed = torch.ops.onednn.qlinear_prepack(w, x_shape)
    gm_nodes = (g.constant(packed, node, "packed_linear_weight"),
                g.constant(w_scale, node, "weight_scale"), g.constant(w_zp, node, "weight_zp"),
                None if bias is None else g.constant(bias.to(torch.float32), node, "bias"))
    out_scale, out_zp, out_dtype = ((*tail.out, torch.uint8) if tail.out
                                    else (1.0, 0, torch.float32))
    args = (q_x, x_scale, x_zp, *gm_nodes, out_scale, out_zp, out_dtype, tail.unary,
            tail.scalars, algorithm)
    fake = _fake_like(tail.last.meta["val"], out_dtype, torch.contiguous_format)
    _replace(tail.last, target, args, fake)
    return True


# Inductor generates the loop of a max pool whose window has at most this many elements and
# calls ATen's kernel beyond (torch 2.13, ``should_fallback_max_pool_with_indices``); ATen's
# own 8-bit channels-last max pool rejects many shapes (a torch bug), so integers are pooled
# only where inductor writes the loop.
_INDUCTOR_MAX_POOL_WINDOW = 25


def integer_max_pool_lowered(kernel_size: Any) -> bool:
    """Whether inductor lowers a max pool with this kernel (so it may pool 8-bit integers)."""
    sizes = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
    sizes = (sizes * 2)[:2] if len(sizes) == 1 else sizes
    return all(isinstance(k, int) for k in sizes) and math.prod(sizes) <= _INDUCTOR_MAX_POOL_WINDOW


def _pool_integers(g: _Graph, node: fx.Node) -> bool:
    """A max pool of dequantized 8-bit values pools the integers instead: dequantizing is
    monotone (a positive scale), so ``max(dequantize(v)) == dequantize(max(v))`` bit for bit
    and the pool reads a quarter of the bytes.  Where a quantize to the same parameters and the
    full storage range follows, the dequantize / quantize pair goes too (it is the identity on
    the integers for scales of normal float32 magnitude), leaving the integer pool alone."""
    dq = node.args[0]
    if not (is_call(dq, _tq().dequantize_per_tensor.default) and len(dq.args) == 3
            and not dq.kwargs):
        return False
    q_in, scale, zp = dq.args
    if len(node.args) < 2 or not integer_max_pool_lowered(node.args[1]):
        return False
    val = q_in.meta.get("val") if isinstance(q_in, fx.Node) else None
    if (val is None or val.dtype not in (torch.uint8, torch.int8) or scalar(scale) is None
            or not 0.0 < float(scale) < math.inf or not isinstance(zp, int)):
        return False
    users = list(node.users)
    if not all(is_call(u, operator.getitem) and u.args[1] == 0 for u in users) or len(users) != 1:
        return False    # the indices are used (or the values twice): leave the float pool
    values = users[0]
    graph = node.graph
    with graph.inserting_before(node):
        pooled = graph.call_function(node.target, (q_in, *node.args[1:]), dict(node.kwargs))
        ints = graph.call_function(operator.getitem, (pooled, 0))
    ints.meta["val"] = _fake_like(values.meta["val"], val.dtype, torch.preserve_format)
    pooled.meta["val"] = (ints.meta["val"], *node.meta["val"][1:])
    after = only_user(values)
    if after is not None and patterns.undoes_dequantize(val.dtype, scale, zp, after):
        after.replace_all_uses_with(ints)
        graph.erase_node(after)
        graph.erase_node(values)
        return True
    with graph.inserting_before(node):
        deq = graph.call_function(dq.target, (ints, scale, zp))
    deq.meta["val"] = values.meta["val"]
    values.replace_all_uses_with(deq)
    graph.erase_node(values)
    return True


def _erase_dead(node: fx.Node) -> None:
    """Erase ``node`` if nothing uses it, and then each producer (or frozen constant) only it
    used."""
    erase_unused(node, ("call_function", "get_attr"))


def _fold(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Replace a dequantize of frozen constants by its float value (what torch's constant
    folding, told to leave these for the fusions, would have made of it)."""
    return patterns.fold_constant_dequantize(gm, node, "_torchquant_dequantized_weight_",
                                             persistent=False) is not None


def _handler(emitters: list[tuple[Callable, Callable, bool]]) -> Callable:
    """The pattern matcher's replacement for one root op: the first of its patterns'
    ``(check, rewrite, needs exact oneDNN)`` emitters whose rewrite applies."""
    def handler(match: Any, *args: Any, **kwargs: Any) -> None:
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        node = match.output_node()
        gm = node.graph.owning_module
        if gm is None:
            return
        # real tensors: the pass packs and folds the frozen constants, and the oneDNN probe
        # behind onednn_u8s8_exact (measured once, cached) must not run on fake tensors
        with unset_fake_temporarily():
            for check, rewrite, needs_exact_onednn in emitters:
                if needs_exact_onednn and not _exactness.onednn_u8s8_exact():
                    continue
                if check(match) and rewrite(_Graph(gm), node):
                    _erase_dead(node)
                    return
    return handler


def _any_check(emitters: list[tuple[Callable, Callable, bool]]) -> Callable:
    return lambda match: any(check(match) for check, _, _ in emitters)


def _x_is_dequantized(match: Any) -> bool:
    node = match.output_node()
    operands = _linear_operands(node)
    x = operands[0] if operands is not None else node.args[0]
    return _activation(x) is not None or (operands is not None and _dynamic_source(x) is not None)


def _fold_rewrite(g: _Graph, node: fx.Node) -> bool:
    return _fold(g.gm, node)


def _always(match: Any) -> bool:
    return True


def _weight_is_frozen(match: Any) -> bool:
    node = match.output_node()
    gm = node.graph.owning_module
    return gm is not None and get_attr_tensor(gm, node.args[0]) is not None


def _fuse_static_linear(g: _Graph, node: fx.Node) -> bool:
    return _fuse_linear(g, node, dynamic=False)


def _fuse_dynamic_linear(g: _Graph, node: fx.Node) -> bool:
    return _fuse_linear(g, node, dynamic=True)


# what this pass emits for each pattern of the ``inductor`` use of
# torchquant.ops.patterns.PATTERNS: (a cheap check on the match, the rewrite, whether it
# needs oneDNN's u8 x s8 products exact)
EMITTERS: dict[str, tuple[Callable, Callable, bool]] = {
    "conv": (_x_is_dequantized, _fuse_conv, False),
    "torchquant_conv": (_always, _fuse_torchquant_conv, False),
    "torchquant_linear": (_always, _fuse_torchquant_linear, False),
    "linear": (_x_is_dequantized, _fuse_static_linear, True),
    "linear_dynamic": (_x_is_dequantized, _fuse_dynamic_linear, True),
    "max_pool": (_always, _pool_integers, False),
    "weight_dequantize": (_weight_is_frozen, _fold_rewrite, False),
}


def register() -> None:
    """Register the fusions (and the folding of the weight dequantizes they leave) as
    patterns of inductor's first freezing pass, before its own conv / linear packing."""
    from torch._inductor.constant_folding import add_dont_constant_fold
    from torch._inductor.fx_passes.freezing_patterns import pass_patterns
    from torch._inductor.pattern_matcher import (MULTIPLE, CallFunctionVarArgs,
                                                 register_graph_pattern)
    tq = _tq()
    add_dont_constant_fold(tq.dequantize_per_channel.default)
    add_dont_constant_fold(tq.dequantize_per_tensor.default)
    # the pass visits nodes last to first: every conv / linear is tried before the weight
    # dequantizes that feed it are folded
    for target, names in patterns.by_root("inductor").items():
        emitters = [EMITTERS[name] for name in names]
        pattern = CallFunctionVarArgs(target, users=MULTIPLE)
        register_graph_pattern(pattern, extra_check=_any_check(emitters),
                               pass_dict=pass_patterns[0], prepend=True)(_handler(emitters))


def aoti_c_shims() -> dict:
    """AOTInductor's ``custom_ops_to_c_shims`` for the native conv ops this pass emits: code
    compiled ahead of time for this process calls them directly (not for packages, which run
    without torchquant)."""
    return _native.aoti_c_shims()
