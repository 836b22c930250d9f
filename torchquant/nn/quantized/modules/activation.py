"""Quantized activation modules on QTensors (torch's quantized activation modules, ported).

Modules whose output qparams differ from the input's carry them as torch does: as ``scale``
(float32 0-d) and ``zero_point`` (int64 0-d) buffers for Hardswish and LeakyReLU (reading them
gives the tensors), as plain Python numbers outside the state dict for ELU, Softmax, PReLU
(``scale`` / ``zero_point``) and Sigmoid (``output_scale`` / ``output_zero_point``).  All of
them also take numbers on assignment, validated (:class:`~.utils.OutputQParams`).
``from_float`` reads them from the float module's output observer.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch
import torch.nn.functional as F

from .... import dtypes as _dt
from ....tensor.qtensor import QTensor
from ....tensor.functions import quantize_per_tensor
from ....tensor import pointwise as _pointwise
from .. import _binary, _normalization
from .. import functional as qF
from ....tensor.validation import require_quantized
from .utils import OutputQParams

__all__ = ["ReLU6", "Hardswish", "ELU", "LeakyReLU", "Sigmoid", "Softmax", "PReLU"]


def _observed_qparams(mod: torch.nn.Module) -> tuple[float, int]:
    """(scale, zero_point) of the float module's output observer."""
    scale, zero_point = mod.activation_post_process.calculate_qparams()
    return float(scale), int(zero_point)


class ReLU6(torch.nn.ReLU):
    """``min(max(x, 0), 6)`` on the integers; the output keeps the input's qparams."""

    def __init__(self, inplace: bool = False) -> None:
        super().__init__(inplace)

    def forward(self, input: QTensor) -> QTensor:
        return qF.hardtanh(input, 0.0, 6.0, self.inplace)

    def _get_name(self) -> str:
        return "QuantizedReLU6"

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "ReLU6":
        return ReLU6(mod.inplace)


class Hardswish(OutputQParams, torch.nn.Hardswish):
    """``x * relu6(x + 3) / 6`` requantized to the module's (scale, zero_point)."""

    _QPARAM_STORAGE = "buffer"  # as torch: m.scale reads a 0-d tensor

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, scale: float, zero_point: int, device=None, dtype=None) -> None:
        super().__init__()
        self._init_output_qparams(scale, zero_point, device, dtype)

    def forward(self, input: QTensor) -> QTensor:
        return qF.hardswish(input, *self._output_qparams())

    def _get_name(self) -> str:
        return "QuantizedHardswish"

    def extra_repr(self) -> str:
        return self._qparams_repr()

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "Hardswish":
        return Hardswish(*_observed_qparams(mod))

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "Hardswish":
        return cls(float(scale), int(zero_point))


class ELU(OutputQParams, torch.nn.ELU):
    """ELU requantized to (scale, zero_point), kept as plain attributes (not in the state
    dict, as torch)."""

    _QPARAM_STORAGE = "plain"

    scale: float
    zero_point: int

    def __init__(self, scale: float, zero_point: int, alpha: float = 1.0) -> None:
        super().__init__(alpha)
        self._init_output_qparams(scale, zero_point)

    def forward(self, input: QTensor) -> QTensor:
        scale, zero_point = self._output_qparams()
        return qF.elu(input, scale, zero_point, self.alpha)

    def _get_name(self) -> str:
        return "QuantizedELU"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "ELU":
        return ELU(*_observed_qparams(mod), mod.alpha)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "ELU":
        return cls(float(scale), int(zero_point), mod.alpha)


class LeakyReLU(OutputQParams, torch.nn.LeakyReLU):
    """Leaky ReLU requantized to the module's (scale, zero_point)."""

    _QPARAM_STORAGE = "buffer"  # as torch: m.scale reads a 0-d tensor

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, scale: float, zero_point: int, negative_slope: float = 1e-2,
                 inplace: bool = False, device=None, dtype=None) -> None:
        super().__init__(negative_slope, inplace)
        self._init_output_qparams(scale, zero_point, device, dtype)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "leaky_relu")
        # torch's quantized::leaky_relu makes the input dense first (measured)
        out = _pointwise.leaky_relu(q, self.negative_slope, *self._output_qparams(),
                                    layout="dense_input")
        return _pointwise.store_inplace(q, out) if self.inplace else out

    def _get_name(self) -> str:
        return "QuantizedLeakyReLU"

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._qparams_repr()}"

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "LeakyReLU":
        return cls(*_observed_qparams(mod), mod.negative_slope, mod.inplace)

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "LeakyReLU":
        return cls(float(scale), int(zero_point), mod.negative_slope, mod.inplace)


class Sigmoid(OutputQParams, torch.nn.Sigmoid):
    """Sigmoid requantized to (output_scale, output_zero_point), plain attributes as in torch;
    default flows use 1/256, 0."""

    _QPARAM_NAMES = ("output_scale", "output_zero_point")
    _QPARAM_STORAGE = "plain"

    output_scale: float
    output_zero_point: int

    def __init__(self, output_scale: float, output_zero_point: int) -> None:
        super().__init__()
        self._init_output_qparams(output_scale, output_zero_point)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "sigmoid")
        return _pointwise.sigmoid(q, *self._output_qparams())

    def extra_repr(self) -> str:
        return self._qparams_repr()

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "Sigmoid":
        return cls(*_observed_qparams(mod))


class Softmax(OutputQParams, torch.nn.Softmax):
    """Softmax of the dequantized input, quantized to (scale, zero_point) (plain attributes,
    not in the state dict, as torch)."""

    _QPARAM_STORAGE = "plain"

    scale: float
    zero_point: int

    def __init__(self, dim: Optional[int] = None, scale: float = 1.0, zero_point: int = 0) -> None:
        super().__init__()
        self.dim = dim
        self._init_output_qparams(scale, zero_point)

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "softmax")
        dim = self.dim
        if dim is None:
            dim = F._get_softmax_dim("softmax", q.dim(), 3)
        return _normalization.softmax(q, dim, *self._output_qparams())

    def _get_name(self) -> str:
        return "QuantizedSoftmax"

    def extra_repr(self) -> str:
        return f"dim={self.dim}, {self._qparams_repr()}"

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "Softmax":
        return Softmax(mod.dim, *_observed_qparams(mod))

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "Softmax":
        return cls(mod.dim, float(scale), int(zero_point))


class PReLU(OutputQParams, torch.nn.Module):
    """PReLU with a quint8 weight; output qparams (scale, zero_point) as plain attributes, not
    in the state dict (as torch).

    The weight's integers are a non-persistent buffer and its qparams Python numbers, so that
    ``torch.export`` / ``torch.compile`` see a plain integer constant and constant qparams;
    ``weight`` reads (and assigns) them as a QTensor, and the state dict saves it under
    ``weight`` (torch keeps it out)."""

    _QPARAM_STORAGE = "plain"

    scale: float
    zero_point: int
    _weight_int: torch.Tensor

    def __init__(self, output_scale: float, output_zero_point: int,
                 num_parameters: int = 1) -> None:
        super().__init__()
        self.num_parameters = num_parameters
        self._init_output_qparams(output_scale, output_zero_point)
        self.register_buffer("_weight_int", torch.zeros(num_parameters, dtype=torch.uint8),
                             persistent=False)
        self.set_weight(quantize_per_tensor(torch.randn(num_parameters), 1.0, 0, _dt.quint8))

    @property
    def weight(self) -> QTensor:
        return QTensor.from_int_per_tensor(self._weight_int, *self._weight_qparams,
                                           self._weight_qdtype)

    @weight.setter
    def weight(self, w: QTensor) -> None:
        self.set_weight(w)

    def set_weight(self, w: QTensor) -> None:
        w = require_quantized(w, "prelu")  # per tensor, 8/32-bit (quint8 from from_float)
        self._weight_int = w.int_data
        self._weight_qparams = w._scale_zp()
        self._weight_qdtype = w.qdtype

    def forward(self, input: QTensor) -> QTensor:
        q = require_quantized(input, "prelu")
        return _binary.prelu(q, self.weight, *self._output_qparams())

    def _get_name(self) -> str:
        return "QuantizedPReLU"

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}, {self._qparams_repr()}"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self.weight

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        key = prefix + "weight"
        if key in state_dict:
            weight = state_dict.pop(key)
            if not isinstance(weight, QTensor) and isinstance(weight, torch.Tensor) \
                    and weight.is_quantized:  # a checkpoint saved by torch
                weight = QTensor.from_int(weight.int_repr(), weight.q_scale(),
                                          weight.q_zero_point(), weight.dtype)
            try:
                self.set_weight(weight)
            except (TypeError, ValueError, RuntimeError) as exc:
                error_msgs.append(f"{key}: {exc}")
        elif strict:
            missing_keys.append(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    @classmethod
    def _with_observed_weight(cls, mod: torch.nn.Module, scale: float,
                              zero_point: int) -> "PReLU":
        qprelu = cls(scale, zero_point, mod.num_parameters)
        float_weight = mod.weight.detach().float()
        observer = mod.qconfig.weight()
        observer(float_weight)
        if observer.dtype != _dt.quint8:
            warnings.warn(f"PReLU's weight observer should have dtype quint8 but got "
                          f"{observer.dtype}", stacklevel=3)
        w_scale, w_zero_point = observer.calculate_qparams()
        qprelu.set_weight(quantize_per_tensor(float_weight, float(w_scale), int(w_zero_point),
                                              _dt.quint8))
        return qprelu

    @classmethod
    def from_float(cls, mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "PReLU":
        return cls._with_observed_weight(mod, *_observed_qparams(mod))

    @classmethod
    def from_reference(cls, mod: torch.nn.Module, scale: float, zero_point: int) -> "PReLU":
        return cls._with_observed_weight(mod, float(scale), int(zero_point))
