"""``calibrate``: the hand-written calibration loop, with a progress bar.

A progress bar is tqdm's when tqdm is installed, else a one-line bar of our own on stderr.
``progress=None`` shows it only when stderr is a terminal; ``True`` always; ``False`` never;
``TORCHQUANT_QUIET=1`` silences the automatic one.
"""
from __future__ import annotations

import sys
import time
from typing import Any, Callable, Iterable, Iterator, Optional

import torch
from torch import nn

from .. import _config

__all__ = ["calibrate", "progress_bar"]


class _SimpleBar:
    """A minimal stand-in for tqdm: ``desc: n/total [#####     ] rate it/s`` on one line."""

    def __init__(self, iterable: Iterable, desc: str, total: Optional[int], stream: Any) -> None:
        self.iterable, self.desc, self.total, self.stream = iterable, desc, total, stream

    def _draw(self, n: int, start: float, final: bool = False) -> None:
        elapsed = max(time.perf_counter() - start, 1e-9)
        if self.total:
            filled = int(20 * n / self.total)
            body = f"{n}/{self.total} [{'#' * filled}{' ' * (20 - filled)}]"
        else:
            body = f"{n}"
        self.stream.write(f"\r{self.desc}: {body} {n / elapsed:.1f} it/s")
        if final:
            self.stream.write("\n")
        self.stream.flush()

    def __iter__(self) -> Iterator[Any]:
        start = last = time.perf_counter()
        n = 0
        self._draw(0, start)
        for item in self.iterable:
            yield item
            n += 1
            now = time.perf_counter()
            if now - last >= 0.1:
                self._draw(n, start)
                last = now
        self._draw(n, start, final=True)


def _wanted(enabled: Optional[bool]) -> bool:
    if enabled is not None:
        return bool(enabled)
    return sys.stderr.isatty() and not _config.quiet()


def progress_bar(iterable: Iterable, desc: str, enabled: Optional[bool] = None,
                 total: Optional[int] = None) -> Iterable:
    """``iterable`` with a progress bar (tqdm if installed, else a simple one) when
    ``enabled`` is True, or None and stderr is a terminal; else ``iterable`` itself."""
    if not _wanted(enabled):
        return iterable
    if total is None and hasattr(iterable, "__len__"):
        try:
            total = len(iterable)  # type: ignore[arg-type]
        except TypeError:
            total = None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return _SimpleBar(iterable, desc, total, sys.stderr)
    return tqdm(iterable, desc=desc, total=total, leave=False)


def _default_forward(model: nn.Module, batch: Any) -> Any:
    """A tensor is the input; a (input, target, ...) tuple or list feeds its first element
    (what a DataLoader of labelled data yields); a dict is passed as keyword arguments."""
    if isinstance(batch, dict):
        return model(**batch)
    if isinstance(batch, (tuple, list)):
        return model(batch[0])
    return model(batch)


def calibrate(model: nn.Module, data: Iterable, progress: Optional[bool] = None, *,
              num_batches: Optional[int] = None,
              forward: Optional[Callable[[nn.Module, Any], Any]] = None) -> nn.Module:
    """Run the prepared ``model`` over ``data`` without gradients so its observers record
    ranges; returns ``model``.

    Each batch is a tensor (the input), an ``(input, target, ...)`` tuple / list (the input
    is the first element), or a dict of keyword arguments; ``forward(model, batch)`` overrides
    that.  ``num_batches`` stops early.  ``progress``: None shows a bar on a terminal, True
    always, False never.  The model's train / eval mode is left as it is.
    """
    run = forward or _default_forward
    total = num_batches
    if total is None and hasattr(data, "__len__"):
        try:
            total = len(data)  # type: ignore[arg-type]
        except TypeError:
            total = None
    elif total is not None and hasattr(data, "__len__"):
        try:
            total = min(total, len(data))  # type: ignore[arg-type]
        except TypeError:
            pass
    with torch.no_grad():
        for index, batch in enumerate(progress_bar(data, "calibrating", progress, total)):
            if num_batches is not None and index >= num_batches:
                break
            run(model, batch)
    return model
