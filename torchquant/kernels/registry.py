"""The kernel registry itself: ``register`` / ``get`` and the kernel mode.

The implementation modules register into it, and :mod:`torchquant.kernels` imports them all
and re-exports these names; keeping the registry in its own module is what lets the
implementations import it without importing their own package back.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

import torch

from .. import _config

__all__ = ["Kernel", "register", "get", "implementations", "reference_only", "set_mode", "mode"]


@dataclass
class Kernel:
    op: str
    name: str
    fn: Callable
    devices: tuple[str, ...]
    applies: Optional[Callable[..., bool]] = None
    available: Callable[[], bool] = field(default=lambda: True)

    def accepts(self, tensor: torch.Tensor, hints: dict) -> bool:
        if tensor.device.type not in self.devices or not self.available():
            return False
        return self.applies is None or bool(self.applies(tensor, **hints))


_REGISTRY: dict[str, list[Kernel]] = {}
_MODE = _config.kernels_mode()  # read once, at import


def register(op: str, name: str, devices: tuple[str, ...] = ("cpu", "cuda"),
             applies: Optional[Callable[..., bool]] = None,
             available: Optional[Callable[[], bool]] = None) -> Callable[[Callable], Callable]:
    """Decorator adding ``fn`` as implementation ``name`` of ``op``.  Name 'reference' is the fallback."""
    def deco(fn: Callable) -> Callable:
        k = Kernel(op, name, fn, devices, applies, available or (lambda: True))
        impls = [i for i in _REGISTRY.setdefault(op, []) if i.name != name]
        if name == "reference":
            impls.append(k)
        else:
            impls.insert(0, k)
        _REGISTRY[op] = impls
        return fn
    return deco


def implementations(op: str) -> dict[str, Kernel]:
    """All implementations of ``op`` by name (tests compare them against the reference)."""
    return {k.name: k for k in _REGISTRY.get(op, [])}


def get(op: str, tensor: torch.Tensor, **hints) -> Callable:
    """The implementation of ``op`` to use for ``tensor`` under the current mode."""
    impls = _REGISTRY.get(op)
    if not impls:
        raise NotImplementedError(f"torchquant has no kernel registered for {op!r}")
    if _MODE != "reference" and not torch.compiler.is_compiling():
        for k in impls:
            if k.name != "reference" and k.accepts(tensor, hints):
                return k.fn
    return impls[-1].fn


def mode() -> str:
    """The current mode: ``TORCHQUANT_KERNELS`` at import, or what :func:`set_mode` /
    :func:`reference_only` set since."""
    return _MODE


def set_mode(new_mode: str) -> None:
    """'auto' (fast kernels where they apply) or 'reference' (plain torch everywhere)."""
    global _MODE
    if new_mode not in ("auto", "reference"):
        raise ValueError(f"kernel mode must be 'auto' or 'reference', got {new_mode!r}")
    _MODE = new_mode


@contextlib.contextmanager
def reference_only() -> Iterator[None]:
    """Run the enclosed code on the plain-torch reference kernels."""
    old = _MODE
    set_mode("reference")
    try:
        yield
    finally:
        set_mode(old)

