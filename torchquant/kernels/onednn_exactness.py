"""Whether oneDNN's (and ``torch._int_mm``'s) int8 products are exact on this CPU, measured once.

oneDNN's u8 x s8 linear and conv accumulate in int32 where the CPU has VNNI or AMX.  On CPUs
without an int32-accumulating u8 x s8 instruction (AVX2 / AVX-512 without VNNI or AMX) oneDNN's
``vpmaddubsw`` saturates ``u8*s8 + u8*s8`` to int16 and the GEMM is wrong for activations above
128: :func:`onednn_u8_exact_max` finds which (measured once per process, capped by
``TORCHQUANT_CPU_ISA``), :func:`onednn_exact_for` answers for one input, and the Linear and conv
kernels (:mod:`.linear`, :mod:`.conv`) run larger inputs there as two exact halves.
:func:`int_mm_exact_on_cpu` asks the same of ``torch._int_mm``.

This module is the one home of these probes and their caches: every answer here reads
:func:`onednn_u8_exact_max` at call time, so code that must see a forced answer reads them
through this module.
"""
from __future__ import annotations

import functools

import torch

from . import cpu_isa

__all__ = ["onednn_available", "onednn_u8_exact_max", "onednn_u8s8_exact", "onednn_exact_for",
           "onednn_usable", "int_mm_exact_on_cpu", "ONEDNN_SAFE_U8_MAX"]


@functools.cache
def onednn_available() -> bool:
    """Whether this torch build has oneDNN's quantized linear/conv ops on CPU (asked once: the
    registry checks it on every call)."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.onednn, "qlinear_pointwise")
            and hasattr(torch.ops.onednn, "qconv_pointwise"))


# --------------------------------------------------------------------------------------------
# oneDNN's u8 x s8 exactness on this CPU
# --------------------------------------------------------------------------------------------

# Without VNNI / AMX, x86 u8 x s8 dot products use ``vpmaddubsw``, which adds the two products
# ``u8 * s8 + u8 * s8`` with int16 saturation: 255 * 127 * 2 = 64770 does not fit.  With
# activations <= 128 no pair can leave int16 (2 * 128 * -128 = -32768, 2 * 128 * 127 = 32512),
# which is why torch's x86 / fbgemm qconfigs quantize activations to 0..127 (reduce_range).
ONEDNN_SAFE_U8_MAX = 128
_FULL_U8_MAX = 255


def _onednn_linear_exact(x_value: int, w_value: int) -> bool:
    k, n = 64, 16
    w = torch.full((n, k), w_value, dtype=torch.int8)
    ones, zeros = torch.ones(n), torch.zeros(n, dtype=torch.int64)
    packed = torch.ops.onednn.qlinear_prepack(w, None)
    for rows in (1, 8):  # oneDNN may pick a GEMV kernel for one row
        x = torch.full((rows, k), x_value, dtype=torch.uint8)
        y = torch.ops.onednn.qlinear_pointwise(x, 1.0, 0, packed, ones, zeros, None, 1.0, 0,
                                               torch.float32, "none", [], "")
        if not bool((y == float(x_value * w_value * k)).all()):
            return False
    return True


def _onednn_conv_exact(x_value: int, w_value: int) -> bool:
    for dims in (1, 2, 3):
        for c_in, c_out, kernel, groups in ((8, 16, 3, 1), (8, 16, 1, 1), (8, 8, 3, 8)):
            w = torch.full((c_out, c_in // groups) + (kernel,) * dims, w_value, dtype=torch.int8)
            ones, zeros = torch.ones(c_out), torch.zeros(c_out, dtype=torch.int64)
            one, zero = [1] * dims, [0] * dims
            packed = torch.ops.onednn.qconv_prepack(w, ones, 1.0, 0, one, zero, one, groups, None)
            x = torch.full((2, c_in) + (4,) * dims, x_value, dtype=torch.uint8)
            y = torch.ops.onednn.qconv_pointwise(x, 1.0, 0, packed, ones, zeros, None, one, zero,
                                                 one, groups, 1.0, 0, torch.float32, "none", [],
                                                 "")
            exact = x_value * w_value * (c_in // groups) * kernel ** dims
            if not bool((y == float(exact)).all()):
                return False
    return True


def onednn_u8_exact_max() -> int:
    """The largest uint8 activation for which oneDNN's u8 x s8 linear and conv are exact here:
    255 where they accumulate in int32 (VNNI, AMX), :data:`ONEDNN_SAFE_U8_MAX` (128) where
    pairs of products saturate to int16 (AVX2, AVX-512 without VNNI), -1 where even that
    fails or oneDNN is missing (then its kernels are never used).

    Measured once, on inputs whose every pair of products sits at the edge (all 255 x 127,
    then all 128 x -128), for one and several rows and for dense, 1x1 and depthwise 1-3d
    convs; the answer is exact integers or not, so it does not depend on rounding.  At most
    :data:`ONEDNN_SAFE_U8_MAX` where ``TORCHQUANT_CPU_ISA`` is ``avx2`` / ``avx512``
    (:mod:`.cpu_isa`: the saturating CPUs' paths, forced on a newer one).
    """
    measured = _onednn_u8_exact_max_measured()
    if measured > ONEDNN_SAFE_U8_MAX and cpu_isa.int8_pairs_forced_saturating():
        return ONEDNN_SAFE_U8_MAX
    return measured


@functools.cache
def _onednn_u8_exact_max_measured() -> int:
    if not onednn_available():
        return -1
    from torch.utils._python_dispatch import _disable_current_modes
    try:
        # real tensors even when first asked during a trace (export's fake / proxy modes):
        # the answer is cached for the process
        with _disable_current_modes(), torch.no_grad():
            if _onednn_linear_exact(255, 127) and _onednn_conv_exact(255, 127):
                return _FULL_U8_MAX
            if (_onednn_linear_exact(ONEDNN_SAFE_U8_MAX, -128)
                    and _onednn_conv_exact(ONEDNN_SAFE_U8_MAX, -128)):
                return ONEDNN_SAFE_U8_MAX
    except RuntimeError:  # a build whose oneDNN ops exist but cannot run here
        pass
    return -1


def onednn_u8s8_exact() -> bool:
    """Whether oneDNN's u8 x s8 kernels are exact for every uint8 activation on this CPU."""
    return onednn_u8_exact_max() == _FULL_U8_MAX


def onednn_exact_for(x: torch.Tensor) -> bool:
    """Whether oneDNN computes ``x``'s (uint8) GEMM / conv exactly on this CPU: always where it
    accumulates in int32; elsewhere only when ``x.max() <= 128`` (one reduction per call, on
    such CPUs only)."""
    limit = onednn_u8_exact_max()
    if limit >= _FULL_U8_MAX:
        return True
    if limit < 0:
        return False
    return x.numel() == 0 or int(x.max()) <= limit


def onednn_usable() -> bool:
    """oneDNN's ops exist and are exact at least on activations <= 128 (the registry's
    ``available`` for the oneDNN kernels, and whether weights get a oneDNN copy)."""
    return onednn_u8_exact_max() >= 0


@functools.cache
def int_mm_exact_on_cpu() -> bool:
    """Whether ``torch._int_mm`` is exact on this CPU for all int8 operands.  ATen runs it on
    oneDNN where it sees AVX-512 VNNI, else on its own loop; oneDNN held below VNNI
    (``ONEDNN_MAX_CPU_ISA=AVX2`` on a VNNI CPU) then computes s8 x s8 as (s8 + 128) x s8 with
    saturating int16 pairs.  Measured once on edge values, as :func:`onednn_u8_exact_max`, with
    any tracing mode set aside: the first question may come from inside a trace (a
    decomposition while ``torch.export`` / AOTInductor traces), where the probe's real tensors
    would meet the trace's proxy mode, fail, and cache "inexact" for the process."""
    from torch.utils._python_dispatch import _disable_current_modes
    k = 64
    try:
        with _disable_current_modes(), torch.no_grad():
            for x_value, w_value in ((127, 127), (127, -128), (-128, -128)):
                x = torch.full((32, k), x_value, dtype=torch.int8)
                w = torch.full((k, 16), w_value, dtype=torch.int8)
                if not bool((torch._int_mm(x, w) == x_value * w_value * k).all()):
                    return False
    except RuntimeError:
        return False
    return True
