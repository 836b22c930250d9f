"""What inductor makes of torchquant's ops: lowerings and fusion passes, installed once.

* :mod:`.elementwise`: per-tensor / per-channel quantize and dequantize become pointwise
  inductor nodes (C++ it fuses), with eager mode's rounding.
* :mod:`.fusion`: dequantize -> conv / linear (-> ReLU / add / add+ReLU) -> quantize becomes
  one oneDNN int8 call whose weight is prepacked at freezing.
* :mod:`.attention`: in ``torchquant.compile``'s graphs, ATen's CPU flash attention becomes
  torchquant's native float32 attention where that is faster (short sequences).
* :mod:`.exact_decompositions`: torchquant's fused ops of eager- / FX-converted models
  (dynamic Linear / LSTM step, add, pooling, static Linear) as tensor / oneDNN ops with the
  eager integers, so an AOTInductor package needs no torchquant.
* :mod:`.cache_key`: all of them, and the CPU decision behind the fusion, in inductor's cache key.

All are registered when torchquant is imported, keyed on torchquant's own ops (the attention
rewrite on torchquant.compile's own compiles): torch's other graphs are untouched and no
inductor configuration value is changed.
"""
from __future__ import annotations

from . import attention, cache_key, elementwise, exact_decompositions, fusion

__all__ = ["register"]

_REGISTERED = False


def register() -> None:
    global _REGISTERED
    if _REGISTERED:
        return
    elementwise.register()
    fusion.register()
    attention.register()
    exact_decompositions.register()
    cache_key.register()
    _REGISTERED = True
