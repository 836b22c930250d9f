"""Quantized Linear fused with an activation: ReLU, LeakyReLU or Tanh, each the static linear
op's post-op (applied to the float result before the one requantization, as torch's oneDNN
kernels do)."""
from __future__ import annotations

from typing import Any

import torch

from ..... import dtypes as _dt
from ...modules import fused as nni
from ....quantized.modules.linear import Linear

__all__ = ["LinearReLU", "LinearLeakyReLU", "LinearTanh"]


class _FusedLinear(Linear):
    """A fused (Linear, activation) container converts from its first child."""

    @classmethod
    def from_reference(cls, ref_mod: torch.nn.Module, output_scale: float,
                       output_zero_point: int):
        return super().from_reference(ref_mod[0], output_scale, output_zero_point)


class LinearReLU(_FusedLinear):
    """``quantize(relu(linear(x)))``."""

    _FLOAT_MODULE: Any = nni.LinearReLU
    _POST_OP = "relu"

    def _get_name(self) -> str:
        return "QuantizedLinearReLU"


class LinearLeakyReLU(_FusedLinear):
    """``quantize(leaky_relu(linear(x), negative_slope))``."""

    _FLOAT_MODULE: Any = nni.LinearLeakyReLU
    _POST_OP = "leaky_relu"

    def __init__(self, in_features: int, out_features: int, negative_slope: float,
                 bias: bool = True, dtype: Any = _dt.qint8) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.negative_slope = negative_slope

    def _post_op_args(self) -> tuple:
        return (self._POST_OP, float(self.negative_slope))

    def _get_name(self) -> str:
        return "QuantizedLinearLeakyReLU"

    @classmethod
    def _new_like(cls, mod: torch.nn.Module, linear: torch.nn.Module) -> "LinearLeakyReLU":
        slope = mod[1].negative_slope if isinstance(mod, nni.LinearLeakyReLU) else 0.01
        return cls(linear.in_features, linear.out_features, slope, linear.bias is not None)

    @classmethod
    def from_reference(cls, ref_mod: torch.nn.Module, output_scale: float,
                       output_zero_point: int) -> "LinearLeakyReLU":
        q = Linear.from_reference.__func__(cls, ref_mod[0], output_scale, output_zero_point)
        q.negative_slope = ref_mod[1].negative_slope
        return q


class LinearTanh(_FusedLinear):
    """``quantize(tanh(linear(x)))``."""

    _FLOAT_MODULE: Any = nni.LinearTanh
    _POST_OP = "tanh"

    def _get_name(self) -> str:
        return "QuantizedLinearTanh"
