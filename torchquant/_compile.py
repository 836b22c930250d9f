"""``torchquant.compile``: the fastest way to run a converted model.

A PT2E model (the ``GraphModule`` ``convert_pt2e`` returns, or an ``ExportedProgram`` of one)
is first lowered (:func:`torchquant.quantization.pt2e.lowering.lower_pt2e`: each
dequantize -> conv / linear (+ relu / add / add+relu) -> quantize becomes one fused int8 op with
its weight packed once; requantize pairs vanish), then handed to ``torch.compile`` (inductor),
which fuses what is left (activation quantize / dequantize, pooling, the float head).  An
eager-converted module (``torchquant.quantization.convert``) already calls the fused ops and
only goes to ``torch.compile``.
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
