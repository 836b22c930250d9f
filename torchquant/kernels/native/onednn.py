"""Int8 conv primitives and an exact int8 GEMM on oneDNN's own library, built once and kept.

``csrc/onednn/onednn_conv.cpp`` is built into ``_onednn.so`` against ``libdnnl.so.3`` from the
``onednn-cpu-gomp`` wheel (oneDNN's OpenMP build: the runtime torch's own threads use, so one
thread pool).  torch keeps the oneDNN inside it private, and its public
``onednn::qconv_pointwise`` op describes the conv to oneDNN again on every call; torch.ao's
conv keeps its primitive.  A :func:`conv_plan` is that kept primitive, with the weight in the
primitive's blocked layout: same attributes as torch's quantized conv (runtime input / output
scale and zero point, per-channel weight scales, float bias, ReLU), so the integers are
torch.ao's (tests/kernels/test_native_onednn.py).  :func:`int8_gemm_provider` is the
library's exact u8 x s8 -> s32 matmul (a primitive per row count), from which the native
fbgemm dynamic Linear takes its accumulator at many rows before applying fbgemm's own
epilogue: torch.ao's numbers, a few per cent faster there.

:func:`available` says whether it runs here: the library built and loaded (not with
``TORCHQUANT_ONEDNN_LIBRARY=0``), its u8 x s8 products exact on this CPU (a probe against the
float64 conv: VNNI; AVX2 and AVX-512 without VNNI saturate int16 pairs), the CPU cap not
forcing a saturating choice, and no AMX on this CPU (its AMX kernels have not been checked
against torch.ao's there; the native AMX conv and torch's oneDNN serve such CPUs).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from ... import _config
from ..._log import emit_once
from .. import cpu_isa
from ._entry import cpp_entry

__all__ = ["available", "describe", "conv_plan", "conv", "bound_conv", "int8_gemm_provider",
           "int8_matmul"]

_LIBRARY = Path(__file__).with_name("_onednn.so")
_state: dict[str, Any] = {}


def _load() -> Optional[str]:
    """Load the library once and probe it; the reason it is not used, or None."""
    if not _config.onednn_library_enabled():
        return f"disabled by {_config.ONEDNN_LIBRARY}=0"
    if "amx_int8" in cpu_isa.cpu_flags():
        return "an AMX CPU (torch's oneDNN and the native AMX conv serve it)"
    if not _LIBRARY.exists():
        return (f"not built ({_LIBRARY.name} absent: libdnnl.so.3 from onednn-cpu-gomp was "
                "not installed when the package was built)")
    try:
        torch.ops.load_library(str(_LIBRARY))
    except (OSError, RuntimeError) as e:
        return f"failed to load {_LIBRARY.name}: {e}"
    major, minor, _ = torch.ops.torchquant_native.onednn_version()
    if (major, minor) < (3, 2):
        return f"libdnnl {major}.{minor} is older than 3.2"
    if not _products_exact():
        return (f"its u8 x s8 products saturate here "
                f"({torch.ops.torchquant_native.onednn_cpu_isa()})")
    return None


def _products_exact() -> bool:
    """Whether the library's int8 convs and matmuls give the exact int32 sums for uint8 codes of
    128 and above against weights of both signs (the convs' float32 output of the unscaled
    accumulator, sums small enough to be exact in it), on the kernel kinds ResNet-like convs
    and a Linear's one and many rows reach."""
    gen = torch.Generator().manual_seed(0)
    for channels, size, kernel, stride in ((16, 8, 3, 1), (3, 16, 7, 2), (64, 4, 1, 1)):
        x = torch.randint(128, 256, (1, channels, size, size), dtype=torch.uint8, generator=gen)
        w = torch.randint(0, 2, (16, channels, kernel, kernel), generator=gen).to(torch.int8)
        w = (w * 2 - 1) * 127
        padding = [kernel // 2] * 2
        plan = torch.ops.torchquant_native.onednn_conv_plan(
            w.to(torch.int8), torch.ones(16), None, list(x.shape), [stride] * 2, padding, [1, 1],
            1, "none", torch.float32, False)
        got = torch.ops.torchquant_native.onednn_conv(x, plan, 1.0, 0, 1.0, 0)
        want = torch.nn.functional.conv2d(x.double(), w.double(), None, stride, padding)
        if not torch.equal(got.double(), want):
            return False
    for rows in (1, 37):
        a = torch.randint(128, 256, (rows, 96), dtype=torch.uint8, generator=gen)
        w = (torch.randint(0, 2, (40, 96), generator=gen) * 254 - 127).to(torch.int8)
        got = torch.ops.torchquant_native.onednn_int8_matmul(a, w)
        if not torch.equal(got.long(), a.long() @ w.long().t()):
            return False
    return True


def _reason() -> Optional[str]:
    if "reason" not in _state:
        _state["reason"] = _load()
    return _state["reason"]


def available() -> bool:
    """Whether the library's kept primitives (the convs, the Linear's GEMM) run here (says
    once, at debug level, why not)."""
    reason = _reason()
    if reason is not None:
        emit_once(logging.DEBUG, f"oneDNN library conv unused: {reason}", key="onednn-library")
        return False
    return not cpu_isa.int8_pairs_forced_saturating()


def describe() -> str:
    """One line: whether the kept oneDNN conv primitives are used, and why not."""
    reason = _reason()
    if reason is not None:
        return f"no kept oneDNN conv primitives ({reason})"
    version = ".".join(map(str, torch.ops.torchquant_native.onednn_version()))
    return (f"kept oneDNN {version} conv primitives "
            f"({torch.ops.torchquant_native.onednn_cpu_isa()})")


def conv_plan(weight: torch.Tensor, weight_scale: torch.Tensor, bias: Optional[torch.Tensor],
              in_shape: Sequence[int], stride: Sequence[int], padding: Sequence[int],
              dilation: Sequence[int], groups: int, unary: str,
              out_dtype: torch.dtype = torch.uint8, x_zero_point: Optional[int] = None,
              other_qparams: Optional[tuple[float, int]] = None) -> Any:
    """A oneDNN conv primitive for uint8 channels-last inputs of ``in_shape`` and this int8
    ``[out, in / groups, kh, kw]`` weight (zero points 0, float ``weight_scale`` per output
    channel, float ``bias``), ReLU fused where ``unary`` is ``'relu'``: run it with
    :func:`conv`.  ``x_zero_point=0`` builds it for that input zero point only (oneDNN's
    faster kernel without the zero point's compensation, as torch's conv does).
    ``other_qparams`` (scale, zero point): the conv adds a uint8 operand of the output's shape
    before the ReLU (torch's ConvAdd2d / ConvAddReLU2d), given to each :func:`conv` call."""
    reason = _reason()
    if reason is not None:
        raise RuntimeError(f"torchquant's oneDNN library conv is not available: {reason}")
    return torch.ops.torchquant_native.onednn_conv_plan(
        weight, weight_scale, bias, list(in_shape), list(stride), list(padding), list(dilation),
        groups, unary, out_dtype, x_zero_point != 0,
        None if other_qparams is None else float(other_qparams[0]),
        0 if other_qparams is None else int(other_qparams[1]))


def conv(x: torch.Tensor, plan: Any, x_scale: float, x_zero_point: int, out_scale: float,
         out_zero_point: int, other: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``plan`` on ``x`` (uint8 codes of the plan's input shape): uint8 codes quantized with
    ``out_scale`` / ``out_zero_point`` (channels last), or the float32 output; ``other``: the
    added operand's codes, where the plan has one."""
    return torch.ops.torchquant_native.onednn_conv.default(x, plan, x_scale, x_zero_point,
                                                          out_scale, out_zero_point, other)


def bound_conv(plan: Any, x_scale: float, x_zero_point: int, out_scale: float,
               out_zero_point: int) -> Callable[[torch.Tensor, Optional[torch.Tensor]],
                                                torch.Tensor]:
    """:func:`conv` with everything but the input (and the added operand) bound, for an eager
    plan's every call: ``run(x, other)``, through the op's C++ entry (:func:`._entry.cpp_entry`:
    the Python call's search for fake script objects was a third of what an eager conv spends
    outside its kernel, BENCHMARKS.md, twelfth session)."""
    call = cpp_entry("onednn_conv")
    qparams = (float(x_scale), int(x_zero_point), float(out_scale), int(out_zero_point))
    return lambda x, other: call(x, plan, *qparams, other)


def int8_gemm_provider() -> int:
    """The address of the library's exact u8 x s8 -> s32 GEMM table
    (``csrc/int8_gemm_provider.h``), which the native fbgemm Linear takes its accumulator
    from (``set_int8_gemm_provider``): oneDNN's brgemm matmul, fbgemm's epilogue."""
    return int(torch.ops.torchquant_native.onednn_int8_gemm_provider())


def int8_matmul(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``a @ weight.T`` for uint8 ``a`` [M, K] and int8 ``weight`` [N, K], exact int32 sums,
    through that GEMM (for tests and the probe)."""
    return torch.ops.torchquant_native.onednn_int8_matmul(a, weight)
