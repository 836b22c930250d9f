"""Quantized dtypes and qschemes.

torchquant stores quantized values in plain integer tensors, so its quantized dtypes are small
descriptor objects rather than ``torch.dtype`` members.  This module is the single place where
torch's own quantized dtype / qscheme objects are accepted as aliases (``to_qdtype``,
``to_qscheme``); everything else in the package normalises through it.
"""
from __future__ import annotations

import enum
from typing import Any, Optional

import torch

__all__ = [
    "QDType", "QScheme", "to_qdtype", "to_qscheme", "is_qdtype_like",
    "from_torch_quantized_dtype",
    "quint8", "qint8", "qint32", "quint4x2", "quint2x4",
    "per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
    "per_channel_symmetric", "per_channel_affine_float_qparams",
]


class QDType(enum.Enum):
    """A quantized dtype: integer range, bit width and the plain storage dtype.

    Members are singletons; they compare equal to their torch aliases so that ported code such
    as ``obs.dtype == torch.quint8`` keeps working.  An ``Enum`` because ``torch.compile``
    treats enum members as constants: a QTensor built inside a compiled graph carries its
    QDType as such.
    """

    # name = (storage dtype, qmin, qmax, bits, signed, torch's dtype, accepted aliases)
    quint8 = (torch.uint8, 0, 255, 8, False, torch.quint8, (torch.quint8, torch.uint8))
    qint8 = (torch.int8, -128, 127, 8, True, torch.qint8, (torch.qint8, torch.int8))
    qint32 = (torch.int32, -(2**31), 2**31 - 1, 32, True, torch.qint32,
              (torch.qint32, torch.int32))
    quint4x2 = (torch.uint8, 0, 15, 4, False, torch.quint4x2, (torch.quint4x2,))
    quint2x4 = (torch.uint8, 0, 3, 2, False, torch.quint2x4, (torch.quint2x4,))

    def __init__(self, storage_dtype: torch.dtype, qmin: int, qmax: int, bits: int,
                 is_signed: bool, torch_dtype: Any, aliases: tuple) -> None:
        self.storage_dtype = storage_dtype
        self.qmin = qmin
        self.qmax = qmax
        self.bits = bits
        self.is_signed = is_signed
        self.torch_dtype = torch_dtype
        self._aliases = tuple(a for a in aliases if a is not None)

    @property
    def values_per_byte(self) -> int:
        """How many values one storage byte holds (2 for quint4x2, 4 for quint2x4, else 1)."""
        return 8 // self.bits if self.bits < 8 else 1

    @property
    def is_sub_byte(self) -> bool:
        return self.bits < 8

    def __repr__(self) -> str:
        return f"torchquant.{self.name}"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QDType):
            return other is self
        return any(other is a for a in self._aliases)

    def __hash__(self) -> int:
        return hash(self.torch_dtype) if self.torch_dtype is not None else hash(self.name)

    def __reduce_ex__(self, protocol):
        return (_qdtype_by_name, (self.name,))


class QScheme:
    """A quantization scheme; compares equal to the torch qscheme of the same name."""

    __slots__ = ("name", "torch_qscheme")
    _registry: dict[str, "QScheme"] = {}

    def __init__(self, name: str, torch_qscheme: Any) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "torch_qscheme", torch_qscheme)
        QScheme._registry[name] = self

    def __setattr__(self, key, value):
        raise AttributeError("QScheme is immutable")

    def __repr__(self) -> str:
        return f"torchquant.{self.name}"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, QScheme):
            return other is self
        return self.torch_qscheme is not None and other is self.torch_qscheme

    def __hash__(self) -> int:
        return hash(self.torch_qscheme) if self.torch_qscheme is not None else hash(self.name)

    def __reduce__(self):
        return (_qscheme_by_name, (self.name,))

    @property
    def is_per_channel(self) -> bool:
        return self.name.startswith("per_channel")

    @property
    def is_symmetric(self) -> bool:
        return self.name.endswith("symmetric")


def _qdtype_by_name(name: str) -> QDType:
    return QDType[name]


def qdtype_of(x: Any) -> QDType:
    """:func:`to_qdtype`, also taking a QDType's name (``"quint8"``): the form graphs and op
    schemas carry, since a QDType object is not a graph constant."""
    return QDType[x] if isinstance(x, str) else to_qdtype(x)


def _qscheme_by_name(name: str) -> QScheme:
    return QScheme._registry[name]


quint8, qint8, qint32 = QDType.quint8, QDType.qint8, QDType.qint32
quint4x2, quint2x4 = QDType.quint4x2, QDType.quint2x4

per_tensor_affine = QScheme("per_tensor_affine", torch.per_tensor_affine)
per_channel_affine = QScheme("per_channel_affine", torch.per_channel_affine)
per_tensor_symmetric = QScheme("per_tensor_symmetric", torch.per_tensor_symmetric)
per_channel_symmetric = QScheme("per_channel_symmetric", torch.per_channel_symmetric)
per_channel_affine_float_qparams = QScheme("per_channel_affine_float_qparams",
                                           torch.per_channel_affine_float_qparams)

_QDTYPE_ALIASES: dict = {}
for _q in QDType:
    for _a in _q._aliases:
        _QDTYPE_ALIASES[_a] = _q
_QSCHEME_ALIASES = {q.torch_qscheme: q for q in QScheme._registry.values()}


def is_qdtype_like(x: Any) -> bool:
    """True for a QDType or any torch dtype accepted as its alias."""
    if isinstance(x, QDType):
        return True
    try:
        return x in _QDTYPE_ALIASES
    except TypeError:
        return False


def from_torch_quantized_dtype(x: Any) -> Optional[QDType]:
    """The QDType standing for one of torch's quantized dtypes (``torch.quint8``, ...), or None
    for anything else -- plain dtypes such as ``torch.uint8`` included, which callers that keep
    plain and quantized dtypes apart (backend configs) leave as given."""
    return next((q for q in QDType if x is q.torch_dtype), None)


def to_qdtype(x: Any) -> QDType:
    """Map a QDType or an accepted torch alias (``torch.quint8``, ``torch.uint8``, ...) to the QDType."""
    if isinstance(x, QDType):
        return x
    try:
        found = _QDTYPE_ALIASES.get(x)
    except TypeError:
        found = None
    if found is None:
        allowed = ", ".join(sorted(QDType.__members__))
        raise TypeError(f"unsupported quantized dtype {x!r}; expected one of torchquant.{{{allowed}}} "
                        "or the torch aliases torch.quint8/qint8/qint32/quint4x2/quint2x4/uint8/int8/int32")
    return found


def to_qscheme(x: Any) -> QScheme:
    """Map a QScheme or a torch qscheme (``torch.per_tensor_affine`` ...) to the QScheme."""
    if isinstance(x, QScheme):
        return x
    try:
        found = _QSCHEME_ALIASES.get(x)
    except TypeError:
        found = None
    if found is None:
        allowed = ", ".join(sorted(QScheme._registry))
        raise TypeError(f"unsupported qscheme {x!r}; expected one of torchquant.{{{allowed}}}")
    return found
