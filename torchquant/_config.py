"""torchquant's environment switches, read in this one module.

Every ``TORCHQUANT_*`` variable the package reads (and the one oneDNN variable its compile-cache
key records) is read here, through one small accessor each.  An accessor reads the environment
when it is called; the module that uses the value decides when that is -- some read it once at
import into a module constant (tests monkeypatch those constants), some read it on every call
(tests set the variable with ``monkeypatch.setenv`` or in a subprocess).  This module imports
only the standard library, so every layer may import it.

* ``TORCHQUANT_QUIET``: anything but unset, empty or ``0`` silences the stderr fallback of
  torchquant's messages and the calibration progress bar (read per message).
* ``TORCHQUANT_KERNELS``: ``auto`` (default) or ``reference`` (plain-torch kernels only; read
  at import).
* ``TORCHQUANT_CPU_ISA``: cap torchquant's CPU choices at ``avx2`` / ``avx512`` /
  ``avx512_vnni`` / ``amx`` / ``default`` (read at import; also part of the compile-cache key).
* ``TORCHQUANT_NATIVE``: ``0`` keeps the native C++ library from loading (read on first use).
* ``TORCHQUANT_ONEDNN_LIBRARY``: ``0`` keeps torchquant's library on oneDNN's own libdnnl
  (``_onednn.so``: the kept conv primitives, the dynamic Linear's GEMM) from loading (read on
  first use).
* ``TORCHQUANT_COMPILE_LOWERING``: ``0`` turns off the exact compile lowerings of conv / add
  (read per call).
* ``TORCHQUANT_ONEDNN_MIN_ROWS``: fewest rows the int8 Linear sends to oneDNN (default 1; read
  at import).
* ``TORCHQUANT_SMALL_M_MAX_ROWS``: most rows the exact float32 GEMM of the dynamic Linear takes
  (default 16; read at import).
* ``TORCHQUANT_COMPILED_HOT_CALLS``: calls before a signature gets a compiled CPU kernel
  (default 2; read at import; set, it also turns off amortised builds).
* ``TORCHQUANT_COMPILED_FIRST_BUILD_ESTIMATE_S``: seconds a process's first kernel build is
  expected to take (default 10; read at import).
* ``TORCHQUANT_COMPILED_BUILD_ESTIMATE_S``: seconds a later build is expected to take (default
  1; read at import; set, it is also the first build's estimate).
* ``ONEDNN_MAX_CPU_ISA``: oneDNN's own ISA cap, read here only for the compile-cache key.
* ``TORCHQUANT_FUSED_GATES``: ``0`` turns off the native library's fused LSTM / GRU gate loops
  (read by the C++ code itself, once).
* ``TORCHQUANT_BUILD_NATIVE``: ``0`` skips building the native library (read by setup.py).
"""
from __future__ import annotations

import os

__all__ = ["QUIET", "KERNELS", "CPU_ISA", "NATIVE", "ONEDNN_LIBRARY", "COMPILE_LOWERING",
           "ONEDNN_MIN_ROWS",
           "SMALL_M_MAX_ROWS", "COMPILED_HOT_CALLS", "COMPILED_FIRST_BUILD_ESTIMATE_S",
           "COMPILED_BUILD_ESTIMATE_S", "ONEDNN_MAX_CPU_ISA", "CPU_ISA_LEVELS",
           "KERNEL_MODES", "DEFAULT_COMPILED_HOT_CALLS", "quiet", "kernels_mode",
           "parse_kernels_mode", "cpu_isa", "parse_cpu_isa", "native_enabled",
           "onednn_library_enabled",
           "compile_lowering_enabled",
           "onednn_min_rows", "small_m_max_rows", "compiled_hot_calls",
           "compiled_hot_calls_set", "compiled_first_build_estimate_s",
           "compiled_build_estimate_s", "compiled_build_estimate_set", "cache_key_environment"]

QUIET = "TORCHQUANT_QUIET"
KERNELS = "TORCHQUANT_KERNELS"
CPU_ISA = "TORCHQUANT_CPU_ISA"
NATIVE = "TORCHQUANT_NATIVE"
ONEDNN_LIBRARY = "TORCHQUANT_ONEDNN_LIBRARY"
COMPILE_LOWERING = "TORCHQUANT_COMPILE_LOWERING"
ONEDNN_MIN_ROWS = "TORCHQUANT_ONEDNN_MIN_ROWS"
SMALL_M_MAX_ROWS = "TORCHQUANT_SMALL_M_MAX_ROWS"
COMPILED_HOT_CALLS = "TORCHQUANT_COMPILED_HOT_CALLS"
COMPILED_FIRST_BUILD_ESTIMATE_S = "TORCHQUANT_COMPILED_FIRST_BUILD_ESTIMATE_S"
COMPILED_BUILD_ESTIMATE_S = "TORCHQUANT_COMPILED_BUILD_ESTIMATE_S"
ONEDNN_MAX_CPU_ISA = "ONEDNN_MAX_CPU_ISA"

CPU_ISA_LEVELS = ("avx2", "avx512", "avx512_vnni", "amx", "default")
KERNEL_MODES = ("auto", "reference")
DEFAULT_COMPILED_HOT_CALLS = 2


def quiet() -> bool:
    """``TORCHQUANT_QUIET``: True unless it is unset, empty or exactly ``0`` (no stripping)."""
    return os.environ.get(QUIET, "") not in ("", "0")


def parse_kernels_mode(value: str) -> str:
    """A ``TORCHQUANT_KERNELS`` value, stripped and lower-cased (blank: ``auto``); ValueError
    unless it is one of :data:`KERNEL_MODES`."""
    mode = value.strip().lower() or "auto"
    if mode not in KERNEL_MODES:
        raise ValueError(f"{KERNELS} must be 'auto' or 'reference', got {mode!r}")
    return mode


def kernels_mode() -> str:
    """``TORCHQUANT_KERNELS`` (default ``auto``), parsed by :func:`parse_kernels_mode`."""
    return parse_kernels_mode(os.environ.get(KERNELS, "auto"))


def parse_cpu_isa(value: str) -> str:
    """A ``TORCHQUANT_CPU_ISA`` level, stripped and lower-cased (blank: ``default``);
    ValueError unless it is one of :data:`CPU_ISA_LEVELS`."""
    level = value.strip().lower() or "default"
    if level not in CPU_ISA_LEVELS:
        raise ValueError(f"{CPU_ISA} must be one of {', '.join(CPU_ISA_LEVELS)}, got {value!r}")
    return level


def cpu_isa() -> str:
    """``TORCHQUANT_CPU_ISA`` (default ``default``), parsed by :func:`parse_cpu_isa`."""
    return parse_cpu_isa(os.environ.get(CPU_ISA, "default"))


def native_enabled() -> bool:
    """``TORCHQUANT_NATIVE``: False only when it is ``0`` (surrounding white space ignored)."""
    return os.environ.get(NATIVE, "1").strip() != "0"


def onednn_library_enabled() -> bool:
    """``TORCHQUANT_ONEDNN_LIBRARY``: False only when it is ``0`` (white space ignored)."""
    return os.environ.get(ONEDNN_LIBRARY, "1").strip() != "0"


def compile_lowering_enabled() -> bool:
    """``TORCHQUANT_COMPILE_LOWERING``: False only when it is ``0`` (white space ignored)."""
    return os.environ.get(COMPILE_LOWERING, "1").strip() != "0"


def onednn_min_rows() -> int:
    """``TORCHQUANT_ONEDNN_MIN_ROWS`` as an int (default 1)."""
    return int(os.environ.get(ONEDNN_MIN_ROWS, "1"))


def small_m_max_rows() -> int:
    """``TORCHQUANT_SMALL_M_MAX_ROWS`` as an int (default 16)."""
    return int(os.environ.get(SMALL_M_MAX_ROWS, "16"))


def compiled_hot_calls() -> int:
    """``TORCHQUANT_COMPILED_HOT_CALLS`` as an int (default :data:`DEFAULT_COMPILED_HOT_CALLS`)."""
    return int(os.environ.get(COMPILED_HOT_CALLS, str(DEFAULT_COMPILED_HOT_CALLS)))


def compiled_hot_calls_set() -> bool:
    """Whether ``TORCHQUANT_COMPILED_HOT_CALLS`` is set at all (to any value)."""
    return COMPILED_HOT_CALLS in os.environ


def compiled_first_build_estimate_s() -> float:
    """``TORCHQUANT_COMPILED_FIRST_BUILD_ESTIMATE_S`` as a float (default 10.0)."""
    return float(os.environ.get(COMPILED_FIRST_BUILD_ESTIMATE_S, "10.0"))


def compiled_build_estimate_s() -> float:
    """``TORCHQUANT_COMPILED_BUILD_ESTIMATE_S`` as a float (default 1.0)."""
    return float(os.environ.get(COMPILED_BUILD_ESTIMATE_S, "1.0"))


def compiled_build_estimate_set() -> bool:
    """Whether ``TORCHQUANT_COMPILED_BUILD_ESTIMATE_S`` is set at all (to any value)."""
    return COMPILED_BUILD_ESTIMATE_S in os.environ


def cache_key_environment() -> str:
    """The raw ``TORCHQUANT_CPU_ISA`` and ``ONEDNN_MAX_CPU_ISA`` values (empty when unset) as
    ``TORCHQUANT_CPU_ISA=...;ONEDNN_MAX_CPU_ISA=...``: what inductor's compile-cache key must
    tell apart."""
    return (f"{CPU_ISA}={os.environ.get(CPU_ISA, '')};"
            f"{ONEDNN_MAX_CPU_ISA}={os.environ.get(ONEDNN_MAX_CPU_ISA, '')}")
