"""Input checks shared by the quantized operators (torch's messages and exception types)."""
from __future__ import annotations

from typing import Any

from .qtensor import QTensor, _refuse_jit_trace

__all__ = ["require_quantized", "require_per_tensor"]


def require_quantized(x: Any, op: str) -> QTensor:
    """``x`` as a per-tensor 8/32-bit QTensor; ValueError for float input, as torch.
    Refuses torch.jit.trace (a quantized module's input: TorchScript cannot carry QTensors)."""
    _refuse_jit_trace()
    if not isinstance(x, QTensor):
        raise ValueError(f"Input to 'quantized.{op}' must be quantized!")
    return require_per_tensor(x, op)


def require_per_tensor(q: QTensor, op: str) -> QTensor:
    """torch's quantized operator kernels take per-tensor affine, non-packed tensors only."""
    if q.axis is not None:
        raise NotImplementedError(f"quantized.{op} supports per-tensor quantized inputs only; "
                                  f"got a {q.qscheme()!r} tensor")
    if q.qdtype.is_sub_byte:
        raise NotImplementedError(f"quantized.{op} does not support {q.qdtype!r} inputs")
    return q
