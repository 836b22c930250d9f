"""What ``torch.compile`` sees of a converted model: ops lowered into pieces inductor can fuse.

``torch.export`` keeps one ``torch.ops.torchquant.*`` node per quantized computation (a graph
other tools read).  Under ``torch.compile`` that would be a chain of opaque calls, each paying
the dispatcher and materialising its integers, with nothing for inductor to fuse.  So while
dynamo compiles (and does not export), the ops below emit instead:

* ``add`` (+ReLU) where every element takes torch's vector path whatever the thread count
  (same-shaped dense operands, see :mod:`._lanes`): the vector formula itself, as plain torch
  ops with explicit fused multiply-adds.
* ``conv`` on CPUs whose oneDNN saturates u8 x s8 pairs (AVX2): one opaque op for the exact
  float conv (``torchquant::conv_exact_float``), then ReLU and the requantization as plain
  torch ops, which inductor fuses with the residual add between two convs into one loop.  The
  op looks at its input, as a graph cannot: one oneDNN call where no value exceeds 127, else
  the split into ``x & 127`` and ``x >> 7`` with the high half scattered from its few nonzero
  positions or, where it is dense, a second oneDNN conv (:func:`..kernels.conv.conv_exact_float`).
  Eager mode fuses the requantization into oneDNN where no value exceeds 128 and splits the
  rest the same way; both give the same integers (tested).

The lowered formulas are the references' (``kernels.reference``) with ``prims.fma`` where
those use a fused multiply-add, so the compiled integers equal eager mode's bit for bit.  Their
rounding depends on inductor not rewriting float arithmetic: lowering is skipped (the opaque
ops run) when the user's inductor config turns on unsafe math or floating-point contraction.
``TORCHQUANT_COMPILE_LOWERING=0`` turns lowering off.
"""
from __future__ import annotations

import os
from typing import Optional

import torch

from .. import _config, affine
from .._after_import import after_import
from .. import dtypes as _dt
from ..kernels import conv as _kconv
from ..kernels.onednn_exactness import onednn_u8_exact_max, onednn_u8s8_exact
from ..kernels.reference import add_formula, quantize_formula
from . import _lanes
from ._library import weight_qparams

__all__ = ["active", "conv", "add"]

# Thread counts a compiled add must give the same integers for (torch.set_num_threads may
# change between calls; dynamo does not guard on it).
_MAX_THREADS = max(os.cpu_count() or 1, torch.get_num_threads())

def _enabled() -> bool:
    if not _config.compile_lowering_enabled():
        return False
    import torch._inductor.config as config
    return (not config.cpp.enable_unsafe_math_opt_flag
            and config.cpp.enable_floating_point_contract_flag in ("off", False))


def _split_cpu() -> bool:
    """oneDNN runs here but saturates u8 x s8 pairs above 128 (measured once)."""
    return onednn_u8_exact_max() >= 0 and not onednn_u8s8_exact()


def _mark_constant_for_dynamo() -> None:
    """Dynamo calls these two once per trace and keeps their result as a constant (marked when
    dynamo is imported: marking imports it, seconds that programs which never compile skip)."""
    torch.compiler.assume_constant_result(_enabled)
    torch.compiler.assume_constant_result(_split_cpu)


after_import(("torch._dynamo",), _mark_constant_for_dynamo)


def active() -> bool:
    """Whether the current trace is a ``torch.compile`` (not an export) that lowers."""
    return (torch.compiler.is_compiling() and not torch.compiler.is_exporting()
            and _enabled())


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma)
    return torch.ops.prims.fma(a, b, c)


def _f32_tensor(value: float, device: torch.device) -> torch.Tensor:
    return torch.tensor(affine.round_to_float32(value), dtype=torch.float32, device=device)


# ---- conv on saturating CPUs -----------------------------------------------------------------

def conv(x: torch.Tensor, x_scale: float, x_zero_point: int, packed: _kconv.PackedConvWeight,
         out_scale: float, out_zero_point: int, relu: bool) -> Optional[torch.Tensor]:
    """The lowered quint8 conv, or None where the opaque op is the lowering (the CPU is exact,
    or the eager path would not run oneDNN)."""
    if (not _split_cpu() or packed.onednn_weight is None or packed.transposed
            or x.dtype != torch.uint8 or x.device.type != "cpu"):
        return None
    y = torch.ops.torchquant.conv_exact_float(
        x, float(x_scale), int(x_zero_point), packed.weight,
        *weight_qparams(packed.weight_scale, packed.weight_zero_point, packed.axis),
        packed.bias, 0 if packed.axis is None else packed.axis, list(packed.stride),
        list(packed.padding), list(packed.dilation), packed.groups)
    if relu:
        y = torch.relu(y)
    mode = affine.quantize_mode(_dt.quint8, per_channel=False)
    out = quantize_formula(y, _f32_tensor(affine.inv_scale_float32(out_scale), x.device),
                           _f32_tensor(float(out_zero_point), x.device), _dt.quint8.qmin,
                           _dt.quint8.qmax, torch.uint8, mode, fma=_fma)
    layout = {4: torch.channels_last, 5: torch.channels_last_3d}.get(out.dim(),
                                                                     torch.contiguous_format)
    return out.contiguous(memory_format=layout)


# ---- add -------------------------------------------------------------------------------------

def _vector_only(a: torch.Tensor, b: torch.Tensor, qdtype: _dt.QDType) -> bool:
    """Every element of ``a + b`` takes torch's vector path with any number of threads up to
    the machine's cores (dynamo guards the compiled graph on the sizes this checks)."""
    if a.shape != b.shape or a.stride() != b.stride() or a.device.type != "cpu":
        return False
    lanes = _lanes.lane_count(qdtype.storage_dtype)
    if _lanes.dense_views([a, b], _lanes.suggested_format(a)) is None:
        return False
    return _lanes.tail_free(a.numel(), lanes, _MAX_THREADS)


def add(a: torch.Tensor, a_scale: float, a_zp: int, b: torch.Tensor, b_scale: float, b_zp: int,
        out_scale: float, out_zp: int, qdtype: _dt.QDType,
        relu: bool) -> Optional[torch.Tensor]:
    """The lowered quantized add, or None where torch's scalar tail would round some elements
    (the opaque op reproduces it)."""
    if not _vector_only(a, b, qdtype):
        return None
    device = a.device
    a_s, b_s = affine.round_to_float32(a_scale), affine.round_to_float32(b_scale)
    operands = (_f32_tensor(a_s, device), _f32_tensor(a_s * -float(a_zp), device),
                _f32_tensor(b_s, device), _f32_tensor(b_s * -float(b_zp), device),
                _f32_tensor(affine.inv_scale_float32(out_scale), device), _f32_tensor(float(out_zp), device))
    return add_formula(a, b, *operands, qdtype.qmin, qdtype.qmax, qdtype.storage_dtype, relu,
                       fma=_fma)
