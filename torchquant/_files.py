"""Writing a file so that a reader never sees it half-written: write a temporary file in the
same folder, then rename it over the target (an atomic step on POSIX)."""
from __future__ import annotations

import os
import tempfile
from typing import Callable

__all__ = ["atomic_write"]


def atomic_write(path: "str | os.PathLike", write: Callable[[str], None], suffix: str = "") -> None:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, then rename it to ``path``
    with the usual permissions; on any failure the temporary file is removed and ``path`` is
    left as it was."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".torchquant-", suffix=suffix)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
