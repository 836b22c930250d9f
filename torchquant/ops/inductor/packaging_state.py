"""Whether this process is compiling an AOTInductor package now, and whether the compile in
progress is ``torchquant.compile``'s.

:func:`.exact_decompositions.packaging` sets it; the freezing pass (:mod:`.fusion`) reads it
to keep to calls a package runs without torchquant (oneDNN's, not torchquant's native conv)
unless the compile is for this process (``torchquant.compile``'s AOT graphs), and the cache key
(:mod:`.cache_key`) to keep the kinds of compiled graph apart.  The attention rewrite
(:mod:`.attention`) applies to ``torchquant.compile``'s graphs only.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Iterator

__all__ = ["is_packaging", "native_allowed", "torchquant_compile", "in_torchquant_compile"]

lock = threading.Lock()
depth = [0]  # nested packaging() contexts
for_packages = [0]  # of them, compiles of packages (which run without torchquant)
_calls = threading.local()  # this thread's calls of torchquant.compile's torch.compile path


def is_packaging() -> bool:
    return depth[0] > 0


def native_allowed() -> bool:
    """Whether compiled code may call torchquant's native ops: anywhere but in a package
    (``torchquant.compile``'s AOT graphs run in this process, with the library loaded)."""
    return for_packages[0] == 0


@contextlib.contextmanager
def torchquant_compile() -> Iterator[None]:
    """Inside: this thread runs a model ``torchquant.compile`` handed to ``torch.compile``
    (Dynamo and inductor compile in the calling thread, on its first call)."""
    _calls.depth = getattr(_calls, "depth", 0) + 1
    try:
        yield
    finally:
        _calls.depth -= 1


def in_torchquant_compile() -> bool:
    """Whether the compile in progress is ``torchquant.compile``'s: its ahead-of-time graphs
    (a package compile for this process) or its ``torch.compile`` path."""
    return getattr(_calls, "depth", 0) > 0 or (depth[0] > 0 and for_packages[0] == 0)
