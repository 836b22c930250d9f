"""Inductor lowerings of torchquant's per-tensor / per-channel quantize and dequantize.

Without them inductor calls each op back into Python (a custom op it cannot see into).  Here
each becomes a pointwise inductor node that its C++ codegen fuses with its neighbours.  The
formulas are :mod:`torchquant.affine`'s (``quantize_formula`` in FMA mode for 8-bit per-tensor
quantize, ``dequantize_formula``), written with inductor's ``ops`` so the generated code rounds
as eager mode does: one fused multiply-add, ``nearbyint`` (half to even), NaN to torch's code (``affine.nan_code``),
clamp, and the same float32 / float64 intermediate types.  Forms without a lowering here
(32-bit storage, float zero points, non-float32 input) stay the opaque op.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ... import affine
from ... import dtypes as _dt
from ..quantize import DECOMPOSED
from ..quantize_dynamic import quantize_dynamic_per_tensor_decomposed

__all__ = ["register"]


def _constant(value: float, dtype: torch.dtype) -> Any:
    from torch._inductor.virtualized import ops
    return ops.constant(value, dtype)


def _pointwise(like: Any, dtype: torch.dtype, inner: Callable) -> Any:
    from torch._inductor import ir
    return ir.Pointwise.create(device=like.get_device(), dtype=dtype, inner_fn=inner,
                               ranges=list(like.get_size()))


def _quantize_8bit_values(value: Any, inv: float, zero_point: int, qmin: int, qmax: int,
                          storage_dtype: torch.dtype, decomposed: bool = False) -> Any:
    """``quantize_formula`` on one float32 value in inductor's ``ops``: FMA, or with
    ``decomposed`` torchao's rounding (:data:`torchquant.ops.quantize.DECOMPOSED`: round the
    product, then add the zero point; NaN to 0)."""
    from torch._inductor.virtualized import ops
    zp = _constant(float(zero_point), torch.float32)
    if decomposed:
        y = ops.add(ops.round(ops.mul(value, _constant(inv, torch.float32))), zp)
        nan = 0
    else:
        y = ops.round(ops.fma(value, _constant(inv, torch.float32), zp))
        nan = affine.nan_code(qmin, qmax, storage_dtype, affine.FMA)
    y = ops.where(ops.eq(y, y), y, _constant(float(nan), torch.float32))
    y = ops.minimum(ops.maximum(y, _constant(float(qmin), torch.float32)),
                    _constant(float(qmax), torch.float32))
    # float -> int32 -> 8 bits: exact (y is an in-range integer), and vectorised by inductor
    return ops.to_dtype(ops.to_dtype(y, torch.int32), storage_dtype)


def _fallback(op: Any, *args: Any) -> Any:
    from torch._inductor.lowering import fallback_handler
    return fallback_handler(op, add_to_fallback_set=False)(*args)


def _quantize_per_tensor(x: Any, scale: float, zero_point: int, qdtype: str,
                         rounding: Any = None) -> Any:
    q = _dt.qdtype_of(qdtype)
    decomposed = rounding == DECOMPOSED
    if (x.get_dtype() != torch.float32 or q.is_sub_byte or q.bits != 8
            or (rounding is not None and not decomposed)
            or affine.quantize_mode(q, per_channel=False) != affine.FMA):
        return _fallback(torch.ops.torchquant.quantize_per_tensor.default, x, scale, zero_point,
                         qdtype, rounding)
    inv = affine.inv_scale_float32(scale)
    load = x.make_loader()
    return _pointwise(x, q.storage_dtype, lambda idx: _quantize_8bit_values(
        load(idx), inv, int(zero_point), q.qmin, q.qmax, q.storage_dtype, decomposed))


def _dequantize_per_tensor(q: Any, scale: float, zero_point: int) -> Any:
    from torch._inductor.virtualized import ops
    if q.get_dtype() not in (torch.uint8, torch.int8):
        return _fallback(torch.ops.torchquant.dequantize_per_tensor.default, q, scale, zero_point)
    load = q.make_loader()
    zp, s = float(zero_point), affine.round_to_float32(scale)
    return _pointwise(q, torch.float32, lambda idx: ops.mul(
        ops.sub(ops.to_dtype(load(idx), torch.float32), _constant(zp, torch.float32)),
        _constant(s, torch.float32)))


def _dequantize_per_channel(q: Any, scales: Any, zero_points: Any, axis: int) -> Any:
    """``dequantize_formula`` per channel with integer zero points: in float64, as torch's
    per-channel kernel computes it, rounded once to float32."""
    from torch._inductor.virtualized import ops
    if (q.get_dtype() not in (torch.uint8, torch.int8) or zero_points.get_dtype().is_floating_point
            or len(scales.get_size()) != 1):
        return _fallback(torch.ops.torchquant.dequantize_per_channel.default, q, scales,
                         zero_points, axis)
    axis = axis % len(q.get_size())
    load_q, load_s, load_zp = q.make_loader(), scales.make_loader(), zero_points.make_loader()

    def inner(idx):
        channel = [idx[axis]]
        f64 = torch.float64
        value = ops.mul(ops.sub(ops.to_dtype(load_q(idx), f64),
                                ops.to_dtype(load_zp(channel), f64)),
                        ops.to_dtype(load_s(channel), f64))
        return ops.to_dtype(value, torch.float32)
    return _pointwise(q, torch.float32, inner)


def register() -> None:
    """Install the lowerings (idempotent: inductor's table is keyed by op)."""
    from torch._inductor.lowering import register_lowering
    tq = torch.ops.torchquant
    for op, fn in ((tq.quantize_per_tensor.default, _quantize_per_tensor),
                   (tq.dequantize_per_tensor.default, _dequantize_per_tensor),
                   (tq.dequantize_per_channel.default, _dequantize_per_channel)):
        register_lowering(op, type_promotion_kind=None)(fn)
    # dynamic quantization: min / max reduction, qparams and codes as tensor ops inductor
    # fuses (one entry of its decomposition table, for torchquant's op only)
    from torch._inductor.decomposition import decompositions
    decompositions[tq.quantize_dynamic_per_tensor.default] = \
        quantize_dynamic_per_tensor_decomposed
