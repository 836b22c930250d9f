"""Dynamic quantization as registered ops: choose the qparams from the input, quantize, return
``(integers, scale, zero_point)`` -- one op, so a graph needs no data-dependent qparams node.

* per tensor (:func:`quantize_dynamic_per_tensor`): quint8 / qint8 with ATen's
  ``ChooseQuantizationParams`` rule, as torch's dynamic quantization
  (``torch.quantize_per_tensor_dynamic``, ``torch._choose_qparams_per_tensor``); the scale is
  the double ATen computes, the integers use its float32 rounding as ATen's kernels do.
  ``reduce_range`` chooses the qparams for half the range (0..127 for quint8) as fbgemm's
  dynamic Linear does, while the values are still clamped to the full range.
  With ``eps`` (PT2E graphs) it is torchao's rule instead: the observer's float32 qparams
  for [qmin, qmax] and the decomposed rounding, as ``quantized_decomposed.choose_qparams`` /
  ``quantize_per_tensor.tensor`` compute them.
* per token (:func:`quantize_dynamic_per_token`): one symmetric int8 scale per row (all dims
  but the last), torchao's per-token rule: ``scale = max(max|row| / 127, 1e-5)``, codes in
  -127..127, zero point 0.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from .. import affine
from .. import dtypes as _dt
from ..kernels.linear import PER_TOKEN_EPS, PER_TOKEN_QMAX, PER_TOKEN_QMIN, per_token_scale
from . import quantize as ops_quantize
from ._library import traced

__all__ = ["quantize_dynamic_per_tensor", "quantize_dynamic_per_token"]

_DYNAMIC_QDTYPES = ("quint8", "qint8")


def _dynamic_qdtype(qdtype: Union[str, _dt.QDType]) -> _dt.QDType:
    resolved = _dt.qdtype_of(qdtype) if isinstance(qdtype, str) else qdtype
    if resolved.name not in _DYNAMIC_QDTYPES:
        raise ValueError(f"dynamic per-tensor quantization supports quint8 and qint8, got "
                         f"{resolved!r}")
    return resolved


def _quantize_dynamic_per_tensor(x: torch.Tensor, qdtype: _dt.QDType, reduce_range: bool
                                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = x.detach().to(torch.float32)
    if x.numel():
        mn, mx = torch.aminmax(x)
        mn, mx = mn.item(), mx.item()
    else:
        mn = mx = 0.0
    # raises on NaN / Inf, so the finite quantize form applies
    scale, zero_point = affine.choose_qparams_aten_scalar(mn, mx, qdtype.qmin, qdtype.qmax,
                                                          False, reduce_range,
                                                          float32_scale=False)
    q = ops_quantize.quantize_finite_per_tensor(x, scale, zero_point, qdtype.qmin, qdtype.qmax,
                                                qdtype.storage_dtype)
    return (q, torch.tensor(scale, dtype=torch.float64, device=x.device),
            torch.tensor(zero_point, dtype=torch.int64, device=x.device))


def _observer_rule(x: torch.Tensor, qdtype: _dt.QDType, qmin: Optional[int],
                   qmax: Optional[int], eps: float
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """torchao's PT2E dynamic quantization (``quantized_decomposed.choose_qparams.tensor`` then
    ``quantize_per_tensor.tensor``), in tensor ops only (eager and inductor's decomposition
    alike): the observer's affine rule in float32 -- ``scale = max((max(mx, 0) - min(mn, 0)) /
    (qmax - qmin), eps)``, ``zero_point = clamp(qmin - round(min(mn, 0) / scale))`` -- and the
    decomposed rounding (:data:`torchquant.ops.quantize.DECOMPOSED`) with ``1 / scale`` taken in
    float64 as torchao's Python reciprocal is; codes clamped to [qmin, qmax]."""
    qmin = qdtype.qmin if qmin is None else qmin
    qmax = qdtype.qmax if qmax is None else qmax
    x = x.to(torch.float32)
    if x.numel() == 0:
        mn = mx = x.new_zeros(())
    else:
        mn, mx = torch.aminmax(x)
    min_neg, max_pos = torch.clamp(mn, max=0.0), torch.clamp(mx, min=0.0)
    scale = torch.clamp((max_pos - min_neg) / float(qmax - qmin),
                        min=affine.round_to_float32(eps))
    zero_point = torch.clamp(qmin - torch.round(min_neg / scale), qmin, qmax)
    inv = torch.reciprocal(scale.to(torch.float64)).to(torch.float32)
    # (inverse scale, zero point) through a one-element reduction: inductor keeps a reduction's
    # result in a buffer, so the quantize loop loads the two numbers instead of recomputing the
    # qparam arithmetic (a float64 division among it) for every vector; exact (max of one value)
    params = torch.stack([inv, zero_point]).unsqueeze(-1).amax(-1)
    inv, zp_f = params[0], params[1]
    # no NaN mask (torchao maps NaN codes to 0): finite input gives none -- the eager op refuses
    # NaN / Inf first, a compiled graph's codes for them are meaningless anyway -- and inductor
    # turns the mask into a scalar loop per vector
    codes = torch.clamp(torch.round(x * inv) + zp_f, qmin, qmax)
    return (codes.to(torch.int32).to(qdtype.storage_dtype), scale.to(torch.float64),
            zero_point.to(torch.int64))


@torch.library.custom_op("torchquant::quantize_dynamic_per_tensor", mutates_args=())
def _quantize_dynamic_per_tensor_op(x: torch.Tensor, qdtype: str, reduce_range: bool,
                                    qmin: Optional[int] = None, qmax: Optional[int] = None,
                                    eps: Optional[float] = None
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if eps is not None:
        if not bool(torch.isfinite(x).all()):
            raise ValueError("quantize_dynamic_per_tensor: input contains NaN or Inf")
        return _observer_rule(x.detach(), _dynamic_qdtype(qdtype), qmin, qmax, eps)
    return _quantize_dynamic_per_tensor(x, _dynamic_qdtype(qdtype), reduce_range)


def quantize_dynamic_per_tensor_decomposed(x: torch.Tensor, qdtype: str, reduce_range: bool,
                                           qmin: Optional[int] = None,
                                           qmax: Optional[int] = None,
                                           eps: Optional[float] = None
                                           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op in tensor ops a compiler can fuse (inductor's decomposition of it): the same
    qparams (:func:`affine.choose_qparams_aten`, the tensor form of the scalar rule the op
    uses) and codes (:func:`affine.quantize_formula` in FMA mode, the fma inductor's own); with
    ``eps`` torchao's rule (:func:`_observer_rule`).  No NaN / Inf check: a compiled graph
    cannot raise on data, so non-finite input gives meaningless codes there where the eager op
    raises."""
    from torch._inductor import inductor_prims
    q = _dynamic_qdtype(qdtype)
    if eps is not None:
        return _observer_rule(x, q, qmin, qmax, eps)
    x = x.to(torch.float32)
    if x.numel() == 0:
        mn = mx = x.new_zeros(())
    else:
        mn, mx = torch.aminmax(x)
    scale, zero_point = affine.choose_qparams_aten(mn, mx, q.qmin, q.qmax, False, reduce_range,
                                                   float32_scale=False)
    codes = affine.quantize_formula(x, torch.reciprocal(scale.to(torch.float32)),
                                    zero_point.to(torch.float32), q.qmin, q.qmax,
                                    q.storage_dtype, affine.FMA, fma=inductor_prims.fma,
                                    narrow_via_int32=True)
    return codes, scale, zero_point


@_quantize_dynamic_per_tensor_op.register_fake
def _(x, qdtype, reduce_range, qmin=None, qmax=None, eps=None):
    storage = _dynamic_qdtype(qdtype).storage_dtype
    return (torch.empty_like(x, dtype=storage), x.new_empty((), dtype=torch.float64),
            x.new_empty((), dtype=torch.int64))


def quantize_dynamic_per_tensor(x: torch.Tensor, qdtype: Union[str, _dt.QDType] = "quint8",
                                reduce_range: bool = False
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes, 0-d float64 scale, 0-d int64 zero point) of float ``x`` with qparams chosen from
    its min / max.  ValueError on NaN or Inf."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"quantize_dynamic_per_tensor expects a float input, got {x.dtype}")
    resolved = _dynamic_qdtype(qdtype)
    if traced(x):
        return torch.ops.torchquant.quantize_dynamic_per_tensor(x, resolved.name, reduce_range)
    return _quantize_dynamic_per_tensor(x, resolved, reduce_range)


def _quantize_dynamic_per_token(x: torch.Tensor
                                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if x.dim() == 0:
        raise ValueError("per-token quantization needs at least one dim")
    x2d = x.detach().to(torch.float32).reshape(-1, x.size(-1))
    if x2d.size(-1) == 0:
        scale = torch.full((x2d.size(0),), PER_TOKEN_EPS, device=x.device)
    else:
        scale = per_token_scale(x2d)
    if not bool(torch.isfinite(scale).all()):
        raise ValueError("quantize_dynamic_per_token: input contains NaN or Inf")
    zero_point = torch.zeros_like(scale, dtype=torch.int32)
    q = ops_quantize.quantize_int(x2d, scale, zero_point, PER_TOKEN_QMIN, PER_TOKEN_QMAX,
                                  torch.int8, 0, affine.quantize_mode(_dt.qint8, per_channel=True))
    rows = x.shape[:-1]
    return q.reshape(x.shape), scale.reshape(rows), zero_point.reshape(rows)


@torch.library.custom_op("torchquant::quantize_dynamic_per_token", mutates_args=())
def _quantize_dynamic_per_token_op(x: torch.Tensor
                                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _quantize_dynamic_per_token(x)


@_quantize_dynamic_per_token_op.register_fake
def _(x):
    rows = x.shape[:-1]
    return (torch.empty_like(x, dtype=torch.int8), x.new_empty(rows, dtype=torch.float32),
            x.new_empty(rows, dtype=torch.int32))


def quantize_dynamic_per_token(x: torch.Tensor
                               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(int8 codes, float32 scale per row, int32 zero point per row (0)) of float ``x``; the
    rows are all dims but the last.  ValueError on NaN or Inf."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"quantize_dynamic_per_token expects a float input, got {x.dtype}")
    if traced(x):
        return torch.ops.torchquant.quantize_dynamic_per_token(x)
    return _quantize_dynamic_per_token(x)
