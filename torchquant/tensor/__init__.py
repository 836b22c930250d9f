"""``QTensor`` and the functions on it: the layer between :mod:`torchquant.ops` and
:mod:`torchquant.nn` (DESIGN.md).

* :mod:`.qtensor` -- the ``QTensor`` class (integers + qparams) and its aten op table;
* :mod:`.torch_ops` -- QTensor handlers for the torch-namespace ops torch supports on quantized
  tensors (``torch.sigmoid(q)``, ``F.max_pool2d(q, 2)``, ...), registered when it is imported,
  which this package does;
* :mod:`.pointwise` -- elementwise quantized activations (unwrap, ``torchquant.ops``, rewrap);
* :mod:`.functions` -- ``quantize_per_tensor``, ``quantize_per_channel``, ``dequantize``, ...;
* :mod:`.validation` -- the input checks of the quantized operators.

``torchquant.qtensor`` and ``torchquant.tensor_functions`` remain as compatibility paths.
"""
from __future__ import annotations

from .qtensor import QTensor
from .functions import (dequantize, fake_quantize_per_channel_affine,
                        fake_quantize_per_tensor_affine, quantize_per_channel,
                        quantize_per_tensor, quantize_per_tensor_dynamic)
from . import torch_ops as torch_ops  # noqa: F401  (registers QTensor's torch.* op handlers)

__all__ = ["QTensor", "quantize_per_tensor", "quantize_per_channel", "dequantize",
           "quantize_per_tensor_dynamic", "fake_quantize_per_tensor_affine",
           "fake_quantize_per_channel_affine"]
