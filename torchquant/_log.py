"""Messages on the ``torchquant`` logger that a user sees without configuring logging.

The package installs a ``NullHandler`` (library etiquette), which also silences Python's
last-resort handler, so a script that never configured logging would see nothing at all.
:func:`emit` logs normally when some real handler is configured (the application's, pytest's)
and otherwise writes the line to stderr itself; ``TORCHQUANT_QUIET=1`` silences that fallback.
"""
from __future__ import annotations

import logging
import sys

from . import _config

__all__ = ["logger", "emit", "emit_once"]

logger = logging.getLogger("torchquant")
_emitted: set[str] = set()


def _configured(log: logging.Logger) -> bool:
    """Whether a handler other than a NullHandler would receive ``log``'s records."""
    current: logging.Logger | None = log
    while current is not None:
        if any(not isinstance(h, logging.NullHandler) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent  # type: ignore[assignment]
    return False


def emit(level: int, message: str) -> None:
    """Log ``message`` on the ``torchquant`` logger, or print it to stderr when logging was
    never configured (INFO and above)."""
    if _configured(logger):
        logger.log(level, "%s", message)
    elif level >= logging.INFO and not _config.quiet():
        name = logging.getLevelName(level)
        print(f"torchquant {name.lower() if level < logging.WARNING else name}: {message}",
              file=sys.stderr)


def emit_once(level: int, message: str, key: str | None = None) -> None:
    """:func:`emit`, at most once per process for ``key`` (default: the message)."""
    key = message if key is None else key
    if key in _emitted:
        return
    _emitted.add(key)
    emit(level, message)
