"""``torchquant.compile``: the fastest way to run a converted model.

On CPUs whose oneDNN u8 x s8 products are exact (VNNI, AMX) a converted model (PT2E, eager or
FX) is compiled ahead of time by AOTInductor for the shapes it is called with
(:mod:`torchquant._compile_aot`), or goes to ``torch.compile`` with inductor freezing and the
C++ wrapper turned on for that compile (``aot=False``, ``torch.compile`` arguments, calls the
AOT graphs cannot serve); either way torchquant's freezing pass
(:mod:`torchquant.ops.inductor.fusion`) turns its dequantize -> conv / linear (+ relu /
hardtanh / add / add+relu) -> quantize into oneDNN int8 calls with their weights prepacked at
freezing; quantize / dequantize left over become fused C++
(:mod:`torchquant.ops.inductor.elementwise`).  No Python runs per op in those parts of the
compiled forward.  (For eager / FX models the pass rewrites their ``torchquant::conv`` calls,
whose weights freezing has made constants.)  In these graphs, and only these, ATen's CPU flash
attention of short sequences becomes torchquant's native float32 attention
(:mod:`torchquant.ops.inductor.attention`).

Where oneDNN saturates u8 x s8 pairs (AVX2, AVX-512 without VNNI) a PT2E graph takes the same
frozen compile, whose pass then turns its convs into torchquant's native conv, exact there by
its high-bit split, and leaves an image's first conv and the linears the float ops on
dequantized values that the graph computes, everything around them fused.  Where freezing
cannot run (another backend, a ``mode``) a PT2E model is first lowered
(:func:`torchquant.quantization.pt2e.lowering.lower_pt2e`: each dequantize -> conv / linear ->
quantize becomes one fused torchquant op, exact on every CPU, its weight packed once) and then
compiled.  Timings are in BENCHMARKS.md.
"""
from __future__ import annotations

import functools
import threading
import warnings
from typing import Any, Callable, Optional

import torch
import torch._inductor.config as _inductor_config
import torch.utils._pytree as pytree
from torch.fx import GraphModule

from ._compile_aot import AOTCompiledModel
from .ops import linear as _ops_linear
from .ops.inductor import packaging_state
from .quantization.pt2e.lowering import lower_pt2e

__all__ = ["compile"]


def _is_pt2e_converted(model: torch.nn.Module) -> bool:
    if not isinstance(model, GraphModule):
        return False
    names = {str(n.target) for n in model.graph.nodes if n.op == "call_function"}
    return any(name.startswith("torchquant.") for name in names)


def compile(model: Any, *, lower: bool = True, use_torch_compile: bool = True,
            inplace: bool = False, aot: Optional[bool] = None, **compile_kwargs: Any) -> Any:
    """Compile a converted model onto int8 kernels.

    A PT2E graph is compiled with inductor freezing -- ahead of time by AOTInductor (``aot``
    below), or by ``torch.compile`` with the C++ wrapper (for this compile only; ``options`` may
    turn either off) -- and torchquant's freezing pass turns each dequantize ->
    conv / linear -> quantize into a oneDNN int8 call with its weight prepacked (call the
    compiled model under ``torch.no_grad()`` or ``torch.inference_mode()``: inductor freezes
    inference graphs only); where oneDNN's int8 saturates, convs become torchquant's native
    conv (exact there) or stay float, linears stay float.  Where freezing cannot run (another
    backend, a ``mode``) it is first lowered onto torchquant's fused ops.  Eager- and
    FX-converted modules take the same frozen compile where oneDNN is exact (their convs'
    weights become constants the pass packs for oneDNN); elsewhere they are compiled as they
    are.

    ``model``: a ``convert_pt2e`` output (``GraphModule``), a ``torch.export.ExportedProgram``
    of one, or any module (an eager-converted one: not lowered, compiled).  ``lower=False``
    skips the lowering, ``use_torch_compile=False`` returns the lowered module uncompiled (eager
    calls of the fused ops).  ``inplace`` lowers the given GraphModule itself instead of a copy.
    ``compile_kwargs`` go to ``torch.compile`` (``backend`` defaults to ``"inductor"``).

    ``aot``: where the freezing pass applies and no ``compile_kwargs`` are given, the model is
    compiled ahead of time by AOTInductor for the input shapes it is called with
    (:mod:`torchquant._compile_aot`: the same kernels without Python around them, 1.7-2.5x
    faster at batch 1 on the bench's CNNs, BENCHMARKS.md); ``aot=False`` takes
    ``torch.compile``, ``aot=True`` insists (a ValueError where the pass does not apply).
    """
    if isinstance(model, torch.export.ExportedProgram):
        model, inplace = model.module(), True
    pt2e = _is_pt2e_converted(model)
    freezing = use_torch_compile and _freezing_compile(compile_kwargs)
    # eager- and FX-converted modules take the same frozen compile: the pass turns their
    # torchquant::conv calls, whose weights freezing makes constants, into oneDNN calls too
    fused_by_inductor = freezing and _ops_linear.onednn_u8s8_exact()
    # where oneDNN saturates, a PT2E graph still compiles frozen (not lowered): the pass makes
    # its convs native split convs or keeps them float, every quantize / dequantize fused
    # around them -- faster there than the lowered fused ops (BENCHMARKS.md, 2026-12-07
    # eleventh session)
    frozen = fused_by_inductor or (freezing and pt2e)
    if lower and pt2e and not frozen:
        model = lower_pt2e(model, inplace=inplace)
    if not use_torch_compile:
        return model
    if aot and not (frozen and not compile_kwargs):
        raise ValueError("torchquant.compile(aot=True) needs the freezing pass (inductor, and "
                         "a PT2E graph or oneDNN int8 exact on this CPU) and no torch.compile "
                         "arguments")
    if aot is not False and frozen and not compile_kwargs:
        return AOTCompiledModel(model, lambda: compile(model, lower=False, aot=False))
    compile_kwargs.setdefault("backend", "inductor")
    if not frozen:
        return torch.compile(model, **compile_kwargs)
    options = dict(compile_kwargs.get("options") or {})
    options.setdefault("freezing", True)
    # the generated forward in C++: a batch-1 call is dozens of oneDNN calls, and their Python
    # wrapper was a sixth of its time (ResNet-shaped b1 0.54 -> 0.45 ms, BENCHMARKS.md
    # 2026-12-05)
    options.setdefault("cpp_wrapper", True)
    compile_kwargs["options"] = options
    compiled = torch.compile(model, **compile_kwargs)
    if options["freezing"]:
        compiled.forward = _traced_for_freezing(compiled.forward, list(model.named_parameters()))
    return compiled


_freezing_lock = threading.Lock()
_freezing_calls = [0, False]  # calls inside, the user's own setting when the first came in


def _traced_for_freezing(forward: Callable,
                         parameters: list[tuple[str, torch.Tensor]]) -> Callable:
    """``forward`` with inductor's global ``freezing`` flag on while it runs, and under
    ``torch.no_grad()`` where nothing could take a gradient.

    ``options={"freezing": True}`` reaches inductor but not Dynamo, which decides from the
    global flag, while it traces, whether the module's weights are static inputs that freezing
    may fold: without it they stay graph inputs and nothing is frozen (the int8 convs would run
    in float on weights dequantized every call).  Dynamo traces inside a call (the first one,
    and a recompile on new shapes), so the flag is set around each call and the user's value
    restored after the last concurrent one returns.

    Inductor freezes inference graphs only: called with grad mode on (Python's default), the
    model compiled a second, unfrozen graph whose int8 convs ran in float (BENCHMARKS.md,
    2026-12-05 fourth session).  Where no input and no parameter requires grad, no gradient can
    flow, so such a call runs under ``no_grad`` and gets the frozen int8 graph; where one
    does (a PT2E model keeps its linears' float biases as parameters that require grad), it
    keeps grad mode and warns once, naming them."""
    warned = [False]

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_grad_enabled():
            trainable = [name for name, p in parameters if p.requires_grad]
            if not trainable and not _input_wants_grad(args, kwargs):
                with torch.no_grad():
                    return run(*args, **kwargs)
            if not warned[0]:
                warned[0] = True
                warnings.warn(
                    "torchquant.compile: this model was called with grad mode on and "
                    + (f"parameters that require grad ({', '.join(trainable[:4])}"
                       f"{', ...' if len(trainable) > 4 else ''})" if trainable
                       else "an input that requires grad")
                    + ": inductor does not freeze such a graph, so its int8 convs / linears run "
                    "as float ops (several times slower).  Call it under torch.no_grad() or "
                    "torch.inference_mode(), or set requires_grad_(False).", stacklevel=2)
        with _freezing_lock:
            if _freezing_calls[0] == 0:
                _freezing_calls[1] = _inductor_config.freezing
                _inductor_config.freezing = True
            _freezing_calls[0] += 1
        try:
            with packaging_state.torchquant_compile():
                return forward(*args, **kwargs)
        finally:
            with _freezing_lock:
                _freezing_calls[0] -= 1
                if _freezing_calls[0] == 0:
                    _inductor_config.freezing = _freezing_calls[1]
    return run


def _input_wants_grad(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(leaf, torch.Tensor) and leaf.requires_grad
               for leaf in pytree.tree_leaves((args, kwargs)))


def _freezing_compile(compile_kwargs: dict) -> bool:
    """Whether this compile can run inductor's freezing pass
    (:mod:`torchquant.ops.inductor.fusion`): inductor is the backend and freezing can be turned
    on (no ``mode``, which excludes ``options``, and freezing not turned off).  The pass turns
    int8 convs / linears into oneDNN calls where oneDNN's u8 x s8 products are exact on this
    CPU; elsewhere a PT2E graph's convs into native split convs (or leaves them float)."""
    backend = compile_kwargs.get("backend", "inductor")
    if backend != "inductor" or "mode" in compile_kwargs:
        return False
    return (compile_kwargs.get("options") or {}).get("freezing") is not False
