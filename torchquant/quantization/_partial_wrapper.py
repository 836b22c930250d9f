"""The constructors a qconfig holds: ``with_args`` / ``with_callable_args`` factories.

Observers, fake quants and the affine-quantized observers all build theirs here, so the
modules defining them need not import one another for it.  :mod:`.observer` re-exports these
names (their torch path).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable


class _PartialWrapper:
    """A reusable constructor: ``functools.partial`` plus keyword arguments produced by
    zero-argument callables at construction time (so each instance gets fresh values)."""

    def __init__(self, p: Callable[..., Any]) -> None:
        self.p = p
        self.callable_args: dict[str, Callable[[], Any]] = {}

    def __call__(self, *args: Any, **keywords: Any) -> Any:
        late = {name: make() for name, make in self.callable_args.items() if name not in keywords}
        return self.p(*args, **late, **keywords)

    def __repr__(self) -> str:
        return repr(self.p) + repr(self.callable_args)

    def with_args(self, **kwargs: Any) -> "_PartialWrapper":
        return _with_args(self, **kwargs)

    def with_callable_args(self, **kwargs: Callable[[], Any]) -> "_PartialWrapper":
        wrapped = _PartialWrapper(self.p)
        wrapped.callable_args = {**self.callable_args, **kwargs}
        return wrapped


def _with_args(cls_or_self: Any, **kwargs: Any) -> _PartialWrapper:
    """Factory building ``cls_or_self(**kwargs)`` anew on every call."""
    return _PartialWrapper(partial(cls_or_self, **kwargs))


def _with_callable_args(cls_or_self: Any, **kwargs: Callable[[], Any]) -> _PartialWrapper:
    """Factory whose keyword arguments are the results of calling ``kwargs``' values."""
    return _PartialWrapper(partial(cls_or_self)).with_callable_args(**kwargs)
