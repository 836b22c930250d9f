"""Several quantizers applied in turn to one model (torchao 0.18's ``ComposableQuantizer``)."""
from __future__ import annotations

from torch.fx import GraphModule, Node

from .quantizer import Q_ANNOTATION_KEY, QuantizationAnnotation, Quantizer

__all__ = ["ComposableQuantizer"]


class ComposableQuantizer(Quantizer):
    """Run each quantizer's ``transform_for_annotation`` and ``annotate`` in list order.

    Earlier quantizers win: a later one may annotate nodes left free, but replacing or removing
    an annotation an earlier one wrote raises ``RuntimeError`` naming the quantizer and node.
    (Mutating an earlier annotation object in place is not detected, as in torchao.)
    """

    def __init__(self, quantizers: list[Quantizer]) -> None:
        super().__init__()
        for q in quantizers:
            if not isinstance(q, Quantizer):
                raise TypeError(f"ComposableQuantizer takes Quantizer instances, got {q!r}")
        self.quantizers = list(quantizers)
        self._graph_annotations: dict[Node, QuantizationAnnotation] = {}

    def _record_and_validate_annotations(self, gm: GraphModule, quantizer: Quantizer) -> None:
        for n in gm.graph.nodes:
            seen = self._graph_annotations.get(n)
            current = n.meta.get(Q_ANNOTATION_KEY)
            if current is None:
                if seen is not None:
                    raise RuntimeError(f"Quantizer {type(quantizer).__name__} has removed "
                                       f"annotations on node {n}")
            elif seen is not None and seen is not current:
                raise RuntimeError(f"Quantizer {type(quantizer).__name__} has changed "
                                   f"annotations on node {n}")
            else:
                self._graph_annotations[n] = current

    def annotate(self, model: GraphModule) -> GraphModule:
        for quantizer in self.quantizers:
            quantizer.annotate(model)
            self._record_and_validate_annotations(model, quantizer)
        return model

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        for quantizer in self.quantizers:
            model = quantizer.transform_for_annotation(model)
        return model

    def validate(self, model: GraphModule) -> None:
        for quantizer in self.quantizers:
            quantizer.validate(model)
