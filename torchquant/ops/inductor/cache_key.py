"""torchquant's part of inductor's compile-cache key.

Inductor caches compiled graphs by the graph, torch's own source and its config; it does not
know that torchquant lowers its ops (:mod:`.elementwise`), fuses them into oneDNN calls
(:mod:`.fusion`) and, while it compiles an AOTInductor package, decomposes the rest
(:mod:`.exact_decompositions`), nor that the fusion depends on the CPU (oneDNN exact or
saturating, fbgemm's instruction set for the native conv and where that conv is preferred,
``TORCHQUANT_CPU_ISA``).  Without this, a graph compiled by an older torchquant, or on the same
machine with oneDNN held to a lower ISA, would be served from the cache.

The key joins inductor's through its table of per-device backend passes, whose uuids every
cache key includes: an entry under a device name no tensor has, so it never runs.  No
configuration value of the user's is touched.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch

from ... import _config
from ...kernels import onednn_exactness as _exactness
from ...kernels import native as _native
from . import exact_decompositions, packaging_state

__all__ = ["register", "uuid"]

_DEVICE = "torchquant_cache_key"  # a key of inductor's table only: no tensor lives there


def _sources() -> tuple[str, ...]:
    package = Path(__file__).resolve().parents[2]
    here = Path(__file__).resolve().parent
    files = sorted(here.glob("*.py")) + [package / "affine.py", package / "dtypes.py",
                                         package / "kernels" / "native" / "__init__.py"]
    return tuple(str(f) for f in files)


def uuid() -> str:
    """The sources of the lowerings and what the CPU decides (measured on real tensors)."""
    from torch._inductor.custom_graph_pass import get_hash_for_files
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        exact = _exactness.onednn_u8s8_exact()
    cpu = (f"onednn_exact={exact};{_config.cache_key_environment()};"
           f"packaging={exact_decompositions.is_packaging()};"
           f"native_allowed={packaging_state.native_allowed()};native={_native.describe()};"
           f"torchquant_compile={packaging_state.in_torchquant_compile()};"
           f"native_exact={_native.available() and _native.exact_u8()}")
    return get_hash_for_files(_sources(), extra=cpu).hex()


def _pass_class() -> type:
    from torch._inductor.custom_graph_pass import CustomGraphModulePass

    class TorchquantCacheKey(CustomGraphModulePass):
        def __call__(self, gm: torch.fx.GraphModule) -> None:  # never run: no such device
            return None

        def uuid(self) -> Optional[Any]:
            return uuid()
    return TorchquantCacheKey


def register() -> None:
    from torch._inductor.codegen.common import custom_backend_passes
    custom_backend_passes.setdefault(_DEVICE, _pass_class()())
