"""The C++ entry of a native op, for the kernels that call ops taking a script object."""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["cpp_entry"]


def cpp_entry(name: str) -> Callable[..., Any]:
    """The C++ function behind ``torch.ops.torchquant_native.<name>.default``.  Ops taking a
    script object (an fbgemm pack, a kept oneDNN plan) are torchbind overloads, whose Python
    ``__call__`` scans the arguments for export's fake script objects on every call (as long as a
    small GEMM takes); these kernels only ever see real objects (graphs hold torchquant's
    ops, not these)."""
    return getattr(torch.ops.torchquant_native, name).default._op
