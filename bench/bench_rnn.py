"""Dynamic quantized LSTM / GRU: torchquant vs torch.ao (engine x86) vs float, interleaved.

    .venv/bin/python bench/bench_rnn.py [--rounds 5] [--budget 1.0] [--only lstm,gru,lm]

Cases (issue #15 / #16):

* ``lstm``: LSTM 2 layers x 512, batch 8, seq 64, 2 threads (bench_peers' LSTM row);
* ``gru``: the same shape as a GRU, 2 threads;
* ``lm``: the LSTM of torch's dynamic-quantization tutorial word language model (512 -> 256,
  5 layers), batch 1, 35 tokens, ``torch.set_num_threads(1)``.

Each round times the three sides with bench_kernels.best_times (short interleaved blocks, the
fastest block counts); the ratios printed are the median over the rounds with their min-max
spread (the machine is shared: single timings are noise).  ``--clock process`` times with the
process's CPU time instead of the wall clock: on a machine other processes load, a 1-thread
case's CPU time leaves out the time it waited for a core (with 2 threads it counts OpenMP's
spinning workers too, so read those with care).  Also prints the SQNR (dB) of each
side's output against float and of torchquant against torch.ao.
"""
from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import best_times  # noqa: E402

warnings.filterwarnings("ignore")


def sqnr(ref: torch.Tensor, x: torch.Tensor) -> float:
    noise = (ref - x).pow(2).sum()
    if noise == 0:
        return float("inf")
    return float(10 * torch.log10(ref.pow(2).sum() / noise))


class Wrap(nn.Module):
    """quantize_dynamic swaps children, not the root: hold the RNN as one."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, *args):
        return self.rnn(*args)


def build(mod: nn.Module):
    import torch.ao.quantization as aoq
    import torchquant.quantization as tq
    ours = tq.quantize_dynamic(Wrap(copy.deepcopy(mod)), {nn.LSTM, nn.GRU}, dtype=torch.qint8)
    ao = aoq.quantize_dynamic(Wrap(copy.deepcopy(mod)), {nn.LSTM, nn.GRU}, dtype=torch.qint8)
    assert type(ours.rnn).__module__.startswith("torchquant"), type(ours.rnn)
    assert type(ao.rnn).__module__.startswith("torch.ao"), type(ao.rnn)
    return ours.rnn, ao.rnn


def cases(only: set[str]) -> list[tuple[str, int, nn.Module, tuple]]:
    torch.manual_seed(0)
    out = []
    if "lstm" in only:
        out.append(("LSTM 2x512 batch 8 seq 64", 2, nn.LSTM(512, 512, 2).eval(),
                    (torch.randn(64, 8, 512),)))
    if "gru" in only:
        out.append(("GRU 2x512 batch 8 seq 64", 2, nn.GRU(512, 512, 2).eval(),
                    (torch.randn(64, 8, 512),)))
    if "lm" in only:  # the tutorial's RNNModel LSTM: embeddings of 512, 5 layers of 256
        hidden = (torch.zeros(5, 1, 256), torch.zeros(5, 1, 256))
        out.append(("word LM LSTM 5x256 batch 1 seq 35", 1, nn.LSTM(512, 256, 5).eval(),
                    (torch.randn(35, 1, 512), hidden)))
    return out


def process_times(fns: dict, budget_s: float, calls: int = 2) -> dict[str, float]:
    """Like bench_kernels.best_times, with the process's CPU time: blocks of ``calls`` calls,
    the sides interleaved until ``budget_s`` of CPU time is spent, the fastest block counts."""
    best = {name: math.inf for name in fns}
    for fn in fns.values():
        fn()
    start, rounds = time.process_time(), 0
    while rounds < 3 or time.process_time() - start < budget_s:
        for name, fn in fns.items():
            t0 = time.process_time()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.process_time() - t0) / calls)
        rounds += 1
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--only", default="lstm,gru,lm")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall")
    args = parser.parse_args()
    torch.backends.quantized.engine = "x86"
    print(f"torch {torch.__version__}, CPU {torch.backends.cpu.get_cpu_capability()}, "
          f"clock {args.clock}")
    print("| case | threads | ours ms | torch.ao ms | float ms | ours/torch.ao (min-max) | "
          "ours/float | SQNR ours | SQNR torch.ao | SQNR ours vs torch.ao |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, threads, mod, x in cases(set(args.only.split(","))):
        torch.set_num_threads(threads)
        ours, ao = build(mod)
        with torch.no_grad():
            ref, got, want = mod(*x)[0], ours(*x)[0], ao(*x)[0]
            fns = {"ours": lambda: ours(*x), "torch.ao": lambda: ao(*x), "float": lambda: mod(*x)}
            timer = best_times if args.clock == "wall" else process_times
            rounds = [timer(fns, args.budget) for _ in range(args.rounds)]
        ratio = [r["ours"] / r["torch.ao"] for r in rounds]
        med = {k: statistics.median(r[k] for r in rounds) for k in fns}
        print(f"| {name} | {threads} | {med['ours'] * 1e3:.2f} | {med['torch.ao'] * 1e3:.2f} | "
              f"{med['float'] * 1e3:.2f} | {statistics.median(ratio):.2f} ({min(ratio):.2f}-"
              f"{max(ratio):.2f}) | {med['ours'] / med['float']:.2f} | {sqnr(ref, got):.1f} | "
              f"{sqnr(ref, want):.1f} | {sqnr(want, got):.1f} |", flush=True)


if __name__ == "__main__":
    main()
