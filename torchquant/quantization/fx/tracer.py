"""Symbolic tracing for FX graph mode quantization.

The tracer keeps standard ``torch.nn`` / ``torchquant.nn`` modules (and fused modules) as leaves,
records for every node the module whose ``forward`` created it (the "scope" the qconfig lookup
uses), and turns a tracing failure into an error that names the module whose forward failed.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule, Tracer

from ...nn.intrinsic.modules.fused import _FusedModule

__all__ = ["QuantizationTracer", "trace_for_quantization"]

_LEAF_MODULE_PREFIXES = ("torch.nn", "torchquant.nn")


class QuantizationTracer(Tracer):
    """``torch.fx.Tracer`` with quantization leaves and per-node scope recording."""

    def __init__(self, skipped_module_names: list[str], skipped_module_classes: list[type]):
        super().__init__()
        self.skipped_module_names = list(skipped_module_names)
        self.skipped_module_classes = tuple(skipped_module_classes)
        self.quant_scope: tuple[str, Optional[type]] = ("", None)
        self.node_name_to_scope: dict[str, tuple[str, Optional[type]]] = {}
        self.failed_scope: Optional[tuple[str, type]] = None

    def is_leaf_module(self, m: torch.nn.Module, module_qualified_name: str) -> bool:
        standard = (m.__module__.startswith(_LEAF_MODULE_PREFIXES)
                    and not isinstance(m, torch.nn.Sequential))
        return (standard or isinstance(m, _FusedModule)
                or module_qualified_name in self.skipped_module_names
                or isinstance(m, self.skipped_module_classes))

    def call_module(self, m: torch.nn.Module, forward: Callable, args: tuple, kwargs: dict) -> Any:
        outer = self.quant_scope
        self.quant_scope = (self.path_of_module(m), type(m))
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_scope is None:
                self.failed_scope = self.quant_scope
            raise
        finally:
            self.quant_scope = outer

    def create_node(self, *args: Any, **kwargs: Any) -> torch.fx.Node:
        node = super().create_node(*args, **kwargs)
        self.node_name_to_scope[node.name] = self.quant_scope
        return node


def trace_for_quantization(model: torch.nn.Module, skipped_module_names: list[str],
                           skipped_module_classes: list[type]
                           ) -> tuple[GraphModule, dict[str, tuple[str, Optional[type]]]]:
    """Trace ``model`` (not copied here); returns the GraphModule and node name -> scope."""
    tracer = QuantizationTracer(skipped_module_names, skipped_module_classes)
    tracer.quant_scope = ("", type(model))
    try:
        graph = tracer.trace(model)
    except Exception as e:
        if tracer.failed_scope is not None and tracer.failed_scope[0]:
            name, cls = tracer.failed_scope
            where = f"the forward of submodule '{name}' ({cls.__name__})"
            hint = (f"mark it as a leaf with PrepareCustomConfig().set_non_traceable_module_names"
                    f"(['{name}']) or .set_non_traceable_module_classes([{cls.__name__}])")
        else:
            where = f"the forward of the model ({type(model).__name__})"
            hint = ("move the untraceable code into a submodule and mark it with "
                    "PrepareCustomConfig().set_non_traceable_module_names / _classes")
        raise RuntimeError(
            f"FX quantization: symbolic tracing failed in {where}: {type(e).__name__}: {e}. "
            f"Python control flow on traced values cannot be traced; {hint}, or quantize with "
            f"PT2E (torch.export based) instead.") from e
    gm = GraphModule(model, graph, type(model).__name__)
    return gm, dict(tracer.node_name_to_scope)
