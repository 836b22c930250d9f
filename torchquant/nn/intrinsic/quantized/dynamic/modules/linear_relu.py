"""Dynamic quantized ``LinearReLU``: ``relu(linear(x))`` with the ReLU in the kernel epilogue."""
from __future__ import annotations

from typing import Any

import torch

from ...... import dtypes as _dt
from .....quantized.dynamic.modules.linear import Linear
from ....modules import fused as nni

__all__ = ["LinearReLU"]


class LinearReLU(Linear):
    """As :class:`torchquant.nn.quantized.dynamic.Linear`, ReLU fused (int8 and float16).

    ``from_float`` takes the fused float ``nn.intrinsic.LinearReLU`` only (torch also lets a
    plain Linear through and so adds a ReLU that was never there).
    """

    _FLOAT_MODULE: Any = (nni.LinearReLU,)
    _FUSED_RELU = True

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 dtype: Any = _dt.qint8, *, per_token: bool = False) -> None:
        super().__init__(in_features, out_features, bias, dtype, per_token=per_token)

    def _get_name(self) -> str:
        return "DynamicQuantizedLinearReLU"

    @classmethod
    def _float_types(cls) -> tuple:
        return tuple(cls._FLOAT_MODULE)

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "LinearReLU":
        return super().from_float(mod, use_precomputed_fake_quant)  # type: ignore[return-value]

    @classmethod
    def from_reference(cls, ref_qlinear_relu: torch.nn.Module) -> "LinearReLU":  # type: ignore[override]
        """From a reference fused module: its child ``0`` is the reference Linear."""
        return super().from_reference(ref_qlinear_relu[0])  # type: ignore[return-value]
