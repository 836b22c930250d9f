"""Inductor decompositions of torchquant's remaining ops into plain tensor ops, same integers.

An AOTInductor package (:func:`torchquant.export_package`) must run without torchquant: every
op in it needs a C++ implementation inside torch.  The quantize / dequantize lowerings
(:mod:`.elementwise`) and the oneDNN fusions (:mod:`.fusion`) cover PT2E graphs; eager- and
FX-converted models also call torchquant's fused ops, decomposed here.  Only while a package
is compiled (:func:`packaging`, also part of inductor's cache key): ``torch.compile`` keeps
running these ops as they are, on the kernels their benchmarks measured.

* ``linear_dynamic``, ``rnn_input_projection_dynamic`` and the hidden projection of
  ``lstm_step_dynamic``: ATen's per-tensor qparams from the input's min / max, codes by
  ``clamp(nearbyint(fma(x, 1/scale, zp)))``, the exact int32 accumulator from
  ``torch._int_mm`` (the uint8 codes shifted to int8, the shift corrected with the weight's
  row sums, which freezing folds), and fbgemm's epilogue ``fma(acc, x_scale * w_scale,
  bias)``: torch.ao's (and torchquant's eager) dynamic Linear bit for bit.
  ``torch._int_mm`` is exact on every CPU (oneDNN with VNNI / AMX, ATen's own loop below)
  but one whose oneDNN is held below its ISA (``ONEDNN_MAX_CPU_ISA=AVX2`` on a VNNI CPU);
  compiled there, the accumulator comes from a float64 matmul instead (exact integers below
  2**53, and the same float32 after the conversion the int32 one gets).
* ``lstm_step_dynamic``: that projection, then torch's gate arithmetic out of place
  (sigmoid / tanh as inductor generates them: within an ulp or so of ATen's kernels).
* ``add`` (+ReLU): torch's vectorised quantized add (``kernels.reference.add_formula``) for
  every element; eager mode takes torch's scalar formula for a tail of fewer elements than a
  vector, which can land one step apart.
* ``clamp`` (hardtanh, ReLU6 of FX models): the eager op's integer clamp.
* ``max_pool2d``: the max pool of the 8-bit integers themselves where inductor writes the
  loop (every window holds an input pixel, so the padding's fill never wins); the float max
  pool of the integers, narrowed back, for windows inductor hands to ATen.
* ``adaptive_avg_pool2d``: exact integer window sums, then ``nearbyint(acc * (1/count) +
  zp)`` as the eager op (MUL_ADD rounding).

The static ``torchquant::linear`` (frozen weight) becomes, at freezing, the oneDNN call its
eager kernel makes (as :mod:`.fusion` does for ``torchquant::conv``).
"""
from __future__ import annotations

import contextlib
import functools
import math
from typing import Any, Iterator, Optional

import torch

from ... import affine
from ... import dtypes as _dt
from ...kernels import elementwise as _kelementwise
from ...kernels import onednn_exactness as _exactness
from ...kernels.reference import add_formula
from .._library import traced
from . import fusion, packaging_state, saturation_safe
from .packaging_state import is_packaging

__all__ = ["register", "decompositions_by_op", "packaging", "is_packaging",
           "onednn_int8_exact"]

_UINT8_SHIFT = 128  # uint8 codes - 128 are int8, which torch._int_mm multiplies


@contextlib.contextmanager
def packaging(graph: torch.fx.Graph, in_process: bool = False) -> Iterator[None]:
    """Inside: inductor decomposes the ops here in ``graph`` (the exported program an
    AOTInductor package is compiled from).  ``in_process``: the compiled code runs in this
    process (``torchquant.compile``'s AOT graphs), so it may still call torchquant's native
    ops; a package may not.

    The entries join inductor's decomposition table on entry and leave it on exit: inductor
    refuses an op that has a table entry and still falls back, so an op has an entry only
    where every call of it in ``graph`` is covered (and none outside a package compile:
    ``torch.compile`` runs the ops as they are)."""
    with packaging_state.lock:
        if packaging_state.depth[0] == 0:
            entries = _table_entries(graph)
            for table in _inductor_tables():
                table.update(entries)
        packaging_state.depth[0] += 1
        packaging_state.for_packages[0] += 0 if in_process else 1
    try:
        yield
    finally:
        with packaging_state.lock:
            packaging_state.depth[0] -= 1
            packaging_state.for_packages[0] -= 0 if in_process else 1
            if packaging_state.depth[0] == 0:
                for table in _inductor_tables():
                    for op in decompositions_by_op():
                        table.pop(op, None)


def _inductor_tables() -> tuple[dict, ...]:
    """Inductor's decomposition table and the copy of it that it actually reads by default
    (``fast_random_decomps``: made, and cached, by the process's first compile -- an entry
    added to the table after that compile alone would never be seen)."""
    from torch._inductor import decomposition
    return decomposition.decompositions, decomposition.fast_random_decomps()


def onednn_int8_exact() -> bool:
    """Whether oneDNN's u8 x s8 products are exact on this CPU (VNNI / AMX): where they are
    not, the int8 conv / Linear rewrites do not apply (the package check says so)."""
    return _exactness.onednn_u8s8_exact()


def _int_mm_exact() -> bool:
    """:func:`torchquant.kernels.onednn_exactness.int_mm_exact_on_cpu`, measured on real
    tensors (the decompositions run while inductor traces with fake ones)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    with unset_fake_temporarily():
        return _exactness.int_mm_exact_on_cpu()


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """``a * b + c`` rounded once: inductor's fma prim while traced (its eager form rounds
    twice), ``torch.addcmul`` (fused on CPU) when these functions run eagerly in the tests."""
    if traced(a, b, c):
        from torch._inductor import inductor_prims
        return inductor_prims.fma(a, b, c)
    return torch.addcmul(c, a, b)


def _dynamic_linear_2d(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                       bias: Optional[torch.Tensor], reduce_range: bool) -> torch.Tensor:
    """torch.ao's dynamic Linear of a 2-D float input (module docstring), float32 out."""
    x = x.to(torch.float32)
    mn, mx = torch.aminmax(x)
    # the float32 scale fbgemm keeps (the eager kernels' scalar rule rounds it so too)
    scale32, zero_point = affine.choose_qparams_aten(mn, mx, 0, 255, False, reduce_range)
    codes = torch.clamp(torch.round(_fma(x, torch.reciprocal(scale32),
                                         zero_point.to(torch.float32))), 0, 255)
    if _int_mm_exact():
        signed = (codes - _UINT8_SHIFT).to(torch.int32).to(torch.int8)
        acc = torch._int_mm(signed, weight.t())
        row_sums = weight.sum(1, dtype=torch.int32)
        acc = (acc + (_UINT8_SHIFT - zero_point.to(torch.int32)) * row_sums).to(torch.float32)
    else:
        shifted = codes.to(torch.float64) - zero_point.to(torch.float64)
        acc = torch.mm(shifted, weight.t().to(torch.float64)).to(torch.float32)
    multiplier = weight_scale.to(torch.float32) * scale32
    if bias is None:
        return acc * multiplier
    return _fma(acc, multiplier.expand(acc.shape[-1:]), bias.to(torch.float32))


def linear_dynamic(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                   reduce_range: bool, relu: bool) -> torch.Tensor:
    y = _dynamic_linear_2d(x.reshape(-1, x.size(-1)), weight, weight_scale, bias, reduce_range)
    y = y.reshape(*x.shape[:-1], weight.size(0))
    return torch.relu(y) if relu else y


def rnn_input_projection(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                         weight_zero_point: torch.Tensor, bias: Optional[torch.Tensor],
                         reduce_range: bool) -> torch.Tensor:
    return linear_dynamic(x, weight, weight_scale, weight_zero_point, bias, reduce_range, False)


def lstm_step(ih: torch.Tensor, h: torch.Tensor, c: torch.Tensor, weight: torch.Tensor,
              weight_scale: Optional[torch.Tensor], weight_zero_point: Optional[torch.Tensor],
              bias: Optional[torch.Tensor], reduce_range: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """``torchquant.ops.rnn._lstm_pointwise`` after the int8 hidden projection, out of place;
    float16 hidden weights (no qparams) are left to the opaque op."""
    gates = _dynamic_linear_2d(h, weight, weight_scale, bias, reduce_range) + ih
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = torch.sigmoid(i), torch.sigmoid(f), torch.tanh(g), torch.sigmoid(o)
    c_next = f * c + i * g
    return o * torch.tanh(c_next), c_next


def add(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor, b_scale: float,
        b_zero_point: int, out_scale: float, out_zero_point: int, qdtype: str,
        post_op: str) -> torch.Tensor:
    qd = _dt.qdtype_of(qdtype)

    def f32(value: float) -> torch.Tensor:
        return torch.tensor(affine.round_to_float32(value), dtype=torch.float32, device=a.device)
    a_s, b_s = affine.round_to_float32(a_scale), affine.round_to_float32(b_scale)
    out = add_formula(a, b, f32(a_s), f32(a_s * -float(a_zero_point)), f32(b_s),
                      f32(b_s * -float(b_zero_point)),
                      f32(affine.inv_scale_float32(out_scale)),
                      f32(float(out_zero_point)),
                      qd.qmin, qd.qmax, qd.storage_dtype, post_op == "relu", fma=_fma)
    return out.contiguous(memory_format=_layout_of(a))


def _layout_of(t: torch.Tensor) -> torch.memory_format:
    """The eager ops' output layout: channels-last where their 4-D input is."""
    if t.dim() == 4 and not t.is_contiguous() and t.is_contiguous(
            memory_format=torch.channels_last):
        return torch.channels_last
    return torch.contiguous_format


def max_pool2d(values: torch.Tensor, kernel_size: list[int], stride: list[int],
               padding: list[int], dilation: list[int], ceil_mode: bool) -> torch.Tensor:
    if not fusion.integer_max_pool_lowered(kernel_size):   # ATen's kernel: pool in float
        out = torch.nn.functional.max_pool2d(values.to(torch.float32), kernel_size,
                                             stride or None, padding, dilation, ceil_mode)
        return out.to(values.dtype).contiguous(memory_format=_layout_of(values))
    out = torch.nn.functional.max_pool2d(values, kernel_size, stride or None, padding, dilation,
                                         ceil_mode)
    return out.contiguous(memory_format=_layout_of(values))


def adaptive_avg_pool2d(values: torch.Tensor, zero_point: int, qdtype: str,
                        output_size: list[int]) -> torch.Tensor:
    """The global mean (output 1 x 1) from int32 sums, as the eager op; other output sizes
    are left to the opaque op (the package check names them)."""
    qd = _dt.qdtype_of(qdtype)
    count = math.prod(values.shape[-2:])
    sums = values.sum((-2, -1), keepdim=True, dtype=torch.int32)
    acc = (sums - count * zero_point).to(torch.float32)
    inv = affine.round_to_float32(1.0 / count)
    q = torch.clamp(torch.round(acc * inv + float(zero_point)), qd.qmin, qd.qmax)
    return q.to(torch.int32).to(qd.storage_dtype).contiguous(memory_format=_layout_of(values))


def clamp(x: torch.Tensor, scale: float, zero_point: int, min: Optional[float],
          max: Optional[float], qdtype: str) -> torch.Tensor:
    """hardtanh / ReLU6 / clamp: the eager op's integer clamp (its bounds from the qparams),
    as maximum / minimum with 0-d tensors: a ``clamp`` of a oneDNN conv's uint8 output would
    match torch's own conv + hardtanh freezing pattern, which expects a float output and fails."""
    low, high = _kelementwise.clamp_bounds(scale, zero_point, _dt.qdtype_of(qdtype), min, max)
    if low is not None:
        x = torch.maximum(x, torch.full((), low, dtype=x.dtype, device=x.device))
    if high is not None:
        x = torch.minimum(x, torch.full((), high, dtype=x.dtype, device=x.device))
    return x


def _global_only(output_size: list[int]) -> bool:
    return all(int(o) == 1 for o in output_size)


def decompositions_by_op() -> dict:
    """op overload -> (decomposition, applies(*args) -> bool)."""
    tq = torch.ops.torchquant
    return {
        tq.linear_dynamic.default: (linear_dynamic, lambda *a: a[1].dtype == torch.int8),
        tq.rnn_input_projection_dynamic.default:
            (rnn_input_projection, lambda *a: a[1].dtype == torch.int8),
        tq.lstm_step_dynamic.default:
            (lstm_step, lambda *a: a[3].dtype == torch.int8 and a[4] is not None),
        tq.add.default: (add, lambda *a: a[0].dtype in (torch.uint8, torch.int8)
                         and a[3].dtype == a[0].dtype),
        tq.clamp.default: (clamp, lambda *a: True),
        tq.max_pool2d.default: (max_pool2d, lambda *a: a[0].dtype in (torch.uint8, torch.int8)),
        tq.adaptive_avg_pool2d.default:
            (adaptive_avg_pool2d, lambda *a: a[0].dtype in (torch.uint8, torch.int8)
             and _global_only(a[3])),
    }


def _table_entries(graph: torch.fx.Graph) -> dict:
    """Inductor decomposition-table entries for the ops whose every call in ``graph`` is
    covered; the others stay opaque (and the package check names them)."""
    def example(arg: Any) -> Any:
        return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg

    covered = decompositions_by_op()
    for node in graph.nodes:
        if node.op == "call_function" and node.target in covered:
            args = _positional(node.target, tuple(example(a) for a in node.args),
                               {k: example(v) for k, v in node.kwargs.items()})
            if not covered[node.target][1](*args):
                del covered[node.target]
    return {op: functools.partial(_decomposed, op, fn) for op, (fn, _) in covered.items()}


def _decomposed(op: torch._ops.OpOverload, fn: Any, *args: Any, **kwargs: Any) -> Any:
    return fn(*_positional(op, args, kwargs))


def register() -> None:
    """Register the static Linear's freezing rewrite (it acts while :func:`packaging` only);
    the decompositions join inductor's table inside :func:`packaging`."""
    _register_linear_fusion()


def _positional(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    """A call's arguments in schema order, defaults filled in."""
    if not kwargs and len(args) == len(op._schema.arguments):
        return args
    out = list(args)
    for arg in op._schema.arguments[len(args):]:
        out.append(kwargs[arg.name] if arg.name in kwargs else arg.default_value)
    return tuple(out)


# ---- the static Linear: the oneDNN call its eager kernel makes -------------------------------

_ONEDNN_LINEAR_POST_OPS = ("none", "relu", "leaky_relu", "tanh")


def _fuse_torchquant_linear(g: Any, node: Any) -> bool:
    """``torchquant::linear`` with a frozen weight (eager- and FX-converted Linear layers) as
    ``onednn.qlinear_pointwise`` with the weight prepacked at freezing: the call the eager
    kernel makes on CPUs where oneDNN's u8 x s8 products are exact, so the same integers;
    where they saturate, the eager kernel's split there (:mod:`.saturation_safe`)."""
    if not is_packaging():
        return False
    a = fusion._op_arguments(node)
    x, post_op = a["x"], a["post_op"]
    frozen = fusion.frozen_op_weight(g, a)
    val = x.meta.get("val") if hasattr(x, "meta") else None
    if (val is None or val.dtype != torch.uint8 or val.dim() != 2 or frozen is None
            or a["out_dtype"] != torch.uint8 or post_op not in _ONEDNN_LINEAR_POST_OPS
            or a["other"] is not None):
        return False
    w, w_scale, bias = frozen
    if not _exactness.onednn_u8s8_exact():
        if fusion.native_allowed() or post_op not in ("none", "relu"):
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
    fusion._replace(node, torch.ops.onednn.qlinear_pointwise.default, args,
                    torch.empty_like(node.meta["val"]))
    return True


def _register_linear_fusion() -> None:
    from torch._inductor.fx_passes.freezing_patterns import pass_patterns
    from torch._inductor.pattern_matcher import (MULTIPLE, CallFunctionVarArgs,
                                                 register_graph_pattern)

    pattern = CallFunctionVarArgs(torch.ops.torchquant.linear.default, users=MULTIPLE)
    register_graph_pattern(pattern, extra_check=fusion._always, pass_dict=pass_patterns[0],
                           prepend=True)(fusion._handler(_fuse_torchquant_linear, False))
