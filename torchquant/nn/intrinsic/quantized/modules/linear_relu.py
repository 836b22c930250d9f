"""Quantized Linear fused with an activation: ReLU (in the kernel's epilogue), LeakyReLU and
Tanh (applied to the float accumulator before the one requantization, as torch's oneDNN
kernels do)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ..... import dtypes as _dt
from ...modules import fused as nni
from ....quantized.modules.linear import Linear
from .....ops import linear as ops_linear
from .....ops import quantize as ops_quantize
from .....qtensor import QTensor

__all__ = ["LinearReLU", "LinearLeakyReLU", "LinearTanh"]


class LinearReLU(Linear):
    """``quantize(relu(linear(x)))`` with the ReLU fused into the int8 kernel."""

    _FLOAT_MODULE: Any = nni.LinearReLU
    _FUSED_RELU = True

    def _get_name(self) -> str:
        return "QuantizedLinearReLU"

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False):
        return super().from_float(mod, use_precomputed_fake_quant)

    @classmethod
    def from_reference(cls, ref_linear_relu: torch.nn.Module, output_scale: float,
                       output_zero_point: int) -> "LinearReLU":
        return super().from_reference(ref_linear_relu[0], output_scale, output_zero_point)


class _LinearFloatActivation(Linear):
    """Linear whose activation runs on the float result before requantizing."""

    def _activation(self, y: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _linear_int(self, q: QTensor, scale: float, zero_point: int) -> torch.Tensor:
        y = ops_linear.linear_float_out(q.int_data, *q._scale_zp(), self._packed_params.packed)
        return ops_quantize.quantize_per_tensor(self._activation(y), scale, zero_point, q.qdtype)

    @classmethod
    def from_reference(cls, ref_mod: torch.nn.Module, output_scale: float,
                       output_zero_point: int):
        return super().from_reference(ref_mod[0], output_scale, output_zero_point)


class LinearLeakyReLU(_LinearFloatActivation):
    """``quantize(leaky_relu(linear(x), negative_slope))``."""

    _FLOAT_MODULE: Any = nni.LinearLeakyReLU

    def __init__(self, in_features: int, out_features: int, negative_slope: float,
                 bias: bool = True, dtype: Any = _dt.qint8) -> None:
        super().__init__(in_features, out_features, bias, dtype)
        self.negative_slope = negative_slope

    def _activation(self, y: torch.Tensor) -> torch.Tensor:
        return F.leaky_relu(y, self.negative_slope)

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


class LinearTanh(_LinearFloatActivation):
    """``quantize(tanh(linear(x)))``."""

    _FLOAT_MODULE: Any = nni.LinearTanh

    def _activation(self, y: torch.Tensor) -> torch.Tensor:
        return torch.tanh(y)

    def _get_name(self) -> str:
        return "QuantizedLinearTanh"
