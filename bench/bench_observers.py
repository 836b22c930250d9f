"""Observer speed: torchquant vs torch.ao.quantization, side by side in one process.

    .venv/bin/python bench/bench_observers.py

Each row runs the same work on the same tensor with both implementations, alternating the two
so that load drifting on a shared machine hits both alike, and reports the medians and
ours / torch.  Rows are plain data (``Row``): add a builder to ``ROW_BUILDERS`` for new ones.
"""
from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch.ao.quantization import observer as torch_obs

import torchquant as tq
from torchquant.quantization import observer as tq_obs

warnings.filterwarnings("ignore")
torch.set_num_threads(2)


@dataclass
class Row:
    label: str
    ours: Callable[[], object]
    torch: Callable[[], object]
    target: float  # the ours / torch ratio to stay at or below


def time_pair(ours: Callable[[], object], theirs: Callable[[], object],
              budget_s: float = 0.5, warmup: int = 3) -> tuple[float, float]:
    """Median seconds of ``ours`` and ``theirs``, sampled alternately after warm-up; fast rows
    get more samples (15 to 500, about ``budget_s`` of sampling each)."""
    for _ in range(warmup):
        ours()
        theirs()
    t0 = time.perf_counter()
    ours()
    theirs()
    repeat = min(500, max(15, int(budget_s / (time.perf_counter() - t0))))
    a, b = [], []
    for _ in range(repeat):
        t0 = time.perf_counter()
        ours()
        t1 = time.perf_counter()
        theirs()
        t2 = time.perf_counter()
        a.append(t1 - t0)
        b.append(t2 - t1)
    return statistics.median(a), statistics.median(b)


def observer_rows() -> Iterable[Row]:
    for n in (1 << 20, 1 << 24):
        size = f"{n >> 20}M"
        x = torch.randn(n)
        weight = x.view(1024, -1)
        ours_mm, torch_mm = tq_obs.MinMaxObserver(), torch_obs.MinMaxObserver()
        yield Row(f"MinMaxObserver forward {size}", lambda: ours_mm(x), lambda: torch_mm(x), 1.2)
        ours_pc = tq_obs.PerChannelMinMaxObserver(dtype=tq.qint8, qscheme=tq.per_channel_symmetric)
        torch_pc = torch_obs.PerChannelMinMaxObserver(dtype=torch.qint8,
                                                      qscheme=torch.per_channel_symmetric)
        yield Row(f"PerChannelMinMaxObserver forward {size} (1024 ch)",
                  lambda: ours_pc(weight), lambda: torch_pc(weight), 1.2)
        ours_h, torch_h = tq_obs.HistogramObserver(), torch_obs.HistogramObserver()
        yield Row(f"HistogramObserver forward {size}", lambda: ours_h(x), lambda: torch_h(x), 1.0)

        def calibrate(cls):
            def run():
                obs = cls()
                obs(x)
                obs(x * 1.5)  # the range widens: exercises re-binning
                return obs.calculate_qparams()
            return run
        yield Row(f"HistogramObserver 2x forward + calculate_qparams {size}",
                  calibrate(tq_obs.HistogramObserver), calibrate(torch_obs.HistogramObserver), 1.0)
        ours_h(x)
        torch_h(x)
        yield Row(f"HistogramObserver calculate_qparams ({size} observed)",
                  ours_h.calculate_qparams, torch_h.calculate_qparams, 1.0)


ROW_BUILDERS: list[Callable[[], Iterable[Row]]] = [observer_rows]


def main() -> None:
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"{'row':<58} {'ours ms':>9} {'torch ms':>9} {'ours/torch':>11} {'target':>7}")
    for build in ROW_BUILDERS:
        for row in build():
            a, b = time_pair(row.ours, row.torch)
            flag = "" if a / b <= row.target else "  over target"
            print(f"{row.label:<58} {a * 1e3:>9.3f} {b * 1e3:>9.3f} {a / b:>11.2f} "
                  f"{row.target:>7.2f}{flag}")


if __name__ == "__main__":
    main()
