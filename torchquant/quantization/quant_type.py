"""``QuantType``: which kind of quantization a qconfig asks for.

The integer values match torch's (they index custom-config dicts saved by torch code); the
string forms are the keys of those dicts.
"""
from __future__ import annotations

import enum

__all__ = ["QuantType"]


class QuantType(enum.IntEnum):
    DYNAMIC = 0
    STATIC = 1
    QAT = 2
    WEIGHT_ONLY = 3


_QUANT_TYPE_NAMES = {
    QuantType.STATIC: "static",
    QuantType.DYNAMIC: "dynamic",
    QuantType.QAT: "qat",
    QuantType.WEIGHT_ONLY: "weight_only",
}


def _get_quant_type_to_str(quant_type: QuantType) -> str:
    """``QuantType.STATIC`` -> ``"static"`` (the key used in custom-config dicts)."""
    return _QUANT_TYPE_NAMES[quant_type]


def _quant_type_from_str(name: str) -> QuantType:
    """Inverse of :func:`_get_quant_type_to_str`; ValueError for an unknown name."""
    for quant_type, text in _QUANT_TYPE_NAMES.items():
        if text == name:
            return quant_type
    raise ValueError(f"Unknown QuantType name {name!r}; expected one of "
                     f"{sorted(_QUANT_TYPE_NAMES.values())}")
