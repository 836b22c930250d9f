"""``torchquant.compile`` / ``lower_pt2e`` on PT2E-converted models (X86InductorQuantizer).

Each dequantize -> conv / linear (+ relu / add / add+relu) -> quantize of the converted graph
must become one fused module calling ``torchquant.ops`` (LoweredConv / LoweredLinear), with no
float conv / linear and no requantize pair left between fused ops, and the lowered model must
compute what the converted (reference) graph computes.

Tolerance: the reference graph runs the float conv / linear on dequantized values (float32
accumulation) and rounds once; the fused ops accumulate exactly in integers.  A pre-rounding
value within float32 error of a rounding boundary can land one step apart, and that step then
travels downstream.  So the codes of every fused op are compared with the reference graph's
codes at the same quantize node: within 1 step on >= 99% of the codes (measured here: 100% on
every model, and >= 99.9% exactly equal, see the asserts), and the float outputs are close.
"""
from __future__ import annotations

import copy
import re
import warnings

import pytest
import torch
import torch.nn as nn

import torchquant
from torchquant.examples.resnet import ResNet18
from torchquant.quantization.pt2e.lowering import (LoweredConv, LoweredDynamicLinear,
                                                   LoweredLinear, lower_pt2e, lowered_op_counts)
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1 = nn.Conv2d(3, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.c3 = nn.Conv2d(16, 16, 1)

    def forward(self, x):
        return self.c3(torch.relu(self.c2(torch.relu(self.c1(x)))))


class ResidualCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.c1 = nn.Conv2d(8, 8, 3, padding=1)
        self.c2 = nn.Conv2d(8, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, 8, 3, padding=1)
        self.c4 = nn.Conv2d(8, 8, 1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        y = torch.relu(self.c2(torch.relu(self.c1(x))) + x)  # add + relu
        z = self.c3(y) + y                                    # add
        z = self.c4(z)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(z, 1), 1))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


def _pt2e(model, shape, seed=0, is_dynamic=False):
    torch.manual_seed(seed)
    model = model.eval()
    example = (torch.randn(*shape),)
    exported = torch.export.export(model, example).module()
    quantizer = X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_dynamic=is_dynamic))
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for _ in range(3):
            prepared(torch.randn(*shape))
    return convert_pt2e(prepared)


@pytest.fixture(scope="module")
def convnet():
    return _pt2e(ConvNet(), (2, 3, 12, 12)), (2, 3, 12, 12)


@pytest.fixture(scope="module")
def residual():
    return _pt2e(ResidualCNN(), (2, 3, 10, 10)), (2, 3, 10, 10)


@pytest.fixture(scope="module")
def mlp():
    return _pt2e(MLP(), (8, 16)), (8, 16)


@pytest.fixture(scope="module")
def resnet():
    return _pt2e(ResNet18(num_classes=10, width=8), (1, 3, 32, 32)), (1, 3, 32, 32)


def _modules(lowered, cls):
    mods = dict(lowered.named_modules())
    return [mods[str(n.target)] for n in lowered.graph.nodes
            if n.op == "call_module" and isinstance(mods[str(n.target)], cls)]


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.values = {}

    def run_node(self, n):
        out = super().run_node(n)
        self.values[n.name] = out
        return out


def _codes_agreement(reference, lowered, x):
    """(fraction exactly equal, fraction within 1 step, count) over the codes of every fused
    op, against the reference graph's quantize node it replaced."""
    ref, low = _Recorder(reference), _Recorder(lowered)
    with torch.no_grad():
        ref.run(x)
        low.run(x)
    equal = within = total = 0
    for node in lowered.graph.nodes:
        source = node.meta.get("lowered_from")
        if node.op != "call_module" or source is None:
            continue
        a, b = ref.values[source].to(torch.int32), low.values[node.name].to(torch.int32)
        assert a.shape == b.shape and a.dtype == b.dtype
        diff = (a - b).abs()
        equal += int((diff == 0).sum())
        within += int((diff <= 1).sum())
        total += diff.numel()
    assert total > 0
    return equal / total, within / total, total


def _check_lowered(converted, shape, n_conv, n_linear, post_ops=None):
    lowered = lower_pt2e(converted)
    convs, linears = _modules(lowered, LoweredConv), _modules(lowered, LoweredLinear)
    assert (len(convs), len(linears)) == (n_conv, n_linear)
    if post_ops is not None:
        assert sorted(m.post_op for m in convs + linears) == sorted(post_ops)
    targets = _targets(lowered)
    # no quantize(dequantize(.)) pair left
    for node in lowered.graph.nodes:
        if node.target is torch.ops.torchquant.quantize_per_tensor.default:
            assert getattr(node.args[0], "target", None) is not \
                torch.ops.torchquant.dequantize_per_tensor.default
    # every weight dequantize is gone (fused, or folded for the float ops left)
    assert torch.ops.torchquant.dequantize_per_channel.default not in targets
    torch.manual_seed(1)
    x = torch.randn(*shape) * 1.5
    exact, within, total = _codes_agreement(converted, lowered, x)
    assert within >= 0.99 and exact >= 0.99, (exact, within, total)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            torch.testing.assert_close(lowered(x), converted(x), rtol=0.05, atol=0.05)
    return lowered, x


def test_conv_net(convnet):
    converted, shape = convnet
    before = _targets(converted)
    assert before.count(torch.ops.aten.conv2d.default) == 3
    lowered, _ = _check_lowered(converted, shape, n_conv=2, n_linear=0,
                                post_ops=["relu", "relu"])
    # the last conv's output is not quantized (float model output): it stays a float conv
    assert _targets(lowered).count(torch.ops.aten.conv2d.default) == 1


def test_residual_cnn_add_and_add_relu(residual):
    converted, shape = residual
    lowered, _ = _check_lowered(converted, shape, n_conv=5, n_linear=0)
    posts = sorted(m.post_op for m in _modules(lowered, LoweredConv))
    assert "add_relu" in posts and "add" in posts and "relu" in posts
    assert torch.ops.aten.add.Tensor not in _targets(lowered)


def test_mlp(mlp):
    converted, shape = mlp
    lowered, _ = _check_lowered(converted, shape, n_conv=0, n_linear=2,
                                post_ops=["relu", "relu"])
    assert _targets(lowered).count(torch.ops.aten.linear.default) == 1  # the float head


def test_resnet18_shaped(resnet):
    converted, shape = resnet
    # 20 convs; the last block's conv2 + add + relu feeds float pooling (the quantizer leaves
    # that output float), so it stays a float conv on dequantized values
    lowered, x = _check_lowered(converted, shape, n_conv=19, n_linear=0)
    posts = [m.post_op for m in _modules(lowered, LoweredConv)]
    assert posts.count("add_relu") == 8 - 1
    counts = lowered_op_counts(lowered)
    assert counts["LoweredConv"] == 19 and counts["conv2d.default"] == 1
    # dq -> max_pool -> q with equal qparams pools the codes themselves
    assert counts["max_pool_codes"] == 1 and "max_pool2d.default" not in counts
    # 122 graph calls per inference before lowering (30 dq, 22 q, 21 weight dq, 20 conv, ...)
    assert sum(lowered_op_counts(converted).values()) == 123
    assert sum(counts.values()) == 32  # 19 fused convs, 3 dq, 2 q, the float tail, the guard


def test_compile_entry_point(mlp):
    converted, shape = mlp
    x = torch.randn(*shape)
    eager = torchquant.compile(converted, use_torch_compile=False)
    assert len(_modules(eager, LoweredLinear)) == 2
    assert _modules(converted, LoweredLinear) == []  # not lowered in place
    compiled = torchquant.compile(converted, fullgraph=True)
    # Where oneDNN is exact the compiled model runs oneDNN's int8 linears (frozen weights): the
    # hidden layers' integers are the same; the last linear writes float, which oneDNN scales
    # and biases in another order than the eager kernel (a float32 rounding, ~3e-8 here)
    tolerance = dict(rtol=0, atol=1e-6)
    with torch.no_grad():
        expected = eager(x)
        torch.testing.assert_close(compiled(x), expected, **tolerance)
    with torch.inference_mode():
        torch.testing.assert_close(compiled(x), expected, **tolerance)


def test_compile_called_with_grad_mode_on(mlp):
    """Inductor freezes inference graphs only.  With nothing that could take a gradient, a call
    in grad mode (Python's default) runs the frozen int8 graph: the no_grad answer, bit for bit.
    With a parameter that requires grad it keeps grad mode and warns once, naming it (on every
    CPU: where oneDNN's u8 x s8 products saturate the graph is frozen too, its float convs /
    linears kept)."""
    converted, shape = mlp
    x = torch.randn(*shape)
    inference_only = copy.deepcopy(converted)
    for p in inference_only.parameters():
        p.requires_grad_(False)
    compiled = torchquant.compile(inference_only)
    with torch.no_grad():
        expected = compiled(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = compiled(x)
    assert not got.requires_grad and torch.equal(got, expected)

    trainable = copy.deepcopy(converted)
    if not any(p.requires_grad for p in trainable.parameters()):
        next(trainable.parameters()).requires_grad_(True)
    names = [n for n, p in trainable.named_parameters() if p.requires_grad]
    compiled = torchquant.compile(trainable)
    with pytest.warns(UserWarning, match=re.escape(names[0])):
        assert compiled(x).requires_grad
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x)  # once per compiled model


def test_compile_residual_cnn_matches_lowered_eager(residual):
    converted, shape = residual
    lowered = torchquant.compile(converted, use_torch_compile=False)
    compiled = torchquant.compile(copy.deepcopy(lowered), lower=False)
    x = torch.randn(*shape) * 2
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), lowered(x), rtol=1e-4, atol=1e-4)


def test_dynamic_mlp():
    """Dynamic PT2E (quint8 activations chosen per call): each Linear (+ReLU) becomes one
    ``linear_dynamic`` call.  The reference runs a float GEMM on the dequantized input, the op
    an int8 GEMM scaled once: equal up to float32 rounding."""
    converted = _pt2e(MLP(), (8, 16), is_dynamic=True)
    lowered = lower_pt2e(converted)
    fused = _modules(lowered, LoweredDynamicLinear)
    assert [m.relu for m in fused] == [True, True, False]
    targets = _targets(lowered)
    assert torch.ops.aten.linear.default not in targets
    assert torch.ops.torchquant.quantize_dynamic_per_tensor.default not in targets
    x = torch.randn(8, 16)
    with torch.inference_mode():
        torch.testing.assert_close(lowered(x), converted(x), rtol=1e-5, atol=1e-6)


def test_compile_exported_program_of_converted_model(convnet):
    """An ExportedProgram of the converted model lowers as the GraphModule does."""
    converted, shape = convnet
    x = torch.randn(*shape)
    program = torch.export.export(converted, (x,))
    lowered = torchquant.compile(program, use_torch_compile=False)
    assert len(_modules(lowered, LoweredConv)) == 2
    with torch.inference_mode():
        torch.testing.assert_close(lowered(x), converted(x), rtol=1e-4, atol=1e-4)


def test_compile_eager_converted_model_is_compiled_only():
    """An eager-converted model already calls the fused ops: torchquant.compile only compiles
    it, and the compiled integers equal eager's."""
    import torchquant.quantization as tq
    torch.manual_seed(0)
    model = nn.Sequential(tq.QuantStub(), nn.Conv2d(3, 4, 3), nn.ReLU(), tq.DeQuantStub()).eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.fuse_modules(model, [["1", "2"]], inplace=True)
    tq.prepare(model, inplace=True)
    model(torch.randn(2, 3, 8, 8))
    tq.convert(model, inplace=True)
    assert torchquant.compile(model, use_torch_compile=False) is model
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad():
        assert torch.equal(torchquant.compile(model, fullgraph=True)(x), model(x))


def test_xnnpack_qint8_linears_fuse():
    """XNNPACKQuantizer's symmetric qint8 activations: every Linear (+ReLU) fuses with int8
    codes in and out, equal to the reference's codes (convs, whose op takes quint8 only, would
    stay float)."""
    from torchquant.quantization.quantizer.xnnpack_quantizer import (
        XNNPACKQuantizer, get_symmetric_quantization_config)
    torch.manual_seed(0)
    example = (torch.randn(8, 16),)
    exported = torch.export.export(MLP().eval(), example).module()
    prepared = prepare_pt2e(exported, XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=True)))
    prepared(*example)
    converted = convert_pt2e(prepared)
    lowered = lower_pt2e(converted)
    fused = _modules(lowered, LoweredLinear)
    assert [m.out_dtype for m in fused] == [torch.int8] * 3
    exact, within, total = _codes_agreement(converted, lowered, torch.randn(8, 16))
    assert exact == 1.0 and total == 8 * 32 * 2 + 8 * 4
