"""Vocabulary of block-granular ("affine") quantization: how values map to integers and which
elements share one set of quantization parameters.

The names and enum values are those of torch's ``observer.py`` / torchao, so configurations
written for either read the same here.  ``get_block_size`` turns a granularity into the
explicit block shape the affine primitives (:mod:`.affine_quantized`) work with.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, auto

__all__ = [
    "MappingType", "ZeroPointDomain", "TorchAODType",
    "Granularity", "PerBlock", "PerTensor", "PerAxis", "PerGroup", "PerRow", "PerToken",
    "get_block_size",
]


class MappingType(Enum):
    """How the float range is mapped onto the integer range.

    * ``SYMMETRIC``: ``[-amax, amax]`` onto ``[qmin, qmax]``, ``scale = 2 * amax / (qmax - qmin)``.
    * ``SYMMETRIC_NO_CLIPPING_ERR``: ``scale = max(min_neg / qmin, max_pos / qmax)``, so neither
      end clips (the negative side may use the extra code of a two's-complement range).
    * ``ASYMMETRIC``: ``[min, max]`` onto ``[qmin, qmax]`` directly.
    """

    SYMMETRIC = auto()
    SYMMETRIC_NO_CLIPPING_ERR = auto()
    ASYMMETRIC = auto()


class ZeroPointDomain(Enum):
    """Where the zero point lives.

    * ``INT``: ``q = round(x / scale) + zero_point`` (integer zero point).
    * ``FLOAT``: ``q = round((x - (zero_point - scale * mid)) / scale)``, ``mid = (qmax + qmin + 1) / 2``
      (a float offset, as int4 weight-only kernels use).
    * ``NONE``: no zero point, ``q = round(x / scale)``.
    """

    INT = auto()
    FLOAT = auto()
    NONE = auto()


class TorchAODType(Enum):
    """Sub-byte signed integer types, kept for configurations written before ``torch.int1`` ...
    ``torch.int7`` existed.  Values are their bit widths."""

    INT1 = auto()
    INT2 = auto()
    INT3 = auto()
    INT4 = auto()
    INT5 = auto()
    INT6 = auto()
    INT7 = auto()


@dataclass(frozen=True)
class Granularity:
    """Which elements share one (scale, zero_point); subclasses say how."""


@dataclass(frozen=True)
class PerBlock(Granularity):
    """An explicit block shape: one qparam set per ``block_size`` block of the tensor."""

    block_size: tuple[int, ...]


@dataclass(frozen=True)
class PerTensor(Granularity):
    """One qparam set for the whole tensor."""


@dataclass(frozen=True)
class PerAxis(Granularity):
    """One qparam set per index of ``axis`` (a ``[8, 16]`` tensor with ``axis=0`` has 8)."""

    axis: int


@dataclass(frozen=True)
class PerGroup(Granularity):
    """One qparam set per ``group_size`` consecutive elements of the last dim (2-D inputs)."""

    group_size: int


class PerRow(Granularity):
    """One qparam set per row: blocks of ``(1, ..., 1, shape[-1])`` (float8 matmul inputs).

    A plain subclass, not a dataclass of its own, exactly as in torch.
    """


class PerToken(Granularity):
    """One qparam set per token, i.e. per index of every dim but the last."""


def get_block_size(input_shape: tuple[int, ...], granularity: Granularity) -> tuple[int, ...]:
    """The block shape that ``granularity`` means for a tensor of ``input_shape``.

    ``PerBlock`` returns its own ``block_size`` (torchao's behaviour; torch 2.13 raises).
    """
    if not isinstance(granularity, Granularity):
        raise AssertionError(f"get_block_size needs a Granularity instance, got {granularity!r} "
                             "(pass PerTensor(), not PerTensor)")
    shape = tuple(input_shape)
    if isinstance(granularity, PerTensor):
        return shape
    if isinstance(granularity, PerAxis):
        block = list(shape)
        block[granularity.axis] = 1
        return tuple(block)
    if isinstance(granularity, PerRow):
        return (1,) * (len(shape) - 1) + (shape[-1],)
    if isinstance(granularity, PerGroup):
        if len(shape) != 2:
            raise AssertionError(f"PerGroup expects a 2-D input, got shape {shape}")
        return (1, granularity.group_size)
    if isinstance(granularity, PerToken):
        return (1,) * (len(shape) - 1) + (shape[-1],)
    if isinstance(granularity, PerBlock):
        return tuple(granularity.block_size)
    raise ValueError(f"unsupported granularity {granularity!r}")
