"""Run a callback once a module has been imported, without importing it.

torchquant's inductor lowerings and passes, and the dynamo markers of a few functions, need
``torch._inductor`` / ``torch._dynamo``, which cost seconds to import.  Most programs that import
torchquant never compile, so these are installed when torch itself imports the module they
extend (every inductor compile imports ``torch._inductor.compile_fx`` before it decomposes,
lowers or freezes a graph), or at once where it is already imported.

While a callback waits, every ``torch.*`` module imported passes through :class:`_Finder`, which
counts the imports in progress; callbacks run only when that count is back to zero, so a
callback's own imports never meet a half-imported torch module (torch's import chains are
circular in places: ``torch._inductor`` imports ``torch._dynamo``, which imports inductor
modules back).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Callable

__all__ = ["after_import"]

# (the modules a callback waits for, the callback)
_PENDING: list[tuple[tuple[str, ...], Callable[[], None]]] = []
_IMPORTS_IN_PROGRESS = 0  # torch modules whose code runs now, counted while callbacks wait


def _initializing(name: str) -> bool:
    spec = getattr(sys.modules.get(name), "__spec__", None)
    return bool(getattr(spec, "_initializing", False))


def _is_torch(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


def _run_pending() -> None:
    for entry in list(_PENDING):
        names, callback = entry
        if entry not in _PENDING or not any(name in sys.modules for name in names):
            continue
        _PENDING.remove(entry)  # first: the imports it makes must not run it again
        try:
            callback()
        except Exception as error:  # never break the user's import of torch's module
            warnings.warn(f"torchquant: setting up for {names[0]} failed ({error!r}); "
                          "compiled graphs run torchquant's ops unfused", RuntimeWarning,
                          stacklevel=2)
    if not _PENDING and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of each torch module imported while callbacks wait: counts the imports
    in progress, and tries the callbacks when the outermost one has finished."""

    def find_spec(self, fullname, path, target=None):  # type: ignore[no-untyped-def]
        if not _PENDING or not _is_torch(fullname):
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module = spec.loader.exec_module

        def exec_module(module):  # type: ignore[no-untyped-def]
            global _IMPORTS_IN_PROGRESS
            _IMPORTS_IN_PROGRESS += 1
            try:
                run_module(module)
            finally:
                _IMPORTS_IN_PROGRESS -= 1
            if _IMPORTS_IN_PROGRESS == 0:
                spec._initializing = False  # importlib clears it only after this returns
                _run_pending()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _Finder()


def after_import(names: tuple[str, ...], callback: Callable[[], None]) -> None:
    """Call ``callback`` now if one of ``names`` is imported (and no torch module is half
    imported), else as soon as one of them is and torch's imports in progress have finished."""
    _PENDING.append((names, callback))
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    if not any(_initializing(name) for name in list(sys.modules) if _is_torch(name)):
        _run_pending()
