"""What every reference quantized module shares: weight qparams stored next to a float weight,
and the quantize -> dequantize of that weight through torchquant's tensor functions.

The qparams of weight ``<name>`` live in attributes ``<name>_qscheme`` / ``<name>_dtype`` /
``<name>_axis_int`` and buffers ``<name>_scale`` / ``<name>_zero_point`` / ``<name>_axis`` --
the layout torch's reference modules use, so lowering code (``from_reference``) reads either.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from ..... import dtypes as _dt
from .....tensor.qtensor import QTensor
from .....tensor.functions import quantize_per_channel, quantize_per_tensor

__all__ = ["ReferenceQuantizedModule"]


def default_weight_qparams() -> dict[str, Any]:
    """torch's default when a reference module gets no qparams: per-tensor quint8, scale 1."""
    return {"qscheme": _dt.per_tensor_affine, "dtype": _dt.quint8, "scale": 1.0,
            "zero_point": 0}


def _resolve_qscheme(qscheme: Any) -> Optional[_dt.QScheme]:
    return None if qscheme is None else _dt.to_qscheme(qscheme)


def _resolve_dtype(dtype: Any) -> Union[_dt.QDType, torch.dtype]:
    """Ours for an integer quantized dtype (ours or torch's alias); a float torch dtype
    (float16 = weight kept in half precision, float32 = not quantized) is kept as it is."""
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return dtype
    return _dt.to_qdtype(dtype)


def _as_buffer(value: Any, dtype: torch.dtype, device: Any, keep_tensor_dtype: bool):
    """torch's rule: a tensor qparam is cloned (Linear / Conv / Embedding / the cells keep its
    dtype, LSTM / GRU re-type it); a Python number becomes a ``dtype`` tensor."""
    if isinstance(value, torch.Tensor):
        value = value.detach().clone()
        return value if keep_tensor_dtype else value.to(dtype)
    return torch.tensor(value, dtype=dtype, device=device)


_PER_TENSOR = (_dt.per_tensor_affine,)
_PER_CHANNEL = (_dt.per_channel_affine, _dt.per_channel_affine_float_qparams)


class ReferenceQuantizedModule(torch.nn.Module):
    """Mixin for a float module whose weight(s) are quantize-dequantized in ``forward``.

    Subclasses call ``_init_weight_qparams`` after the float module's ``__init__``."""

    _IS_REFERENCE = True
    # torch saves <name>_qscheme / <name>_dtype in the state dict of these (not of the RNNs)
    _QPARAMS_IN_STATE_DICT = True
    # qschemes torch accepts (the RNNs reject the float-qparams scheme)
    _SUPPORTED_QSCHEMES: tuple = (None,) + _PER_TENSOR + _PER_CHANNEL
    # Linear / Conv / Embedding / the cells keep a tensor qparam's dtype; LSTM / GRU do not
    _KEEP_TENSOR_DTYPE = True

    # ---- construction ---------------------------------------------------------------------
    def _init_weight_qparams(self, weight_qparams: Optional[dict], device: Any = None) -> None:
        """The qparams of ``self.weight`` (``None`` = per-tensor quint8, scale 1, zp 0)."""
        qparams = default_weight_qparams() if weight_qparams is None else weight_qparams
        self._register_qparams("weight", qparams, device, default_buffers=True)
        # torch honours quant_min / quant_max only on its "decomposed" path, which clamps the
        # integers; the default path quantizes over the dtype's full range.
        self.is_decomposed: bool = bool(qparams.get("is_decomposed", False))
        self.weight_quant_min: Optional[int] = qparams.get("quant_min")
        self.weight_quant_max: Optional[int] = qparams.get("quant_max")

    def _register_qparams(self, name: str, qparams: dict, device: Any,
                          default_buffers: bool) -> None:
        """Attributes and buffers for weight ``name``.  Without integer qparams (qscheme
        ``None`` or a float dtype) ``default_buffers`` registers scale 1 / zp 0 / axis 0 (as
        torch does for Linear, Conv, Embedding) and otherwise nothing (torch's RNNs)."""
        if "qscheme" not in qparams or "dtype" not in qparams:
            raise KeyError(f"{self._get_name()}: weight qparams for {name!r} need 'qscheme' "
                           f"and 'dtype', got keys {sorted(qparams)}")
        qscheme = _resolve_qscheme(qparams["qscheme"])
        if qscheme not in self._SUPPORTED_QSCHEMES:
            raise AssertionError(f"qscheme: {qscheme} is not supported in reference quantized "
                                 f"{self._get_name()}")
        dtype = _resolve_dtype(qparams["dtype"])
        setattr(self, f"{name}_qscheme", qscheme)
        setattr(self, f"{name}_dtype", dtype)
        keep = self._KEEP_TENSOR_DTYPE
        has_qparams = qscheme is not None and (isinstance(dtype, _dt.QDType)
                                               or not default_buffers)
        if has_qparams:
            scale = _as_buffer(qparams["scale"], torch.float32, device, keep)
            zero_point = _as_buffer(qparams["zero_point"], torch.int32, device, keep)
            if qscheme in _PER_CHANNEL:
                if "axis" not in qparams:
                    raise KeyError(f"{self._get_name()}: per-channel qparams for {name!r} "
                                   f"need 'axis'")
                axis = _as_buffer(qparams["axis"], torch.int32, device, keep)
            else:
                axis = torch.tensor(0, dtype=torch.int32, device=device)
        elif default_buffers:
            scale = torch.tensor(1.0, dtype=torch.float32, device=device)
            zero_point = torch.tensor(0, dtype=torch.int32, device=device)
            axis = torch.tensor(0, dtype=torch.int32, device=device)
        else:
            return
        self.register_buffer(f"{name}_scale", scale)
        self.register_buffer(f"{name}_zero_point", zero_point)
        self.register_buffer(f"{name}_axis", axis)
        setattr(self, f"{name}_axis_int", int(axis))

    def _quantized_weight_names(self) -> list[str]:
        return ["weight"]

    # ---- the weight -------------------------------------------------------------------------
    def _quantize_named(self, weight: torch.Tensor, name: str) -> Union[QTensor, torch.Tensor]:
        """``weight`` quantized with the qparams of ``name``: a QTensor, or a float16 tensor
        for float16 weights (as torch's ``get_quantized_weight``)."""
        qscheme = getattr(self, f"{name}_qscheme", None)
        dtype = getattr(self, f"{name}_dtype", None)
        if dtype is torch.float16:
            return weight.to(torch.float16)
        w = weight.detach()
        if isinstance(dtype, _dt.QDType) and not dtype.is_sub_byte and qscheme in _PER_TENSOR:
            q = quantize_per_tensor(w, float(getattr(self, f"{name}_scale")),
                                    int(getattr(self, f"{name}_zero_point")), dtype)
        elif isinstance(dtype, _dt.QDType) and qscheme in _PER_CHANNEL \
                and dtype is not _dt.quint2x4:
            q = quantize_per_channel(w, getattr(self, f"{name}_scale"),
                                     getattr(self, f"{name}_zero_point"),
                                     int(getattr(self, f"{name}_axis")), dtype)
        else:
            raise ValueError(f"Unsupported dtype and qscheme: {dtype}, {qscheme}")
        if name == "weight" and getattr(self, "is_decomposed", False):
            qmin, qmax = self.weight_quant_min, self.weight_quant_max
            if qmin is not None and qmax is not None and (qmin, qmax) != (dtype.qmin, dtype.qmax):
                q = q._with(q.int_data.clamp(qmin, qmax))
        return q

    def _fake_quantize_named(self, weight: torch.Tensor, name: str) -> torch.Tensor:
        """quantize -> dequantize of ``weight`` (unchanged when it has no qscheme), in the
        weight's dtype so the float op that follows sees matching dtypes."""
        if getattr(self, f"{name}_qscheme", None) is None:
            return weight
        q = self._quantize_named(weight, name)
        out = q.dequantize() if isinstance(q, QTensor) else q
        return out.to(weight.dtype)

    def get_weight(self) -> torch.Tensor:
        """The weight after quantize -> dequantize: what the reference forward computes with."""
        return self._fake_quantize_named(self.weight, "weight")

    def get_quantized_weight(self) -> Union[QTensor, torch.Tensor]:
        """The weight as a QTensor with the stored qparams (float16 tensor for fp16 weights)."""
        return self._quantize_named(self.weight, "weight")

    # ---- state dict -----------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self._QPARAMS_IN_STATE_DICT:
            for name in self._quantized_weight_names():
                destination[f"{prefix}{name}_qscheme"] = getattr(self, f"{name}_qscheme")
                destination[f"{prefix}{name}_dtype"] = getattr(self, f"{name}_dtype")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        names = self._quantized_weight_names()
        if self._QPARAMS_IN_STATE_DICT:
            for name in names:
                for attr, resolve in (("qscheme", _resolve_qscheme), ("dtype", _resolve_dtype)):
                    key = f"{prefix}{name}_{attr}"
                    if key not in state_dict:
                        if strict:
                            missing_keys.append(key)
                        continue
                    try:
                        setattr(self, f"{name}_{attr}", resolve(state_dict.pop(key)))
                    except TypeError as e:
                        error_msgs.append(f"while loading {key!r}: {e}")
        for name in names:
            # a per-tensor module may load per-channel qparams (and back): take the saved shape
            for suffix in ("scale", "zero_point", "axis"):
                value = state_dict.get(f"{prefix}{name}_{suffix}")
                current = getattr(self, f"{name}_{suffix}", None)
                if isinstance(value, torch.Tensor) and isinstance(current, torch.Tensor):
                    setattr(self, f"{name}_{suffix}",
                            torch.empty_like(value, device=current.device))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        for name in names:
            if isinstance(getattr(self, f"{name}_axis", None), torch.Tensor):
                setattr(self, f"{name}_axis_int", int(getattr(self, f"{name}_axis")))
