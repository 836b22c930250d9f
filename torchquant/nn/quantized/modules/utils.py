"""Helpers the quantized modules share: weight quantization from an observer, the output
qparams of an observed float module, and :class:`OutputQParams` -- how a module holds, validates,
saves and loads its output ``scale`` / ``zero_point``."""
from __future__ import annotations

import math
import numbers
from typing import Any, ClassVar, Optional, Sequence

import torch

from .... import dtypes as _dt
from ....tensor.qtensor import QTensor, torchscript_unsupported
from ....tensor.functions import quantize_per_channel, quantize_per_tensor

__all__ = ["quantize_weight", "observed_output_qparams", "weight_observer_of", "OutputQParams",
           "as_output_scale", "as_output_zero_point"]

_PER_TENSOR = ("per_tensor_affine", "per_tensor_symmetric")
_PER_CHANNEL = ("per_channel_affine", "per_channel_symmetric")


def _qscheme_name(qscheme: Any) -> str:
    return str(_dt.to_qscheme(qscheme)).rsplit(".", 1)[-1]


def quantize_weight(float_weight: torch.Tensor, observer: torch.nn.Module) -> QTensor:
    """Quantize a float weight with the qparams its (already run) observer computed.

    As torch does, the integers are then clamped to the observer's own quant range when that
    is narrower than the dtype's (e.g. the -127..127 weight observers).
    """
    scale, zero_point = observer.calculate_qparams()
    qdtype = _dt.to_qdtype(observer.dtype)
    scheme = _qscheme_name(observer.qscheme)
    w = float_weight.detach().float()
    if scheme in _PER_TENSOR:
        q = quantize_per_tensor(w, float(scale), int(zero_point), qdtype)
    elif scheme in _PER_CHANNEL:
        q = quantize_per_channel(w, scale.double(), zero_point.long(), observer.ch_axis, qdtype)
    elif scheme == "per_channel_affine_float_qparams":
        q = quantize_per_channel(w, scale.float(), zero_point.float(), observer.ch_axis, qdtype)
    else:
        raise ValueError(f"unexpected weight qscheme {observer.qscheme!r}")
    qmin, qmax = getattr(observer, "quant_min", None), getattr(observer, "quant_max", None)
    if (qmin is not None and qmax is not None and (qmin, qmax) != (qdtype.qmin, qdtype.qmax)
            and not qdtype.is_sub_byte):
        q = q._with(q.int_data.clamp(qmin, qmax))
    return q


def observed_output_qparams(mod: torch.nn.Module) -> tuple[float, int]:
    """(scale, zero_point) of an observed float module's output observer."""
    if not hasattr(mod, "activation_post_process"):
        raise AssertionError(f"{type(mod).__name__} has no activation_post_process: prepare "
                             "and calibrate the model before converting it")
    scale, zero_point = mod.activation_post_process.calculate_qparams()
    return float(scale), int(zero_point)


def weight_observer_of(mod: torch.nn.Module, use_precomputed_fake_quant: bool = False):
    """The weight observer / fake-quant of a float or QAT module, run on its weight."""
    if hasattr(mod, "weight_fake_quant"):
        observer = mod.weight_fake_quant
    else:
        if getattr(mod, "qconfig", None) is None:
            raise AssertionError(f"{type(mod).__name__} must have a qconfig to be converted")
        observer = mod.qconfig.weight()
    if not use_precomputed_fake_quant:
        observer(mod.weight)
    return observer


# ---- output qparams -----------------------------------------------------------------------------

_FLOAT32_MAX = float(torch.finfo(torch.float32).max)
_FLOAT32_TINY = float(torch.finfo(torch.float32).smallest_normal) * 2.0**-23  # smallest subnormal


def _one_number(value: Any, what: str) -> Any:
    """``value`` as a Python number: numbers pass, 0-d / 1-element plain tensors are read once.

    TypeError for anything else (None, strings, QTensors, bool, complex); ValueError for a
    tensor of more than one element."""
    if isinstance(value, torch.Tensor):
        if isinstance(value, QTensor):
            raise TypeError(f"{what} must be a number or a 1-element tensor, got a QTensor")
        if value.dtype == torch.bool or value.dtype.is_complex:
            raise TypeError(f"{what} must be a real number, got a tensor of {value.dtype}")
        if value.numel() != 1:
            raise ValueError(f"{what} must be a single number, got a tensor of shape "
                             f"{tuple(value.shape)}")
        return value.detach().reshape(()).item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{what} must be a number or a 1-element tensor, got "
                        f"{type(value).__name__}")
    return value


def as_output_scale(value: Any, what: str = "scale") -> float:
    """A module's output scale as a Python float: positive, finite, and inside float32's range
    (the state dict and the kernels hold it as float32)."""
    v = float(_one_number(value, what))
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{what} must be positive and finite, got {v}")
    if not _FLOAT32_TINY <= v <= _FLOAT32_MAX:
        raise ValueError(f"{what} must lie in float32's range, got {v}")
    return v


def as_output_zero_point(value: Any, qdtypes: Sequence[_dt.QDType],
                         what: str = "zero_point") -> int:
    """A module's output zero point as a Python int: an integer (integral floats accepted)
    inside the range of the dtypes the module can output."""
    v = _one_number(value, what)
    if not isinstance(v, numbers.Integral):
        v = float(v)
        if not math.isfinite(v) or v != math.floor(v):
            raise ValueError(f"{what} must be an integer, got {v}")
    v = int(v)
    lo, hi = min(d.qmin for d in qdtypes), max(d.qmax for d in qdtypes)
    if not lo <= v <= hi:
        names = " / ".join(d.name for d in qdtypes)
        raise ValueError(f"{what} must lie in [{lo}, {hi}] (the range of the {names} output), "
                         f"got {v}")
    return v


def _version_of(t: torch.Tensor) -> Optional[int]:
    """``t._version``, or None for an inference tensor (made under ``torch.inference_mode``),
    which keeps no version counter."""
    return None if t.is_inference() else t._version


class NotScriptable:
    """Mixin: ``torch.jit.script`` refuses the module with a clear error (it calls
    ``__prepare_scriptable__`` on every submodule first) instead of compiling a forward that
    would run TorchScript on QTensors."""

    def __prepare_scriptable__(self) -> Any:
        raise torchscript_unsupported(f"torch.jit.script ({type(self).__name__})")


def refuse_float_dtype_change(module: Any, fn: Any) -> None:
    """RuntimeError when ``fn`` (what ``Module._apply`` maps over tensors) turns float32 into
    another float dtype: a converted model computes in integers with float32 qparams."""
    try:
        dtype = fn(torch.zeros(1)).dtype
    except Exception:  # not a tensor map we can probe (the real call will say what is wrong)
        return
    if dtype != torch.float32 and dtype.is_floating_point:
        raise RuntimeError(
            f"{type(module).__name__} is a quantized module: converting it to {dtype} would "
            "round its float32 qparams and biases and silently change its outputs. Convert the "
            "float model instead; a quantized model takes float32 input (as torch.ao's: "
            "'Quantize only works on Float Tensor')")


class OutputQParams(NotScriptable):
    """Mixin of the quantized modules with output qparams (``scale`` / ``zero_point``).

    They are what torch's module of the same name holds, in one of three storages
    (``_QPARAM_STORAGE``):

    * ``"saved"`` -- Python numbers, written to the state dict as a float32 and an int64 0-d
      tensor (torch's Linear, Conv and QFunctional families).  Reading ``m.scale`` gives the
      number assigned, as in torch; the state dict holds it at float32 precision, as torch's.
    * ``"plain"`` -- Python numbers outside the state dict (torch's ELU, Softmax, PReLU,
      Sigmoid).
    * ``"buffer"`` -- tensors of shape ``_QPARAM_BUFFER_SHAPE``, as torch's buffers (BatchNorm,
      Hardswish, LeakyReLU, the norms: 0-d; Quantize: 1 element).  Reading ``m.scale`` returns
      the buffer, as torch does; the buffer keeps its float dtype (so the value read back is
      rounded to it).

    Assigning a number or a 0-d / 1-element tensor works in all three (torch's buffers refuse
    numbers): the value is validated (TypeError for a wrong type, ValueError for a
    non-positive / non-finite scale or a zero point that is not an integer in the range of the
    dtypes the module outputs, ``_OUTPUT_QDTYPES``) and stored.  Forwards read the Python
    numbers ``self._output_qparams()`` returns, never ``float(buffer)``, so that ``torch.export``
    / ``torch.compile(fullgraph=True)`` see constants rather than data-dependent reads.  For the
    buffer storage those are a cache, refreshed on assignment and ``load_state_dict``, and --
    outside of tracing -- whenever a buffer was replaced or changed in place (``.to()``,
    ``fill_``...); under tracing the cache is trusted.

    Loading accepts 0-d and 1-element tensors (or numbers) for either key, so torch's state
    dicts and ours load both ways.  Subclasses call ``_init_output_qparams`` in ``__init__``.
    """

    _QPARAM_NAMES: ClassVar[tuple[str, str]] = ("scale", "zero_point")
    _QPARAM_STORAGE: ClassVar[str] = "saved"
    _QPARAM_BUFFER_SHAPE: ClassVar[tuple[int, ...]] = ()
    # Output dtypes the module can produce (the zero point must fit one of them); the default
    # is every per-tensor dtype the quantized ops take -- the output follows the input.
    _OUTPUT_QDTYPES: ClassVar[tuple[_dt.QDType, ...]] = (_dt.quint8, _dt.qint8, _dt.qint32)

    _out_scale: float
    _out_zero_point: int

    def _output_qdtypes(self) -> tuple[_dt.QDType, ...]:
        return self._OUTPUT_QDTYPES

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        """``.to()`` / ``.cpu()`` as any module; a float-dtype change (``.half()``,
        ``.bfloat16()``, ``.double()``, ``.to(torch.float16)``) raises instead of rounding the
        float qparams and biases, which would silently change the outputs."""
        refuse_float_dtype_change(self, fn)
        return super()._apply(fn, recurse)  # type: ignore[misc]

    def _init_output_qparams(self, scale: Any, zero_point: Any, device: Any = None,
                             dtype: Any = None) -> None:
        """Set the initial qparams; the buffer storage registers its buffers (``dtype`` /
        ``device`` as torch's factory kwargs: the float dtype of ``scale`` and the device)."""
        scale_name, zp_name = self._QPARAM_NAMES
        if self._QPARAM_STORAGE == "buffer":
            shape = self._QPARAM_BUFFER_SHAPE
            self.register_buffer(scale_name, torch.ones(shape, device=device, dtype=dtype))
            self.register_buffer(zp_name, torch.zeros(shape, device=device, dtype=torch.int64))
        setattr(self, scale_name, scale)
        setattr(self, zp_name, zero_point)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._QPARAM_NAMES:
            self._set_output_qparam(name, value)
        else:
            super().__setattr__(name, value)

    def _set_output_qparam(self, name: str, value: Any, inplace: bool = False) -> None:
        is_scale = name == self._QPARAM_NAMES[0]
        number = (as_output_scale(value, name) if is_scale
                  else as_output_zero_point(value, self._output_qdtypes(), name))
        if self._QPARAM_STORAGE == "buffer":
            buf = self._buffers.get(name)
            if buf is None:
                raise AttributeError(f"{type(self).__name__} has no {name!r} buffer: call "
                                     "_init_output_qparams first")
            if is_scale:  # what the buffer will hold (its float dtype) must be valid too
                number = as_output_scale(torch.tensor(number, dtype=buf.dtype), name)
            if inplace:
                with torch.no_grad():
                    buf.fill_(number)
            else:
                self._buffers[name] = torch.full(buf.shape, number, dtype=buf.dtype,
                                                 device=buf.device)
            self._note_qparam_buffers()
        else:
            torch.nn.Module.__setattr__(self, name, number)
        object.__setattr__(self, "_out_scale" if is_scale else "_out_zero_point", number)

    def _note_qparam_buffers(self) -> None:
        """Buffer storage: remember which buffers (and versions) the cached numbers match."""
        s, z = self._buffers[self._QPARAM_NAMES[0]], self._buffers[self._QPARAM_NAMES[1]]
        object.__setattr__(self, "_qparam_buffers", (s, _version_of(s), z, _version_of(z)))

    def _sync_output_qparams(self) -> None:
        """Buffer storage: re-read the cached numbers from the buffers (validated)."""
        scale_name, zp_name = self._QPARAM_NAMES
        scale = as_output_scale(self._buffers[scale_name], scale_name)
        zero_point = as_output_zero_point(self._buffers[zp_name], self._output_qdtypes(),
                                          zp_name)
        object.__setattr__(self, "_out_scale", scale)
        object.__setattr__(self, "_out_zero_point", zero_point)
        self._note_qparam_buffers()

    def _output_qparams(self) -> tuple[float, int]:
        """(scale, zero_point) as Python numbers, for the forward."""
        if self._QPARAM_STORAGE == "buffer" and not torch.compiler.is_compiling():
            s, z = self._buffers[self._QPARAM_NAMES[0]], self._buffers[self._QPARAM_NAMES[1]]
            seen = self._qparam_buffers
            # inference tensors keep no version (None): their numbers are re-read every call
            if s is not seen[0] or z is not seen[2] or seen[1] is None or seen[3] is None \
                    or s._version != seen[1] or z._version != seen[3]:
                self._sync_output_qparams()
        return self._out_scale, self._out_zero_point

    def _qparams_repr(self) -> str:
        scale, zero_point = self._output_qparams()
        return f"scale={scale}, zero_point={zero_point}"

    # ---- state dict -----------------------------------------------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)  # (buffers: saved there)
        if self._QPARAM_STORAGE == "saved":
            scale_name, zp_name = self._QPARAM_NAMES
            destination[prefix + scale_name] = torch.tensor(self._out_scale, dtype=torch.float32)
            destination[prefix + zp_name] = torch.tensor(self._out_zero_point, dtype=torch.int64)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        handled = []
        if self._QPARAM_STORAGE != "plain":
            inplace = not local_metadata.get("assign_to_params_buffers", False)
            for name in self._QPARAM_NAMES:
                key = prefix + name
                if key not in state_dict:
                    if self._QPARAM_STORAGE == "saved":
                        missing_keys.append(key)  # (buffers: nn.Module reports them)
                    continue
                value = state_dict.pop(key)
                handled.append(key)
                try:
                    self._set_output_qparam(name, value, inplace=inplace)
                except (TypeError, ValueError) as exc:
                    error_msgs.append(f"While copying {key}: {exc}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        if handled and self._QPARAM_STORAGE == "buffer":  # nn.Module saw the buffers' keys gone
            missing_keys[:] = [k for k in missing_keys if k not in handled]
