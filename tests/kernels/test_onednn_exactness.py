"""The CPU probes of torchquant/kernels/onednn_exactness.py answer the same inside a trace as
outside it (the first question may come from a decomposition while torch.export / AOTInductor
traces, and the answer is cached for the process)."""
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchquant.kernels import onednn_exactness as exactness


def _asked_inside_a_trace(probe):
    seen = []

    def traced(x):
        seen.append(probe())
        return x + 1

    make_fx(traced, tracing_mode="fake")(torch.randn(2))
    return seen


def test_int_mm_probe_inside_a_trace_answers_as_outside():
    expected = exactness.int_mm_exact_on_cpu()
    exactness.int_mm_exact_on_cpu.cache_clear()
    try:
        # before the fix the probe's real tensors met the trace's proxy mode, raised, and
        # "inexact" was cached: the eager dynamic Linear then compiled ahead of time onto a
        # float64 matmul, 10x slower
        assert _asked_inside_a_trace(exactness.int_mm_exact_on_cpu) == [expected]
    finally:
        exactness.int_mm_exact_on_cpu.cache_clear()
    assert exactness.int_mm_exact_on_cpu() == expected


def test_onednn_probe_inside_a_trace_answers_as_outside():
    expected = exactness.onednn_u8_exact_max()
    measured = exactness._onednn_u8_exact_max_measured
    measured.cache_clear()
    try:
        assert _asked_inside_a_trace(exactness.onednn_u8_exact_max) == [expected]
    finally:
        measured.cache_clear()
    assert exactness.onednn_u8_exact_max() == expected
