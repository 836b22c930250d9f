"""``torchquant.nn.quantized.functional.conv1d / conv2d / conv3d``: one-off quantized convs
(the weight is packed on every call, as torch's functional form does -- use the modules to
pack once)."""
from __future__ import annotations

from typing import Any, Optional, Sequence, Union

import torch

from ... import dtypes as _dt
from ...ops import conv as ops_conv
from ...tensor.qtensor import QTensor
from ...tensor.validation import require_quantized

__all__ = ["conv1d", "conv2d", "conv3d"]

IntOrTuple = Union[int, Sequence[int]]
_INPUT_LAYOUT = {1: "(N, C, L)", 2: "(N, C, H, W)", 3: "(N, C, D, H, W)"}


def _conv(n: int, input: Any, weight: Any, bias: Optional[torch.Tensor], stride: IntOrTuple,
          padding: IntOrTuple, dilation: IntOrTuple, groups: int, padding_mode: str,
          scale: float, zero_point: int, dtype: Any) -> QTensor:
    op = f"conv{n}d"
    if padding_mode != "zeros":
        raise NotImplementedError("Only zero-padding is supported!")
    q = require_quantized(input, op)
    if q.qdtype is not _dt.quint8:
        raise NotImplementedError(f"quantized.{op}: only quint8 activations are supported, "
                                  f"got {q.qdtype!r}")
    if not isinstance(weight, QTensor) or weight.qdtype is not _dt.qint8:
        raise NotImplementedError(f"quantized.{op}: only qint8 QTensor weights are supported")
    if _dt.to_qdtype(dtype) is not _dt.quint8:
        raise NotImplementedError(f"quantized.{op}: only quint8 outputs are supported, got "
                                  f"{dtype!r}")
    if q.dim() != n + 2:
        raise ValueError(f"Input shape must be `{_INPUT_LAYOUT[n]}`!")
    if weight.dim() != n + 2:
        raise ValueError(f"quantized.{op}: weight must be {n + 2}-D [out, in/groups, *kernel], "
                         f"got shape {tuple(weight.shape)}")
    if bias is not None:
        bias = bias.detach().float()
    packed = ops_conv.pack_conv_weight(weight.int_data, weight.scale, weight.zero_point,
                                       weight.axis, bias, stride, padding, dilation, groups)
    out = ops_conv.conv(q.int_data, *q._scale_zp(), packed, float(scale), int(zero_point))
    return QTensor.from_int(out, float(scale), int(zero_point), _dt.quint8)


def conv1d(input: QTensor, weight: QTensor, bias: Optional[torch.Tensor], stride: IntOrTuple = 1,
           padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
           padding_mode: str = "zeros", scale: float = 1.0, zero_point: int = 0,
           dtype: Any = _dt.quint8) -> QTensor:
    """Quantized 1-D conv of a quint8 ``(N, C, L)`` input with a qint8 weight, requantized to
    ``(scale, zero_point)``."""
    return _conv(1, input, weight, bias, stride, padding, dilation, groups, padding_mode, scale,
                 zero_point, dtype)


def conv2d(input: QTensor, weight: QTensor, bias: Optional[torch.Tensor], stride: IntOrTuple = 1,
           padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
           padding_mode: str = "zeros", scale: float = 1.0, zero_point: int = 0,
           dtype: Any = _dt.quint8) -> QTensor:
    """Quantized 2-D conv of a quint8 ``(N, C, H, W)`` input."""
    return _conv(2, input, weight, bias, stride, padding, dilation, groups, padding_mode, scale,
                 zero_point, dtype)


def conv3d(input: QTensor, weight: QTensor, bias: Optional[torch.Tensor], stride: IntOrTuple = 1,
           padding: IntOrTuple = 0, dilation: IntOrTuple = 1, groups: int = 1,
           padding_mode: str = "zeros", scale: float = 1.0, zero_point: int = 0,
           dtype: Any = _dt.quint8) -> QTensor:
    """Quantized 3-D conv of a quint8 ``(N, C, D, H, W)`` input."""
    return _conv(3, input, weight, bias, stride, padding, dilation, groups, padding_mode, scale,
                 zero_point, dtype)

