"""torchquant: PyTorch's quantization API (``torch.ao.quantization``) on plain integer tensors.

Port code by renaming: ``torch.ao.X`` -> ``torchquant.X``, ``torch.quantize_per_tensor`` ->
``torchquant.quantize_per_tensor``, and torch's quantized dtypes (quint8, qint8, ...) to
``torchquant.quint8`` etc.; the torch dtype objects are accepted as aliases in dtypes.py only.
"""
from __future__ import annotations

import logging as _logging

import torch as _torch

from .dtypes import (QDType, QScheme, per_channel_affine, per_channel_affine_float_qparams,
                     per_channel_symmetric, per_tensor_affine, per_tensor_symmetric, qint8, qint32,
                     quint2x4, quint4x2, quint8, to_qdtype, to_qscheme)
from .tensor import (QTensor, dequantize, fake_quantize_per_channel_affine,
                     fake_quantize_per_tensor_affine, quantize_per_channel, quantize_per_tensor,
                     quantize_per_tensor_dynamic)
from .tensor.qtensor import _rebuild_qtensor
from . import qtensor as qtensor  # noqa: F401  (compatibility paths, see their docstrings)
from . import tensor_functions as tensor_functions  # noqa: F401
from . import dtypes as _dtypes

__version__ = "0.1.0"

_logging.getLogger("torchquant").addHandler(_logging.NullHandler())

# Let torch.load(weights_only=True) rebuild our tensors and dtype/qscheme objects.  Files saved
# before QTensor moved into torchquant.tensor name it by its old module, torchquant.qtensor
# (still importable): both paths are allowed.
_torch.serialization.add_safe_globals([
    QTensor, _rebuild_qtensor, QDType, QScheme, _dtypes._qdtype_by_name, _dtypes._qscheme_by_name,
    (QTensor, "torchquant.qtensor.QTensor"),
    (_rebuild_qtensor, "torchquant.qtensor._rebuild_qtensor"),
])

__all__ = [
    "QDType", "QScheme", "QTensor", "to_qdtype", "to_qscheme",
    "quint8", "qint8", "qint32", "quint4x2", "quint2x4",
    "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric", "per_channel_symmetric",
    "per_channel_affine_float_qparams",
    "quantize_per_tensor", "quantize_per_channel", "dequantize", "quantize_per_tensor_dynamic",
    "fake_quantize_per_tensor_affine", "fake_quantize_per_channel_affine",
]

__all__ += ["compile", "export_package", "load"]


def __getattr__(name: str):
    """``torchquant.compile`` (:mod:`._compile`) loads the quantization workflow it lowers, and
    ``export_package`` / ``load`` (:mod:`._package`) the AOTInductor packaging, so they are
    imported on first use: ``import torchquant`` stays free of nn / quantization."""
    if name == "compile":
        from ._compile import compile
        return compile
    if name in ("export_package", "load"):
        from . import _package
        return getattr(_package, name)
    raise AttributeError(f"module 'torchquant' has no attribute {name!r}")
