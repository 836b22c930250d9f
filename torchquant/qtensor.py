"""Compatibility path: ``QTensor`` lives in :mod:`torchquant.tensor.qtensor`.

``torchquant.qtensor`` stays importable (``from torchquant.qtensor import QTensor``), and
checkpoints saved before the move name this module's ``_rebuild_qtensor`` in their pickles
(``torchquant/__init__.py`` allows that old path for ``torch.load(weights_only=True)``), so
``_rebuild_qtensor`` must stay reachable here.  Any other name is read from the new module.
"""
from __future__ import annotations

from typing import Any

from .tensor import qtensor as _impl
from .tensor.qtensor import (QTensor, _rebuild_qtensor, new_qtensor,  # noqa: F401
                             shared_qparams, torchscript_unsupported)

__all__ = ["QTensor"]


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
