"""Kernel registry: one name per operation, a plain-torch reference and optional fast variants.

``get(op, tensor, **hints)`` returns the first registered implementation whose device matches,
that is available on this machine and that accepts the call (``applies``); the reference is
always last and always accepts.  Force the reference everywhere with the environment variable
``TORCHQUANT_KERNELS=reference`` or, in code, ``with torchquant.kernels.reference_only(): ...``.
"""
from __future__ import annotations

from .registry import Kernel, get, implementations, mode, reference_only, register, set_mode

# The implementations register themselves when imported.
from . import (reference, cpu_compiled, linear, conv, embedding,  # noqa: E402,F401
               recurrent, native)

__all__ = ["Kernel", "register", "get", "implementations", "reference_only", "set_mode", "mode"]
