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
* 8-bit ``sigmoid`` / ``tanh`` / ``hardsigmoid`` / ``hardswish`` / ``elu`` / ``celu`` /
  ``leaky_relu``: the eager op's value table (256 codes, built here as a constant) of the path
  torch's kernel takes for the layout -- the vectorised one where the input is dense in the
  output's layout (its scalar tail of fewer elements than a vector may land a step apart, as
  for ``add``), the scalar one where every element takes it; other layouts stay opaque.
* ``conv_transpose``: the eager op's reference computation (dequantize, float transposed
  conv, post-op, quantize); inductor's float conv may sum in another order than the eager
  call's, so an output within an ulp of a tie can land a step apart.
* ``mul`` (+ReLU), ``add_scalar``, ``mul_scalar``, ``cat``, ``mean_inner_dims``,
  ``avg_pool2d`` (static image sizes): the eager ops' formulas (exact int32 products
  and sums, torch's float32 multipliers and rounding modes; cat's channels-last vector /
  remainder split).
* ``max_pool2d``: the max pool of the 8-bit integers themselves where inductor writes the
  loop (every window holds an input pixel, so the padding's fill never wins); the float max
  pool of the integers, narrowed back, for windows inductor hands to ATen.
* ``adaptive_avg_pool2d``: exact integer window sums, then ``nearbyint(acc * (1/count) +
  zp)`` as the eager op (MUL_ADD rounding).

The static ``torchquant::linear`` (frozen weight) becomes, at freezing, the oneDNN call its
eager kernel makes: the ``torchquant_linear`` pattern of :mod:`.fusion`.
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
from .. import _lanes
from .. import binary as _binary
from .. import pooling as _pooling
from .._library import traced
from . import fusion, packaging_state
from .packaging_state import is_packaging

__all__ = ["decompositions_by_op", "packaging", "is_packaging",
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
    return _global_mean(values, zero_point, qdtype, 2, True)


def _global_mean(values: torch.Tensor, zero_point: int, qdtype: str, ndim: int,
                 keepdim: bool) -> torch.Tensor:
    qd = _dt.qdtype_of(qdtype)
    dims = tuple(range(values.dim() - ndim, values.dim()))
    count = math.prod(values.shape[values.dim() - ndim:])
    sums = values.sum(dims, keepdim=keepdim, dtype=torch.int32)
    acc = (sums - count * zero_point).to(torch.float32)
    inv = affine.round_to_float32(1.0 / count)
    q = torch.clamp(torch.round(acc * inv + float(zero_point)), qd.qmin, qd.qmax)
    q = q.to(torch.int32).to(qd.storage_dtype)
    return q.contiguous(memory_format=_layout_of(values)) if keepdim else q


def _avg_pool_operands(in_sizes: tuple, out_sizes: tuple, kernel: list[int], stride: list[int],
                       padding: list[int], count_include_pad: bool,
                       divisor_override: Optional[int], zero_point: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """(valid count * zero point, float32 1 / divisor) per output position, as the eager op
    computes them (:func:`torchquant.ops.pooling.avg_pool_counts`), real constants of the
    graph."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        valid, divisor = _pooling.avg_pool_counts(in_sizes, out_sizes, kernel, stride or kernel,
                                                  padding, count_include_pad, divisor_override)
        return (valid.to(torch.float32) * zero_point,
                affine.inv_scale_f32(divisor.to(torch.float32)))


def avg_pool2d(values: torch.Tensor, zero_point: int, qdtype: str, kernel_size: list[int],
               stride: list[int], padding: list[int], ceil_mode: bool, count_include_pad: bool,
               divisor_override: Optional[int]) -> torch.Tensor:
    """The eager op: exact window sums (float32 of 8-bit codes), the valid elements' zero
    point removed, ``round(acc * (1 / divisor) + zp)`` (MUL_ADD)."""
    qd = _dt.qdtype_of(qdtype)
    sums = torch.nn.functional.avg_pool2d(values.to(torch.float32), kernel_size, stride or None,
                                          padding, ceil_mode, True, divisor_override=1)
    shifted_zero, inv = _avg_pool_operands(tuple(values.shape[-2:]), tuple(sums.shape[-2:]),
                                           kernel_size, stride, padding, count_include_pad,
                                           divisor_override, zero_point)
    return affine.quantize_formula(sums - shifted_zero, inv,
                                   _f32_const(float(zero_point), values.device), qd.qmin,
                                   qd.qmax, qd.storage_dtype, affine.MUL_ADD)


def mean_inner_dims(values: torch.Tensor, zero_point: int, qdtype: str, ndim: int,
                    keepdim: bool) -> torch.Tensor:
    """``x.mean(inner dims)`` of codes: the eager op's numerics, as the global pool above."""
    return _global_mean(values, zero_point, qdtype, ndim, keepdim)


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


_MAPPED_ACTIVATIONS = {"sigmoid": "suggested", "tanh": "suggested", "hardsigmoid": "suggested",
                       "hardswish": "suggested", "elu": "contiguous", "celu": "contiguous"}


def _value_table(name: str, params: tuple, scale: float, zero_point: int, out_scale: float,
                 out_zero_point: int, qd: _dt.QDType, path: str) -> torch.Tensor:
    """The eager op's value table for torch's vectorised (``path="vector"``) or scalar path
    (:func:`torchquant.kernels.elementwise.value_tables`), built from real numbers while
    inductor traces with fake tensors: a constant of the graph."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
    vector_fn, tail_fn = _kelementwise.float_functions(name, params)
    with unset_fake_temporarily(), disable_proxy_modes_tracing():
        tables = _kelementwise.value_tables(scale, zero_point, vector_fn, tail_fn, out_scale,
                                            out_zero_point, qd, torch.device("cpu"))
    return tables[0] if path == "vector" else tables[1]


def _mapped_path(x: torch.Tensor, layout: str) -> Optional[tuple[str, torch.memory_format]]:
    """(the path torch's kernel takes for the elements, the output's layout) of an activation
    with ``layout`` (:data:`torchquant.ops.activation.LAYOUTS`): ``vector`` where the input is
    dense in the output's layout (one flat loop; eager takes the scalar formula for a tail of
    fewer elements than a vector, which can land one step apart, as for :func:`add`),
    ``tail`` where no two neighbours of the output are neighbours of the input (every element
    the scalar formula), None otherwise (a per-row tail; the op stays opaque)."""
    suggested = _lanes.suggested_format(x)
    if layout == "dense_input":
        return "vector", suggested
    out_format = torch.contiguous_format if layout == "contiguous" else suggested
    if _lanes.dense_views([x], out_format) is not None:
        return "vector", out_format
    if x.dim() >= 2 and x.size(-1) != 1 and out_format == torch.contiguous_format \
            and x.stride(-1) != 1:
        return "tail", out_format
    return None


def _mapped(name: str, x: torch.Tensor, scale: float, zero_point: int, params: tuple,
            out_scale: float, out_zero_point: int, qdtype: str, layout: str) -> torch.Tensor:
    """An 8-bit activation (sigmoid, tanh, hardsigmoid, hardswish, ELU, CELU, leaky ReLU): the
    eager op's value table of the path its elements take (:func:`_mapped_path`), looked up."""
    qd = _dt.qdtype_of(qdtype)
    path, out_format = _mapped_path(x, layout)
    table = _value_table(name, tuple(float(p) for p in params), float(scale), int(zero_point),
                         float(out_scale), int(out_zero_point), qd, path)
    index = x.to(torch.int32) - qd.qmin if qd.qmin else x.to(torch.int32)
    return torch.ops.aten.index.Tensor(table, [index]).contiguous(memory_format=out_format)


def _mapped_decomposition(name: str) -> Any:
    def decomposition(x: torch.Tensor, scale: float, zero_point: int, *rest: Any) -> torch.Tensor:
        *params, out_scale, out_zero_point, qdtype = rest
        return _mapped(name, x, scale, zero_point, tuple(params), out_scale, out_zero_point,
                       qdtype, _MAPPED_ACTIVATIONS[name])
    return decomposition


def _mapped_applies(layout_of_call: Any) -> Any:
    def applies(*args: Any) -> bool:
        return _eight_bit(*args) and _mapped_path(args[0], layout_of_call(args)) is not None
    return applies


def leaky_relu(x: torch.Tensor, scale: float, zero_point: int, negative_slope: float,
               out_scale: float, out_zero_point: int, qdtype: str, layout: str) -> torch.Tensor:
    return _mapped("leaky_relu", x, scale, zero_point, (negative_slope,), out_scale,
                   out_zero_point, qdtype, layout)


def _f32_const(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(affine.round_to_float32(value), dtype=torch.float32, device=device)


def mul(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor, b_scale: float,
        b_zero_point: int, out_scale: float, out_zero_point: int, qdtype: str,
        post_op: str) -> torch.Tensor:
    """The eager op's formula (``torchquant.ops.binary``): the exact int32 product of the
    shifted codes times the float32 multiplier ``a_scale * b_scale * (1 / out_scale)``, rounded,
    plus the zero point (ROUND_ADD)."""
    qd = _dt.qdtype_of(qdtype)
    a32 = affine.round_to_float32(a_scale)
    multiplier = affine.round_to_float32(affine.round_to_float32(a32 * affine.round_to_float32(
        b_scale)) * affine.inv_scale_float32(out_scale))
    product = (a.to(torch.int32) - a_zero_point) * (b.to(torch.int32) - b_zero_point)
    return affine.quantize_formula(product.to(torch.float32), _f32_const(multiplier, a.device),
                                   _f32_const(float(out_zero_point), a.device),
                                   out_zero_point if post_op == "relu" else qd.qmin, qd.qmax,
                                   qd.storage_dtype, affine.ROUND_ADD)


_CONV_TRANSPOSE = {3: torch.nn.functional.conv_transpose1d, 4: torch.nn.functional.conv_transpose2d,
                   5: torch.nn.functional.conv_transpose3d}
_CONV_TRANSPOSE_POST_OPS = ("none", "relu", "add", "add_relu", "leaky_relu", "tanh")


def conv_transpose(x: torch.Tensor, x_scale: float, x_zero_point: int, weight: torch.Tensor,
                   weight_scale: torch.Tensor, weight_zero_point: torch.Tensor,
                   bias: Optional[torch.Tensor], weight_axis: int, stride: list[int],
                   padding: list[int], output_padding: list[int], dilation: list[int],
                   groups: int, out_scale: float, out_zero_point: int, post_op: str = "none",
                   negative_slope: float = 0.01, other: Optional[torch.Tensor] = None,
                   other_scale: float = 1.0, other_zero_point: int = 0) -> torch.Tensor:
    """The eager op (torchquant's reference transposed conv): the input and weight dequantized
    (the per-channel weight in float64, as torch), a float transposed conv, the post-op, one
    quantize (``round(fma(y, 1 / out_scale, zp))``).  The float conv is inductor's call of
    ATen's, whose algorithm may order its sums otherwise than the eager call (layouts), so an
    output within an ulp of a rounding tie can land one step apart."""
    x_hat = affine.dequantize_int(x, *affine.per_tensor_qparams(x_scale, x_zero_point, x.device))
    axis = None if weight_scale.dim() == 0 else weight_axis
    w_hat = affine.dequantize_formula(*affine.dequantize_operands(
        weight, weight_scale, weight_zero_point, axis))
    y = _CONV_TRANSPOSE[x.dim()](x_hat, w_hat, bias, stride, padding, output_padding, groups,
                                 dilation)
    if post_op in ("add", "add_relu"):
        y = y + affine.dequantize_int(other, *affine.per_tensor_qparams(
            other_scale, other_zero_point, other.device))
    if post_op in ("relu", "add_relu"):
        y = torch.relu(y)
    elif post_op == "leaky_relu":
        y = torch.nn.functional.leaky_relu(y, negative_slope)
    elif post_op == "tanh":
        y = torch.tanh(y)
    return affine.quantize_formula(y, _f32_const(affine.inv_scale_float32(out_scale), x.device),
                                   _f32_const(float(out_zero_point), x.device), _dt.quint8.qmin,
                                   _dt.quint8.qmax, torch.uint8, affine.FMA, fma=_fma)


def add_scalar(x: torch.Tensor, scale: float, zero_point: int, other: float, out_scale: float,
               out_zero_point: int, qdtype: str, post_op: str) -> torch.Tensor:
    """The eager op: the codes moved by ``round(other / scale)`` steps, times the float32
    multiplier ``scale * (1 / out_scale)``, rounded, plus the zero point (ROUND_ADD)."""
    qd = _dt.qdtype_of(qdtype)
    steps = round(float(other) / scale)
    multiplier = affine.round_to_float32(affine.round_to_float32(scale)
                                         * affine.inv_scale_float32(out_scale))
    moved = x.to(torch.int32) - (zero_point - steps)
    return affine.quantize_formula(moved.to(torch.float32), _f32_const(multiplier, x.device),
                                   _f32_const(float(out_zero_point), x.device),
                                   out_zero_point if post_op == "relu" else qd.qmin, qd.qmax,
                                   qd.storage_dtype, affine.ROUND_ADD)


def mul_scalar(x: torch.Tensor, other: float, qdtype: str) -> torch.Tensor:
    """The eager op: the codes themselves, mirrored in the range, or zeros."""
    qd = _dt.qdtype_of(qdtype)
    if float(other) == 0:
        return torch.zeros_like(x)
    if float(other) > 0:
        return x.clone()
    return ((qd.qmax + qd.qmin) - x.to(torch.int32)).to(qd.storage_dtype)


def _cat_nhwc_part(x: torch.Tensor, scale: float, zp: int, out_scale: float, out_zp: int,
                   qd: _dt.QDType) -> torch.Tensor:
    """The eager op's channels-last part: fma dequantize and ROUND_ADD for whole vectors of
    channels, ``(q - zp) * scale`` and MUL_ADD for the rest."""
    if scale == out_scale and zp == out_zp:
        return x
    inv = _f32_const(affine.inv_scale_float32(out_scale), x.device)
    out_zp_t = _f32_const(float(out_zp), x.device)
    s32 = affine.round_to_float32(scale)
    split = x.shape[1] // _binary.CAT_NHWC_LANES * _binary.CAT_NHWC_LANES
    parts = []
    if split:
        head = _fma(x[:, :split].to(torch.float32), _f32_const(s32, x.device),
                    _f32_const(s32 * -float(zp), x.device))
        parts.append(affine.quantize_formula(head, inv, out_zp_t, qd.qmin, qd.qmax,
                                             qd.storage_dtype, affine.ROUND_ADD))
    if split < x.shape[1]:
        rest = (x[:, split:].to(torch.float32) - float(zp)) * s32
        parts.append(affine.quantize_formula(rest, inv, out_zp_t, qd.qmin, qd.qmax,
                                             qd.storage_dtype, affine.MUL_ADD))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


def cat(tensors: list[torch.Tensor], scales: list[float], zero_points: list[int], dim: int,
        out_scale: float, out_zero_point: int, qdtype: str) -> torch.Tensor:
    """The eager op: channels-last 4-d inputs along channels as torch's vectorised kernel,
    others dequantized and quantized again (``round(fma(x, 1 / out_scale, zp))``)."""
    qd = _dt.qdtype_of(qdtype)
    if dim == 1 and all(t.dim() == 4 and t.is_contiguous(memory_format=torch.channels_last)
                        for t in tensors):
        parts = [_cat_nhwc_part(t, float(s), int(z), float(out_scale), int(out_zero_point), qd)
                 for t, s, z in zip(tensors, scales, zero_points)]
        return torch.cat(parts, 1).contiguous(memory_format=torch.channels_last)
    device = tensors[0].device
    inv = _f32_const(affine.inv_scale_float32(out_scale), device)
    out_zp = _f32_const(float(out_zero_point), device)
    parts = [affine.quantize_formula((t.to(torch.float32) - float(z)) * affine.round_to_float32(s),
                                     inv, out_zp, qd.qmin, qd.qmax, qd.storage_dtype,
                                     affine.FMA, fma=_fma)
             for t, s, z in zip(tensors, scales, zero_points)]
    return torch.cat(parts, dim)


def _global_only(output_size: list[int]) -> bool:
    return all(int(o) == 1 for o in output_size)


def _eight_bit(*args: Any) -> bool:
    return args[0].dtype in (torch.uint8, torch.int8)


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
        **{getattr(tq, name).default: (_mapped_decomposition(name),
                                       _mapped_applies(lambda a, layout=layout: layout))
           for name, layout in _MAPPED_ACTIVATIONS.items()},
        tq.leaky_relu.default: (leaky_relu, _mapped_applies(lambda a: a[7])),
        tq.mean_inner_dims.default:
            (mean_inner_dims, lambda *a: a[0].dtype in (torch.uint8, torch.int8)
             and math.prod(a[0].shape[a[0].dim() - a[3]:]) < (1 << 22)),
        tq.add_scalar.default: (add_scalar, _eight_bit),
        tq.conv_transpose.default:
            (conv_transpose, lambda *a: a[0].dtype == torch.uint8 and a[0].dim() in (3, 4, 5)
             and a[15] in _CONV_TRANSPOSE_POST_OPS),
        tq.avg_pool2d.default:
            (avg_pool2d, lambda *a: _eight_bit(*a)
             and all(isinstance(d, int) for d in a[0].shape[-2:])),
        tq.mul_scalar.default: (mul_scalar, _eight_bit),
        tq.mul.default: (mul, lambda *a: _eight_bit(*a) and a[3].dtype == a[0].dtype),
        tq.cat.default: (cat, lambda *a: all(t.dtype in (torch.uint8, torch.int8)
                                              for t in a[0])),
        tq.max_pool2d.default: (max_pool2d, lambda *a: a[0].dtype in (torch.uint8, torch.int8)),
        tq.adaptive_avg_pool2d.default:
            (adaptive_avg_pool2d, lambda *a: a[0].dtype in (torch.uint8, torch.int8)
             and _global_only(a[3])),
    }


def _table_entries(graph: torch.fx.Graph) -> dict:
    """Inductor decomposition-table entries for the ops whose every call in ``graph`` is
    covered; the others stay opaque (and the package check names them)."""
    def example(arg: Any) -> Any:
        if isinstance(arg, (list, tuple)):
            return type(arg)(example(a) for a in arg)
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


def _positional(op: torch._ops.OpOverload, args: tuple, kwargs: dict) -> tuple:
    """A call's arguments in schema order, defaults filled in."""
    if not kwargs and len(args) == len(op._schema.arguments):
        return args
    out = list(args)
    for arg in op._schema.arguments[len(args):]:
        out.append(kwargs[arg.name] if arg.name in kwargs else arg.default_value)
    return tuple(out)
