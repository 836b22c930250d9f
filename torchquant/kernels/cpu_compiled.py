"""Fast CPU elementwise kernels: the reference formulas compiled by inductor into one fused loop.

Eager torch needs four or five passes over memory for a quantize (multiply-add, round, clamp,
cast); inductor emits a single vectorised loop, which is what lets plain torch match torch's
hand-written quantize kernel.  Only used for large tensors (compilation and guard overhead
dominate below ~256k elements) and never while an outer ``torch.compile`` is tracing.  If
compilation fails (no C++ compiler, say) the kernel marks itself unavailable and the
reference takes over.
"""
from __future__ import annotations

import logging
import os

import torch

from . import register
from .reference import add_formula, dequantize_formula, fake_quantize_formula, quantize_formula

log = logging.getLogger("torchquant")
MIN_NUMEL = int(os.environ.get("TORCHQUANT_COMPILED_MIN_NUMEL", str(1 << 18)))
_broken: set[str] = set()
_compiled: dict[str, object] = {}


def _inductor_fma(a, b, c):
    return torch.ops.prims.fma(a, b, c)


def _quantize(x, inv, zp, qmin, qmax, storage_dtype, mode):
    return quantize_formula(x, inv, zp, qmin, qmax, storage_dtype, mode, fma=_inductor_fma,
                           narrow_via_int32=True)


def _add(x, y, x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin, qmax,
         storage_dtype, relu):
    return add_formula(x, y, x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin, qmax,
                       storage_dtype, relu, fma=_inductor_fma)


_SOURCES = {"quantize": _quantize, "dequantize": dequantize_formula,
            "fake_quantize": fake_quantize_formula, "add": _add}
# A quantized add is ~8 eager passes (not 4), so compiling pays off on smaller tensors.
_MIN_NUMEL = {"add": int(os.environ.get("TORCHQUANT_COMPILED_ADD_MIN_NUMEL", str(1 << 14)))}


def _fn(op: str):
    fn = _compiled.get(op)
    if fn is None:
        import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma)
        fn = torch.compile(_SOURCES[op], dynamic=True, fullgraph=True)
        _compiled[op] = fn
    return fn


def _guarded(op: str):
    def run(*args):
        try:
            return _fn(op)(*args)
        except Exception as exc:  # compilation unavailable: fall back for good
            _broken.add(op)
            log.warning("torchquant: compiled %s kernel unavailable (%s); using the reference", op,
                        type(exc).__name__)
            from .reference import __dict__ as ref
            return ref[f"{op}_formula"](*args)
    return run


def _applies(op):
    def check(t: torch.Tensor, **hints) -> bool:
        return op not in _broken and t.numel() >= _MIN_NUMEL.get(op, MIN_NUMEL)
    return check


for _op in _SOURCES:
    register(_op, "cpu_compiled", devices=("cpu",), applies=_applies(_op))(_guarded(_op))
