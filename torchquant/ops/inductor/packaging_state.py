"""Whether this process is compiling an AOTInductor package now.

:func:`.exact_decompositions.packaging` sets it; the freezing pass (:mod:`.fusion`) reads it
to keep to calls a package runs without torchquant (oneDNN's, not torchquant's native conv)
unless the compile is for this process (``torchquant.compile``'s AOT graphs), and the cache key
(:mod:`.cache_key`) to keep the kinds of compiled graph apart.
"""
from __future__ import annotations

import threading

__all__ = ["is_packaging", "native_allowed"]

lock = threading.Lock()
depth = [0]  # nested packaging() contexts
for_packages = [0]  # of them, compiles of packages (which run without torchquant)


def is_packaging() -> bool:
    return depth[0] > 0


def native_allowed() -> bool:
    """Whether compiled code may call torchquant's native ops: anywhere but in a package
    (``torchquant.compile``'s AOT graphs run in this process, with the library loaded)."""
    return for_packages[0] == 0
