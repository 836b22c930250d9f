"""Quantize / dequantize speed: torchquant vs torch's quantized-tensor kernels, side by side.

    .venv/bin/python bench/bench_tensor.py

Each row times both implementations in the same process on the same tensor (median of
repeats after warm-up, 2 threads) and prints ours / torch.  Compilation of our fused kernels
happens during warm-up and is not timed.
"""
from __future__ import annotations

import statistics
import time
import warnings

import torch

import torchquant as tq

warnings.filterwarnings("ignore")
torch.set_num_threads(2)


def timeit(fn, repeat: int = 30) -> float:
    for _ in range(3):
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def rows():
    for n in (1 << 20, 1 << 24):
        x = torch.randn(n)
        label = f"{n >> 20}M"
        yield (f"quantize_per_tensor quint8 {label}",
               lambda: tq.quantize_per_tensor(x, 0.02, 10, tq.quint8),
               lambda: torch.quantize_per_tensor(x, 0.02, 10, torch.quint8))
        yield (f"quantize_per_tensor qint8 {label}",
               lambda: tq.quantize_per_tensor(x, 0.02, 0, tq.qint8),
               lambda: torch.quantize_per_tensor(x, 0.02, 0, torch.qint8))
        w = x.view(1024, -1)
        s = torch.rand(1024, dtype=torch.float64) * 0.02 + 0.01
        z = torch.zeros(1024, dtype=torch.long)
        yield (f"quantize_per_channel qint8 {label} (1024 ch)",
               lambda: tq.quantize_per_channel(w, s, z, 0, tq.qint8),
               lambda: torch.quantize_per_channel(w, s, z, 0, torch.qint8))
        ours_q = tq.quantize_per_tensor(x, 0.02, 10, tq.quint8)
        torch_q = torch.quantize_per_tensor(x, 0.02, 10, torch.quint8)
        yield (f"dequantize per tensor {label}", ours_q.dequantize, torch_q.dequantize)
        ours_c = tq.quantize_per_channel(w, s, z, 0, tq.qint8)
        torch_c = torch.quantize_per_channel(w, s, z, 0, torch.qint8)
        yield (f"dequantize per channel {label}", ours_c.dequantize, torch_c.dequantize)


def main() -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'row':<44} {'ours ms':>9} {'torch ms':>9} {'ours/torch':>11}")
    ratios = []
    for name, ours, theirs in rows():
        a, b = timeit(ours), timeit(theirs)
        ratios.append(a / b)
        print(f"{name:<44} {a * 1e3:>9.3f} {b * 1e3:>9.3f} {a / b:>11.2f}")
    geo = statistics.geometric_mean(ratios)
    print(f"{'geomean':<44} {'':>9} {'':>9} {geo:>11.2f}")


if __name__ == "__main__":
    main()
