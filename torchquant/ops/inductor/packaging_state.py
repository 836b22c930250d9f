"""Whether this process is compiling an AOTInductor package now.

:func:`.exact_decompositions.packaging` sets it; the freezing pass (:mod:`.fusion`) reads it
to keep to calls a package runs without torchquant (oneDNN's, not torchquant's native conv),
and the cache key (:mod:`.cache_key`) to keep the two kinds of compiled graph apart.
"""
from __future__ import annotations

import threading

__all__ = ["is_packaging"]

lock = threading.Lock()
depth = [0]  # nested packaging() contexts


def is_packaging() -> bool:
    return depth[0] > 0
