"""QAT ``Linear`` for dynamic quantization (converted to ``nnqd.Linear``)."""
from __future__ import annotations

from typing import Any

from .... import _workflow
from ...modules.linear import Linear as _QATLinear

__all__ = ["Linear"]


class Linear(_QATLinear):
    """As :class:`torchquant.nn.qat.Linear`, but the qconfig's activation observer must be
    memoryless (a moving average with ``averaging_constant == 1``): dynamic quantization
    computes activation qparams from each batch alone, so QAT must simulate that."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 qconfig: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_features, out_features, bias, qconfig, device, dtype)
        if not _workflow.activation_is_memoryless(qconfig):
            raise ValueError("Dynamic QAT requires a memoryless observer."
                             "This means a MovingAverage observer with averaging constant "
                             "equal to 1")
