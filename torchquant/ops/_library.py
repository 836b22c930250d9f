"""Shared machinery of the ``torch.ops.torchquant`` namespace.

Every op is declared once with ``torch.library.custom_op`` (plain tensors and Python numbers
in, plain tensors out) and a fake implementation, so ``torch.export`` and ``torch.compile``
see one opaque node per quantized computation.  Eager hot paths skip the dispatcher and call
the implementation directly; :func:`traced` says when the registered op must be used instead.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.utils.weak import WeakIdKeyDictionary

from ..kernels import registry as _registry

__all__ = ["NAMESPACE", "traced", "PackCache", "weight_qparams", "kernel_mode"]


# The kernel registry's mode (``auto`` / ``reference``): part of the key of every call that a
# module keeps bound (a forced mode must not reuse another mode's kernel).  The registry's own
# public accessor, re-exported (no wrapper: the eager forwards call it on every call).
kernel_mode = _registry.mode

NAMESPACE = "torchquant"


def traced(*tensors: Optional[torch.Tensor]) -> bool:
    """True while dynamo / export / make_fx trace the call: the tensors are fake, functional or
    proxied (not plain ``torch.Tensor``), or dynamo is compiling."""
    if torch.compiler.is_compiling():
        return True
    return any(t is not None and type(t) is not torch.Tensor for t in tensors)


def plain_eager(x: torch.Tensor) -> bool:
    """A plain tensor outside any tracing (no dynamo, no fake / proxy mode active): values made
    from it may be kept in a cache and shared by later calls."""
    return (type(x) is torch.Tensor and not torch.compiler.is_compiling()
            and torch._C._len_torch_dispatch_stack() == 0)


def cached(cache: dict, limit: int, key: Any, build: Callable[[], Any]) -> Any:
    """``cache[key]``, built on a miss and kept when built from real tensors only (no fake,
    functional or traced ones, outside dynamo); the cache is emptied at ``limit`` entries."""
    value = cache.get(key)
    if value is None:
        value = build()
        items = value if isinstance(value, tuple) else (value,)
        if not torch.compiler.is_compiling() and all(
                type(t) is torch.Tensor for t in items if isinstance(t, torch.Tensor)):
            if len(cache) >= limit:
                cache.clear()
            cache[key] = value
    return value


def weight_qparams(scale: torch.Tensor, zero_point: torch.Tensor,
                   axis: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed weight's qparams as an op takes them: 0-d per tensor (a packed weight may hold
    a 1-element tensor), 1-d per channel -- the rank tells the op which."""
    if axis is None:
        return scale.reshape(()), zero_point.reshape(())
    return scale, zero_point


class PackCache:
    """Prepacked forms keyed on the plain tensors they were built from.

    An exported or compiled graph passes a module's integer weight, its qparams and bias to an
    op on every call; the packed form (oneDNN blocking, weight sums) is built once per
    (weight, qparams, bias) and kept while the weight tensor lives.  An in-place change of any
    of them (``_version``) rebuilds it.  Inference tensors (made under
    ``torch.inference_mode``) keep no version: for them the identity alone is the key, so an
    in-place change of such a weight inside inference mode is not seen.
    """

    def __init__(self, build: Callable[..., Any]) -> None:
        self._build = build
        self._entries = WeakIdKeyDictionary()

    @staticmethod
    def _stamp(tensors: tuple) -> tuple:
        return tuple(None if t is None else
                     (id(t), None if t.is_inference() else t._version)
                     if isinstance(t, torch.Tensor) else t for t in tensors)

    def get(self, weight: torch.Tensor, *rest: Any) -> Any:
        stamp = self._stamp((weight, *rest))
        entry = self._entries.get(weight)
        if entry is None or entry[0] != stamp:
            entry = (stamp, self._build(weight, *rest))
            self._entries[weight] = entry
        return entry[1]
