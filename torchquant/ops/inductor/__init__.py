"""What inductor makes of torchquant's ops: lowerings and fusion passes, installed once.

* :mod:`.elementwise`: per-tensor / per-channel quantize and dequantize become pointwise
  inductor nodes (C++ it fuses), with eager mode's rounding.
* :mod:`.fusion`: dequantize -> conv / linear (-> ReLU / add / add+ReLU) -> quantize becomes
  one oneDNN int8 call whose weight is prepacked at freezing (the ``inductor`` use of
  :data:`torchquant.ops.patterns.PATTERNS`), as do frozen ``torchquant::conv`` / ``linear``
  nodes.
* :mod:`.attention`: in ``torchquant.compile``'s graphs, ATen's CPU flash attention becomes
  torchquant's native float32 attention where that is faster (short sequences).
* :mod:`.exact_decompositions`: torchquant's fused ops of eager- / FX-converted models
  (dynamic Linear / LSTM step, add, pooling, static Linear) as tensor / oneDNN ops with the
  eager integers, so an AOTInductor package needs no torchquant.
* :mod:`.cache_key`: all of them, and the CPU decision behind the fusion, in inductor's cache key.

All are registered once inductor is loaded (at torchquant's import where it already is, else
when torch imports it: every inductor compile does before it decomposes, lowers or freezes a
graph; a program that never compiles does not pay inductor's import), keyed on torchquant's
own ops (the attention rewrite on torchquant.compile's own compiles): torch's other graphs
are untouched and no inductor configuration value is changed.
"""
from __future__ import annotations

from ..._after_import import after_import
from . import attention, cache_key, elementwise, exact_decompositions, fusion

__all__ = ["register", "register_when_inductor_loads"]

# loading any of these loads inductor's lowering, decomposition and pattern tables
_INDUCTOR_MODULES = ("torch._inductor.compile_fx", "torch._inductor.lowering",
                     "torch._inductor.decomposition", "torch._inductor.pattern_matcher",
                     "torch._inductor.fx_passes.freezing_patterns")

_REGISTERED = False


def register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    elementwise.register()
    fusion.register()
    attention.register()
    cache_key.register()
    _REGISTERED = True


def register_when_inductor_loads() -> None:
    """:func:`register` now if inductor is imported, else right after torch imports it."""
    after_import(_INDUCTOR_MODULES, register)
