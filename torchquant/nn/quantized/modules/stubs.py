"""``Quantize`` / ``DeQuantize``: the modules QuantStub / DeQuantStub convert to."""
from __future__ import annotations

from typing import Any, Optional

import torch

from .... import dtypes as _dt
from .... import affine
from ....ops import quantize as ops_quantize
from ....tensor.qtensor import QTensor, new_qtensor, shared_qparams
from ....tensor.functions import dequantize, quantize_per_tensor
from .utils import NotScriptable, OutputQParams

__all__ = ["Quantize", "DeQuantize"]

def _torch_type_name(dtype: torch.dtype) -> str:
    """torch's scalar type name (``Double``, ``Half``, ``Long`` ...), as its messages say it."""
    return torch.empty(0, dtype=dtype).type().rsplit(".", 1)[-1].replace("Tensor", "")


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
        if isinstance(X, torch.Tensor) and X.dtype is not torch.float32 \
                and not isinstance(X, QTensor):
            # torch.ao's message and type: a converted model quantizes float32 only (a half
            # input would be rounded already, a double one silently narrowed)
            raise RuntimeError(f"Quantize only works on Float Tensor, got "
                               f"{_torch_type_name(X.dtype)}")
        if not torch.compiler.is_compiling():
            ops_quantize.note_model_call()  # (a layer-repeated shape is not yet "hot")
            if (type(X) is torch.Tensor and X.dtype is torch.float32 and not X.requires_grad
                    and self.dtype.bits >= 8):
                # Plain eager, float32 in: the quantize kernel on operands made once per
                # (qparams, device) -- what quantize_per_tensor computes, without its
                # per-call validation and 0-d tensor construction.
                qparams = self._output_qparams()
                operands = self._eager_operands.get((qparams, X.device))
                if operands is None:
                    operands = self._quantize_operands(qparams, X.device)
                inv, zp_f32, mode, qdtype, scale_t, zp_t = operands
                values = ops_quantize.quantize_per_tensor_eager(X, inv, zp_f32, qparams[1],
                                                                qdtype, mode)
                return new_qtensor(values, scale_t, zp_t, qdtype, None, qparams)
        scale, zero_point = self._output_qparams()
        return quantize_per_tensor(X, scale, zero_point, self.dtype)

    @property
    def _eager_operands(self) -> dict:
        cache = self.__dict__.get("_eager_operand_cache")
        if cache is None:
            cache = {}
            object.__setattr__(self, "_eager_operand_cache", cache)
        return cache

    def _quantize_operands(self, qparams: tuple[float, int], device: torch.device) -> tuple:
        """(1/scale and zero point as the float32 tensors the formula takes, the rounding mode,
        the qdtype, the shared 0-d qparams of the result) for these qparams on ``device``."""
        scale, zero_point = qparams
        qdtype = self.dtype
        scale_t, zp_t = shared_qparams(float(scale), int(zero_point), qdtype)  # validates
        scale_64, zp_64 = affine.per_tensor_qparams(scale, zero_point, device)
        mode = affine.quantize_mode(qdtype, per_channel=False)
        _, inv, zp_f32, mode = affine.quantize_operands(scale_64.new_empty(()), scale_64,
                                                        zp_64, None, mode)
        operands = (inv, zp_f32, mode, qdtype, scale_t.to(device), zp_t.to(device))
        cache = self._eager_operands
        if len(cache) >= 8:
            cache.clear()
        cache[(qparams, device)] = operands
        return operands

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
        if type(Xq) is QTensor:
            return Xq.dequantize()
        return dequantize(Xq)

    @staticmethod
    def from_float(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False) -> "DeQuantize":
        return DeQuantize()
