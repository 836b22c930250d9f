"""Quantized Conv2d fused with an add of a second quantized tensor (and ReLU).

As torch's oneDNN kernels: ``quantize(conv(x_hat, w_hat, b) + extra_hat)`` (ReLU on that sum
for ``ConvAddReLU2d``), one requantization to the module's qparams: the conv op's ``add`` /
``add_relu`` post-op.
"""
from __future__ import annotations

from typing import Any, ClassVar

from .....tensor.qtensor import QTensor
from ...modules import fused as nni
from .....tensor.validation import require_quantized
from ....quantized.modules.conv import Conv2d

__all__ = ["ConvAdd2d", "ConvAddReLU2d"]


class ConvAdd2d(Conv2d):
    """``forward(input, extra_input) = quantize(conv2d(input) + extra_input)``; ``extra_input``
    is a per-tensor quantized tensor of the conv output's shape."""

    _NAME = "QuantizedConvAdd2d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvAdd2d
    _POST_OP: ClassVar[str] = "add"

    def forward(self, input: QTensor, extra_input: QTensor) -> QTensor:  # type: ignore[override]
        q = self._quantized_input(input)
        return self._conv(q, require_quantized(extra_input, self._get_name()))


class ConvAddReLU2d(ConvAdd2d):
    """``forward(input, extra_input) = quantize(relu(conv2d(input) + extra_input))``."""

    _NAME = "QuantizedConvAddReLU2d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvAddReLU2d
    _POST_OP: ClassVar[str] = "add_relu"
