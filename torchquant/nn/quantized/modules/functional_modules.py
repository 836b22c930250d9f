"""FloatFunctional / FXFloatFunctional / QFunctional: tensor arithmetic as modules.

Eager-mode quantization can only observe and swap modules, so models written for it route
``add``, ``mul``, ``cat``... through a FloatFunctional instance; convert swaps it for a
QFunctional that runs the quantized ops with the observed output qparams.  The two float
classes are defined in :mod:`torchquant.nn.float_functional` (nn.quantizable builds on them)
and re-exported here.
"""
from __future__ import annotations

import torch

from ....tensor.qtensor import QTensor
from ...float_functional import FloatFunctional, FXFloatFunctional, _no_forward
from .. import _binary
from .utils import OutputQParams

__all__ = ["FloatFunctional", "FXFloatFunctional", "QFunctional"]


class QFunctional(OutputQParams, torch.nn.Module):
    """The quantized ops.  Binary ops and ``cat`` produce (``scale``, ``zero_point``): plain,
    assignable Python numbers saved in the state dict as float32 / int64 0-d tensors, as
    torch (:class:`~.utils.OutputQParams`); ``add_scalar`` / ``mul_scalar`` derive their
    output qparams from the input."""

    scale: float
    zero_point: int

    def __init__(self) -> None:
        super().__init__()
        self._init_output_qparams(1.0, 0)
        self.activation_post_process = torch.nn.Identity()

    forward = _no_forward

    def _get_name(self) -> str:
        return "QFunctional"

    def extra_repr(self) -> str:
        return self._qparams_repr()

    def add(self, x: QTensor, y: QTensor) -> QTensor:
        return self.activation_post_process(_binary.add(x, y, *self._output_qparams()))

    def add_scalar(self, x: QTensor, y: float) -> QTensor:
        return _binary.add_scalar(x, y)

    def mul(self, x: QTensor, y: QTensor) -> QTensor:
        return self.activation_post_process(_binary.mul(x, y, *self._output_qparams()))

    def mul_scalar(self, x: QTensor, y: float) -> QTensor:
        return _binary.mul_scalar(x, y)

    def cat(self, x: list[QTensor], dim: int = 0) -> QTensor:
        return self.activation_post_process(_binary.cat(x, dim, *self._output_qparams()))

    def add_relu(self, x: QTensor, y: QTensor) -> QTensor:
        return self.activation_post_process(
            _binary.add(x, y, *self._output_qparams(), relu=True))

    def matmul(self, x: QTensor, y: QTensor) -> QTensor:
        return _binary.matmul(x, y, *self._output_qparams())

    @classmethod
    def from_float(cls, mod: torch.nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "QFunctional":
        if type(mod).__name__ != "FloatFunctional":
            raise AssertionError("QFunctional.from_float expects an instance of FloatFunctional, "
                                 f"got {type(mod).__name__}")
        new_mod = cls()
        new_mod.scale, new_mod.zero_point = mod.activation_post_process.calculate_qparams()
        return new_mod
