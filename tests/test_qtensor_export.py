"""torch-level functions on a QTensor under ``torch.export`` and ``torch.compile(fullgraph=True)``.

Export's and dynamo's tracers do not re-dispatch an aten op to a QTensor built in the graph, so
every function QTensor supports is taken at the torch-function level (QTensor's ``_FUNCTIONS``)
and lowered to its ``torchquant`` op.  Each case here quantizes the input inside the module,
calls one function and dequantizes: the exported graph must hold the op, and the exported and
compiled modules must give eager's values bit for bit (under no_grad and inference_mode).
Eager itself is checked against torch's quantized tensors where torch has the function.
"""
import pytest
import torch
import torch.ao.nn.quantized.functional as ao_F
import torch.nn as nn
import torch.nn.functional as F

import torchquant as tq
import torchquant.nn.quantized.functional as tqF
from torchquant.nn.quantized.modules import activation as tq_activation

pytestmark = pytest.mark.filterwarnings("ignore:`nn.functional.upsample` is deprecated")

SCALE, ZERO_POINT = 0.05, 128
_MASK = torch.rand(2, 3, 6, 8, generator=torch.Generator().manual_seed(3)) > 0.5


def _quant(x, qdtype=tq.quint8):
    return tq.quantize_per_tensor(x, SCALE, ZERO_POINT if qdtype is tq.quint8 else 0, qdtype)


# name -> (function of a quantized tensor (works on torch's too unless marked), the torchquant
# op the graph must hold (None: layout only), whether torch's quantized tensors take it)
CASES = {
    "torch.sigmoid": (torch.sigmoid, "sigmoid", True),
    "Tensor.sigmoid": (lambda t: t.sigmoid(), "sigmoid", True),
    "F.sigmoid": (F.sigmoid, "sigmoid", True),
    "nn.Sigmoid": (nn.Sigmoid(), "sigmoid", True),
    "torch.tanh": (torch.tanh, "tanh", True),
    "F.tanh": (F.tanh, "tanh", True),
    "nn.Tanh": (nn.Tanh(), "tanh", True),
    "F.hardsigmoid": (F.hardsigmoid, "hardsigmoid", True),
    "nn.Hardsigmoid": (nn.Hardsigmoid(), "hardsigmoid", True),
    "F.hardsigmoid inplace": (lambda t: F.hardsigmoid(t, inplace=True), "hardsigmoid", True),
    "F.leaky_relu": (lambda t: F.leaky_relu(t, 0.2), "leaky_relu", True),
    "nn.LeakyReLU": (nn.LeakyReLU(0.1), "leaky_relu", True),
    "F.leaky_relu inplace": (lambda t: F.leaky_relu(t, 0.2, inplace=True), "leaky_relu", True),
    "F.leaky_relu_": (lambda t: F.leaky_relu_(t, 0.2), "leaky_relu", True),
    "F.hardtanh": (lambda t: F.hardtanh(t, -0.5, 0.5), "clamp", True),
    "nn.Hardtanh": (nn.Hardtanh(-0.25, 0.75), "clamp", True),
    "F.hardtanh_": (F.hardtanh_, "clamp", True),
    "F.relu6": (F.relu6, "clamp", True),
    "nn.ReLU6 inplace": (nn.ReLU6(inplace=True), "clamp", True),
    "torch.clamp": (lambda t: torch.clamp(t, -0.5, 0.7), "clamp", True),
    "Tensor.clamp": (lambda t: t.clamp(min=-0.3), "clamp", True),
    "torch.clip": (lambda t: torch.clip(t, max=0.3), "clamp", True),
    "F.threshold": (lambda t: F.threshold(t, 0.1, 0.3), "threshold", True),
    "torch.threshold": (lambda t: torch.threshold(t, 0.1, -0.3), "threshold", True),
    "F.avg_pool2d": (lambda t: F.avg_pool2d(t, 2), "avg_pool2d", True),
    "F.avg_pool3d": (lambda t: F.avg_pool3d(t.unsqueeze(0), 2), "avg_pool3d", True),
    "F.adaptive_avg_pool2d": (lambda t: F.adaptive_avg_pool2d(t, 3), "adaptive_avg_pool2d",
                              True),
    "F.max_pool2d": (lambda t: F.max_pool2d(t, 2), "max_pool2d", True),
    "F.max_pool2d indices": (lambda t: F.max_pool2d(t, 2, return_indices=True)[0],
                             "max_pool2d_with_indices", False),
    "F.interpolate": (lambda t: F.interpolate(t, scale_factor=2), "upsample_nearest2d", True),
    "F.interpolate size": (lambda t: F.interpolate(t, size=(5, 11)), "upsample_nearest2d",
                           True),
    "F.interpolate nearest-exact": (
        lambda t: F.interpolate(t, scale_factor=1.5, mode="nearest-exact"),
        "upsample_nearest2d", True),
    "F.interpolate bilinear": (
        lambda t: F.interpolate(t, scale_factor=2, mode="bilinear", align_corners=False),
        "upsample_bilinear2d", True),
    "F.upsample": (lambda t: F.upsample(t, scale_factor=2), "upsample_nearest2d", True),
    "torch.mean spatial": (lambda t: torch.mean(t, (2, 3), keepdim=True), "mean_inner_dims",
                           True),
    "Tensor.mean": (lambda t: t.mean(-1), "mean_inner_dims", True),
    "torch.cat": (lambda t: torch.cat([t, t], 1), None, True),
    "torch.stack": (lambda t: torch.stack([t, t]), None, True),
    "Tensor.max dim": (lambda t: t.max(1)[0], None, True),
    "torch.min": (lambda t: torch.min(t), None, True),
    "torch.sort": (lambda t: torch.sort(t, -1, descending=True)[0], None, True),
    "Tensor.topk": (lambda t: t.topk(3)[0], None, True),
    "Tensor.to": (lambda t: t.to("cpu"), None, True),
    "torch.flatten": (lambda t: torch.flatten(t, 1), None, True),
    "Tensor.as_strided": (lambda t: t.as_strided((2, 3), (1, 2)), None, True),
    "Tensor.repeat": (lambda t: t.repeat(1, 2, 1, 3), None, True),
    "torch.index_select": (lambda t: torch.index_select(t, 3, torch.tensor([5, 0, 2])), None,
                           True),
    "Tensor.index_select": (lambda t: t.index_select(1, torch.tensor([2, 2, 0])), None, True),
    "Tensor.masked_fill": (lambda t: t.masked_fill(t.int_repr() % 3 == 0, 0.3), None, True),
    "torch.masked_fill": (lambda t: torch.masked_fill(t, _MASK, -0.125), None, True),
    # torchquant's functional forms and modules (torch's take its quantized tensors)
    "tqF.hardswish": (lambda t: tqF.hardswish(t, 0.04, 100), "hardswish", False),
    "tqF.elu": (lambda t: tqF.elu(t, 0.04, 100, 0.5), "elu", False),
    "tqF.celu": (lambda t: tqF.celu(t, 0.04, 100, 0.5), "celu", False),
    "tqF.leaky_relu rescaled": (lambda t: tqF.leaky_relu(t, 0.1, scale=0.04, zero_point=90),
                                "leaky_relu", False),
    "tqF.threshold": (lambda t: tqF.threshold(t, 0.1, 0.3), "threshold", False),
    "tqF.clamp": (lambda t: tqF.clamp(t, -0.5, 0.5), "clamp", False),
    "nnq.Sigmoid": (tq_activation.Sigmoid(0.004, 3), "sigmoid", False),
    "nnq.LeakyReLU": (tq_activation.LeakyReLU(0.04, 90, 0.2), "leaky_relu", False),
    "nnq.Hardswish": (tq_activation.Hardswish(0.04, 90), "hardswish", False),
    "nnq.ELU": (tq_activation.ELU(0.04, 90, 0.7), "elu", False),
}

# torch's functional forms of the last cases, for the eager check
TORCH_EQUIVALENT = {
    "tqF.hardswish": lambda t: ao_F.hardswish(t, 0.04, 100),
    "tqF.elu": lambda t: ao_F.elu(t, 0.04, 100, 0.5),
    "tqF.celu": lambda t: ao_F.celu(t, 0.04, 100, 0.5),
    "tqF.leaky_relu rescaled": lambda t: ao_F.leaky_relu(t, 0.1, scale=0.04, zero_point=90),
    "tqF.threshold": lambda t: ao_F.threshold(t, 0.1, 0.3),
    "tqF.clamp": lambda t: ao_F.clamp(t, -0.5, 0.5),
    "F.max_pool2d indices": lambda t: F.max_pool2d(t, 2),
}


class OneFunction(nn.Module):
    def __init__(self, fn, qdtype=tq.quint8):
        super().__init__()
        self.fn = fn
        self.qdtype = qdtype

    def forward(self, x):
        return self.fn(_quant(x, self.qdtype)).dequantize()


def _graph_ops(graph_module):
    return {str(n.target).split(".")[1] for n in graph_module.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("torchquant.")}


def _input():
    return torch.randn(2, 3, 6, 8, generator=torch.Generator().manual_seed(0)) * 2


@pytest.mark.parametrize("name", list(CASES))
def test_eager_matches_torch(name):
    fn, _, torch_takes_it = CASES[name]
    torch_fn = fn if torch_takes_it else TORCH_EQUIVALENT.get(name)
    if torch_fn is None:
        pytest.skip("torch's module has its own qparams (tests/nn/test_activation_modules.py)")
    x = _input()
    for ours, theirs, zero_point in ((tq.quint8, torch.quint8, ZERO_POINT),
                                     (tq.qint8, torch.qint8, 0)):
        got = fn(_quant(x, ours))
        expected = torch_fn(torch.quantize_per_tensor(x, SCALE, zero_point, theirs))
        assert got.shape == expected.shape
        assert (got.q_scale(), got.q_zero_point()) == pytest.approx(
            (expected.q_scale(), expected.q_zero_point()), rel=1e-6)
        assert torch.equal(got.int_repr(), expected.int_repr())


@pytest.mark.parametrize("name", list(CASES))
def test_export_holds_the_op_and_matches_eager(name):
    fn, op, _ = CASES[name]
    model = OneFunction(fn)
    x = _input()
    expected = model(x)
    exported = torch.export.export(model, (x,))
    ops = _graph_ops(exported.graph_module)
    assert {"quantize_per_tensor", "dequantize_per_tensor"} <= ops
    if op is not None:
        assert op in ops
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(exported.module()(x), expected)
    x2 = torch.randn(2, 3, 6, 8) * 4  # other values, same program
    assert torch.equal(exported.module()(x2), model(x2))


@pytest.mark.parametrize("name", list(CASES))
def test_compile_fullgraph_matches_eager(name):
    """dynamo and AOT autograd with the ops' fake kernels (inductor: the chained test below)."""
    fn, _, _ = CASES[name]
    model = OneFunction(fn, tq.qint8)
    x = _input()
    expected = model(x)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), expected)
    with torch.inference_mode():
        assert torch.equal(compiled(x), expected)


class Chain(nn.Module):
    """Many activations on one QTensor, as in a MobileNet-style block."""

    def __init__(self):
        super().__init__()
        self.hardswish = tq_activation.Hardswish(0.05, 64)
        self.leaky = nn.LeakyReLU(0.1)

    def forward(self, x):
        q = _quant(x)
        q = self.hardswish(F.hardtanh(q, -2.0, 3.0))
        q = torch.clamp(self.leaky(q), -1.0, 2.0)
        gate = F.hardsigmoid(F.adaptive_avg_pool2d(q, 1))
        s = torch.sigmoid(F.avg_pool2d(q, 2))
        t = torch.tanh(F.interpolate(s, scale_factor=2))
        return (gate.dequantize() * t.dequantize()).flatten(1)


def test_chain_under_inductor_export_and_inference_mode():
    torch.manual_seed(0)
    model = Chain()
    x = torch.randn(2, 4, 8, 8)
    expected = model(x)
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), expected)
    with torch.inference_mode():
        assert torch.equal(compiled(x), expected)
        exported = torch.export.export(model, (x,))
        assert torch.equal(exported.module()(x), expected)
    assert {"clamp", "hardswish", "leaky_relu", "hardsigmoid", "adaptive_avg_pool2d",
            "sigmoid", "avg_pool2d", "tanh", "upsample_nearest2d"} <= _graph_ops(
                exported.graph_module)


def test_prelu_module_exports_and_compiles_without_graph_breaks():
    class WithPReLU(nn.Module):
        def __init__(self):
            super().__init__()
            self.prelu = tq_activation.PReLU(0.04, 90, 3)
            self.prelu.set_weight(tq.quantize_per_tensor(torch.tensor([0.25, -0.5, 0.125]),
                                                         0.01, 64, tq.quint8))

        def forward(self, x):
            return self.prelu(_quant(x)).dequantize()

    model = WithPReLU()
    x = torch.randn(2, 3, 4, 5)
    expected = model(x)
    exported = torch.export.export(model, (x,))
    assert "prelu" in _graph_ops(exported.graph_module)
    with torch.inference_mode():
        assert torch.equal(exported.module()(x), expected)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(model)(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1
    assert torch.equal(torch.compile(model, fullgraph=True, backend="aot_eager")(x), expected)


def test_functions_leave_other_calls_to_the_default_path():
    """A handler that does not take a call (tensor bounds, ``out=``, an unsupported mode)
    hands it on: torch's rules (and QTensor's dispatch) decide, as before."""
    q = _quant(_input())
    with pytest.raises(NotImplementedError, match="upsample_bicubic2d|bicubic"):
        F.interpolate(q, scale_factor=2, mode="bicubic")
    with pytest.raises(NotImplementedError, match="threshold_"):
        F.threshold(q, 0.1, 0.2, inplace=True)
    with pytest.raises(Exception):
        torch.clamp(q, min=torch.zeros(()))
    per_channel = tq.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                                          torch.tensor([0, 1]), 0, tq.quint8)
    with pytest.raises(NotImplementedError, match="per-tensor"):
        F.leaky_relu(per_channel)
    assert q.to("cpu") is q and q.to(torch.uint8) is q


# quint8 only in torch: channel_shuffle and grid_sample (bilinear, torch's integer interpolation)
_GRID = torch.rand(2, 5, 7, 2, generator=torch.Generator().manual_seed(4)) * 2.4 - 1.2
QUINT8_CASES = {
    "torch.channel_shuffle": (lambda t: torch.channel_shuffle(t.repeat(1, 2, 1, 1), 3), None),
    "nn.ChannelShuffle": (nn.ChannelShuffle(3), None),
    "F.grid_sample": (lambda t: F.grid_sample(t, _GRID, align_corners=False),
                      "grid_sample_bilinear2d"),
    "F.grid_sample border": (
        lambda t: F.grid_sample(t, _GRID, padding_mode="border", align_corners=True),
        "grid_sample_bilinear2d"),
}


@pytest.mark.parametrize("name", list(QUINT8_CASES))
def test_quint8_only_functions_export_compile_and_match_torch(name):
    fn, op = QUINT8_CASES[name]
    x = _input()
    got = fn(_quant(x))
    want = fn(torch.quantize_per_tensor(x, SCALE, ZERO_POINT, torch.quint8))
    assert got.q_zero_point() == want.q_zero_point()
    assert torch.equal(got.int_repr(), want.int_repr())
    model = OneFunction(fn)
    expected = model(x)
    exported = torch.export.export(model, (x,))
    if op is not None:
        assert op in _graph_ops(exported.graph_module)
    with torch.no_grad():
        assert torch.equal(exported.module()(x), expected)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(x), expected)
