"""The PT2E quantizer contract: a :class:`Quantizer` marks nodes of an exported graph with
:class:`QuantizationAnnotation` objects (``node.meta["quantization_annotation"]``) built from
quantization specs; ``prepare_pt2e`` turns those marks into observers / fake quants.

Semantics follow torchao 0.18's ``torchao.quantization.pt2e.quantizer.quantizer``; the observer
and fake-quant constructors are torchquant's own (``torchquant.quantization.observer`` /
``fake_quantize``).  Spec ``dtype`` is kept as given: plain ``torch.int8`` / ``torch.uint8`` (as
torchao writes them) and torchquant / torch quantized dtypes are all accepted.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

from torch import Tensor
from torch.fx import GraphModule, Node

from ..fake_quantize import FakeQuantizeBase
from ..observer import ObserverBase

__all__ = [
    "Quantizer",
    "QuantizationSpecBase",
    "QuantizationSpec",
    "FixedQParamsQuantizationSpec",
    "EdgeOrNode",
    "SharedQuantizationSpec",
    "DerivedQuantizationSpec",
    "QuantizationAnnotation",
    "ObserverOrFakeQuantize",
    "ObserverOrFakeQuantizeConstructor",
    "Q_ANNOTATION_KEY",
]

#: ``node.meta`` key under which quantizers store a node's :class:`QuantizationAnnotation`.
Q_ANNOTATION_KEY = "quantization_annotation"

ObserverOrFakeQuantize = Union[ObserverBase, FakeQuantizeBase]
#: A class or a ``.with_args(...)`` factory building an observer / fake quant.
ObserverOrFakeQuantizeConstructor = Callable[..., ObserverOrFakeQuantize]

#: A point of quantization: an input edge ``(producer, consumer)`` or a node's output.
EdgeOrNode = Union[tuple[Node, Node], Node]


def _check_range(owner: str, quant_min: Optional[int], quant_max: Optional[int]) -> None:
    if quant_min is not None and quant_max is not None and quant_min > quant_max:
        raise ValueError(f"{owner}: quant_min {quant_min} must be <= quant_max {quant_max}.")


def _check_ch_axis(owner: str, ch_axis: Optional[int]) -> None:
    if ch_axis is not None and ch_axis < 0:
        raise ValueError(f"{owner}: ch_axis must be >= 0 (count channels from the front), "
                         f"got {ch_axis}.")


def _is_edge_or_node(x: Any) -> bool:
    if isinstance(x, Node):
        return True
    return isinstance(x, tuple) and len(x) == 2 and all(isinstance(n, Node) for n in x)


class QuantizationSpecBase(ABC):  # noqa: B024 -- a marker base, no abstract methods
    """Base of every spec saying how one tensor (a node's input edge or output) is quantized."""


@dataclass(eq=True, frozen=True)
class QuantizationSpec(QuantizationSpecBase):
    """Quantize a tensor with an observer / fake quant built by ``observer_or_fake_quant_ctr``;
    the non-None fields are handed to that constructor at prepare time."""

    dtype: Any
    observer_or_fake_quant_ctr: ObserverOrFakeQuantizeConstructor
    quant_min: Optional[int] = None
    quant_max: Optional[int] = None
    qscheme: Optional[Any] = None
    ch_axis: Optional[int] = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        _check_range("QuantizationSpec", self.quant_min, self.quant_max)
        _check_ch_axis("QuantizationSpec", self.ch_axis)


@dataclass(eq=True, frozen=True)
class FixedQParamsQuantizationSpec(QuantizationSpecBase):
    """Quantize with fixed ``scale`` / ``zero_point`` (sigmoid-like outputs with a known range)."""

    dtype: Any
    scale: float
    zero_point: int
    quant_min: Optional[int] = None
    quant_max: Optional[int] = None
    qscheme: Optional[Any] = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        # [TQ] torchao accepts an empty range here; it can only fail later, at convert.
        _check_range("FixedQParamsQuantizationSpec", self.quant_min, self.quant_max)


@dataclass(eq=True, frozen=True)
class SharedQuantizationSpec(QuantizationSpecBase):
    """Use the same observer (hence qparams) as another edge or node output."""

    edge_or_node: EdgeOrNode

    def __post_init__(self) -> None:
        # [TQ] torchao stores anything and fails inside prepare; a wrong target is caught here.
        if not _is_edge_or_node(self.edge_or_node):
            raise TypeError("SharedQuantizationSpec.edge_or_node must be a torch.fx.Node or a "
                            f"(producer, consumer) tuple of Nodes, got {self.edge_or_node!r}")


@dataclass(eq=True, frozen=True)
class DerivedQuantizationSpec(QuantizationSpecBase):
    """qparams computed by ``derive_qparams_fn`` from the observers of ``derived_from``
    (e.g. an int32 bias whose scale is input scale * weight scale)."""

    derived_from: list[EdgeOrNode]
    derive_qparams_fn: Callable[[list[ObserverOrFakeQuantize]], tuple[Tensor, Tensor]]
    dtype: Any
    quant_min: Optional[int] = None
    quant_max: Optional[int] = None
    qscheme: Optional[Any] = None
    ch_axis: Optional[int] = None
    is_dynamic: bool = False

    def __post_init__(self) -> None:
        _check_range("DerivedQuantizationSpec", self.quant_min, self.quant_max)
        _check_ch_axis("DerivedQuantizationSpec", self.ch_axis)


@dataclass
class QuantizationAnnotation:
    """How one node's inputs and output are quantized.

    ``input_qspec_map`` is keyed by the input *node* (the edge ``(input, this node)``);
    ``allow_implicit_sharing`` lets an input edge reuse its producer's output observer when the
    two specs are equal; ``_annotated`` marks nodes already claimed by a pattern so that later
    patterns skip them.
    """

    input_qspec_map: dict[Node, Optional[QuantizationSpecBase]] = field(default_factory=dict)
    output_qspec: Optional[QuantizationSpecBase] = None
    allow_implicit_sharing: bool = True
    _annotated: bool = False


class Quantizer(ABC):
    """What a backend tells ``prepare_pt2e``: which tensors of an exported graph to quantize."""

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Optional rewrite before annotation (e.g. scalars to tensor attributes, decomposing an
        op into quantizable pieces); the default leaves the model as it is."""
        return model

    @abstractmethod
    def annotate(self, model: GraphModule) -> GraphModule:
        """Write ``node.meta["quantization_annotation"]`` on the nodes to quantize."""

    @abstractmethod
    def validate(self, model: GraphModule) -> None:
        """Check the annotated model can be lowered by this backend (raise if not)."""

    def prepare_obs_or_fq_callback(
        self, model: GraphModule,
        edge_or_node_to_obs_or_fq: dict[EdgeOrNode, ObserverOrFakeQuantize],
    ) -> None:
        """Called by prepare after the observers of every sharing group exist and before they
        are inserted; may adjust or replace entries of ``edge_or_node_to_obs_or_fq``."""
        return None
