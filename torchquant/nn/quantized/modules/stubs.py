"""``Quantize`` / ``DeQuantize``: the modules QuantStub / DeQuantStub convert to."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .... import dtypes as _dt
from ....kernels import cpu_compiled as _cpu_compiled
from ....tensor_functions import dequantize, quantize_per_tensor
from .utils import NotScriptable, OutputQParams

__all__ = ["Quantize", "DeQuantize"]

_REDUCED_FLOATS = (torch.float16, torch.bfloat16)
_TORCH_TYPE_NAMES = {torch.float16: "Half", torch.bfloat16: "BFloat16"}


class Quantize(OutputQParams, torch.nn.Module):
    """Quantizes a float tensor per tensor with fixed (scale, zero_point, dtype).

    ``scale`` (float32) and ``zero_point`` (int64) are 1-element buffers, as in torch (reading
    them gives the tensors); they also take numbers on assignment.  The forward reads Python
    numbers cached from them (:class:`~.utils.OutputQParams`), so tracing sees no
    ``float(buffer)``.  ``factory_kwargs`` may set their ``device`` and the float ``dtype`` of
    ``scale``."""

    _QPARAM_STORAGE = "buffer"
    _QPARAM_BUFFER_SHAPE = (1,)

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, scale: float, zero_point: int, dtype: Any,
                 factory_kwargs: Optional[dict] = None) -> None:
        super().__init__()
        factory_kwargs = torch.nn.factory_kwargs(factory_kwargs)
        self.dtype = _dt.to_qdtype(dtype)
        self._init_output_qparams(scale, zero_point, factory_kwargs.get("device"),
                                  factory_kwargs.get("dtype"))

    def _output_qdtypes(self) -> tuple[_dt.QDType, ...]:
        return (self.dtype,)

    def forward(self, X: torch.Tensor):
        if isinstance(X, torch.Tensor) and X.dtype in _REDUCED_FLOATS:
            # torch.ao's message and type; quantizing a rounded input would change results.
            raise RuntimeError(f"Quantize only works on Float Tensor, got "
                               f"{_TORCH_TYPE_NAMES[X.dtype]}")
        if not torch.compiler.is_compiling():
            _cpu_compiled.note_model_call()  # (a layer-repeated shape is not yet "hot")
        scale, zero_point = self._output_qparams()
        return quantize_per_tensor(X, scale, zero_point, self.dtype)

    def extra_repr(self) -> str:
        return f"scale={self.scale}, zero_point={self.zero_point}, dtype={self.dtype}"

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "Quantize":
        if not hasattr(mod, "activation_post_process"):
            raise AssertionError(f"Module {type(mod).__name__} must have an "
                                 "activation_post_process attribute to be converted to Quantize")
        scale, zero_point = mod.activation_post_process.calculate_qparams()
        return Quantize(float(scale.float().reshape(-1)[0]),
                        int(zero_point.long().reshape(-1)[0]),
                        mod.activation_post_process.dtype)


class DeQuantize(NotScriptable, torch.nn.Module):
    """Dequantizes a QTensor (or a list of them) to float32."""

    def forward(self, Xq: Any) -> Any:
        return dequantize(Xq)

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "DeQuantize":
        return DeQuantize()
