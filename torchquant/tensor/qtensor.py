"""``QTensor``: a quantized tensor over plain integer storage.

A ``torch.Tensor`` wrapper subclass holding ``int_data`` (uint8 / int8 / int32; packed bytes for
the sub-byte dtypes), ``scale`` and ``zero_point`` (0-d per tensor, 1-d along ``axis`` per
channel) and the quantized dtype.  Its ``dtype`` is the storage dtype; the quantized dtype is
``.qdtype``.  Only the operations that make sense on quantized values are defined (see
``_OPS``); anything else raises ``NotImplementedError`` naming the op, never a float fallback.
"""
from __future__ import annotations

import math
import sys
from collections import namedtuple
from typing import Any, Callable, Optional, Sequence

import torch

from .. import affine
from .. import dtypes as _dt
from ..dtypes import QDType, QScheme
from ..ops import quantize as ops_quantize

__all__ = ["QTensor"]

_SHARED_QPARAMS: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}  # from_int_per_tensor's

aten = torch.ops.aten
_ValuesIndices = namedtuple("_ValuesIndices", ["values", "indices"])


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def torchscript_unsupported(what: str) -> RuntimeError:
    """The error for TorchScript (``torch.jit.script`` / ``trace``, hence ``save``) meeting a
    QTensor or a quantized module.  TorchScript would see only the storage-less wrapper -- no
    integers, no qparams -- and read or save garbage (or crash the interpreter); it is refused
    up front, pointing to the tracers that do support QTensors."""
    return RuntimeError(
        f"{what} does not support torchquant's QTensors or quantized modules: TorchScript sees "
        f"a QTensor as an empty wrapper (its integers and qparams live in Python), so the "
        f"result would be wrong or crash. Use torch.export.export(model, args) (a graph of "
        f"torch.ops.torchquant ops, saved with torch.export.save) or torch.compile(model) "
        f"instead.")


def _refuse_jit_trace() -> None:
    if torch._C._get_tracing_state() is not None:
        raise torchscript_unsupported("torch.jit.trace")


class QTensor(torch.Tensor):
    """Quantized tensor.  Build it with :func:`torchquant.quantize_per_tensor`,
    :func:`torchquant.quantize_per_channel` or :meth:`QTensor.from_int`."""

    int_data: torch.Tensor
    scale: torch.Tensor
    zero_point: torch.Tensor
    qdtype: QDType
    axis: Optional[int]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        _refuse_jit_trace()
        if func in _EAGER_VIEW_FUNCTIONS and args and _plain_per_tensor(args[0]):
            out = _eager_view(func, args, kwargs)
            if out is not NotImplemented:
                return out
        # Only a few torch-level functions are taken here, before torch decomposes them into
        # ops that cost more (F.max_pool2d would become max_pool2d_with_indices, whose indices
        # force a float round trip); everything else goes straight on to __torch_dispatch__.
        handler = _FUNCTIONS.get(func)
        if handler is not None:
            out = handler(*args, **(kwargs or {}))
            if out is not NotImplemented:  # NotImplemented: not a call the handler takes
                return out
        if func in _LAYOUT_FUNCTIONS and args and _traced_per_tensor(args[0]):
            # While traced, a per-tensor QTensor's layout ops act on its integers directly:
            # export's and dynamo's tracers do not re-dispatch these to __torch_dispatch__.
            return _rewrap(args[0], func(args[0].int_data, *args[1:], **(kwargs or {})))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))

    @staticmethod
    def __new__(cls, int_data: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                qdtype: QDType, axis: Optional[int] = None, shape: Optional[Sequence[int]] = None,
                numbers: Optional[tuple[float, int]] = None):
        _refuse_jit_trace()
        qdtype = _dt.qdtype_of(qdtype)
        if qdtype.is_sub_byte:
            shape = tuple(shape)
            strides, offset = _contiguous_strides(shape), 0
        else:
            shape, strides, offset = int_data.shape, int_data.stride(), int_data.storage_offset()
        return torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=strides, storage_offset=offset, dtype=qdtype.storage_dtype,
            device=int_data.device, requires_grad=False)

    def __init__(self, int_data, scale, zero_point, qdtype, axis=None, shape=None, numbers=None):
        self.int_data = int_data
        self.scale = scale
        self.zero_point = zero_point
        self.qdtype = _dt.qdtype_of(qdtype)
        self.axis = axis
        if numbers is not None:
            # (scale, zero_point) as Python numbers, equal to the tensors: read by the hot
            # paths, and what graphs see as constants (they travel in __tensor_flatten__).
            self._numbers = numbers

    # ---- construction -------------------------------------------------------------------------
    @classmethod
    def from_int(cls, int_data: torch.Tensor, scale: Any, zero_point: Any, qdtype: Any,
                 axis: Optional[int] = None, shape: Optional[Sequence[int]] = None) -> "QTensor":
        """Wrap existing integers (no copy).  Validates storage dtype, value range and qparams.

        For sub-byte dtypes ``int_data`` may be the packed 1-D bytes (give ``shape``) or the
        unpacked values in the logical shape (they are packed here)."""
        qdtype = _dt.to_qdtype(qdtype)
        if not isinstance(int_data, torch.Tensor) or isinstance(int_data, QTensor):
            raise TypeError(f"int_data must be a plain integer tensor, got {type(int_data).__name__}")
        if int_data.dtype != qdtype.storage_dtype:
            raise TypeError(f"int_data for {qdtype!r} must have dtype {qdtype.storage_dtype}, "
                            f"got {int_data.dtype}")
        if qdtype.is_sub_byte:
            if shape is None:
                if int_data.numel() and int(int_data.max()) > qdtype.qmax:
                    raise ValueError(f"values for {qdtype!r} must lie in [0, {qdtype.qmax}]")
                shape = tuple(int_data.shape)
                int_data = affine.pack_sub_byte(int_data, qdtype.bits)
            else:
                need = math.ceil(math.prod(shape) / qdtype.values_per_byte)
                if int_data.dim() != 1 or int_data.numel() != need:
                    raise ValueError(f"packed {qdtype!r} data for shape {tuple(shape)} must be 1-D "
                                     f"with {need} bytes, got shape {tuple(int_data.shape)}")
        scale_t, zp_t = _normalise_qparams(scale, zero_point, qdtype, axis,
                                           shape if qdtype.is_sub_byte else int_data.shape)
        return cls(int_data, scale_t, zp_t, qdtype, axis, shape)

    @classmethod
    def from_int_per_tensor(cls, int_data: torch.Tensor, scale: float, zero_point: int,
                            qdtype: QDType) -> "QTensor":
        """:meth:`from_int` for the per-call outputs of quantized modules (8/32-bit storage):
        each distinct (scale, zero_point, qdtype) is validated and made into 0-d tensors once,
        then shared -- QTensor qparams are never modified in place."""
        if int_data.dtype != qdtype.storage_dtype or qdtype.is_sub_byte:
            return cls.from_int(int_data, scale, zero_point, qdtype)
        key = (float(scale), int(zero_point), qdtype)
        if torch.compiler.is_compiling():  # no shared cache while dynamo traces
            scale_t, zp_t = _normalise_qparams(key[0], key[1], qdtype, None, ())
            return cls(int_data, scale_t, zp_t, qdtype, numbers=key[:2])
        qparams = shared_qparams(key[0], key[1], qdtype)
        if cls is QTensor and type(int_data) is torch.Tensor:
            return new_qtensor(int_data, qparams[0], qparams[1], qdtype, None, key[:2])
        return cls(int_data, qparams[0], qparams[1], qdtype, numbers=key[:2])

    # ---- tracing / serialization --------------------------------------------------------------
    def __tensor_flatten__(self):
        # plain constants only (the dtype by name): dynamo rebuilds the tensor from them
        return ["int_data", "scale", "zero_point"], (self.qdtype.name, self.axis,
                                                     tuple(self.shape),
                                                     self.__dict__.get("_numbers"))

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        qdtype, axis, shape, numbers = ctx
        qdtype = _dt.qdtype_of(qdtype)
        return QTensor(inner["int_data"], inner["scale"], inner["zero_point"], qdtype, axis,
                       outer_size if qdtype.is_sub_byte else None, numbers)

    def __reduce_ex__(self, protocol):
        return (_rebuild_qtensor, (self.int_data, self.scale, self.zero_point, self.qdtype.name,
                                   self.axis, tuple(self.shape)))

    def __deepcopy__(self, memo):
        out = QTensor(self.int_data.clone(), self.scale.clone(), self.zero_point.clone(),
                      self.qdtype, self.axis, tuple(self.shape))
        memo[id(self)] = out
        return out

    # ---- accessors ----------------------------------------------------------------------------
    @property
    def is_quantized(self) -> bool:  # type: ignore[override]
        """True for users.  torch's own internals (fake-tensor conversion for torch.compile and
        export, serialization) read ``is_quantized`` to mean "has a torch quantized dtype", which a
        QTensor never has, so callers inside the ``torch`` package see False -- except
        ``torch.testing``, whose comparisons then compare dequantized values and qschemes, as
        for torch's quantized tensors."""
        caller = sys._getframe(1).f_globals.get("__name__", "")
        return not (caller == "torch" or caller.startswith("torch.")) \
            or caller.startswith("torch.testing")

    def qscheme(self) -> QScheme:  # type: ignore[override]
        if self.axis is None:
            return _dt.per_tensor_affine
        if self.zero_point.dtype.is_floating_point:
            return _dt.per_channel_affine_float_qparams
        return _dt.per_channel_affine

    def int_repr(self) -> torch.Tensor:  # type: ignore[override]
        """A copy of the stored integers (packed 1-D bytes for sub-byte dtypes, as torch)."""
        _refuse_jit_trace()
        return self.int_data.clone(memory_format=torch.preserve_format) \
            if not self.qdtype.is_sub_byte else self.int_data.clone()

    def q_scale(self) -> float:  # type: ignore[override]
        self._need_per_tensor("q_scale")
        return float(self.scale)

    def q_zero_point(self) -> int:  # type: ignore[override]
        self._need_per_tensor("q_zero_point")
        return int(self.zero_point)

    def q_per_channel_scales(self) -> torch.Tensor:  # type: ignore[override]
        self._need_per_channel("q_per_channel_scales")
        return self.scale.clone()

    def q_per_channel_zero_points(self) -> torch.Tensor:  # type: ignore[override]
        self._need_per_channel("q_per_channel_zero_points")
        return self.zero_point.clone()

    def q_per_channel_axis(self) -> int:  # type: ignore[override]
        self._need_per_channel("q_per_channel_axis")
        return int(self.axis)

    def dequantize(self) -> torch.Tensor:  # type: ignore[override]
        _refuse_jit_trace()
        if type(self) is QTensor and self.axis is None and self.qdtype.bits >= 8:
            ints = self.int_data
            if type(ints) is torch.Tensor and not torch.compiler.is_compiling():  # plain eager
                return ops_quantize.dequantize_per_tensor_tensors(
                    ints, self.scale, self.zero_point, self.__dict__.get("_numbers"))
        if _traced_per_tensor(self):  # one graph node, its qparams constants
            return ops_quantize.dequantize_per_tensor(self.int_data, *self._numbers)
        return ops_quantize.dequantize_int(self._values(), self.scale, self.zero_point, self.axis)

    def _scale_zp(self) -> tuple[float, int]:
        """Per-tensor (scale, zero_point) as Python numbers, read from the tensors once (the
        per-call hot paths key their caches on them; qparams change only through
        :meth:`_replace_qparams`, which drops this cache)."""
        numbers = self.__dict__.get("_numbers")
        if numbers is None:
            numbers = (float(self.scale), int(self.zero_point))
            if not torch.compiler.is_compiling():
                self._numbers = numbers
        return numbers

    def _replace_qparams(self, scale: torch.Tensor, zero_point: torch.Tensor,
                         axis: Optional[int] = None,
                         numbers: Optional[tuple[float, int]] = None) -> None:
        """Install a new qparams record, for the in-place ops whose output qparams differ from
        the input's (``hardsigmoid_``, ``copy_`` from another QTensor, ...).  The only way
        qparams change: scale, zero point and axis are replaced together and the cached
        Python numbers of :meth:`_scale_zp` are replaced with them -- by ``numbers`` (the new
        per-tensor qparams as Python numbers, where the caller has them) or dropped (the
        tensors themselves are never modified -- they may be shared with other QTensors)."""
        self.scale = scale
        self.zero_point = zero_point
        self.axis = axis
        self.__dict__.pop("_numbers", None)
        if numbers is not None and axis is None:
            self._numbers = numbers

    def _need_per_tensor(self, what: str) -> None:
        if self.axis is not None:
            raise RuntimeError(f"QTensor.{what}() is only defined for per-tensor quantization; "
                               f"this tensor is {self.qscheme()!r}")

    def _need_per_channel(self, what: str) -> None:
        if self.axis is None:
            raise RuntimeError(f"QTensor.{what}() is only defined for per-channel quantization; "
                               "this tensor is torchquant.per_tensor_affine")

    def _values(self) -> torch.Tensor:
        """The integers in the logical shape (a view for 8/32-bit, unpacked copy for sub-byte)."""
        if self.qdtype.is_sub_byte:
            return affine.unpack_sub_byte(self.int_data, self.qdtype.bits,
                                          self.numel()).reshape(self.shape)
        return self.int_data

    def _with(self, values: torch.Tensor, scale: Optional[torch.Tensor] = None,
              zero_point: Optional[torch.Tensor] = None, axis: Any = "same") -> "QTensor":
        """New QTensor over ``values`` (logical-shape integers) with these or self's qparams."""
        same = scale is None and zero_point is None and (axis == "same" or axis == self.axis)
        axis = self.axis if axis == "same" else axis
        scale = self.scale if scale is None else scale
        zero_point = self.zero_point if zero_point is None else zero_point
        if self.qdtype.is_sub_byte:
            return QTensor(affine.pack_sub_byte(values, self.qdtype.bits), scale, zero_point,
                           self.qdtype, axis, tuple(values.shape))
        numbers = self.__dict__.get("_numbers") if same else None
        if type(values) is torch.Tensor and not torch.compiler.is_compiling():
            return new_qtensor(values, scale, zero_point, self.qdtype, axis, numbers)
        return QTensor(values, scale, zero_point, self.qdtype, axis, numbers=numbers)

    def __repr__(self, *, tensor_contents=None) -> str:
        meta = f"size={tuple(self.shape)}, dtype={self.qdtype!r}, qscheme={self.qscheme()!r}"
        if _is_symbolic(self.int_data):  # while torch.compile/export traces: no values to show
            return f"QTensor({meta})"
        body = repr(self.dequantize()) if self.numel() else "tensor([])"  # size is in meta
        body = body[len("tensor("):-1] if body.startswith("tensor(") else body
        if self.axis is None:
            q = f"scale={self.q_scale()}, zero_point={self.q_zero_point()}"
        else:
            q = (f"scales={self.scale.tolist()}, zero_points={self.zero_point.tolist()}, "
                 f"axis={self.axis}")
        return f"QTensor({body}, {meta}, {q})"

    # ---- dispatch -----------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _OPS.get(func) or _OPS.get(func.overloadpacket)
        if handler is None:
            out = _decompose(func, args, kwargs)
            if out is not NotImplemented:
                return out
            raise NotImplementedError(
                f"torchquant.QTensor does not support {func}: quantized tensors only define the "
                "ops that are exact on integers. Call .dequantize() to get a float tensor first.")
        if (func.is_view and torch.is_inference_mode_enabled() and args
                and isinstance(args[0], torch.Tensor) and not args[0].is_inference()):
            # torch's rule: a view of a normal tensor is a normal tensor even in inference mode
            # (it shares the base's version counter); a wrapper made in inference mode would
            # be an inference tensor, which torch then fails to attach to its base.
            with torch.inference_mode(False):
                return handler(func, *args, **kwargs)
        return handler(func, *args, **kwargs)


_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


def _decompose(func, args, kwargs):
    """Under torch.inference_mode() the CompositeImplicitAutograd ops (flatten, view_as,
    contiguous, dropout, movedim, ...) arrive at __torch_dispatch__ undecomposed (elsewhere the
    autograd key decomposes them on the way): run the same C++ composite kernel eager torch
    runs (``func.decompose`` would prefer a Python decomposition meant for tracing, which can
    differ: dropout's clones where eager returns its input).  NotImplemented if there is none."""
    if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), _COMPOSITE):
        return func._op_dk(_COMPOSITE, *args, **kwargs)
    return func.decompose(*args, **kwargs)


# ------------------------------------------------------------------------------------------------
# qparam validation shared by the constructors
# ------------------------------------------------------------------------------------------------

def _normalise_qparams(scale: Any, zero_point: Any, qdtype: QDType, axis: Optional[int],
                       shape: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    if axis is None:
        if isinstance(scale, (int, float)) and isinstance(zero_point, int):
            # Plain numbers: validate in Python (a per-call hot path for small tensors).
            if not (math.isfinite(scale) and scale > 0):
                raise ValueError(f"scale must be positive and finite, got [{scale}]")
            if not qdtype.qmin <= zero_point <= qdtype.qmax:
                raise ValueError(f"zero_point must lie in [{qdtype.qmin}, {qdtype.qmax}] for "
                                 f"{qdtype!r}, got [{zero_point}]")
            return (torch.tensor(float(scale), dtype=torch.float64),
                    torch.tensor(zero_point, dtype=torch.int64))
        scale_t = torch.as_tensor(scale, dtype=torch.float64).detach().clone().cpu()
        if scale_t.numel() != 1:
            raise ValueError(f"per-tensor scale must be a single number, got {scale_t.numel()} values")
        scale_t = scale_t.reshape(())
        affine.check_scale(scale_t)
        zp_t = torch.as_tensor(zero_point).detach().clone().cpu()
        if zp_t.numel() != 1:
            raise ValueError(f"per-tensor zero_point must be a single integer, got {zp_t.numel()} values")
        if zp_t.dtype.is_floating_point:
            if not bool(torch.isfinite(zp_t).all()) or float(zp_t) != round(float(zp_t)):
                raise ValueError(f"per-tensor zero_point must be an integer, got {float(zp_t)}")
        zp_t = zp_t.reshape(()).to(torch.int64)
        affine.check_zero_point(zp_t, qdtype)
        return scale_t, zp_t
    ndim = len(shape)
    if not -max(ndim, 1) <= axis < max(ndim, 1) or ndim == 0:
        raise ValueError(f"axis {axis} is out of range for a tensor of {ndim} dimensions")
    axis = axis % ndim
    scale_t = torch.as_tensor(scale).detach()
    if not scale_t.dtype.is_floating_point:
        raise TypeError(f"per-channel scales must be floating point, got {scale_t.dtype}")
    scale_t = scale_t.to(torch.float64).reshape(-1).clone()
    zp_t = torch.as_tensor(zero_point).detach().reshape(-1).clone()
    n = shape[axis]
    if scale_t.numel() != n or zp_t.numel() != n:
        raise ValueError(f"per-channel quantization along axis {axis} needs {n} scales and zero "
                         f"points, got {scale_t.numel()} scales and {zp_t.numel()} zero points")
    affine.check_scale(scale_t, "scales")
    if not zp_t.dtype.is_floating_point:
        zp_t = zp_t.to(torch.int64)
    affine.check_zero_point(zp_t, qdtype, "zero_points")
    return scale_t.to(scale_t.device), zp_t


def shared_qparams(scale: float, zero_point: int,
                   qdtype: QDType) -> tuple[torch.Tensor, torch.Tensor]:
    """The validated 0-d (scale, zero_point) tensors of these per-tensor qparams, made once and
    shared by every QTensor that has them (qparams are never modified in place).  Raises for
    invalid qparams, as :meth:`QTensor.from_int`."""
    key = (scale, zero_point, qdtype)
    qparams = _SHARED_QPARAMS.get(key)
    if qparams is None:
        if len(_SHARED_QPARAMS) >= 4096:
            _SHARED_QPARAMS.clear()
        qparams = _SHARED_QPARAMS[key] = _normalise_qparams(scale, zero_point, qdtype, None, ())
    return qparams


_make_wrapper_subclass = torch.Tensor._make_wrapper_subclass
_get_tracing_state = torch._C._get_tracing_state


def new_qtensor(int_data: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor,
                 qdtype: QDType, axis: Optional[int] = None,
                 numbers: Optional[tuple[float, int]] = None) -> QTensor:
    """``QTensor(int_data, scale, zero_point, qdtype, axis, numbers=numbers)`` for 8/32-bit
    storage in plain eager mode, in one step: no normalisation of ``qdtype`` (a QDType) and
    no checks -- the caller's qparams are already valid and ``int_data`` has ``qdtype``'s
    storage dtype.  (Under dynamo the class constructor is what it traces: not used there.)"""
    if _get_tracing_state() is not None:
        _refuse_jit_trace()
    out = _make_wrapper_subclass(QTensor, int_data.shape, strides=int_data.stride(),
                                 storage_offset=int_data.storage_offset(),
                                 dtype=qdtype.storage_dtype, device=int_data.device,
                                 requires_grad=False)
    out.int_data = int_data
    out.scale = scale
    out.zero_point = zero_point
    out.qdtype = qdtype
    out.axis = axis
    if numbers is not None:
        out._numbers = numbers
    return out


def _plain_per_tensor(q: Any) -> bool:
    """A per-tensor 8/32-bit QTensor over a plain tensor, outside dynamo: the eager fast
    paths apply (not to subclasses, fake / functional integers, or while tracing)."""
    return (type(q) is QTensor and q.axis is None and q.qdtype.bits >= 8
            and type(q.int_data) is torch.Tensor and not torch.compiler.is_compiling())


# Pure layout functions: on a per-tensor QTensor the same function of its integers, with the
# same qparams.  In eager mode they run on the integers directly (no decomposition, no
# __torch_dispatch__ round trip, no copy of the qparams).
_EAGER_VIEW_FUNCTIONS = frozenset({
    torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.flatten, torch.flatten,
    torch.Tensor.contiguous, torch.Tensor.squeeze, torch.squeeze, torch.Tensor.unsqueeze,
    torch.unsqueeze, torch.Tensor.permute, torch.permute, torch.Tensor.transpose,
    torch.transpose,
})


def _eager_view(func: Callable, args: tuple, kwargs: Optional[dict]) -> Any:
    """``func(q, ...)`` of :data:`_EAGER_VIEW_FUNCTIONS` on the integers of ``q = args[0]``;
    NotImplemented where the result is not a same-dtype tensor (``view(dtype)``: the general
    path decides)."""
    q = args[0]
    ints = q.int_data
    out = func(ints, *args[1:], **(kwargs or {}))
    if out is ints:  # a no-op (contiguous of a contiguous tensor, ...): the input itself
        return q
    if type(out) is not torch.Tensor or out.dtype != ints.dtype:
        return NotImplemented
    numbers = q.__dict__.get("_numbers")
    if torch.is_inference_mode_enabled() and not out.is_inference():
        # a view of a normal tensor is a normal tensor even in inference mode (torch's rule;
        # the general path makes its wrapper the same way)
        with torch.inference_mode(False):
            return new_qtensor(out, q.scale, q.zero_point, q.qdtype, None, numbers)
    return new_qtensor(out, q.scale, q.zero_point, q.qdtype, None, numbers)


# Layout-only functions: on a per-tensor QTensor they are the same function of its integers.
_LAYOUT_FUNCTIONS = frozenset({
    torch.Tensor.view, torch.Tensor.reshape, torch.reshape, torch.Tensor.flatten, torch.flatten,
    torch.Tensor.permute, torch.permute, torch.Tensor.transpose, torch.transpose,
    torch.Tensor.contiguous, torch.Tensor.squeeze, torch.squeeze, torch.Tensor.unsqueeze,
    torch.unsqueeze, torch.Tensor.__getitem__, torch.Tensor.narrow, torch.narrow,
    torch.Tensor.select, torch.select, torch.Tensor.expand, torch.Tensor.clone, torch.clone,
    torch.Tensor.detach, torch.detach,
    torch.Tensor.chunk, torch.chunk, torch.Tensor.split, torch.split, torch.Tensor.unbind,
    torch.unbind, torch.Tensor.t, torch.t, torch.Tensor.as_strided, torch.as_strided,
    torch.Tensor.repeat, torch.Tensor.index_select, torch.index_select, torch.channel_shuffle,
    torch.native_channel_shuffle,
})


def _traced_per_tensor(q: Any) -> bool:
    return (type(q) is QTensor and q.axis is None and not q.qdtype.is_sub_byte
            and "_numbers" in q.__dict__
            and (type(q.int_data) is not torch.Tensor or torch.compiler.is_compiling()))


def _rewrap(q: QTensor, out: Any) -> Any:
    if isinstance(out, torch.Tensor):
        return QTensor(out, q.scale, q.zero_point, q.qdtype, numbers=q._numbers)
    return type(out)(_rewrap(q, o) for o in out)


def _is_symbolic(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake
    from torch._subclasses.functional_tensor import FunctionalTensor
    return is_fake(t) or isinstance(t, FunctionalTensor) or t.device.type == "meta"


def _rebuild_qtensor(int_data, scale, zero_point, qdtype_name, axis, shape):
    return QTensor(int_data, scale, zero_point, _dt._qdtype_by_name(qdtype_name), axis, shape)


# ------------------------------------------------------------------------------------------------
# op table
# ------------------------------------------------------------------------------------------------

_OPS: dict[Any, Callable] = {}
_FUNCTIONS: dict[Any, Callable] = {}  # torch-level functions QTensor handles itself


def _implements_function(*funcs):
    def deco(fn):
        for f in funcs:
            _FUNCTIONS[f] = fn
        return fn
    return deco


def _implements(*funcs):
    def deco(fn):
        for f in funcs:
            _OPS[f] = fn
        return fn
    return deco


def _unsupported(what: str, q: QTensor):
    raise NotImplementedError(f"torchquant.QTensor: {what} is not supported for "
                              f"{q.qscheme()!r} tensors; call .dequantize() first")


def _as_float(x):
    return x.dequantize() if isinstance(x, QTensor) else x


@_implements(aten.detach.default, aten.alias.default)
def _detach(func, q):
    return q._with(func(q._values()))


@_implements(aten.clone.default)
def _clone(func, q, memory_format=torch.preserve_format):
    if q.qdtype.is_sub_byte:
        return q._with(q._values())
    return q._with(q.int_data.clone(memory_format=memory_format), q.scale.clone(),
                   q.zero_point.clone())


@_implements(aten.dequantize.self)
def _dequantize(func, q):
    return q.dequantize()


@_implements(aten._to_copy.default)
def _to_copy(func, q, dtype=None, device=None, layout=None, pin_memory=None,
             non_blocking=False, memory_format=None):
    if dtype is not None and dtype != q.dtype:
        raise NotImplementedError(
            f"torchquant.QTensor cannot be cast to {dtype}: use .dequantize() for float values "
            "or .int_repr() for the integers")
    kw = dict(device=device, non_blocking=non_blocking)
    if memory_format is not None and not q.qdtype.is_sub_byte:
        kw["memory_format"] = memory_format
    ints = q.int_data.to(**kw)
    return QTensor(ints, q.scale.to(device=device), q.zero_point.to(device=device), q.qdtype,
                   q.axis, tuple(q.shape))


@_implements_function(torch.Tensor.to)
def _to_function(input, *args, **kwargs):
    """``Tensor.to`` taken at the torch-function level: itself where nothing changes (as
    torch), else the ``_to_copy`` handler."""
    if not isinstance(input, QTensor):
        return NotImplemented
    copy = kwargs.pop("copy", False)
    device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
    same_device = device is None or (device.type == input.device.type and (
        device.index is None or device.index == input.device.index))
    # torch's aliasing rule: the same layout only when the integers' own ``.to`` keeps them
    # (a tensor that is contiguous in both formats, c == 1 or h == w == 1, is still laid out
    # anew in the format asked for)
    same_layout = memory_format in (None, torch.preserve_format) or (
        not input.qdtype.is_sub_byte
        and input.int_data.to(memory_format=memory_format) is input.int_data)
    if not copy and same_device and (dtype is None or dtype == input.dtype) and same_layout:
        return input
    return _to_copy(aten._to_copy.default, input, dtype=dtype, device=device,
                    non_blocking=non_blocking, memory_format=memory_format)


# ---- view-like ops ----------------------------------------------------------------------------

def _view_axis(old_shape, axis, new_shape) -> int:
    """Where the channel dim lands after a reshape; it must survive as a whole dimension."""
    before = math.prod(old_shape[:axis])
    acc = 1
    for k, s in enumerate(new_shape):
        if acc == before and s == old_shape[axis]:
            return k
        acc *= s
    raise RuntimeError(f"cannot reshape a per-channel QTensor of shape {tuple(old_shape)} (axis "
                       f"{axis}) to {tuple(new_shape)}: the channel dimension must stay whole")


@_implements(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def _view(func, q, size):
    vals = func(q._values(), size) if not q.qdtype.is_sub_byte else q._values().reshape(size)
    axis = None if q.axis is None else _view_axis(tuple(q.shape), q.axis, tuple(vals.shape))
    return q._with(vals, axis=axis)


@_implements(aten.as_strided.default)
def _as_strided(func, q, size, stride, storage_offset=None):
    if q.axis is not None or q.qdtype.is_sub_byte:
        raise RuntimeError("Setting strides is possible only on uniformly (per-tensor) quantized "
                           "8/32-bit tensors")
    return q._with(func(q.int_data, size, stride, storage_offset))


@_implements(aten.expand.default)
def _expand(func, q, size, implicit=False):
    vals = func(q._values(), size, implicit=implicit) if not q.qdtype.is_sub_byte \
        else q._values().expand(size).contiguous()
    axis = q.axis
    if axis is not None:
        axis = axis + vals.dim() - q.dim()
        if vals.shape[axis] != q.shape[q.axis]:
            raise RuntimeError("cannot expand the channel dimension of a per-channel QTensor")
    return q._with(vals, axis=axis)


@_implements(aten.select.int)
def _select(func, q, dim, index):
    dim = dim % q.dim()
    vals = q._values().select(dim, index)
    if q.axis is None:
        return q._with(vals)
    if dim == q.axis:
        idx = index % q.shape[dim]
        return q._with(vals, q.scale[idx], q.zero_point[idx], axis=None)
    return q._with(vals, axis=q.axis - 1 if dim < q.axis else q.axis)


@_implements(aten.slice.Tensor)
def _slice(func, q, dim=0, start=None, end=None, step=1):
    dim = dim % q.dim()
    vals = func(q._values(), dim, start, end, step)
    if q.axis is not None and dim == q.axis:
        return q._with(vals, q.scale[start:end:step], q.zero_point[start:end:step])
    return q._with(vals)


def _refuse_strided_per_channel(q: "QTensor") -> None:
    """torch's rule (and message): a per-channel quantized tensor takes no new strides, so it
    cannot be transposed or permuted (``contiguous(memory_format=...)`` still works)."""
    if q.axis is not None:
        raise RuntimeError("Setting strides is possible only on uniformly quantized tensor")


@_implements(aten.transpose.int)
def _transpose(func, q, dim0, dim1):
    _refuse_strided_per_channel(q)
    d0, d1 = dim0 % max(q.dim(), 1), dim1 % max(q.dim(), 1)
    return q._with(q._values().transpose(d0, d1))


@_implements(aten.t.default)
def _t(func, q):
    _refuse_strided_per_channel(q)
    return _transpose(func, q, 0, 1) if q.dim() == 2 else q._with(q._values())


@_implements(aten.permute.default)
def _permute(func, q, dims):
    _refuse_strided_per_channel(q)
    dims = [d % q.dim() for d in dims]
    return q._with(q._values().permute(dims))


@_implements(aten.unsqueeze.default)
def _unsqueeze(func, q, dim):
    dim = dim % (q.dim() + 1)
    axis = None if q.axis is None else (q.axis + 1 if dim <= q.axis else q.axis)
    return q._with(q._values().unsqueeze(dim), axis=axis)


@_implements(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims)
def _squeeze(func, q, dim=None):
    if dim is None:
        dims = [d for d in range(q.dim()) if q.shape[d] == 1]
    else:
        dims = [d % max(q.dim(), 1) for d in ([dim] if isinstance(dim, int) else dim)]
        dims = [d for d in dims if q.dim() and q.shape[d] == 1]
    if q.axis is not None and q.axis in dims:
        raise RuntimeError("Squeeze is only possible on non-axis dimension for Per-Channel "
                           "Quantized Tensors.")  # torch's message
    vals = q._values()
    for d in sorted(dims, reverse=True):
        vals = vals.squeeze(d)
    axis = None if q.axis is None else q.axis - sum(1 for d in dims if d < q.axis)
    return q._with(vals, axis=axis)


@_implements(aten.split.Tensor, aten.split_with_sizes.default)
def _split(func, q, split, dim=0):
    dim = dim % q.dim()
    parts = func(q._values(), split, dim)
    if q.axis is None or dim != q.axis:
        return [q._with(p) for p in parts]
    out, start = [], 0
    for p in parts:
        n = p.shape[dim]
        out.append(q._with(p, q.scale[start:start + n], q.zero_point[start:start + n]))
        start += n
    return out


@_implements(aten.unbind.int)
def _unbind(func, q, dim=0):
    return [_select(None, q, dim, i) for i in range(q.shape[dim % q.dim()])]


@_implements(aten.index.Tensor)
def _index(func, q, indices):
    if q.axis is not None:
        _unsupported("advanced indexing", q)
    return q._with(func(q._values(), indices))


# ---- comparisons (on real values, like torch) ---------------------------------------------------

@_implements(aten.eq.Tensor, aten.eq.Scalar, aten.ne.Tensor, aten.ne.Scalar, aten.ge.Tensor,
             aten.ge.Scalar, aten.le.Tensor, aten.le.Scalar, aten.gt.Tensor, aten.gt.Scalar,
             aten.lt.Tensor, aten.lt.Scalar)
def _compare(func, a, b):
    return func(_as_float(a), _as_float(b))


def _compare_function(func):
    def run(*args, **kwargs):
        return func(*(_as_float(a) for a in args), **kwargs)
    return run


for _func in (torch.eq, torch.ne, torch.ge, torch.le, torch.gt, torch.lt, torch.Tensor.eq,
              torch.Tensor.ne, torch.Tensor.ge, torch.Tensor.le, torch.Tensor.gt, torch.Tensor.lt,
              torch.Tensor.__eq__, torch.Tensor.__ne__, torch.Tensor.__ge__, torch.Tensor.__le__,
              torch.Tensor.__gt__, torch.Tensor.__lt__):
    # taken at the torch-function level too (export's tracer would not dispatch them)
    _FUNCTIONS[_func] = _compare_function(_func)
del _func


@_implements(aten.equal.default)
def _equal(func, a, b):
    if not (isinstance(a, QTensor) and isinstance(b, QTensor)):
        return False
    if a.shape != b.shape or a.qdtype is not b.qdtype or a.qscheme() != b.qscheme():
        return False
    if a.axis != b.axis:
        return False
    if not (torch.equal(a.scale, b.scale) and torch.equal(a.zero_point, b.zero_point)):
        return False
    return torch.equal(a._values(), b._values())


# ---- in-place ---------------------------------------------------------------------------------

@_implements(aten.copy_.default)
def _copy_(func, dst, src, non_blocking=False):
    if not isinstance(dst, QTensor):
        raise NotImplementedError("copying a QTensor into a float tensor is not supported; use "
                                  "dst.copy_(q.dequantize())")
    if isinstance(src, QTensor):
        if src.qdtype is not dst.qdtype:
            raise TypeError(f"cannot copy a {src.qdtype!r} QTensor into a {dst.qdtype!r} one")
        if dst.qdtype.is_sub_byte:
            dst.int_data.copy_(src.int_data)
        else:
            dst.int_data.copy_(src.int_data.expand_as(dst.int_data))
        dst._replace_qparams(src.scale.clone(), src.zero_point.clone(), src.axis)
        return dst
    if not src.dtype.is_floating_point:
        raise TypeError(f"QTensor.copy_ needs a float or quantized source, got {src.dtype}")
    if not (dst.is_contiguous() or dst.is_contiguous(memory_format=torch.channels_last)):
        # torch refuses to quantize into a strided view (per tensor or per channel)
        raise RuntimeError("Quantized copy only works with contiguous and NHWC Tensors: cannot "
                           "write float values into a non-contiguous QTensor view")
    vals = ops_quantize.quantize_int(src.expand(dst.shape), dst.scale, dst.zero_point,
                                     dst.qdtype.qmin, dst.qdtype.qmax, dst.qdtype.storage_dtype,
                                     dst.axis,
                                     affine.quantize_mode(dst.qdtype, dst.axis is not None))
    if dst.qdtype.is_sub_byte:
        dst.int_data.copy_(affine.pack_sub_byte(vals, dst.qdtype.bits))
    else:
        dst.int_data.copy_(vals)
    return dst


@_implements(aten.resize_.default)
def _resize_(func, q, size, memory_format=None):
    if q.axis is not None or q.qdtype.is_sub_byte:
        _unsupported("resize_", q)
    q.int_data.resize_(size)
    _refresh_metadata(q)
    return q


def _refresh_metadata(q: QTensor) -> None:
    """Make the wrapper's sizes/strides follow its storage after an in-place resize."""
    with torch.utils._mode_utils.no_dispatch():
        torch.Tensor.data.__set__(q, QTensor(q.int_data, q.scale, q.zero_point, q.qdtype, q.axis))


# ---- reductions / ordering ----------------------------------------------------------------------

def _need_monotone(q: QTensor, what: str, dim: Optional[int] = None) -> None:
    if q.axis is not None and (dim is None or dim % q.dim() == q.axis):
        _unsupported(what + (" across channels" if dim is not None else ""), q)


@_implements(aten.max.default, aten.min.default)
def _minmax_all(func, q):
    _need_monotone(q, str(func.overloadpacket.__name__))
    return q._with(func(q._values()), axis=None if q.axis is None else q.axis)


@_implements(aten.max.dim, aten.min.dim)
def _minmax_dim(func, q, dim, keepdim=False):
    _need_monotone(q, str(func.overloadpacket.__name__), dim)
    vals, idx = func(q._values(), dim, keepdim)
    axis = q.axis
    if axis is not None and not keepdim and dim % q.dim() < axis:
        axis -= 1
    return _ValuesIndices(q._with(vals, axis=axis), idx)


def _minmax_function(name: str):
    """``torch.max`` / ``Tensor.max`` (and min) of one QTensor, overall or along ``dim``,
    taken at the torch-function level; the binary forms take the default path."""
    aten_all, aten_dim = getattr(aten, name).default, getattr(aten, name).dim

    def run(input, dim=None, keepdim=False, *, out=None):
        if not isinstance(input, QTensor) or out is not None or isinstance(dim, torch.Tensor):
            return NotImplemented
        if dim is None:
            return _minmax_all(aten_all, input)
        return _minmax_dim(aten_dim, input, dim, keepdim)
    return run


_implements_function(torch.max, torch.Tensor.max)(_minmax_function("max"))
_implements_function(torch.min, torch.Tensor.min)(_minmax_function("min"))


@_implements(aten.mean.default, aten.mean.dim)
def _mean(func, q, *args, **kwargs):
    if q.axis is not None:
        _unsupported("mean", q)
    out = func(q.dequantize(), *args, **kwargs)
    vals = ops_quantize.quantize_int(out, q.scale, q.zero_point, q.qdtype.qmin, q.qdtype.qmax,
                                     q.qdtype.storage_dtype, None,
                                     affine.quantize_mode(q.qdtype, False))
    return q._with(vals)


@_implements(aten.sort.default, aten.sort.stable)
def _sort(func, q, *args, **kwargs):
    dim = kwargs.get("dim", -1)
    if func is aten.sort.default and args:
        dim = args[0]
    elif func is aten.sort.stable and len(args) > 1:
        dim = args[1]
    _need_monotone(q, "sort", dim)
    vals, idx = func(q._values(), *args, **kwargs)
    return _ValuesIndices(q._with(vals), idx)


@_implements_function(torch.sort, torch.Tensor.sort)
def _sort_function(input, dim=-1, descending=False, stable=False, *, out=None):
    if not isinstance(input, QTensor) or out is not None:
        return NotImplemented
    return _sort(aten.sort.stable, input, stable=stable, dim=dim, descending=descending)


@_implements_function(torch.topk, torch.Tensor.topk)
def _topk_function(input, k, dim=-1, largest=True, sorted=True, *, out=None):
    if not isinstance(input, QTensor) or out is not None:
        return NotImplemented
    return _topk(aten.topk.default, input, k, dim, largest, sorted)


@_implements(aten.topk.default)
def _topk(func, q, k, dim=-1, largest=True, sorted=True):
    _need_monotone(q, "topk", dim)
    vals, idx = func(q._values(), k, dim, largest, sorted)
    return _ValuesIndices(q._with(vals), idx)


# ---- ops quantized models need ----------------------------------------------------------------

@_implements(aten.relu.default)
def _relu(func, q):
    if _plain_per_tensor(q):  # one clamp against the zero point as a number (eager)
        return q._with(torch.clamp_min(q.int_data, q._scale_zp()[1]))
    zp = affine._broadcast(q.zero_point, q.dim(), q.axis)
    if zp.dtype.is_floating_point:
        _unsupported("relu", q)
    vals = torch.maximum(q._values(), zp.to(q.int_data.dtype))
    return q._with(vals)


@_implements(aten.relu_.default)
def _relu_(func, q):
    out = _relu(func, q)
    q.int_data.copy_(out.int_data)
    return q


@_implements_function(torch.relu, torch.Tensor.relu, torch.nn.functional.relu)
def _relu_function(input, inplace=False):
    """relu taken at the torch-function level (nn.ReLU calls F.relu): the same integer
    handler, without the dispatch round trip -- which export's and dynamo's tracers would not
    make for a QTensor built in the graph."""
    return _relu_(None, input) if inplace else _relu(None, input)


def _cat_inputs(tensors, what):
    if not tensors:
        raise ValueError(f"{what} needs at least one tensor")
    if not all(isinstance(t, QTensor) for t in tensors):
        raise TypeError(f"{what} cannot mix QTensors and float tensors; quantize or dequantize first")
    first = tensors[0]
    out = []
    for t in tensors:
        if t.qdtype is not first.qdtype:
            raise TypeError(f"{what} needs one quantized dtype, got {first.qdtype!r} and {t.qdtype!r}")
        same = (t.axis == first.axis and torch.equal(t.scale, first.scale)
                and torch.equal(t.zero_point, first.zero_point))
        if not same:
            if first.axis is not None:
                raise NotImplementedError(f"{what} of per-channel QTensors needs identical qparams")
            # Re-quantize to the first input's qparams (torch takes the output qparams from it).
            t = _requantize(t, first)
        out.append(t._values())
    return first, out


def _requantize(t: QTensor, like: QTensor) -> torch.Tensor:
    vals = ops_quantize.quantize_int(t.dequantize(), like.scale, like.zero_point, like.qdtype.qmin,
                                     like.qdtype.qmax, like.qdtype.storage_dtype, None,
                                     affine.quantize_mode(like.qdtype, False))
    return like._with(vals)


@_implements(aten.cat.default)
def _cat(func, tensors, dim=0):
    first, vals = _cat_inputs(list(tensors), "cat")
    if first.axis is not None and dim % first.dim() == first.axis:
        raise NotImplementedError("cat along the channel axis of per-channel QTensors")
    return first._with(torch.cat(vals, dim))


@_implements_function(torch.cat, torch.concat, torch.concatenate)
def _cat_function(tensors, dim=0, *, out=None):
    """``torch.cat`` taken at the torch-function level (export's and dynamo's tracers would
    not dispatch ``aten.cat`` to QTensors built in the graph)."""
    if out is not None or isinstance(dim, str):
        return NotImplemented
    return _cat(None, tensors, dim)


@_implements_function(torch.stack)
def _stack_function(tensors, dim=0, *, out=None):
    if out is not None:
        return NotImplemented
    return _stack(None, tensors, dim)


@_implements(aten.stack.default)
def _stack(func, tensors, dim=0):
    first, vals = _cat_inputs(list(tensors), "stack")
    out = torch.stack(vals, dim)
    axis = first.axis
    if axis is not None and dim % (first.dim() + 1) <= axis:
        axis += 1
    return first._with(out, axis=axis)


@_implements(aten.is_same_size.default)
def _is_same_size(func, a, b):
    return a.shape == b.shape
