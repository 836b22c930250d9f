"""torchquant.onnx.export: the four models of issue 30 through the flows that apply to them,
exported, checked with onnx.checker, run in ONNX Runtime (CPU EP) and compared with
torchquant's own outputs.

Tolerance: ORT's outputs equal torchquant's within one quantization step on >= 99 % of the
elements (except the ResNet-18-shaped FX / eager models' quantized logits: WITHIN_ONE_STEP
says why), none more than two steps apart.  The step is the output's scale where the output is quantized (FX / eager CNNs end
in a DeQuantStub), else the scale of the last quantized tensor before the float output: the
last quantize / dequantize in the graph for the PT2E CNNs (their classifier Linear outputs
float), and for the dynamic models (MiniLM-like encoder, LSTM) the dynamic scale torch would
pick for the last quantized activation, ``(max(x, 0) - min(x, 0)) / 255`` (255 rather than
``reduce_range``'s 127: the stricter step) -- the last Linear's input for the encoder, the
output hidden state for the LSTM (the last step's hidden state is what the last hidden
projection quantizes).  Where the two differ at all it is by the rounding of single codes:
ONNX's QuantizeLinear divides by the scale, torchquant multiplies by its float32 reciprocal
(fbgemm's rule), so a value within an ulp of a tie can land one code apart; ORT's integer
kernels requantize with their own float multiplier; the float ops sum in another order.
The dynamic LSTM is translated step by step (MatMulInteger of each step's quantized hidden
state, torch's gate arithmetic in float ops): its integers are torchquant's, so it is held to
the same tolerance as the rest.

Inputs use a batch other than the export example's (dynamic batch dimension).  Models are
tiny; each case is one test, so that pytest-xdist builds each model once.
"""
from __future__ import annotations

import copy
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxscript")
ort = pytest.importorskip("onnxruntime")

import torchquant.onnx as tq_onnx  # noqa: E402
import torchquant.quantization as tq  # noqa: E402
from shipping_models import MobileNetV2Shaped  # noqa: E402  (tests/, the package tests' models)
from torchquant.examples import resnet  # noqa: E402
from torchquant.quantization import quantize_fx  # noqa: E402
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e  # noqa: E402
from torchquant.quantization.quantizer import x86_inductor_quantizer as xiq  # noqa: E402

EXAMPLE_BATCH, TEST_BATCH = 2, 16

# The share of elements within one step that each case must reach, and the most steps any
# element may be off.  The ResNet-18-shaped FX / eager models end in quantized logits after
# 20 requantized convs: ONNX Runtime's QLinearConv adds the bias on the int32 accumulator grid
# (step x_scale * w_scale), torch and torchquant add it in float after scaling, so each conv
# output can round one step apart where its value sits within half an accumulator step of a
# tie; those single-code differences add up through the network and the final Linear, whose
# output step is as fine as its input's.  Measured here: 97-99 % within one step, none past
# three (width 8 and 32, batch 16 / 64).  ``export(..., exact=True)`` writes the integer-exact
# form instead (test_exact_form_*), within one step everywhere.
WITHIN_ONE_STEP = {("resnet", "fx"): 0.95, ("resnet", "eager"): 0.95}
MAX_STEPS = {("resnet", "fx"): 3, ("resnet", "eager"): 3}


# ---- models -----------------------------------------------------------------------------------

class _EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int) -> None:
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.ff2 = nn.Linear(d, ff), nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        attn = torch.softmax(q @ k.transpose(-1, -2) / (d // self.heads) ** 0.5, dim=-1)
        x = self.ln1(x + self.o((attn @ v).transpose(1, 2).reshape(b, t, d)))
        return self.ln2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


class MiniLMLike(nn.Module):
    """A two-layer BERT-style encoder (Linear, LayerNorm, softmax attention, GELU) on token
    embeddings: what all-MiniLM-L6-v2's dynamic quantization touches, at toy size."""

    def __init__(self, d: int = 32, heads: int = 2, ff: int = 64) -> None:
        super().__init__()
        self.layers = nn.Sequential(_EncoderLayer(d, heads, ff), _EncoderLayer(d, heads, ff))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class LSTMModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def _input(name: str, batch: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = {"resnet": (3, 32, 32), "mobilenet": (3, 32, 32), "minilm": (8, 32),
             "lstm": (5, 16)}[name]
    return torch.randn(batch, *shape, generator=gen)


def _float_model(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "resnet":
        return resnet.randomize_bn(resnet.ResNet18(num_classes=10, width=8)).eval()
    if name == "mobilenet":
        return resnet.randomize_bn(MobileNetV2Shaped()).eval()
    return {"minilm": MiniLMLike, "lstm": LSTMModel}[name]().eval()


def _convert(name: str, flow: str, model: nn.Module) -> nn.Module:
    example = (_input(name, EXAMPLE_BATCH, 0),)
    calib = [(_input(name, 4, s),) for s in (1, 2)]
    dynamic = name in ("minilm", "lstm")
    if flow == "pt2e":
        batch = ({0: torch.export.Dim("batch", max=1024)},)
        gm = torch.export.export(copy.deepcopy(model), example, dynamic_shapes=batch).module()
        prepared = prepare_pt2e(gm, xiq.X86InductorQuantizer().set_global(
            xiq.get_default_x86_inductor_quantization_config(is_dynamic=dynamic)))
        for c in calib:
            prepared(*c)
        return convert_pt2e(prepared)
    if flow == "fx":
        if dynamic:
            mapping = tq.QConfigMapping().set_object_type(
                nn.LSTM if name == "lstm" else nn.Linear, tq.default_dynamic_qconfig)
        else:
            mapping = tq.get_default_qconfig_mapping("x86")
        prepared = quantize_fx.prepare_fx(copy.deepcopy(model), mapping, example)
        for c in calib:
            prepared(*c)
        return quantize_fx.convert_fx(prepared)
    if dynamic:  # eager
        return tq.quantize_dynamic(copy.deepcopy(model), {
            nn.LSTM if name == "lstm" else nn.Linear: tq.default_dynamic_qconfig})
    m = tq.fuse_modules(copy.deepcopy(model), model.fuse_patterns())
    m.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(m, inplace=True)
    for c in calib:
        m(*c)
    return tq.convert(m)


CASES = [("resnet", "pt2e"), ("resnet", "fx"), ("resnet", "eager"),
         ("mobilenet", "pt2e"), ("mobilenet", "fx"),
         ("minilm", "pt2e"), ("minilm", "fx"), ("minilm", "eager"),
         ("lstm", "fx"), ("lstm", "eager")]


def _last_qdq_scale(model: nn.Module, example: tuple) -> float:
    """Scale of the last per-tensor quantize / dequantize in the model's exported graph."""
    ep = torch.export.export(model, example, strict=False)
    scale = None
    for node in ep.graph.nodes:
        if node.op == "call_function" and str(node.target).startswith(
                ("torchquant.quantize_per_tensor", "torchquant.dequantize_per_tensor")):
            scale = float(node.args[1])
    assert scale is not None
    return scale


def _dynamic_step(float_model: nn.Module, name: str, x: torch.Tensor) -> float:
    """One step of torch's dynamic qparams for the last quantized activation (255 levels)."""
    if name == "lstm":
        last = float_model(x)
    else:
        seen = []
        layer = float_model.layers[-1].ff2
        handle = layer.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
        float_model(x)
        handle.remove()
        last = seen[-1]
    return (last.max().clamp_min(0) - last.min().clamp_max(0)).item() / 255


def _ort_run(path, x: torch.Tensor) -> torch.Tensor:
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (inp,) = session.get_inputs()
    return torch.from_numpy(session.run(None, {inp.name: x.numpy()})[0])


def _check_graph(name: str, path) -> None:
    """onnx.checker accepts the file; static models hold QuantizeLinear / DequantizeLinear
    with per-channel (axis 0, one scale per output channel) int8 weight dequantization,
    dynamic ones quantize their activations (QuantizeLinear) and multiply them as integers
    (MatMulInteger; a PT2E graph is lowered onto torchquant's fused ops first)."""
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    ops = {n.op_type for n in model.graph.node}
    assert "QuantizeLinear" in ops
    inits = {i.name: i for i in model.graph.initializer}
    if name in ("resnet", "mobilenet"):
        dq = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
        per_channel = [n for n in dq if n.input[1] in inits and len(inits[n.input[1]].dims) == 1
                       and any(a.name == "axis" and a.i == 0 for a in n.attribute)]
        weights = [n for n in per_channel if n.input[0] in inits
                   and inits[n.input[0]].data_type == onnx.TensorProto.INT8]
        assert weights, "no per-channel int8 weight DequantizeLinear"
    else:
        assert "MatMulInteger" in ops
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"


@pytest.mark.parametrize("name, flow", CASES, ids=[f"{n}-{f}" for n, f in CASES])
def test_export_runs_in_ort_like_torchquant(name, flow, tmp_path):
    """Export (batch-2 example), check the graph, then run ORT at batch 16: its outputs equal
    torchquant's within one quantization step (module docstring) on >= 99 % of the elements
    (>= 95 % and at most 3 steps for the ResNet's quantized logits, see WITHIN_ONE_STEP)."""
    float_model = _float_model(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _convert(name, flow, float_model)
        example = (_input(name, EXAMPLE_BATCH, 0),)
        path = tq_onnx.export(model, example, tmp_path / f"{name}_{flow}.onnx")
    _check_graph(name, path)
    x = _input(name, TEST_BATCH, 7)
    with torch.no_grad():
        ref = model(x)
        if name in ("minilm", "lstm"):
            step = _dynamic_step(float_model, name, x)
        else:
            step = _last_qdq_scale(model, example)
    out = _ort_run(path, x)
    assert out.shape == ref.shape
    steps = (out - ref).abs() / step
    within = (steps <= 1 + 1e-4).float().mean().item()
    assert within >= WITHIN_ONE_STEP.get((name, flow), 0.99), (within, step)
    assert steps.max().item() <= MAX_STEPS.get((name, flow), 2) + 1e-4, (within, step)


EXACT_CASES = [("resnet", "fx"), ("resnet", "eager"), ("mobilenet", "fx")]


@pytest.mark.parametrize("name, flow", EXACT_CASES, ids=[f"{n}-{f}" for n, f in EXACT_CASES])
def test_exact_form_gives_torchquants_integers_in_ort(name, flow, tmp_path):
    """``exact=True``: no QDQ unit for ORT to fuse (no weight DequantizeLinear: the static ops are
    float Conv / MatMul of integer values and torchquant's epilogue), and ORT's outputs are
    torchquant's within one step everywhere (the issue's >= 99 %), equal on >= 80 % of
    elements (measured 90-100 %). Not all: at batch 16 some small convs run torchquant's
    native conv, which rounds ``acc * (x_scale * w_scale)`` (fbgemm's order) where the exact
    form rounds ``acc * x_scale`` first (oneDNN's and torch.ao's order), one step apart at
    rare ties that then propagate (one code flipped before the classifier moves an image's
    every logit)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = _convert(name, flow, _float_model(name))
        example = (_input(name, EXAMPLE_BATCH, 0),)
        path = tq_onnx.export(model, example, tmp_path / f"{name}_{flow}.onnx", exact=True)
    graph = onnx.load(str(path)).graph
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    inits = {i.name for i in graph.initializer}
    assert "Conv" in {n.op_type for n in graph.node}
    # the model's own quantize / dequantize stubs stay; no weight is dequantized
    assert not [n for n in graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits]
    x = _input(name, TEST_BATCH, 7)
    with torch.no_grad():
        ref = model(x)
    out = _ort_run(path, x)
    steps = (out - ref).abs() / _last_qdq_scale(model, example)
    assert (steps <= 1 + 1e-4).all(), steps.max()
    assert (out == ref).float().mean().item() >= 0.8


def test_batch_one_example_keeps_batch_dynamic(tmp_path):
    """A batch-1 example (which torch.export would specialize) still gives a file that runs
    at batch 4."""
    model = _convert("mobilenet", "fx", _float_model("mobilenet"))
    path = tq_onnx.export(model, (_input("mobilenet", 1, 0),), tmp_path / "m.onnx")
    x = _input("mobilenet", 4, 3)
    with torch.no_grad():
        ref = model(x)
    out = _ort_run(path, x)
    assert out.shape == ref.shape
    assert torch.allclose(out, ref, atol=_last_qdq_scale(model, (x,)) * 1.0001)


class _LeakyModel(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = torch.ops.torchquant.quantize_per_tensor(x, 0.1, 128, "quint8")
        y = torch.ops.torchquant.leaky_relu(q, 0.1, 128, 0.2, 0.1, 128, "quint8", "contiguous")
        return torch.ops.torchquant.dequantize_per_tensor(y, 0.1, 128)


def test_unsupported_op_names_the_node_and_writes_nothing(tmp_path):
    path = tmp_path / "leaky.onnx"
    with pytest.raises(NotImplementedError, match=r"node 'leaky_relu'.*torchquant\.leaky_relu"):
        tq_onnx.export(_LeakyModel(), (torch.randn(2, 4),), path)
    assert not path.exists()


def test_unsupported_variant_names_the_node(tmp_path):
    """A translated op with arguments outside the translation (here a 3-d adaptive pool
    output size) is refused too, naming the node."""
    class Pool(nn.Module):
        def forward(self, x):
            q = torch.ops.torchquant.quantize_per_tensor(x, 0.1, 0, "quint8")
            y = torch.ops.torchquant.adaptive_avg_pool2d(q, 0, "quint8", [2, 2])
            return torch.ops.torchquant.dequantize_per_tensor(y, 0.1, 0)
    with pytest.raises(NotImplementedError, match=r"adaptive_avg_pool2d.*output_size \[2, 2\]"):
        tq_onnx.export(Pool(), (torch.rand(2, 3, 4, 4),), tmp_path / "p.onnx")


def test_imports_without_onnx_and_says_how_to_install():
    """The package and torchquant.onnx import without onnx / onnxscript; export says what to
    pip install."""
    code = ("import sys\n"
            "for m in ('onnx', 'onnxscript', 'onnx_ir', 'onnxruntime'): sys.modules[m] = None\n"
            "import torch, torchquant, torchquant.onnx\n"
            "try:\n"
            "    torchquant.onnx.export(torch.nn.Identity(), (torch.zeros(2),), 'x.onnx')\n"
            "except ImportError as e:\n"
            "    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "pip install 'torchquant[onnx]'" in out.stdout


_EPS = torch.finfo(torch.float32).eps


@pytest.mark.parametrize("rule", ["aten", "aten-reduce-range", "torchao", "torchao-0-127"])
def test_dynamic_qparams_are_torchquants(rule, tmp_path):
    """The exported quantize_dynamic_per_tensor picks torchquant's scale and zero point --
    ATen's rule (eager / FX dynamic modules; with and without reduce_range) and torchao's
    observer rule (the ``qmin`` / ``qmax`` / ``eps`` form PT2E convert emits) -- on ordinary,
    one-sided, all-zero and tiny-range inputs (each rule's floor on the scale); the codes may
    differ by one where a value sits on a tie (ONNX divides by the scale, torchquant
    multiplies by a float32 reciprocal)."""
    extra = {"aten": (False,), "aten-reduce-range": (True,), "torchao": (False, 0, 255, _EPS),
             "torchao-0-127": (False, 0, 127, _EPS)}[rule]

    class Quantize(nn.Module):
        def forward(self, x):
            return torch.ops.torchquant.quantize_dynamic_per_tensor(x, "quint8", *extra)
    model = Quantize()
    session = ort.InferenceSession(str(tq_onnx.export(model, (torch.randn(2, 64),),
                                                      tmp_path / "q.onnx")),
                                   providers=["CPUExecutionProvider"])
    gen = torch.Generator().manual_seed(0)
    cases = [torch.zeros(3, 64), torch.rand(3, 64, generator=gen) * 1e-3,
             -torch.rand(3, 64, generator=gen) * 1e-3, torch.randn(3, 64, generator=gen) * 1e-6,
             torch.rand(3, 64, generator=gen) * 5, -torch.rand(3, 64, generator=gen)]
    cases += [torch.randn(3, 64, generator=gen) * 10 ** float(torch.empty(()).uniform_(
        -2, 2, generator=gen)) + float(torch.randn((), generator=gen)) for _ in range(50)]
    equal = total = 0
    for x in cases:
        codes, scale, zero_point = model(x)
        o_codes, o_scale, o_zp = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert float(o_scale) == scale.item() and int(o_zp) == zero_point.item()
        diff = (torch.from_numpy(o_codes).int() - codes.int()).abs()
        assert diff.max().item() <= 1
        equal, total = equal + (diff == 0).sum().item(), total + diff.numel()
    assert equal / total >= 0.999
