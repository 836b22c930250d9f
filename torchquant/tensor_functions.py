"""Compatibility path: the tensor functions live in :mod:`torchquant.tensor.functions`."""
from __future__ import annotations

from typing import Any

from .tensor import functions as _impl
from .tensor.functions import (dequantize, fake_quantize_per_channel_affine,
                               fake_quantize_per_tensor_affine, quantize_per_channel,
                               quantize_per_tensor, quantize_per_tensor_dynamic)

__all__ = ["quantize_per_tensor", "quantize_per_channel", "dequantize",
           "quantize_per_tensor_dynamic", "fake_quantize_per_tensor_affine",
           "fake_quantize_per_channel_affine"]


def __getattr__(name: str) -> Any:
    return getattr(_impl, name)
