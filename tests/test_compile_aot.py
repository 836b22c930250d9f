"""``torchquant.compile``'s AOTInductor path (torchquant/_compile_aot.py): the graphs it compiles
per call signature compute what the ``torch.compile`` path computes, bit for bit (the same
freezing pass, the same kernels); their code calls no Python-implemented torchquant op; calls
it cannot serve take the ``torch.compile`` path."""
from __future__ import annotations

import copy
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

import torchquant
from torchquant._compile_aot import AOTCompiledModel
from torchquant._package import generated_code, torchquant_ops_called
from torchquant.kernels import native
from torchquant.ops import linear as ops_linear
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)

pytestmark = pytest.mark.skipif(not ops_linear.onednn_u8s8_exact(),
                                reason="the AOT path needs the freezing pass (oneDNN exact)")


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 16, 3, padding=1)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)
        self.fc = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.c1(x))
        y = torch.relu(self.c2(y) + y)
        return self.fc(y.mean((2, 3)))


@pytest.fixture(scope="module")
def converted() -> torch.fx.GraphModule:
    return _converted()


def _converted() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    model = SmallCNN().eval()
    example = (torch.randn(2, 3, 12, 12),)
    batch = ({0: torch.export.Dim("batch", max=256)},)
    gm = torch.export.export(model, example, dynamic_shapes=batch).module()
    prepared = prepare_pt2e(gm, X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config()))
    for s in range(2):
        prepared(torch.randn(4, 3, 12, 12, generator=torch.Generator().manual_seed(s)))
    return convert_pt2e(prepared)


def _inputs(batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 12, 12, generator=torch.Generator().manual_seed(batch))


def test_graphs_per_signature_equal_the_torch_compile_path(converted, caplog):
    """Batch 1 and 4 get graphs of their own shapes, a third batch size one symbolic-batch graph
    that then serves a fourth; every output equals the torch.compile path's bit for bit (under
    no_grad and inference_mode), and each compile is announced.  The compiled graphs' C++ calls
    torchquant's native convs (directly, through their C shims, not the proxy executor) or
    oneDNN, and no op implemented in Python (the issue's test of the compiled forward).  An
    input that wants a gradient takes the torch.compile path.  One test, so that the three AOT
    compiles are made once."""
    ours = torchquant.compile(copy.deepcopy(converted))
    assert isinstance(ours, AOTCompiledModel)
    reference = torchquant.compile(copy.deepcopy(converted), aot=False)
    outputs = {}
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="torchquant"):
        for batch in (1, 4, 8, 3, 1):
            x = _inputs(batch)
            outputs[batch] = ours(x)
            assert torch.equal(outputs[batch], reference(x)), batch
    with torch.inference_mode():  # the same graphs, the same answers
        assert torch.equal(ours(_inputs(4)), outputs[4])
    assert len(ours._batched) == 1 and None not in ours._batched.values()
    assert len({id(g) for g in ours._graphs.values()}) == 3  # b1, b4, symbolic (b8 and b3)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("compiling for" in m for m in messages) == 3
    assert any("symbolic batch" in m for m in messages)

    packages = list(Path(ours._folder.name).glob("*.pt2"))
    assert len(packages) == 3
    native_calls, onednn_calls = [], []
    for path in packages:
        sources = generated_code(str(path))
        text = "".join(sources.values())
        assert torchquant_ops_called(sources) == []
        assert "torchquant_native::qconv2d" not in text  # no proxy-executor call of a native conv
        native_calls.append(text.count("aoti_torch_cpu_qconv2d("))
        onednn_calls.append("qconv_pointwise" in text)
        # the convs: native (static batch), native-or-oneDNN per call (symbolic), or oneDNN
        assert native_calls[-1] >= 3 or "qconv2d_or_onednn(" in text or "qconv_pointwise" in text
    if native.available() and native.exact_u8():  # small convs are native at a static batch
        assert max(native_calls) >= 3  # the C shim's declaration and two calls
    else:
        assert all(onednn_calls)  # every package's convs are oneDNN's

    # an input that wants a gradient: the torch.compile path (which keeps grad mode)
    with pytest.warns(UserWarning, match="grad mode on"):
        out = ours(_inputs(4).requires_grad_(True))
    assert ours._fallback is not None
    # tolerance: grad mode keeps that graph unfrozen, so its convs run in float on dequantized
    # values (the converted graph's own semantics) and a code at a rounding tie can land one
    # step from the int8 kernels'; the logits then differ by about a step's effect
    torch.testing.assert_close(out.detach(), outputs[4], rtol=1e-3, atol=1e-3)


def test_aot_true_refuses_torch_compile_arguments(converted):
    with pytest.raises(ValueError, match="aot=True"):
        torchquant.compile(copy.deepcopy(converted), aot=True, fullgraph=True)


def test_a_model_aotinductor_cannot_compile_falls_back(caplog):
    """An eager model whose forward export rejects (data-dependent control flow) still runs,
    through torch.compile, and the log says why."""
    class Branchy(nn.Module):
        def forward(self, x):
            return x * 2 if x.sum() > 0 else x - 1

    ours = torchquant.compile(Branchy(), aot=True)
    x = torch.ones(2, 3)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="torchquant"):
        assert torch.equal(ours(x), x * 2)
        assert torch.equal(ours(-x), -x - 1)
    assert ours._failed is not None
    assert any("could not compile" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("flow", ["eager", "fx"])
def test_eager_and_fx_models_compile_ahead_of_time(flow):
    """Eager- and FX-converted models take the AOT path too: the package compile's exact
    decompositions (adds, pools, Linears) with the native convs kept; outputs equal the
    converted model's bit for bit."""
    import torchquant.quantization as tq
    from torchquant.examples.resnet import ResNet18, randomize_bn
    from torchquant.quantization import quantize_fx
    torch.manual_seed(0)
    float_model = randomize_bn(ResNet18(num_classes=10, width=8)).eval()
    calib = torch.randn(8, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    if flow == "fx":
        prepared = quantize_fx.prepare_fx(copy.deepcopy(float_model),
                                          tq.get_default_qconfig_mapping("x86"), (calib[:2],))
        with torch.no_grad():
            prepared(calib)
        model = quantize_fx.convert_fx(prepared)
    else:
        model = tq.fuse_modules(copy.deepcopy(float_model), float_model.fuse_patterns())
        model.qconfig = tq.get_default_qconfig("x86")
        tq.prepare(model, inplace=True)
        with torch.no_grad():
            model(calib)
        model = tq.convert(model)
    ours = torchquant.compile(model)
    x = torch.randn(1, 3, 32, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert torch.equal(ours(x), model(x))
    assert ours._failed is None and len(ours._graphs) == 1
