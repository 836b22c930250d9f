"""Writing a file so that a reader never sees it half-written: write a temporary file in the
same folder, then rename it over the target (an atomic step on POSIX)."""
from __future__ import annotations

import os
import stat
import tempfile
from typing import Callable

__all__ = ["atomic_write", "stage_file", "commit_staged"]


def _final_mode(path: str) -> int:
    """The mode the written file gets: an existing file's own (a private 0600 file stays
    private), else the usual mode for a new file (0666 less the umask)."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def stage_file(path: "str | os.PathLike", write: Callable[[str], None], suffix: str = "") -> str:
    """Call ``write(tmp_path)`` on a temporary file beside ``path`` and give it the mode
    ``path`` will have; returns the temporary path (to :func:`commit_staged`).  On failure the
    temporary file is removed and the exception propagates."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".torchquant-", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _final_mode(path))  # mkstemp makes 0600 files
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return tmp


def commit_staged(staged: list[tuple[str, str]]) -> None:
    """Rename each staged ``(tmp, path)`` over its target."""
    for tmp, path in staged:
        os.replace(tmp, path)


def atomic_write(path: "str | os.PathLike", write: Callable[[str], None], suffix: str = "") -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it to ``path``
    (keeping an existing file's mode, else the usual one); on any failure the temporary file is removed and ``path`` is
    left as it was."""
    tmp = stage_file(path, write, suffix)
    try:
        os.replace(tmp, os.fspath(path))
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
