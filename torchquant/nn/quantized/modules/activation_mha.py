"""Static quantized MultiheadAttention: the quantizable MHA after convert.

Projections are ``nnq.Linear`` on QTensors, the Q scaling a quantized ``mul_scalar``; the
softmax-attention core runs in float between ``DeQuantize`` and ``Quantize``.  Outputs (the
attention output and, when requested, the weights) are QTensors.  ``bias_k`` / ``bias_v`` are
quint8 QTensor buffers (torch keeps them as plain attributes, outside the state dict; here they
round-trip through it).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ... import _workflow
from ... import quantizable as _nnqa
from .... import affine
from .... import dtypes as _dt
from ....tensor.qtensor import QTensor
from ....tensor.functions import quantize_per_tensor
from .functional_modules import QFunctional
from .linear import Linear
from .stubs import DeQuantize, Quantize

__all__ = ["MultiheadAttention"]


def _quantize_bias_kv(b: Tensor) -> QTensor:
    """quint8 per-tensor with the (ATen) qparams of the values' own range."""
    b = b.detach().float()
    scale, zp = affine.choose_qparams_aten(b.min(), b.max(), _dt.quint8.qmin, _dt.quint8.qmax)
    return quantize_per_tensor(b, float(scale), int(zp), _dt.quint8)


class MultiheadAttention(_nnqa.MultiheadAttention):
    """Quantized ``nn.MultiheadAttention`` (query / key / value must be QTensors)."""

    _FLOAT_MODULE = _nnqa.MultiheadAttention  # type: ignore[assignment]

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, device=device, dtype=dtype)
        for name in ("linear_Q", "linear_K", "linear_V", "out_proj"):
            lin = getattr(self, name)
            self._modules[name] = Linear(lin.in_features, lin.out_features, lin.bias is not None)
        self.q_scaling_product = QFunctional()
        self.quant_attn_output = Quantize(1.0, 0, _dt.quint8)
        self.quant_attn_output_weights = Quantize(1.0, 0, _dt.quint8)
        self.dequant_q, self.dequant_k, self.dequant_v = DeQuantize(), DeQuantize(), DeQuantize()
        self._quantize_bias_kv()
        del self.in_proj_weight
        del self.in_proj_bias

    def _quantize_bias_kv(self) -> None:
        for name in ("bias_k", "bias_v"):
            b = self._parameters.pop(name, None)
            if b is not None:
                self.register_buffer(name, _quantize_bias_kv(b))

    def _get_name(self) -> str:
        return "QuantizedMultiheadAttention"

    def forward(self, query: Tensor, key: Tensor, value: Tensor,  # type: ignore[override]
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        for what, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, QTensor):
                raise ValueError(f"Input to 'quantized.MultiheadAttention' must be quantized! "
                                 f"({what} is a {type(t).__name__} of {t.dtype})")
        return self._forward_impl(query, key, value, key_padding_mask, need_weights, attn_mask,
                                  average_attn_weights, is_causal)

    @classmethod
    def from_float(cls, other: Any) -> Any:
        raise NotImplementedError("It looks like you are trying to convert a non-observed MHA "
                                  "module. Please, see the examples on quantizable MHAs.")

    @classmethod
    def from_observed(cls, other: _nnqa.MultiheadAttention) -> "MultiheadAttention":
        """Convert a prepared and calibrated quantizable MHA."""
        if not isinstance(other, cls._FLOAT_MODULE) or isinstance(other, cls):
            raise AssertionError(f"{cls.__name__}.from_observed expects an observed "
                                 f"{cls._FLOAT_MODULE.__name__}, got {type(other)}")
        converted = _workflow.convert(other, mapping=None, inplace=False, remove_qconfig=True,
                            convert_custom_config_dict=None, _record=False)
        converted.__class__ = cls
        with torch.no_grad():
            converted._quantize_bias_kv()
        del converted.in_proj_weight
        del converted.in_proj_bias
        return converted
