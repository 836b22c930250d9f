"""Fast CPU elementwise kernels: the reference formulas compiled by inductor, one fused loop each.

Eager torch needs four to eight passes over memory for a quantize or a quantized add; inductor
emits a single vectorised loop, which is what lets plain torch match torch's hand-written
quantized kernels.  ``torch.compile`` itself is the wrong wrapper for tensors this small: its
per-call cost (frame guards, the AOT runtime wrappers) is 25-40 us, as much as the whole loop
at activation sizes, and its dynamic-shape kernels ran ~2x slower than static ones (measured on
a quantized add of 200k elements: 63 us dynamic, 24 us static and called directly, torch's own
kernel 24 us).  So each *hot* signature -- op, shapes, strides, dtypes, the non-tensor arguments
and the thread count -- gets its own static kernel: the formula is traced with ``make_fx``,
compiled by inductor, and its generated function is called directly (~4 us of overhead).

A signature is compiled on its ``HOT_CALLS``-th call (a model repeats its shapes every batch;
the one-off shapes of a test or a calibration step stay eager), and at most ``MAX_KERNELS``
are kept.  Compilation costs ~0.7 s per new signature with a warm inductor cache and several
seconds with an empty one; a build slower than ``SLOW_BUILD_S`` says so once at WARNING on the
``torchquant`` logger.  Builds happen on the calling thread: ``make_fx`` and AOT autograd patch
``nn.Module.__call__`` process-wide while they trace, so a build on a background thread breaks
every module call the main thread makes meanwhile (seen: "module is not installed as a
submodule" in a training loop).  So a converted model's first call compiles nothing: a
signature is hot on its ``HOT_CALLS``-th call only once it has been seen in an earlier model
call too (converted models mark their calls, :func:`note_model_call`), so shapes that the layers
of one forward repeat wait for the next call (or for ``_SAME_CALL_FACTOR`` times as many calls).
If a build fails (no C++ compiler, say) the op marks itself unavailable and the reference takes
over.  Never used while an outer ``torch.compile`` traces (the registry checks).

Amortised builds (issue #15: a build must not stall an answer for long): the elementwise ops
behind the kernel registry time their eager formula, and a signature is built only once the
eager runs it has cost so far add up to what a build is expected to cost (:func:`expected_build_s`:
an estimate until this process has measured builds, then their mean).  A one-off shape never builds; a
shape that is run often builds after it has already spent about the build's time in eager
runs, so waiting for the kernel never costs more than the eager runs it replaces (the ski-rental
bound: at most twice the best choice in hindsight).  Setting ``TORCHQUANT_COMPILED_HOT_CALLS``
(or :data:`HOT_CALLS`, or a caller's ``hot_calls``) to other than the default asks for the plain
call count instead (tests; callers that know their shapes repeat).  Eager times are attributed
to the signature the calling thread last asked for, so concurrent callers may mix them up: that
only moves when a kernel builds, never what it computes.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

import torch

from .. import _config
from .._log import emit_once
from .registry import register
from ..affine import FMA
from .reference import (add_formula, dequantize_formula, fake_quantize_formula,
                        quantize_finite_formula, quantize_formula)

log = logging.getLogger("torchquant")
_DEFAULT_HOT_CALLS = _config.DEFAULT_COMPILED_HOT_CALLS
HOT_CALLS = _config.compiled_hot_calls()
# What a build is expected to cost before this process has measured one (seconds).  The first
# build of a process also starts inductor's C++ toolchain and costs far more than later ones
# (BENCHMARKS.md, "first use").
FIRST_BUILD_ESTIMATE_S = _config.compiled_first_build_estimate_s()
BUILD_ESTIMATE_S = _config.compiled_build_estimate_s()
# Seconds of eager runs per amortised signature so far, and the seconds each build took.
_eager_s: dict[tuple, float] = {}
_build_s: list[float] = []
_last_pending = threading.local()
MAX_KERNELS = 256
_broken: set[str] = set()
_kernels: dict[tuple, Callable[[list], Any]] = {}
_calls: dict[tuple, int] = {}
# A build slower than this says so (once) on the torchquant logger.
SLOW_BUILD_S = 2.0
# Model calls so far (converted models note each call, see note_model_call), and the one in
# which each signature was first seen: a shape repeated by the layers of one forward is not yet
# "hot" (a first inference must not compile), unless it repeats a lot (a model that notes no
# calls, e.g. a dynamic one, after the first has run).
_model_calls = 0
_first_seen_in: dict[tuple, int] = {}
_SAME_CALL_FACTOR = 4


def note_model_call() -> None:
    """Called by converted models on each call (their ``Quantize``): separates one forward's
    repeated shapes from shapes repeated across calls."""
    global _model_calls
    _model_calls += 1


def _inductor_fma(a, b, c):
    return torch.ops.prims.fma(a, b, c)


def _quantize(x, inv, zp, qmin, qmax, storage_dtype, mode):
    return quantize_formula(x, inv, zp, qmin, qmax, storage_dtype, mode, fma=_inductor_fma,
                           narrow_via_int32=True)


def _quantize_finite(x, inv, zp, qmin, qmax, storage_dtype):
    # the NaN mask of the general formula is a no-op on finite input: same integers
    return _quantize(x, inv, zp, qmin, qmax, storage_dtype, FMA)


def _add(x, y, x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin, qmax,
         storage_dtype, relu):
    return add_formula(x, y, x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin, qmax,
                       storage_dtype, relu, fma=_inductor_fma)


def _add_bytes_in_words(x_words, y_words, x_scale, x_premul, y_scale, y_premul, inv_out,
                        zp_out, qmin, qmax, relu):
    """:func:`_add` of quint8 operands read four to an int32 word, the four results packed the
    same way.  Inductor's vector loop over uint8 loads and stores 8 (AVX2) or 16 bytes at a
    time; on CPUs without masked byte loads (AVX2) those partial vectors go through a stack
    copy and the loop runs several times slower than over full int32 vectors."""
    words = None
    for shift in (0, 8, 16, 24):
        q = _add((x_words >> shift) & 255, (y_words >> shift) & 255, x_scale, x_premul, y_scale,
                 y_premul, inv_out, zp_out, qmin, qmax, torch.int32, relu) << shift
        words = q if words is None else words | q
    return words


def _as_words(t: torch.Tensor) -> Optional[torch.Tensor]:
    """``t`` (flat, contiguous uint8) viewed as int32 words, where its length and offset allow."""
    if (t.dtype != torch.uint8 or t.dim() != 1 or not t.is_contiguous() or t.numel() % 4
            or t.storage_offset() % 4 or t.data_ptr() % 4):
        return None
    return t.view(torch.int32)


def add_kernel(args: tuple, amortise: bool = False) -> Optional[Callable[[list], torch.Tensor]]:
    """The compiled quantized add for ``args`` (:func:`_add`'s arguments) once hot, as a
    function of the list of its tensors returning the output; None before that or where
    compilation fails.  Same-length flat quint8 operands run four values to an int32 word."""
    x_words, y_words = _as_words(args[0]), _as_words(args[1])
    if (x_words is not None and y_words is not None and x_words.numel() == y_words.numel()
            and args[10] == torch.uint8):
        word_args = (x_words, y_words, *args[2:10], args[11])
        kernel = compiled("add_words", word_args, source=_add_bytes_in_words, amortise=amortise)
        if kernel is None:
            return None
        return lambda inputs: kernel([inputs[0].view(torch.int32), inputs[1].view(torch.int32),
                                      *inputs[2:]])[0].view(torch.uint8)
    kernel = compiled("add", args, amortise=amortise)
    if kernel is None:
        return None
    return lambda inputs: kernel(inputs)[0]


_SOURCES = {"quantize": _quantize, "quantize_finite": _quantize_finite,
            "dequantize": dequantize_formula, "fake_quantize": fake_quantize_formula, "add": _add}
_EAGER = {"quantize": quantize_formula, "quantize_finite": quantize_finite_formula,
          "dequantize": dequantize_formula, "fake_quantize": fake_quantize_formula,
          "add": add_formula}
# Below these sizes the eager formula costs about what a kernel call does (measured).
_MIN_NUMEL = {"quantize": 1 << 15, "quantize_finite": 1 << 15, "dequantize": 1 << 15,
              "fake_quantize": 1 << 15, "add": 1 << 13}


def _signature(op: str, args: tuple) -> tuple:
    parts: list[Any] = [op, torch.get_num_threads()]
    for a in args:
        if isinstance(a, torch.Tensor):
            parts.append((tuple(a.shape), a.stride(), a.dtype))
        else:
            parts.append(a)
    return tuple(parts)


# The inductor settings these kernels are built under, whatever the user has set globally (a
# kernel is called directly with all its inputs and must round exactly as the eager formula):
# freezing would treat the inputs as constants and drop them from the entry point's inputs;
# the C++ wrapper changes the entry point; fast-math / FP contraction flags change rounding;
# custom graph passes could rewrite the formula; autotuning and bandwidth profiling only cost.
# Applied as a config patch around tracing and compilation, so the user's values come back.
# Settings a torch version does not have are skipped.
_INDUCTOR_SETTINGS: dict[str, Any] = {
    "freezing": False,
    "freezing_discard_parameters": False,
    "cpp_wrapper": False,
    "max_autotune": False,
    "max_autotune_gemm": False,
    "max_autotune_pointwise": False,
    "fallback_random": False,
    "implicit_fallbacks": True,
    "keep_output_stride": True,
    "pad_outputs": False,
    "force_layout_optimization": False,
    "emulate_precision_casts": False,
    "profile_bandwidth": False,
    "benchmark_kernel": False,
    "pre_grad_custom_pass": None,
    "joint_custom_pre_pass": None,
    "joint_custom_post_pass": None,
    "post_grad_custom_pre_pass": None,
    "post_grad_custom_post_pass": None,
    "cpp.simdlen": None,
    "cpp.enable_unsafe_math_opt_flag": False,
    "cpp.enable_floating_point_contract_flag": "off",
}


def _inductor_settings() -> dict[str, Any]:
    import torch._inductor.config as config
    return {k: v for k, v in _INDUCTOR_SETTINGS.items() if k in config._config}


def _build(source: Callable, args: tuple) -> Callable[[list], Any]:
    """A static inductor kernel of ``source`` for exactly these argument shapes / constants,
    built under :data:`_INDUCTOR_SETTINGS` (the user's inductor config is restored after)."""
    import torch._inductor.config
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma)
    from torch.fx.experimental.proxy_tensor import make_fx
    positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    tensors = [args[i] for i in positions]

    def formula(*ts):
        full = list(args)
        for i, t in zip(positions, ts):
            full[i] = t
        return source(*full)

    with torch.no_grad(), torch._inductor.config.patch(_inductor_settings()):
        graph = make_fx(formula)(*tensors)
        compiled = torch._inductor.compile(graph, tensors)
    # The generated module's entry point, without the AOT wrappers (it takes a list it may
    # clear); the wrapped function is the fallback if this inductor keeps it elsewhere.
    direct = getattr(getattr(compiled, "_torchdynamo_orig_callable", None),
                     "current_callable", None)
    lifted_constants = any(node.op == "get_attr" for node in graph.graph.nodes)
    if direct is not None and not lifted_constants:  # (constants become extra inputs there)
        return direct
    return lambda inputs: compiled(*inputs)


def expected_build_s() -> float:
    """What the next build is expected to cost: :data:`FIRST_BUILD_ESTIMATE_S` before the
    process's first build (it also starts inductor's toolchain), then the mean of the builds
    after the first (the last 16), or :data:`BUILD_ESTIMATE_S` before there are any.  Setting
    ``TORCHQUANT_COMPILED_BUILD_ESTIMATE_S`` fixes both estimates to its value."""
    if not _build_s:
        if _config.compiled_build_estimate_set():
            return BUILD_ESTIMATE_S
        return FIRST_BUILD_ESTIMATE_S
    recent = _build_s[1:][-16:]
    return sum(recent) / len(recent) if recent else BUILD_ESTIMATE_S


def stats() -> dict[str, float]:
    """Kernels built in this process, the seconds all builds took and the longest one."""
    return {"built": len(_build_s), "build_s": sum(_build_s),
            "longest_build_s": max(_build_s, default=0.0)}


def note_eager_seconds(seconds: float) -> None:
    """Add an eager run's time to the signature the calling thread last asked a kernel for
    (and got none): see the module docstring's amortised builds."""
    key = getattr(_last_pending, "key", None)
    if key is not None:
        _last_pending.key = None
        _eager_s[key] = _eager_s.get(key, 0.0) + seconds


def _build_timed(source: Callable, args: tuple) -> Callable[[list], Any]:
    expected = expected_build_s()
    if expected > SLOW_BUILD_S:  # said before the wait, not only after it
        emit_once(logging.WARNING, f"building a compiled CPU kernel for a shape that repeats "
                  f"(this one call may take ~{expected:.0f} s or more: the first build starts "
                  "inductor's C++ toolchain; TORCHQUANT_KERNELS=reference avoids builds)",
                  key="build-start")
    start = time.perf_counter()
    kernel = _build(source, args)
    took = time.perf_counter() - start
    _build_s.append(took)
    if took > SLOW_BUILD_S:
        emit_once(logging.WARNING, f"building a compiled CPU kernel took {took:.1f} s (an empty "
                  "inductor cache, probably); later builds are faster, and "
                  "TORCHQUANT_KERNELS=reference avoids them", key="slow-build")
    return kernel


def _amortising() -> bool:
    return not _config.compiled_hot_calls_set() and HOT_CALLS == _DEFAULT_HOT_CALLS


def hot_kernel(op: str, source: Callable, args: tuple, hot_calls: Optional[int] = None,
               amortise: bool = False) -> Optional[Callable[[list], Any]]:
    """The static kernel of ``source(*args)`` once this signature is hot (its ``hot_calls``-th
    call, default ``HOT_CALLS``; with ``amortise``, and a signature seen with it before, also
    only once its eager runs have cost what a build is expected to: then the caller reports
    each eager run's time with :func:`note_eager_seconds`), else None (run it eager).  Call the
    kernel with the list of ``args``' tensors, in order; it returns a tuple of outputs.
    ``op`` names the formula: one name, one ``source``."""
    key = _signature(op, args)
    kernel = _kernels.get(key)
    if kernel is None:
        seen = _calls[key] = _calls.get(key, 0) + 1
        threshold = HOT_CALLS if hot_calls is None else hot_calls
        first_call = _first_seen_in.setdefault(key, _model_calls)
        amortised = hot_calls is None and _amortising() and (amortise or key in _eager_s)
        if amortised:
            _eager_s.setdefault(key, 0.0)
            _last_pending.key = key
        if seen < threshold:
            return None
        if (threshold > 1 and _model_calls and first_call == _model_calls
                and seen < threshold * _SAME_CALL_FACTOR):
            return None  # only repeated within the model call it first appeared in
        if amortised and _eager_s[key] < expected_build_s():
            return None  # the eager runs have not yet paid for a build
        _last_pending.key = None
        if len(_kernels) >= MAX_KERNELS:
            _kernels.clear()
            _calls.clear()
            _first_seen_in.clear()
            _eager_s.clear()
        kernel = _kernels[key] = _build_timed(source, args)
    return kernel


def compiled(op: str, args: tuple, source: Optional[Callable] = None,
             hot_calls: Optional[int] = None, amortise: bool = False
             ) -> Optional[Callable[[list], Any]]:
    """:func:`hot_kernel` of ``source`` (default: this module's formula ``op``), or None
    before the signature is hot or where compilation fails -- then for good, logged once:
    the caller runs its eager form."""
    if op in _broken:
        return None
    try:
        return hot_kernel(op, _SOURCES[op] if source is None else source, args, hot_calls,
                          amortise)
    except Exception as exc:  # no C++ compiler, or an inductor that cannot build it
        _broken.add(op)
        log.warning("torchquant: compiled %s kernel unavailable (%s: %s); using the eager "
                    "form", op, type(exc).__name__, exc)
        return None


def _guarded(op: str):
    single = op != "fake_quantize"

    def eager(args):
        start = time.perf_counter()
        out = _EAGER[op](*args)
        note_eager_seconds(time.perf_counter() - start)
        return out

    def run(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if op == "add":
            kernel = add_kernel(args, amortise=True)
            return eager(args) if kernel is None else kernel(tensors)
        kernel = compiled(op, args, amortise=True)
        if kernel is None:
            return eager(args)
        out = kernel(tensors)
        return out[0] if single else tuple(out)
    return run


def _applies(op):
    def check(t: torch.Tensor, **hints) -> bool:
        return op not in _broken and t.numel() >= _MIN_NUMEL[op]
    return check


for _op in _SOURCES:
    register(_op, "cpu_compiled", devices=("cpu",), applies=_applies(_op))(_guarded(_op))
