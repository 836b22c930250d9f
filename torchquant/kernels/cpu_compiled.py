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
seconds with an empty one, so by default it never blocks a call: a hot signature is queued for
a background thread and the eager formula answers until its kernel is ready
(``TORCHQUANT_COMPILE_IN_BACKGROUND=0`` builds synchronously on the hot call instead, which
makes the path each call takes deterministic; :func:`wait_for_kernels` waits for the queue).
If a build fails (no C++ compiler, say) the op marks itself unavailable and the reference takes
over.  Never used while an outer ``torch.compile`` traces (the registry checks).
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Optional

import torch

from .._log import emit_once
from .registry import register
from ..affine import FMA
from .reference import (add_formula, dequantize_formula, fake_quantize_formula,
                        quantize_finite_formula, quantize_formula)

log = logging.getLogger("torchquant")
HOT_CALLS = int(os.environ.get("TORCHQUANT_COMPILED_HOT_CALLS", "2"))
MAX_KERNELS = 256
_broken: set[str] = set()
_kernels: dict[tuple, Callable[[list], Any]] = {}
_calls: dict[tuple, int] = {}
# Build hot kernels on a background thread (the eager formula answers meanwhile).
BACKGROUND = os.environ.get("TORCHQUANT_COMPILE_IN_BACKGROUND", "1") not in ("0", "")
# A synchronous build slower than this says so (once) on the torchquant logger.
SLOW_BUILD_S = 2.0
_pending: set[tuple] = set()
_failures: dict[str, BaseException] = {}
_queue: "queue.Queue[tuple[tuple, str, Callable, tuple]]" = queue.Queue()
_lock = threading.Lock()
_worker: Optional[threading.Thread] = None


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


def add_kernel(args: tuple) -> Optional[Callable[[list], torch.Tensor]]:
    """The compiled quantized add for ``args`` (:func:`_add`'s arguments) once hot, as a
    function of the list of its tensors returning the output; None before that or where
    compilation fails.  Same-length flat quint8 operands run four values to an int32 word."""
    x_words, y_words = _as_words(args[0]), _as_words(args[1])
    if (x_words is not None and y_words is not None and x_words.numel() == y_words.numel()
            and args[10] == torch.uint8):
        word_args = (x_words, y_words, *args[2:10], args[11])
        kernel = compiled("add_words", word_args, source=_add_bytes_in_words)
        if kernel is None:
            return None
        return lambda inputs: kernel([inputs[0].view(torch.int32), inputs[1].view(torch.int32),
                                      *inputs[2:]])[0].view(torch.uint8)
    kernel = compiled("add", args)
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


def _build_timed(source: Callable, args: tuple) -> Callable[[list], Any]:
    start = time.perf_counter()
    kernel = _build(source, args)
    took = time.perf_counter() - start
    if took > SLOW_BUILD_S and not BACKGROUND:
        emit_once(logging.WARNING, f"building a compiled CPU kernel took {took:.1f} s (inductor's "
                  "cache was cold); later ones are faster. TORCHQUANT_COMPILE_IN_BACKGROUND=1 "
                  "builds them without blocking", key="slow-build")
    return kernel


def _background_loop() -> None:
    while True:
        key, op, source, args = _queue.get()
        try:
            kernel = _build_timed(source, args)
            with _lock:
                if len(_kernels) >= MAX_KERNELS:
                    _kernels.clear()
                    _calls.clear()
                _kernels[key] = kernel
        except Exception as exc:  # reported by compiled() on the caller's thread
            with _lock:
                _failures[op] = exc
        finally:
            with _lock:
                _pending.discard(key)
            _queue.task_done()


def _submit(key: tuple, op: str, source: Callable, args: tuple) -> None:
    """Queue a background build of ``key`` (once), starting the worker thread if needed."""
    global _worker
    with _lock:
        if key in _pending:
            return
        _pending.add(key)
        if _worker is None or not _worker.is_alive():
            _worker = threading.Thread(target=_background_loop, name="torchquant-compile",
                                       daemon=True)
            _worker.start()
    _queue.put((key, op, source, args))


def wait_for_kernels(timeout: Optional[float] = None) -> bool:
    """Wait until every queued background build is done (True), or ``timeout`` seconds
    passed (False).  For benchmarks and tests that want the compiled path."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _lock:
            if not _pending:
                return True
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def pending_kernels() -> int:
    """How many kernel builds are queued or running in the background."""
    with _lock:
        return len(_pending)


def hot_kernel(op: str, source: Callable, args: tuple,
               hot_calls: Optional[int] = None) -> Optional[Callable[[list], Any]]:
    """The static kernel of ``source(*args)`` once this signature is hot (its ``hot_calls``-th
    call, default ``HOT_CALLS``), else None (run it eager).  Call the kernel with the list of
    ``args``' tensors, in order; it returns a tuple of outputs.  ``op`` names the formula:
    one name, one ``source``."""
    key = _signature(op, args)
    kernel = _kernels.get(key)
    if kernel is None:
        seen = _calls[key] = _calls.get(key, 0) + 1
        if seen < (HOT_CALLS if hot_calls is None else hot_calls):
            return None
        if BACKGROUND:
            _submit(key, op, source, args)
            return None
        if len(_kernels) >= MAX_KERNELS:
            _kernels.clear()
            _calls.clear()
        kernel = _kernels[key] = _build_timed(source, args)
    return kernel


def compiled(op: str, args: tuple, source: Optional[Callable] = None,
             hot_calls: Optional[int] = None) -> Optional[Callable[[list], Any]]:
    """:func:`hot_kernel` of ``source`` (default: this module's formula ``op``), or None
    before the signature is hot or where compilation fails -- then for good, logged once:
    the caller runs its eager form."""
    if op in _broken:
        return None
    try:
        if op in _failures:
            raise _failures.pop(op)
        return hot_kernel(op, _SOURCES[op] if source is None else source, args, hot_calls)
    except Exception as exc:  # no C++ compiler, or an inductor that cannot build it
        _broken.add(op)
        log.warning("torchquant: compiled %s kernel unavailable (%s: %s); using the eager "
                    "form", op, type(exc).__name__, exc)
        return None


def _guarded(op: str):
    single = op != "fake_quantize"

    def run(*args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if op == "add":
            kernel = add_kernel(args)
            return _EAGER[op](*args) if kernel is None else kernel(tensors)
        kernel = compiled(op, args)
        if kernel is None:
            return _EAGER[op](*args)
        out = kernel(tensors)
        return out[0] if single else tuple(out)
    return run


def _applies(op):
    def check(t: torch.Tensor, **hints) -> bool:
        return op not in _broken and t.numel() >= _MIN_NUMEL[op]
    return check


for _op in _SOURCES:
    register(_op, "cpu_compiled", devices=("cpu",), applies=_applies(_op))(_guarded(_op))
