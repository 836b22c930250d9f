"""torchquant's compute layer: every quantized computation as a registered torch op.

``torch.ops.torchquant.<name>`` takes plain integer tensors and qparams (Python numbers per
tensor, tensors per channel) and returns plain tensors, so ``torch.export`` graphs hold only
tensors and these ops.  The Python functions here are what modules and ``QTensor`` call: in
eager mode they run the kernels directly (no dispatcher cost), while traced they emit the op.
This package is the only caller of the kernel registry for these computations.
"""
from __future__ import annotations

from . import (activation, binary, compile_lowering, conv, embedding, fake_quantize, linear,
               linear_fp16, normalization, pooling, quantize, quantize_block, quantize_dynamic,
               rnn)
from ._library import traced
from .inductor import register_when_inductor_loads as _register_when_inductor_loads

_register_when_inductor_loads()

__all__ = ["activation", "binary", "compile_lowering", "conv", "embedding", "fake_quantize",
           "linear", "linear_fp16", "normalization", "pooling", "quantize", "quantize_block",
           "quantize_dynamic", "rnn", "traced"]
