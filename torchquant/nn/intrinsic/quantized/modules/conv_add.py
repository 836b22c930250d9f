"""Quantized Conv2d fused with an add of a second quantized tensor (and ReLU).

As torch's oneDNN kernels: ``quantize(conv(x_hat, w_hat, b) + extra_hat)`` (ReLU on that sum
for ``ConvAddReLU2d``), one requantization to the module's qparams.  The sum is formed on the
float accumulator (dequantize, float conv, add, quantize).
"""
from __future__ import annotations

from typing import Any, ClassVar

import torch

from .....ops import quantize as ops_quantize
from ..... import dtypes as _dt
from .....qtensor import QTensor
from ...modules import fused as nni
from ....quantized._conv_functional import _conv_float_out
from ....._validation import require_quantized
from ....quantized.modules.conv import Conv2d

__all__ = ["ConvAdd2d", "ConvAddReLU2d"]


class ConvAdd2d(Conv2d):
    """``forward(input, extra_input) = quantize(conv2d(input) + extra_input)``."""

    _NAME = "QuantizedConvAdd2d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvAdd2d
    _ADD_RELU: ClassVar[bool] = False

    def forward(self, input: QTensor, extra_input: QTensor) -> QTensor:  # type: ignore[override]
        q = self._quantized_input(input)
        extra = require_quantized(extra_input, self._get_name())
        p = self._packed_params
        y = _conv_float_out(self._input_int(q), q.scale, q.zero_point, p)
        if tuple(extra.shape) != tuple(y.shape):
            raise ValueError(f"{self._get_name()}: extra_input must have the conv output's shape "
                             f"{tuple(y.shape)}, got {tuple(extra.shape)}")
        y = y + extra.dequantize()
        if self._ADD_RELU:
            y = torch.relu(y)
        qd = _dt.quint8
        scale, zero_point = self._output_qparams()
        out = ops_quantize.quantize_per_tensor(y, scale, zero_point, qd)
        return QTensor.from_int_per_tensor(out, scale, zero_point, qd)


class ConvAddReLU2d(ConvAdd2d):
    """``forward(input, extra_input) = quantize(relu(conv2d(input) + extra_input))``."""

    _NAME = "QuantizedConvAddReLU2d"
    _FLOAT_MODULE: ClassVar[Any] = nni.ConvAddReLU2d
    _ADD_RELU: ClassVar[bool] = True
