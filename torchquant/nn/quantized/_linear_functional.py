"""``torchquant.nn.quantized.functional.linear``: a one-off quantized linear (packs the weight
on every call, as torch's functional form does -- use the module to pack once)."""
from __future__ import annotations

from typing import Optional

import torch

from ...ops import linear as ops_linear
from ...tensor.qtensor import QTensor
from ...tensor.validation import require_quantized

__all__ = ["linear"]


def linear(input: QTensor, weight: QTensor, bias: Optional[torch.Tensor] = None,
           scale: Optional[float] = None, zero_point: Optional[int] = None) -> QTensor:
    """Quantized ``input @ weight.T + bias`` requantized to (scale, zero_point); without them
    the input's qparams are used, as torch does."""
    q = require_quantized(input, "linear")
    if not isinstance(weight, QTensor):
        raise TypeError(f"quantized linear: weight must be a qint8 QTensor, got "
                        f"{type(weight).__name__}")
    scale = q.q_scale() if scale is None else float(scale)
    zero_point = q.q_zero_point() if zero_point is None else int(zero_point)
    packed = ops_linear.pack_linear_weight(weight.int_data, weight.scale, weight.zero_point,
                                           weight.axis, bias)
    out = ops_linear.linear(q.int_data, *q._scale_zp(), packed, scale, zero_point,
                            q.qdtype.storage_dtype)
    return QTensor.from_int(out, scale, zero_point, q.qdtype)
