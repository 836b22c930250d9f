"""torchao's PT2E module paths under the torchquant prefix, so that porting is a rename:
``torchao.quantization.pt2e.quantize_pt2e`` -> ``torchquant.quantization.pt2e.quantize_pt2e``,
``torchao.quantization.pt2e.quantizer.x86_inductor_quantizer`` ->
``torchquant.quantization.pt2e.quantizer.x86_inductor_quantizer`` and the rest of the table
below.  Each alias is the very module object it names (no copy: one class per name), found by
an import hook installed when ``torchquant.quantization`` is imported, so nothing is loaded
before it is asked for.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["TORCHAO_PT2E_PATHS", "install"]

_PREFIX = "torchquant.quantization."

# torchao path (after "torchao.quantization.") -> the torchquant module (after the prefix)
TORCHAO_PT2E_PATHS: dict[str, str] = {
    "pt2e.quantize_pt2e": "quantize_pt2e",
    "pt2e.quantizer": "quantizer",
    "pt2e.quantizer.quantizer": "quantizer.quantizer",
    "pt2e.quantizer.utils": "quantizer.utils",
    "pt2e.quantizer.composable_quantizer": "quantizer.composable_quantizer",
    "pt2e.quantizer.x86_inductor_quantizer": "quantizer.x86_inductor_quantizer",
    "pt2e.observer": "observer",
    "pt2e.fake_quantize": "fake_quantize",
    "pt2e.graph_utils": "quantizer._graph_utils",
    "pt2e.reference_representation_rewrite": "pt2e.reference_representation",
}
_ALIASES = {_PREFIX + alias: _PREFIX + target for alias, target in TORCHAO_PT2E_PATHS.items()}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)  # the same object
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Already executed under its own name; only give back the ``__spec__`` the import
        system replaced with the alias's."""
        module.__spec__ = self.own_spec


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        real = _ALIASES.get(fullname)
        if real is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real))


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
