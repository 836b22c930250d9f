"""Dynamic quantized modules: torchquant vs torch.ao (engine x86) vs float, side by side.

    .venv/bin/python bench/bench_dynamic.py [--quick]

Linear on the MiniLM (384 / 1536) and BERT-base (768 / 3072) shapes at batch 1 and 32 with
sequence 128, LSTM and GRU (2 layers, hidden 512, sequence 64, batch 8).  Both sides are built
with from_float from the same float module and their default dynamic qconfig; "per_token" is
torchquant's per_token_dynamic_qconfig.  Times: best interleaved block (see bench_kernels).
"""
from __future__ import annotations

import argparse
import copy
import warnings

import torch
from torch import nn

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import best_times, geomean  # noqa: E402

warnings.filterwarnings("ignore")

LINEAR = [("MiniLM qkv/out", 384, 384), ("MiniLM ffn up", 384, 1536), ("MiniLM ffn down", 1536, 384),
          ("BERT ffn up", 768, 3072), ("BERT ffn down", 3072, 768)]


def with_qconfig(mod: nn.Module, qconfig) -> nn.Module:
    mod = copy.deepcopy(mod)
    mod.qconfig = qconfig
    return mod


def linear_rows(timing: dict) -> list:
    import torch.ao.nn.quantized.dynamic as ao_nnqd
    import torch.ao.quantization as aoq
    import torchquant.nn.quantized.dynamic as nnqd
    import torchquant.quantization as tq
    rows = []
    for batch in (1, 32):
        for name, k, n in LINEAR:
            lin = nn.Linear(k, n)
            x = torch.randn(batch, 128, k)
            ours = nnqd.Linear.from_float(with_qconfig(lin, tq.default_dynamic_qconfig))
            tok = nnqd.Linear.from_float(with_qconfig(lin, tq.per_token_dynamic_qconfig))
            ao = ao_nnqd.Linear.from_float(with_qconfig(lin, aoq.default_dynamic_qconfig))
            with torch.no_grad():
                t = best_times({"ours": lambda: ours(x), "per_token": lambda: tok(x),
                                "torch.ao": lambda: ao(x), "float": lambda: lin(x)}, **timing)
            rows.append((f"{name} b{batch}x128 {k}->{n}", batch, t))
    return rows


def rnn_rows(timing: dict) -> list:
    import torch.ao.nn.quantized.dynamic as ao_nnqd
    import torch.ao.quantization as aoq
    import torchquant.nn.quantized.dynamic as nnqd
    import torchquant.quantization as tq
    rows = []
    x = torch.randn(64, 8, 512)
    for name in ("LSTM", "GRU"):
        mod = getattr(nn, name)(512, 512, num_layers=2).eval()
        ours = getattr(nnqd, name).from_float(with_qconfig(mod, tq.default_dynamic_qconfig))
        ao = getattr(ao_nnqd, name).from_float(with_qconfig(mod, aoq.default_dynamic_qconfig))
        with torch.no_grad():
            t = best_times({"ours": lambda: ours(x), "torch.ao": lambda: ao(x),
                            "float": lambda: mod(x)}, **timing)
        rows.append((f"{name} 2x512, seq 64, batch 8", 8, t))
    return rows


def show(title: str, rows: list, cols: list[str]) -> list[float]:
    print(f"\n## {title}\n")
    ratio_cols = [c for c in cols if c not in ("torch.ao", "float")]
    print("| case | " + " | ".join(f"{c} ms" for c in cols) + " | "
          + " | ".join(f"{c}/torch.ao" for c in ratio_cols) + " | ours/float |")
    print("|" + "---|" * (1 + len(cols) + len(ratio_cols) + 1))
    ratios = {c: [] for c in ratio_cols}
    for name, _, t in rows:
        for c in ratio_cols:
            ratios[c].append(t[c] / t["torch.ao"])
        print(f"| {name} | " + " | ".join(f"{t[c] * 1e3:.3f}" for c in cols) + " | "
              + " | ".join(f"{t[c] / t['torch.ao']:.2f}" for c in ratio_cols)
              + f" | {t['ours'] / t['float']:.2f} |")
    print("\n" + "; ".join(f"{c}/torch.ao geomean {geomean(v):.2f}" for c, v in ratios.items()))
    return ratios["ours"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.backends.quantized.engine = "x86"
    timing = {"budget_s": 0.3 if args.quick else 1.5}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU {torch.backends.cpu.get_cpu_capability()}")
    lin = linear_rows(timing)
    show("Dynamic Linear", lin, ["ours", "per_token", "torch.ao", "float"])
    show("Dynamic RNNs", rnn_rows(timing), ["ours", "torch.ao", "float"])


if __name__ == "__main__":
    main()
