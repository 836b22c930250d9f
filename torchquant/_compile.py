"""``torchquant.compile``: the fastest way to run a converted model.

A PT2E model (the ``GraphModule`` ``convert_pt2e`` returns, or an ``ExportedProgram`` of one)
is first lowered (:func:`torchquant.quantization.pt2e.lowering.lower_pt2e`: each
dequantize -> conv / linear (+ relu / add / add+relu) -> quantize becomes one fused int8 op with
its weight packed once; requantize pairs vanish), then handed to ``torch.compile`` (inductor),
which fuses what is left (activation quantize / dequantize, pooling, the float head).  An
eager-converted module (``torchquant.quantization.convert``) already calls the fused ops and
only goes to ``torch.compile`` (exporting it first gains nothing: its graph has no
dequantize -> conv -> quantize left to fuse).

Where compiling does not pay (measured on the digits CNN at batch 1, 2026-12-03, AVX2, one
thread, CPU time): eager 0.86-0.91 ms, compiled 0.94-1.13 ms, torch.ao 0.16 ms.  The graph
has no breaks; dynamo's guards cost ~0.07 ms a call; ``dynamic=False`` and ``freezing`` change
nothing measurable.  The time is in the ops the graph calls: each ``torchquant::*`` op runs
its eager Python implementation behind the dispatcher (the eager modules instead reuse
per-layer plans bound on their first call), and oneDNN's qconv / qlinear cost 40-110 us a call
at these sizes against 6-12 us for torch.ao's kernels.  At larger batches compiling pays (the
digits CNN at batch 450: compiled 0.46x eager's time).  The demo times both and says which is
faster.
"""
from __future__ import annotations

from typing import Any

import torch
from torch.fx import GraphModule

from .quantization.pt2e.lowering import lower_pt2e

__all__ = ["compile"]


def _is_pt2e_converted(model: torch.nn.Module) -> bool:
    if not isinstance(model, GraphModule):
        return False
    names = {str(n.target) for n in model.graph.nodes if n.op == "call_function"}
    return any(name.startswith("torchquant.") for name in names)


def compile(model: Any, *, lower: bool = True, use_torch_compile: bool = True,
            inplace: bool = False, **compile_kwargs: Any) -> Any:
    """Lower a converted model onto torchquant's fused int8 ops, then ``torch.compile`` it.

    ``model``: a ``convert_pt2e`` output (``GraphModule``), a ``torch.export.ExportedProgram``
    of one, or any module (an eager-converted one: not lowered, compiled).  ``lower=False``
    skips the lowering, ``use_torch_compile=False`` returns the lowered module uncompiled (eager
    calls of the fused ops).  ``inplace`` lowers the given GraphModule itself instead of a copy.
    ``compile_kwargs`` go to ``torch.compile`` (``backend`` defaults to ``"inductor"``).
    """
    if isinstance(model, torch.export.ExportedProgram):
        model, inplace = model.module(), True
    if lower and _is_pt2e_converted(model):
        model = lower_pt2e(model, inplace=inplace)
    if not use_torch_compile:
        return model
    compile_kwargs.setdefault("backend", "inductor")
    return torch.compile(model, **compile_kwargs)
