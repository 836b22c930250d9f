"""The one piece every reference module shares: weight qparams stored next to a float weight,
and the quantize-dequantize of that weight through torchquant's tensor functions."""
from __future__ import annotations

from typing import Any, Optional

import torch

from ..... import dtypes as _dt
from .....qtensor import QTensor
from .....tensor_functions import quantize_per_channel, quantize_per_tensor

__all__ = ["ReferenceQuantizedModule"]

_DEFAULT_QPARAMS = {"qscheme": _dt.per_tensor_affine, "dtype": _dt.quint8, "scale": 1.0,
                    "zero_point": 0}


def _scheme(qscheme: Any) -> str:
    return str(_dt.to_qscheme(qscheme)).rsplit(".", 1)[-1]


class ReferenceQuantizedModule(torch.nn.Module):
    """Mixin: ``<name>_qscheme`` / ``<name>_dtype`` attributes and ``<name>_scale`` /
    ``<name>_zero_point`` / ``<name>_axis`` buffers for each quantized weight ``<name>``."""

    _IS_REFERENCE = True
    _QPARAMS_IN_STATE_DICT = True  # torch saves <name>_qscheme / <name>_dtype for these

    def _init_weight_qparams(self, weight_qparams: Optional[dict], device: Any = None,
                             name: str = "weight") -> None:
        qparams = dict(_DEFAULT_QPARAMS if weight_qparams is None else weight_qparams)
        qscheme = _dt.to_qscheme(qparams["qscheme"])
        dtype = qparams["dtype"]
        dtype = torch.float16 if dtype in (torch.float16, torch.float32) else _dt.to_qdtype(dtype)
        scheme = _scheme(qscheme)
        if scheme not in ("per_tensor_affine", "per_channel_affine",
                          "per_channel_affine_float_qparams"):
            raise ValueError(f"reference modules support per-tensor / per-channel affine "
                             f"weights, got {qscheme!r}")
        setattr(self, f"{name}_qscheme", qscheme)
        setattr(self, f"{name}_dtype", dtype)
        setattr(self, f"{name}_quant_min", qparams.get("quant_min"))
        setattr(self, f"{name}_quant_max", qparams.get("quant_max"))
        zp_dtype = torch.float32 if scheme == "per_channel_affine_float_qparams" else torch.int64
        scale = torch.as_tensor(qparams["scale"], dtype=torch.float32, device=device)
        zero_point = torch.as_tensor(qparams["zero_point"], dtype=zp_dtype, device=device)
        axis = int(qparams.get("axis", 0) or 0) if scheme != "per_tensor_affine" else 0
        self.register_buffer(f"{name}_scale", scale.detach().clone())
        self.register_buffer(f"{name}_zero_point", zero_point.detach().clone())
        self.register_buffer(f"{name}_axis", torch.tensor(axis, dtype=torch.int32, device=device))

    def _quantized(self, weight: torch.Tensor, name: str = "weight") -> QTensor:
        qscheme = getattr(self, f"{name}_qscheme")
        dtype = getattr(self, f"{name}_dtype")
        scale = getattr(self, f"{name}_scale")
        zero_point = getattr(self, f"{name}_zero_point")
        w = weight.detach().float()
        if _scheme(qscheme) == "per_tensor_affine":
            q = quantize_per_tensor(w, float(scale), int(zero_point), dtype)
        else:
            q = quantize_per_channel(w, scale, zero_point, int(getattr(self, f"{name}_axis")),
                                     dtype)
        qmin, qmax = getattr(self, f"{name}_quant_min", None), getattr(self, f"{name}_quant_max",
                                                                       None)
        if qmin is not None and qmax is not None and not dtype.is_sub_byte \
                and (qmin, qmax) != (dtype.qmin, dtype.qmax):
            q = q._with(q.int_data.clamp(qmin, qmax))
        return q

    def _weight_dequantized(self, weight: torch.Tensor, name: str = "weight") -> torch.Tensor:
        if getattr(self, f"{name}_dtype") is torch.float16:
            return weight.to(torch.float16).to(weight.dtype)
        return self._quantized(weight, name).dequantize().to(weight.dtype)

    def get_weight(self) -> torch.Tensor:
        """The float weight after quantize -> dequantize (what the reference forward uses)."""
        return self._weight_dequantized(self.weight)

    def get_quantized_weight(self) -> QTensor:
        return self._quantized(self.weight)

    def _qparam_names(self) -> list[str]:
        return ["weight"]

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._QPARAMS_IN_STATE_DICT:
            for name in self._qparam_names():
                destination[f"{prefix}{name}_qscheme"] = getattr(self, f"{name}_qscheme")
                destination[f"{prefix}{name}_dtype"] = getattr(self, f"{name}_dtype")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if self._QPARAMS_IN_STATE_DICT:
            for name in self._qparam_names():
                for attr, convert in (("qscheme", _dt.to_qscheme), ("dtype", None)):
                    key = f"{prefix}{name}_{attr}"
                    if key in state_dict:
                        value = state_dict.pop(key)
                        if convert is not None:
                            value = convert(value)
                        elif value is not torch.float16:
                            value = _dt.to_qdtype(value)
                        setattr(self, f"{name}_{attr}", value)
                    elif strict:
                        missing_keys.append(key)
        for name in self._qparam_names():  # per-tensor <-> per-channel qparams resize
            for suffix in ("scale", "zero_point"):
                value = state_dict.get(f"{prefix}{name}_{suffix}")
                if isinstance(value, torch.Tensor):
                    setattr(self, f"{name}_{suffix}", torch.empty_like(value))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
