"""torchquant against every peer, on the same model and data, side by side in one process.

    .venv/bin/python bench/bench_peers.py [--quick] [--only tutorial,cnn,minilm,lstm]

Two threads (the tutorial workload also one).  The header names the CPU and its int8-relevant
flags.  For each workload every implementation is built from the same float model and
timed interleaved with the others (bench_kernels.best_times); each row prints its time, its
ratio to float eager and to each peer (smaller is faster), and its fidelity to float (output
SQNR in dB for the CNN and the LSTM, mean embedding cosine for MiniLM).

Workloads (``--quick``: smaller inputs and budgets, to check that everything runs):

* the torchao PT2E tutorial renamed: ResNet-18-shaped (width 32) and MobileNetV2-shaped
  (width 0.5) CNNs on 3x32x32, batch 1 / 16 / 64 (quick: 1 / 4), 2 threads and 1 thread:
  float eager; torchao PT2E + plain ``torch.compile`` with inductor freezing; the same steps
  with torchquant's names; ``torchquant.compile`` of the torchquant PT2E model.  Each thread
  count gets its own compiles, made under that count: one per batch (the tutorial's way,
  static shapes), and one serving every batch (dynamic after the first), timed at the later
  batches.

* ResNet-18-shaped CNN, static int8, batch 1 and 16 (224x224; quick: 64x64, batch 1 and 4):
  float eager; torch.ao eager (x86, fused, get_default_qconfig('x86')); torch.ao FX (x86
  qconfig mapping); torchao 0.18 PT2E (X86InductorQuantizer) + inductor with freezing; ONNX
  Runtime quantize_static (QDQ, per-channel weights); torchquant eager (same recipe as
  torch.ao eager), torchquant eager + torch.compile, and torchquant.compile on the PT2E-converted
  model (torchquant's X86InductorQuantizer), directly and after ``lower_pt2e``.
* all-MiniLM-L6-v2 encoder, dynamic int8 Linear, batch 32 x 128 tokens (quick: 4 x 32):
  float; torch.ao quantize_dynamic; torchao PT2E dynamic + inductor (freezing); ORT
  quantize_dynamic per-channel (``reduce_range`` on CPUs without VNNI, as ORT advises);
  torchquant quantize_dynamic eager, eager + torch.compile; the PT2E dynamic-converted
  encoder under the tutorial's plain torch.compile + freezing, ``torchquant.compile``, and
  ``torchquant.compile`` after ``lower_pt2e``.
* LSTM 2 layers x 512, dynamic, batch 8 x seq 64 (quick: seq 16): float; torch.ao
  quantize_dynamic; ORT quantize_dynamic per-channel; torchquant quantize_dynamic eager
  (+ torch.compile).

A peer that cannot be built here (missing package, export failure) prints one line saying why
and the bench goes on.
"""
from __future__ import annotations

import argparse
import copy
import functools
import os
import sys
import tempfile
import traceback
import warnings
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_kernels import best_times  # noqa: E402

warnings.filterwarnings("ignore")

PEERS = ["float", "torch.ao eager", "torch.ao FX", "torchao PT2E", "ORT"]


def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    ref, out = ref.float(), out.float()
    noise = (ref - out).pow(2).mean().item()
    return float("inf") if noise == 0 else 10 * torch.log10(ref.pow(2).mean() / noise).item()


def mean_cosine(ref: torch.Tensor, out: torch.Tensor) -> float:
    return torch.nn.functional.cosine_similarity(ref.float(), out.float(), dim=-1).mean().item()


class Impl(SimpleNamespace):
    """One implementation of a workload: ``fn(x)`` returns a float tensor."""


def _try(name: str, build: Callable[[], Callable], impls: dict) -> None:
    try:
        impls[name] = build()
    except Exception as exc:  # a peer missing here must not stop the others
        print(f"  {name}: skipped ({type(exc).__name__}: {str(exc).splitlines()[0][:150]})")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc()


def _warm(fn: Callable, inputs: list, freezing: bool = False) -> Callable:
    """Run ``fn`` once per input (compiles happen here, under inductor freezing if asked)."""
    import torch._inductor.config as inductor_config
    with inductor_config.patch(freezing=freezing), torch.no_grad():
        for x in inputs:
            fn(x)
    return fn


def report(title: str, impls: dict[str, Callable], inputs: dict[str, object],
           fidelity: Callable[[torch.Tensor, torch.Tensor], float], fidelity_name: str,
           timing: dict) -> None:
    """Time every implementation on each input and print one table per input."""
    for label, x in inputs.items():
        with torch.no_grad():
            ref = impls["float"](x)
            fid = {}
            for name, fn in impls.items():
                try:
                    fid[name] = fidelity(ref, fn(x))
                except Exception as exc:
                    print(f"  {name} failed on {label}: {type(exc).__name__}: {exc}")
            live = {n: (lambda fn=impls[n]: fn(x)) for n in impls if n in fid}
            t = best_times(live, **timing)
        peers = [p for p in PEERS if p in t]
        print(f"\n### {title}, {label}\n")
        print("| implementation | ms | " + " | ".join(f"/ {p}" for p in peers)
              + f" | {fidelity_name} |")
        print("|---|---:|" + "---:|" * len(peers) + "---:|")
        for name in t:
            ratios = " | ".join(f"{t[name] / t[p]:.2f}" for p in peers)
            print(f"| {name} | {t[name] * 1e3:.2f} | {ratios} | {fid[name]:.4f} |")


# ---- ONNX Runtime -------------------------------------------------------------------------------

def _ort_session(path: str):
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # ORT's pool threads spin after each run by default, taking a core from whatever is timed
    # next in the interleaved rounds (seen: torchquant eager, timed after ORT, 2x slower than
    # alone); without spinning ORT's own times are unchanged within noise.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def _onnx_export(model: nn.Module, args: tuple, path: str, input_names: list[str],
                 dynamic_axes: dict) -> None:
    torch.onnx.export(model, args, path, input_names=input_names, output_names=["out"],
                      dynamic_axes=dynamic_axes, opset_version=17, dynamo=False)


def _cpu_has_vnni() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return True
    return "avx512_vnni" in flags or "avx_vnni" in flags or "amx_int8" in flags


def _ort_quantize_dynamic(fp32: str, int8: str) -> None:
    """ORT's quantize_dynamic, per-channel int8 weights.  Without VNNI, ORT's u8 x s8 kernels
    saturate pairwise sums (vpmaddubsw) and ORT advises ``reduce_range``: used there."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    quantize_dynamic(fp32, int8, per_channel=True, reduce_range=not _cpu_has_vnni(),
                     weight_type=QuantType.QInt8)


def _ort_fn(session, names: list[str]) -> Callable:
    def run(x):
        feeds = x if isinstance(x, dict) else {names[0]: x}
        out = session.run(None, {k: v.numpy() for k, v in feeds.items()})[0]
        return torch.from_numpy(out)
    return run


# ---- ResNet-18-shaped CNN (static) -----------------------------------------------------------

def cnn(quick: bool, timing: dict, tmp: str) -> None:
    import torch.ao.nn.quantized as ao_nnq
    import torch.ao.quantization as aoq

    import torchquant
    import torchquant.quantization as tq
    from torchquant.examples.resnet import ResNet18, randomize_bn

    size, batches = (64, (1, 4)) if quick else (224, (1, 16))
    torch.manual_seed(0)
    float_model = randomize_bn(ResNet18()).eval()
    ao_ops = SimpleNamespace(QuantStub=aoq.QuantStub, DeQuantStub=aoq.DeQuantStub,
                             FloatFunctional=ao_nnq.FloatFunctional)
    ao_model = ResNet18(ops=ao_ops).eval()
    ao_model.load_state_dict(float_model.state_dict())
    calib = [torch.randn(2, 3, size, size) for _ in range(2)]
    inputs = {f"batch {b}": torch.randn(b, 3, size, size) for b in batches}
    example = (calib[0],)
    batch_dim = ({0: torch.export.Dim("batch", max=1024)},)  # one exported model, any batch
    impls: dict[str, Callable] = {"float": float_model}

    def eager_recipe(lib, model):
        model = lib.fuse_modules(copy.deepcopy(model), model.fuse_patterns())
        model.qconfig = lib.get_default_qconfig("x86")
        lib.prepare(model, inplace=True)
        with torch.no_grad():
            for c in calib:
                model(c)
        return lib.convert(model)

    def ao_fx():
        from torch.ao.quantization.quantize_fx import convert_fx, prepare_fx
        prepared = prepare_fx(copy.deepcopy(ao_model), aoq.get_default_qconfig_mapping("x86"),
                              example)
        with torch.no_grad():
            for c in calib:
                prepared(c)
        return convert_fx(prepared)

    def torchao_pt2e():
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        exported = torch.export.export(copy.deepcopy(float_model), example,
                                       dynamic_shapes=batch_dim).module()
        quantizer = xiq.X86InductorQuantizer().set_global(
            xiq.get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for c in calib:
                prepared(c)
        compiled = torch.compile(convert_pt2e(prepared))
        return _warm(compiled, list(inputs.values()), freezing=True)

    def ort_static():
        from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                              quantize_static)
        fp32, int8 = f"{tmp}/cnn.onnx", f"{tmp}/cnn_int8.onnx"
        _onnx_export(float_model, example, fp32, ["x"], {"x": {0: "batch"}})

        class Reader(CalibrationDataReader):
            def __init__(self):
                self.data = iter([{"x": c.numpy()} for c in calib])

            def get_next(self):
                return next(self.data, None)

        quantize_static(fp32, int8, Reader(), quant_format=QuantFormat.QDQ, per_channel=True,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
        return _ort_fn(_ort_session(int8), ["x"])

    def torchquant_pt2e():
        from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchquant.quantization.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        exported = torch.export.export(copy.deepcopy(float_model), example,
                                       dynamic_shapes=batch_dim).module()
        quantizer = X86InductorQuantizer().set_global(
            get_default_x86_inductor_quantization_config())
        prepared = prepare_pt2e(exported, quantizer)
        with torch.no_grad():
            for c in calib:
                prepared(c)
        return convert_pt2e(prepared)

    _try("torch.ao eager", lambda: eager_recipe(aoq, ao_model), impls)
    _try("torch.ao FX", ao_fx, impls)
    _try("torchao PT2E", torchao_pt2e, impls)
    _try("ORT", ort_static, impls)
    _try("torchquant eager", lambda: eager_recipe(tq, float_model), impls)
    if "torchquant eager" in impls:
        _try("torchquant eager+compile",
             lambda: _warm(torchquant.compile(impls["torchquant eager"]),
                           list(inputs.values())), impls)
    converted: dict = {}
    _try("torchquant PT2E lowered (no compile)",
         lambda: converted.setdefault("m", torchquant.compile(torchquant_pt2e(),
                                                              use_torch_compile=False)), impls)
    _try("torchquant.compile PT2E",
         lambda: _warm(torchquant.compile(torchquant_pt2e()), list(inputs.values())), impls)
    if "m" in converted:
        _try("torchquant.compile PT2E lowered",
             lambda: _warm(torchquant.compile(converted["m"], lower=False),
                           list(inputs.values())), impls)
        _profile(converted["m"])
    report(f"ResNet-18-shaped CNN {size}x{size}, static int8", impls, inputs, sqnr_db,
           "SQNR dB", timing)


def _profile(lowered) -> None:
    from torchquant.quantization.pt2e.lowering import lowered_op_counts
    counts = lowered_op_counts(lowered)
    total = sum(v for k, v in counts.items() if k != "GuardsFn")
    print(f"  torchquant lowered graph: {total} calls per inference: "
          + ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])))


# ---- all-MiniLM-L6-v2 (dynamic Linear) ---------------------------------------------------------

class _Encoder(nn.Module):
    """The HF encoder as ids, mask -> last hidden state (one tensor out, for export / ONNX)."""

    def __init__(self, bert: nn.Module) -> None:
        super().__init__()
        self.bert = bert
        # the pooler's output is unused here; left in, its dead Linear + Tanh partition has no
        # output node, which the X86InductorQuantizer's linear-unary matcher (torchao's and
        # torchquant's alike) trips on
        self.bert.pooler = None

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def minilm(quick: bool, timing: dict, tmp: str, shape: Optional[str] = None) -> None:
    import torch.ao.quantization as aoq

    import torchquant
    import torchquant.quantization as tq
    from torchquant.examples import minilm as minilm_example
    if not minilm_example.available():
        print("\nall-MiniLM-L6-v2 not installed: skipped")
        return
    batch, seq = (4, 32) if quick else (32, 128)
    if shape:  # "BxT", e.g. 1x128
        batch, seq = (int(v) for v in shape.lower().split("x"))
    encoder = _Encoder(minilm_example.load_model()[0].auto_model.eval()).eval()
    torch.manual_seed(0)
    ids = torch.randint(1000, 20000, (batch, seq))
    feed = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    example = (feed["input_ids"], feed["attention_mask"])

    def call(model):
        return lambda f: model(f["input_ids"], f["attention_mask"])

    impls: dict[str, Callable] = {"float": call(encoder)}

    def torchao_pt2e():
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
        exported = torch.export.export(copy.deepcopy(encoder), example, strict=False).module()
        quantizer = xiq.X86InductorQuantizer().set_global(
            xiq.get_default_x86_inductor_quantization_config(is_dynamic=True))
        prepared = prepare_pt2e(exported, quantizer)
        prepared(*example)
        return _warm(call(torch.compile(convert_pt2e(prepared))), [feed], freezing=True)

    def ort_dynamic():
        fp32, int8 = f"{tmp}/minilm.onnx", f"{tmp}/minilm_int8.onnx"
        _onnx_export(encoder, example, fp32, ["input_ids", "attention_mask"],
                     {"input_ids": {0: "b", 1: "t"}, "attention_mask": {0: "b", 1: "t"}})
        _ort_quantize_dynamic(fp32, int8)
        return _ort_fn(_ort_session(int8), ["input_ids", "attention_mask"])

    def torchquant_pt2e():
        from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
        from torchquant.quantization.quantizer.x86_inductor_quantizer import (
            X86InductorQuantizer, get_default_x86_inductor_quantization_config)
        exported = torch.export.export(copy.deepcopy(encoder), example, strict=False).module()
        quantizer = X86InductorQuantizer().set_global(
            get_default_x86_inductor_quantization_config(is_dynamic=True))
        prepared = prepare_pt2e(exported, quantizer)
        prepared(*example)
        return convert_pt2e(prepared)

    _try("torch.ao eager", lambda: call(aoq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear},
                                                             dtype=torch.qint8)), impls)
    _try("torchao PT2E", torchao_pt2e, impls)
    _try("ORT", ort_dynamic, impls)
    ours = tq.quantize_dynamic(copy.deepcopy(encoder), {nn.Linear: tq.default_dynamic_qconfig})
    impls["torchquant eager"] = call(ours)
    _try("torchquant eager+compile",
         lambda: _warm(call(torchquant.compile(ours)), [feed]), impls)
    lowered: dict = {}
    _try("torchquant PT2E lowered (no compile)",
         lambda: call(lowered.setdefault("m", torchquant.compile(torchquant_pt2e(),
                                                                 use_torch_compile=False))),
         impls)
    _try("torchquant PT2E (tutorial)",
         lambda: _warm(call(torch.compile(torchquant_pt2e())), [feed], freezing=True), impls)
    _try("torchquant.compile PT2E",
         lambda: _warm(call(torchquant.compile(torchquant_pt2e())), [feed]), impls)
    if "m" in lowered:
        _try("torchquant.compile PT2E lowered",
             lambda: _warm(call(torchquant.compile(lowered["m"], lower=False)), [feed]), impls)
        _profile(lowered["m"])

    def pooled_cosine(ref, out):  # mean-pooled embeddings, as the sentence model does
        return mean_cosine(ref.mean(1), out.mean(1))

    report("all-MiniLM-L6-v2 encoder, dynamic int8 Linear", impls, {f"{batch} x {seq}": feed},
           pooled_cosine, "emb. cosine", timing)


# ---- LSTM (dynamic) ------------------------------------------------------------------------------

class _LSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(512, 512, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def lstm(quick: bool, timing: dict, tmp: str) -> None:
    import torch.ao.quantization as aoq

    import torchquant
    import torchquant.quantization as tq
    batch, seq = (8, 16) if quick else (8, 64)
    torch.manual_seed(0)
    model = _LSTM().eval()
    x = torch.randn(batch, seq, 512)
    impls: dict[str, Callable] = {"float": model}

    def ort_dynamic():
        fp32, int8 = f"{tmp}/lstm.onnx", f"{tmp}/lstm_int8.onnx"
        _onnx_export(model, (x,), fp32, ["x"], {"x": {0: "b", 1: "t"}})
        _ort_quantize_dynamic(fp32, int8)
        return _ort_fn(_ort_session(int8), ["x"])

    _try("torch.ao eager", lambda: aoq.quantize_dynamic(copy.deepcopy(model), {nn.LSTM},
                                                        dtype=torch.qint8), impls)
    _try("ORT", ort_dynamic, impls)
    ours = tq.quantize_dynamic(copy.deepcopy(model), {nn.LSTM: tq.default_dynamic_qconfig})
    impls["torchquant eager"] = ours
    _try("torchquant eager+compile", lambda: _warm(torchquant.compile(ours), [x]), impls)
    report("LSTM 2 x 512, dynamic int8", impls, {f"batch {batch} x seq {seq}": x}, sqnr_db,
           "SQNR dB", timing)


# ---- the torchao PT2E tutorial, renamed (plain torch.compile + freezing) -----------------------

class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2Shaped(nn.Module):
    """torchvision's MobileNetV2 layout (ReLU6, residual adds, Linear head) at a width
    multiplier, written here (torchvision is not a dependency)."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]

    def __init__(self, width: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        c = lambda v: max(8, int(v * width + 4) // 8 * 8)  # noqa: E731
        cin = c(32)
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin),
                                   nn.ReLU6()]
        for expand, cout, repeat, stride in self.SETTINGS:
            for i in range(repeat):
                layers.append(_InvertedResidual(cin, c(cout), stride if i == 0 else 1, expand))
                cin = c(cout)
        last = max(1280, c(1280))
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(last, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def _cpu_flags() -> str:
    """The CPU model and its SIMD flags that matter for int8 (from /proc/cpuinfo)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "unknown CPU")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    wanted = ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
              "avx512_bf16", "amx_int8", "amx_bf16"]
    return f"{model}; flags: {' '.join(f for f in wanted if f in flags)}"


def _pt2e_tutorial(lib: str, float_model: nn.Module, example: tuple, calib: list) -> nn.Module:
    """The torchao PT2E tutorial's steps with ``lib``'s names (torchao or torchquant):
    export, prepare with X86InductorQuantizer, calibrate, convert."""
    if lib == "torchao":
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e
    else:
        import torchquant.quantization.quantizer.x86_inductor_quantizer as xiq
        from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    batch = ({0: torch.export.Dim("batch", max=1024)},)
    exported = torch.export.export(copy.deepcopy(float_model), example,
                                   dynamic_shapes=batch).module()
    quantizer = xiq.X86InductorQuantizer().set_global(
        xiq.get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for c in calib:
            prepared(c)
    return convert_pt2e(prepared)


def tutorial(quick: bool, timing: dict, tmp: str) -> None:
    """ResNet-18-shaped (width 32) and MobileNetV2-shaped (width 0.5) CNNs on 3x32x32 inputs,
    batch 1 / 16 / 64: float eager, torchao's PT2E tutorial (plain ``torch.compile`` with
    ``freezing``), the same tutorial with torchquant's names, and ``torchquant.compile``.
    Timed with 2 threads and with 1 thread."""
    import torchquant
    from torchquant.examples.resnet import ResNet18, randomize_bn
    batches = (1, 4) if quick else (1, 16, 64)
    models = {"ResNet-18-shaped (width 32)": lambda: randomize_bn(ResNet18(width=32)),
              "MobileNetV2-shaped (width 0.5)": lambda: randomize_bn(MobileNetV2Shaped(0.5))}
    for title, make in models.items():
        torch.manual_seed(0)
        float_model = make().eval()
        calib = [torch.randn(4, 3, 32, 32) for _ in range(2)]
        inputs = {f"batch {b}": torch.randn(b, 3, 32, 32) for b in batches}
        warm_inputs = list(inputs.values())

        def compiled(lib: str, warm: list) -> Callable:
            model = _pt2e_tutorial(lib, float_model, (calib[0],), calib)
            return _warm(torch.compile(model), warm, freezing=True)

        def compiled_impls(warm: list) -> dict[str, Callable]:
            torch._dynamo.reset()
            impls: dict[str, Callable] = {"float": float_model}
            _try("torchao PT2E", lambda: compiled("torchao", warm), impls)
            _try("torchquant PT2E (tutorial)", lambda: compiled("torchquant", warm), impls)
            _try("torchquant.compile PT2E",
                 lambda: _warm(torchquant.compile(_pt2e_tutorial("torchquant", float_model,
                                                                 (calib[0],), calib)),
                               warm), impls)
            return impls

        threads = torch.get_num_threads()
        for n in (threads, 1):
            # Each thread count gets its own compiles, made with that count: oneDNN weights
            # prepacked at freezing for one thread count make every call at another reorder
            # them (torchao's and torchquant's alike; see BENCHMARKS.md 2026-12-05).
            torch.set_num_threads(n)
            # The tutorial's way: compiled for the batch it then runs (static shapes).
            for label, x in inputs.items():
                report(f"{title}, static int8, PT2E tutorial flow, {n} thread(s), compiled "
                       f"for this batch", compiled_impls([x]), {label: x}, sqnr_db, "SQNR dB",
                       timing)
            # One compiled model for every batch: the first batch's graph is static, the
            # second compile (Dynamo's automatic dynamic shapes) serves the other batches.
            if len(inputs) > 1:
                later = dict(list(inputs.items())[1:])
                report(f"{title}, static int8, PT2E tutorial flow, {n} thread(s), one compile "
                       f"for batches {', '.join(str(x.shape[0]) for x in warm_inputs)}",
                       compiled_impls(warm_inputs), later, sqnr_db, "SQNR dB", timing)
        torch.set_num_threads(threads)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="small inputs and budgets")
    parser.add_argument("--only", default="tutorial,cnn,minilm,lstm",
                        help="comma-separated workloads (tutorial, cnn, minilm, lstm)")
    parser.add_argument("--minilm-shape", default=None,
                        help="MiniLM's batch x tokens, e.g. 1x128 (default 32x128)")
    parser.add_argument("--fbgemm-isa", default=None,
                        help="force fbgemm (torch.ao's and torchquant's native kernels) down to "
                             "this instruction set, e.g. avx2: with ONEDNN_MAX_CPU_ISA=AVX2 "
                             "ATEN_CPU_CAPABILITY=avx2 TORCHQUANT_CPU_ISA=avx2 the whole "
                             "process runs as on an AVX2 CPU")
    args = parser.parse_args(argv)
    torch.set_num_threads(2)
    torch.backends.quantized.engine = "x86"
    if args.fbgemm_isa:
        from torchquant.kernels import native
        native.force_isa(args.fbgemm_isa)
        print(f"fbgemm forced to {native.isa()}")
    timing = {"budget_s": 0.3 if args.quick else 3.0, "block_s": 0.02 if args.quick else 0.05}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"CPU {torch.backends.cpu.get_cpu_capability()}")
    print(_cpu_flags())
    print("ratios: row time / column time (smaller is faster)")
    workloads = {"tutorial": tutorial, "cnn": cnn, "lstm": lstm,
                 "minilm": functools.partial(minilm, shape=args.minilm_shape)}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only.split(","):
            print(f"\n## {name}")
            workloads[name.strip()](args.quick, timing, tmp)


if __name__ == "__main__":
    main()
