"""Quantized add (+ReLU) on plain per-tensor quantized integers, with torch's numerics.

Both operands are dequantized, added in float and requantized; torch's vectorised loop and its
scalar tail round differently, and :mod:`._lanes` reproduces which elements take which path.
A repeated call (a residual add in a model: same qparams, shapes and layout) is bound once to
one compiled-kernel call.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .. import affine, kernels
from ..kernels import cpu_compiled
from .. import dtypes as _dt
from ._library import traced
from . import _lanes

__all__ = ["add"]


def _f32(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float32, device=device)


_ADD_CONSTANTS: dict[tuple, tuple] = {}  # a calibrated model reuses a handful of qparam sets


def _add_constants(a_s: float, a_z: int, b_s: float, b_z: int, scale: float, zero_point: int,
                   device: torch.device) -> tuple:
    """The fused kernel's 0-d operands (per input: scale, -zp * scale; the output's float32
    inverse scale and zero point), made once per set."""
    key = (a_s, a_z, b_s, b_z, scale, zero_point, device)
    constants = _ADD_CONSTANTS.get(key)
    if constants is None:
        xs, ys = _f32(a_s, device), _f32(b_s, device)
        inv_out = affine.inv_scale_f32(torch.tensor(scale, device=device)).to(torch.float32)
        constants = (xs, xs * _f32(-float(a_z), device), ys, ys * _f32(-float(b_z), device),
                     inv_out, _f32(float(zero_point), device))
        if len(_ADD_CONSTANTS) >= 256:
            _ADD_CONSTANTS.clear()
        _ADD_CONSTANTS[key] = constants
    return constants


# Ready-bound adds per (qparams, layout, threads, kernel mode): in a model each residual add
# repeats one call, and the checks and views around the fused kernel cost more than the kernel
# itself -- several times more right after a conv has flushed the caches (measured).
_ADD_PLANS: dict[tuple, Callable] = {}


def _plan(values_a: torch.Tensor, values_b: torch.Tensor, qd: _dt.QDType, operands: list,
          relu: bool) -> Optional[Callable]:
    """The add as one compiled-kernel call on flat views, where it is that (dense operands,
    no tail elements, the compiled kernel chosen and hot); else None."""
    lanes = _lanes.lane_count(qd.storage_dtype)
    layout = _lanes.dense_layout([values_a, values_b], lanes, _lanes.suggested_format(values_a))
    if layout is None:
        return None
    to_flat, from_flat = layout
    flat_a = to_flat(values_a)
    if kernels.get("add", flat_a) is not kernels.implementations("add")["cpu_compiled"].fn:
        return None
    statics = (qd.qmin, qd.qmax, qd.storage_dtype, relu)
    kernel = cpu_compiled.compiled("add", (flat_a, to_flat(values_b), *operands, *statics))
    if kernel is None:
        return None
    return lambda x, y: from_flat(kernel([to_flat(x), to_flat(y), *operands])[0])


def _plan_key(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float,
              b_zp: int, out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> tuple:
    return (qd, a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, relu, a.shape, a.stride(),
            b.shape, b.stride(), a.device, torch.get_num_threads(), kernels.mode())


def _add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
         out_scale: float, out_zp: int, qd: _dt.QDType, relu: bool) -> torch.Tensor:
    key = None
    if not torch.compiler.is_compiling():
        key = _plan_key(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qd, relu)
        plan = _ADD_PLANS.get(key)
        if plan is not None:  # this exact call was checked before
            return plan(a, b)
    operands = list(_add_constants(a_scale, a_zp, b_scale, b_zp, out_scale, out_zp, a.device))
    inv_out = operands[4]

    def vector_path(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        # One fused kernel (compiled on CPU for large tensors): the formula of
        # affine.dequantize_int_premul for both operands, then ROUND_ADD requantization.
        return kernels.get("add", x)(x, y, *operands, qd.qmin, qd.qmax, qd.storage_dtype, relu)

    def tail_path(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total = (affine.dequantize_int(x, torch.tensor(a_scale, dtype=torch.float64),
                                       torch.tensor(a_zp))
                 + affine.dequantize_int(y, torch.tensor(b_scale, dtype=torch.float64),
                                         torch.tensor(b_zp)))
        if relu:
            total = torch.clamp(total, min=0.0)
        return affine.quantize_with_multiplier(total, inv_out, out_zp, qd.qmin, qd.qmax,
                                               qd.storage_dtype, affine.MUL_ADD)

    out = _lanes.apply([a, b], vector_path, tail_path, _lanes.lane_count(qd.storage_dtype),
                       _lanes.suggested_format(a))
    if key is not None and a.shape == b.shape:
        plan = _plan(a, b, qd, operands, relu)
        if plan is not None:
            if len(_ADD_PLANS) >= 256:
                _ADD_PLANS.clear()
            _ADD_PLANS[key] = plan
    return out


@torch.library.custom_op("torchquant::add", mutates_args=())
def _add_op(a: torch.Tensor, a_scale: float, a_zero_point: int, b: torch.Tensor, b_scale: float,
            b_zero_point: int, out_scale: float, out_zero_point: int, qdtype: str,
            post_op: str) -> torch.Tensor:
    return _add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point,
                _dt.qdtype_of(qdtype), post_op == "relu")


@_add_op.register_fake
def _(a, a_scale, a_zero_point, b, b_scale, b_zero_point, out_scale, out_zero_point, qdtype,
      post_op):
    return torch.empty_like(a + b)


def add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qdtype: _dt.QDType, relu: bool = False) -> torch.Tensor:
    """The integers of ``quantize(relu?(a_hat + b_hat))`` (broadcasting as torch) for two
    per-tensor quantized operands of ``qdtype`` (the output's too)."""
    if traced(a, b):
        return torch.ops.torchquant.add(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp,
                                        qdtype.name, "relu" if relu else "none")
    return _add(a, a_scale, a_zp, b, b_scale, b_zp, out_scale, out_zp, qdtype, relu)
