"""Fake-quantize forward + backward, torchquant vs torch.ao, in one process (2 threads).

Rows: per-tensor activations on a (64, 256, 28, 28) tensor and per-channel weights on a
(256, 256, 3, 3) tensor, for ``FakeQuantize`` and ``FusedMovingAvgObsFakeQuantize`` with their
default settings.  Prints milliseconds (the best of 5 alternating rounds, each a median) and
the ours/torch ratio (target <= 1.5).

    .venv/bin/python bench/bench_fake_quantize.py
"""
from __future__ import annotations

import statistics
import time
import warnings

import torch
import torch.ao.quantization as tq

from torchquant.quantization import fake_quantize as fq

ACTIVATION_SHAPE = (64, 256, 28, 28)
WEIGHT_SHAPE = (256, 256, 3, 3)
ROWS = [
    ("FakeQuantize, per-tensor activation", "default_fake_quant", ACTIVATION_SHAPE),
    ("FusedMovingAvgObsFakeQuantize, per-tensor activation", "default_fused_act_fake_quant",
     ACTIVATION_SHAPE),
    ("FakeQuantize, per-channel weight", "default_per_channel_weight_fake_quant", WEIGHT_SHAPE),
    ("FusedMovingAvgObsFakeQuantize, per-channel weight",
     "default_fused_per_channel_wt_fake_quant", WEIGHT_SHAPE),
]


def time_forward_backward(module: torch.nn.Module, x: torch.Tensor, grad: torch.Tensor,
                          repeats: int) -> float:
    """Median wall time (ms) of one forward + backward."""
    times = []
    for _ in range(repeats):
        x.grad = None
        start = time.perf_counter()
        module(x).backward(grad)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def compare(factory: str, x: torch.Tensor, grad: torch.Tensor, rounds: int,
            repeats: int) -> tuple[float, float]:
    """(torch ms, ours ms): short alternating rounds, best round each, so that load from
    other processes on a shared machine hits both sides alike."""
    theirs, ours = getattr(tq, factory)(), getattr(fq, factory)()
    for module in (theirs, ours):  # warm up (ours compiles its fused kernels here)
        time_forward_backward(module, x, grad, 3)
    theirs_ms, ours_ms = [], []
    for _ in range(rounds):
        theirs_ms.append(time_forward_backward(theirs, x, grad, repeats))
        ours_ms.append(time_forward_backward(ours, x, grad, repeats))
    return min(theirs_ms), min(ours_ms)


def main() -> None:
    torch.set_num_threads(2)
    warnings.filterwarnings("ignore", message=".*reduce_range.*")
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; best-round median ms of "
          "forward+backward")
    print(f"{'case':<55} {'shape':<18} {'torch':>8} {'ours':>8} {'ours/torch':>10}")
    for label, factory, shape in ROWS:
        x = torch.randn(shape).requires_grad_()
        grad = torch.randn(shape)
        big = shape == ACTIVATION_SHAPE
        t, o = compare(factory, x, grad, rounds=5, repeats=3 if big else 10)
        print(f"{label:<55} {str(tuple(shape)):<18} {t:8.2f} {o:8.2f} {o / t:10.2f}")


if __name__ == "__main__":
    main()
