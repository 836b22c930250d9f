"""torchquant's own CPU-dependent choices, and the one setting that forces them lower.

Three things choose paths by CPU: oneDNN (its ISA, forced with ``ONEDNN_MAX_CPU_ISA``), ATen's
vector kernels (``ATEN_CPU_CAPABILITY``) and torchquant itself.  torchquant's choice is
whether oneDNN's u8 x s8 int8 kernels are exact for every uint8 activation (VNNI / AMX:
int32 accumulation) or saturate int16 pairs of products above 128 (AVX2, AVX-512 without
VNNI); that one fact (``kernels.onednn_exactness.onednn_u8_exact_max``, measured) picks the
split of large activations into two exact halves, the sparse high half, and the small-M float32
GEMM of the dynamic Linear.  ``TORCHQUANT_CPU_ISA`` caps it, read once at import:

* ``default`` (or unset): what the CPU measures;
* ``avx512_vnni`` / ``amx``: the same (the exact int8 paths need VNNI; AMX adds nothing that
  changes torchquant's choices);
* ``avx2`` / ``avx512``: behave as on a CPU whose int8 pairs saturate, even where oneDNN is
  exact -- the paths an AVX2-only server takes, run on a newer CPU.

Every path gives the same integer codes (tests/kernels/test_cpu_paths.py).  The float16
dynamic Linear has no CPU choice of its own (a float32 GEMM of the widened weight).
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable, Iterator

from .. import _config

__all__ = ["ISA_LEVELS", "cpu_isa_cap", "set_cpu_isa_cap", "forced_cpu_isa",
           "int8_pairs_forced_saturating", "cpu_flags", "on_change"]

ISA_LEVELS = _config.CPU_ISA_LEVELS
_SATURATING = ("avx2", "avx512")
_CAP = _config.cpu_isa()  # read once, at import
_LISTENERS: list[Callable[[], None]] = []


def cpu_isa_cap() -> str:
    """The level torchquant's CPU choices are capped at (:data:`ISA_LEVELS`)."""
    return _CAP


def on_change(listener: Callable[[], None]) -> Callable[[], None]:
    """Register ``listener`` (drops a cache of a choice made under the old cap)."""
    _LISTENERS.append(listener)
    return listener


def set_cpu_isa_cap(level: str) -> None:
    """Cap torchquant's CPU choices at ``level`` from now on.  Weights packed before keep the
    plans they built (modules re-plan when repacked); tests use :func:`forced_cpu_isa`."""
    global _CAP
    _CAP = _config.parse_cpu_isa(level)
    for listener in _LISTENERS:
        listener()


@contextlib.contextmanager
def forced_cpu_isa(level: str) -> Iterator[None]:
    """Run the enclosed code with torchquant's CPU choices capped at ``level``."""
    old = _CAP
    set_cpu_isa_cap(level)
    try:
        yield
    finally:
        set_cpu_isa_cap(old)


def int8_pairs_forced_saturating() -> bool:
    """Whether the cap makes torchquant treat oneDNN's u8 x s8 kernels as saturating."""
    return _CAP in _SATURATING


@functools.cache
def cpu_flags() -> tuple[str, ...]:
    """The x86 SIMD flags of this CPU that matter here (from /proc/cpuinfo, read once; empty
    elsewhere)."""
    interesting = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                   "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_int8", "amx_bf16")
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    present = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in interesting if flag in present)
    except OSError:
        pass
    return ()
