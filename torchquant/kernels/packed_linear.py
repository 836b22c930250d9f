"""The packed int8 Linear weight: :class:`PackedLinearWeight`, built by
:func:`pack_linear_weight` once per weight, holds the plain weight and what every Linear kernel
(:mod:`.linear`, :mod:`.linear_small_m`, :mod:`.recurrent`, the native ones) derives from it --
per-channel qparams, weight sums, oneDNN's blocked copy (where oneDNN is usable,
:func:`~.onednn_exactness.onednn_usable`) -- and the kernels' per-pack caches.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

import torch

from .arguments import check_bias, check_weight_qparams, per_channel_view
from .onednn_exactness import onednn_usable
from .registry import get
from .. import affine

__all__ = ["PackedLinearWeight", "pack_linear_weight"]


@dataclass(frozen=True, eq=False)
class PackedLinearWeight:
    """An int8 Linear weight with everything the kernels need, computed once.

    ``weight`` is the plain int8 ``[out, in]`` tensor (``weight.t()`` is ``_int_mm``'s operand,
    no copy) with ``weight_scale`` / ``weight_zero_point`` as given (0-d per tensor, 1-d per
    channel along ``axis`` 0).  Derived: per-channel float32 scales and int64 zero points,
    the per-channel weight sums (``_int_mm``'s activation zero-point correction) and the
    oneDNN-blocked copy.  ``requant_epilogues`` caches the static ``_int_mm`` epilogue per
    (input, output) qparams, which a calibrated model never changes.  Pickling / deepcopy
    repack from the plain fields (oneDNN tensors have no storage to copy).
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor
    weight_zero_point: torch.Tensor
    axis: Optional[int]
    bias: Optional[torch.Tensor]
    channel_scale: torch.Tensor
    channel_zero_point: torch.Tensor
    weight_sum: torch.Tensor
    symmetric: bool
    onednn_weight: Optional[torch.Tensor]
    requant_epilogues: dict = field(default_factory=dict, repr=False)
    # :func:`quantized_linear`'s checked, bound calls (call_key -> linear_plan's plan).
    plans: dict = field(default_factory=dict, repr=False)

    @property
    def in_features(self) -> int:
        return self.weight.size(1)

    @property
    def out_features(self) -> int:
        return self.weight.size(0)

    def dequantized_weight(self) -> torch.Tensor:
        operands = affine.dequantize_operands(self.weight, self.weight_scale,
                                              self.weight_zero_point, self.axis)
        return get("dequantize", self.weight, per_channel=self.axis is not None)(*operands)

    def to(self, device: Union[str, torch.device]) -> "PackedLinearWeight":
        """The same weight packed for ``device``."""
        return pack_linear_weight(self.weight.to(device), self.weight_scale, self.weight_zero_point,
                                  self.axis, None if self.bias is None else self.bias.to(device))

    def __reduce__(self):
        return (pack_linear_weight, (self.weight, self.weight_scale, self.weight_zero_point,
                                     self.axis, self.bias))


def pack_linear_weight(weight: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                       axis: Optional[int] = None,
                       bias: Optional[torch.Tensor] = None) -> PackedLinearWeight:
    """Pack int8 weights ``[out, in]`` with per-tensor (``axis=None``) or per-channel
    (``axis=0``) qparams and an optional float bias."""
    op = "pack_linear_weight"
    if not isinstance(weight, torch.Tensor) or type(weight) is not torch.Tensor:
        raise TypeError(f"{op}: weight must be a plain int8 tensor (QTensor: pass .int_data), "
                        f"got {type(weight).__name__}")
    if weight.dim() != 2:
        raise ValueError(f"{op}: weight must be 2-D [out_features, in_features], got shape "
                         f"{tuple(weight.shape)}")
    if axis not in (None, 0):
        raise ValueError(f"{op}: per-channel weights must be quantized along axis 0, got {axis}")
    scale, zero_point = torch.as_tensor(scale), torch.as_tensor(zero_point)
    check_weight_qparams(weight, scale, zero_point, axis, op)
    weight = weight.detach().contiguous()
    n = weight.size(0)
    bias = check_bias(bias, n, op)
    if bias is not None:
        bias = bias.to(weight.device)
    channel_scale, channel_zp = per_channel_view(scale, zero_point, n, weight.device)
    symmetric = not bool(channel_zp.any())
    onednn_weight = None
    if symmetric and weight.device.type == "cpu" and onednn_usable() and weight.numel():
        onednn_weight = torch.ops.onednn.qlinear_prepack(weight, None)
    return PackedLinearWeight(weight, scale, zero_point, axis, bias, channel_scale, channel_zp,
                              weight.sum(1, dtype=torch.int32), symmetric, onednn_weight)
