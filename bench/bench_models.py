"""Whole models: float vs torch.ao eager (engine x86) vs torchquant, side by side in one run.

    .venv/bin/python bench/bench_models.py [--quick]

* ResNet-18-shaped CNN (224x224, batch 1 and 8; residual adds through FloatFunctional):
  the same fused, calibrated recipe (get_default_qconfig('x86')) on both sides.
* all-MiniLM-L6-v2 (real weights, if installed): quantize_dynamic on its Linear layers,
  batch 1 and 32 at sequence 128, default dynamic qconfig on both sides, plus torchquant's
  per_token_dynamic_qconfig.
* The same CNN through FX graph mode (batch 1 and 8): torchquant's prepare_fx / convert_fx vs
  torch.ao's quantize_fx, x86 backend config and default qconfig mapping on both sides.
"""
from __future__ import annotations

import argparse
import copy
import io
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import best_times  # noqa: E402

warnings.filterwarnings("ignore")


def size_mb(model: nn.Module) -> float:
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.tell() / 1e6


def cnn_rows(timing: dict) -> list:
    import torch.ao.nn.quantized as ao_nnq
    import torch.ao.quantization as aoq
    import torchquant.quantization as tq
    from torchquant.examples.resnet import ResNet18, randomize_bn
    ao_ops = SimpleNamespace(QuantStub=aoq.QuantStub, DeQuantStub=aoq.DeQuantStub,
                             FloatFunctional=ao_nnq.FloatFunctional)
    torch.manual_seed(0)
    float_model = randomize_bn(ResNet18()).eval()
    ao_model = ResNet18(ops=ao_ops).eval()
    ao_model.load_state_dict(float_model.state_dict())
    calib = torch.randn(4, 3, 224, 224)

    def recipe(lib, model):
        model = lib.fuse_modules(copy.deepcopy(model), model.fuse_patterns())
        model.qconfig = lib.get_default_qconfig("x86")
        lib.prepare(model, inplace=True)
        with torch.no_grad():
            model(calib)
        return lib.convert(model)

    ours, theirs = recipe(tq, float_model), recipe(aoq, ao_model)
    compiled = torch.compile(ours, fullgraph=True)  # the same model through torchquant's ops
    rows = []
    for batch in (1, 8):
        x = torch.randn(batch, 3, 224, 224)
        with torch.no_grad():
            if not torch.equal(compiled(x), ours(x)):
                raise AssertionError("compiled model differs from eager")
            t = best_times({"ours": lambda: ours(x), "compiled": lambda: compiled(x),
                            "torch.ao": lambda: theirs(x), "float": lambda: float_model(x)},
                           **timing)
        rows.append((f"ResNet-18 batch {batch}", t))
    sizes = {"ours": size_mb(ours), "torch.ao": size_mb(theirs), "float": size_mb(float_model)}
    return rows, sizes


def fx_cnn_rows(timing: dict) -> list:
    """The ResNet-18-shaped CNN through FX graph mode: torchquant's quantize_fx vs torch.ao's
    (x86 backend config and default qconfig mapping on both sides, same calibration)."""
    import torch.ao.nn.quantized as ao_nnq
    import torch.ao.quantization as aoq
    import torch.ao.quantization.quantize_fx as ao_fx
    from torch.ao.quantization.backend_config.x86 import get_x86_backend_config as ao_x86_config
    from torchquant.examples.resnet import ResNet18, randomize_bn
    from torchquant.quantization import quantize_fx as tq_fx
    from torchquant.quantization.backend_config.x86 import get_x86_backend_config
    from torchquant.quantization.qconfig import get_default_qconfig_mapping
    ao_ops = SimpleNamespace(QuantStub=aoq.QuantStub, DeQuantStub=aoq.DeQuantStub,
                             FloatFunctional=ao_nnq.FloatFunctional)
    torch.manual_seed(0)
    float_model = randomize_bn(ResNet18()).eval()
    ao_model = ResNet18(ops=ao_ops).eval()
    ao_model.load_state_dict(float_model.state_dict())
    calib = torch.randn(4, 3, 224, 224)
    example = (calib[:1],)
    ours = tq_fx.prepare_fx(float_model, get_default_qconfig_mapping("x86"), example,
                            backend_config=get_x86_backend_config())
    theirs = ao_fx.prepare_fx(copy.deepcopy(ao_model), aoq.get_default_qconfig_mapping("x86"),
                              example, backend_config=ao_x86_config())
    with torch.no_grad():
        ours(calib)
        theirs(calib)
    ours = tq_fx.convert_fx(ours, backend_config=get_x86_backend_config())
    theirs = ao_fx.convert_fx(theirs, backend_config=ao_x86_config())
    rows = []
    for batch in (1, 8):
        x = torch.randn(batch, 3, 224, 224)
        with torch.no_grad():
            ref, out = theirs(x), ours(x)
            sqnr = (20 * torch.log10(ref.norm() / (ref - out).norm().clamp_min(1e-12))).item()
            if sqnr < 30:
                raise AssertionError(f"FX: ours vs torch.ao FX SQNR {sqnr:.1f} dB < 30")
            t = best_times({"ours": lambda: ours(x), "torch.ao": lambda: theirs(x),
                            "float": lambda: float_model(x)}, **timing)
        rows.append((f"ResNet-18 FX batch {batch}", t))
    return rows


def minilm_rows(timing: dict) -> list:
    from torchquant.examples import minilm
    if not minilm.available():
        print("all-MiniLM-L6-v2 not installed: skipped")
        return []
    import torch.ao.quantization as aoq
    import torchquant.quantization as tq
    model = minilm.load_model()
    encoder = model[0].auto_model.eval()
    ours = tq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear: tq.default_dynamic_qconfig})
    tok = tq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear: tq.per_token_dynamic_qconfig})
    theirs = aoq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear}, dtype=torch.qint8)
    rows = []
    for batch in (1, 32):
        ids = torch.randint(1000, 20000, (batch, 128))
        mask = torch.ones_like(ids)
        call = lambda m: (lambda: m(input_ids=ids, attention_mask=mask))
        with torch.no_grad():
            t = best_times({"ours": call(ours), "per_token": call(tok), "torch.ao": call(theirs),
                            "float": call(encoder)}, **timing)
        rows.append((f"MiniLM batch {batch} x 128", t))
    return rows


def show(rows: list, cols: list[str]) -> None:
    ratio_cols = [c for c in cols if c not in ("torch.ao", "float")]
    print("| model | " + " | ".join(f"{c} ms" for c in cols) + " | "
          + " | ".join(f"{c}/torch.ao" for c in ratio_cols) + " | ours/float |")
    print("|" + "---|" * (1 + len(cols) + len(ratio_cols) + 1))
    for name, t in rows:
        print(f"| {name} | " + " | ".join(f"{t[c] * 1e3:.2f}" for c in cols) + " | "
              + " | ".join(f"{t[c] / t['torch.ao']:.2f}" for c in ratio_cols)
              + f" | {t['ours'] / t['float']:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    torch.backends.quantized.engine = "x86"
    timing = {"budget_s": 0.5 if args.quick else 3.0, "block_s": 0.05}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU {torch.backends.cpu.get_cpu_capability()}\n")
    rows, sizes = cnn_rows(timing)
    print("## ResNet-18-shaped CNN (static, fused, x86 qconfig; compiled = torch.compile(ours, "
          "fullgraph=True))\n")
    show(rows, ["ours", "compiled", "torch.ao", "float"])
    for name, t in rows:
        print(f"{name}: compiled / eager {t['compiled'] / t['ours']:.2f}")
    print(f"\nsize MB: ours {sizes['ours']:.2f}, torch.ao {sizes['torch.ao']:.2f}, float "
          f"{sizes['float']:.2f}; ours/float {sizes['ours'] / sizes['float']:.3f}")
    rows = fx_cnn_rows(timing)
    print("\n## ResNet-18-shaped CNN through FX graph mode (prepare_fx / convert_fx, x86 backend "
          "config; torch.ao = torch.ao's quantize_fx)\n")
    show(rows, ["ours", "torch.ao", "float"])
    rows = minilm_rows(timing)
    if rows:
        print("\n## all-MiniLM-L6-v2 encoder (dynamic Linear)\n")
        show(rows, ["ours", "per_token", "torch.ao", "float"])


if __name__ == "__main__":
    main()
