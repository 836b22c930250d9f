"""The dynamic PT2E flow (X86InductorQuantizer with is_dynamic=True) under plain torch.compile
with freezing: each dynamically quantized activation's min / max, qparams and codes become
inductor-fused C++ (the decomposition of ``torchquant::quantize_dynamic_per_tensor``) and each
linear one oneDNN int8 call reading those qparams (ops/inductor/fusion.py).  Before, every
linear ran in float behind a Python call per quantize: all-MiniLM-L6-v2 compiled was slower
than float."""
import copy

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
from torch._inductor.utils import run_and_get_code

import torchquant
import torchquant.kernels.onednn_exactness as exactness
from torchquant.ops.quantize_dynamic import quantize_dynamic_per_tensor
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)


def _inputs():
    g = torch.Generator().manual_seed(0)
    yield torch.randn(7, 33, generator=g)
    yield torch.rand(4, 50, generator=g) * 3 + 0.5        # all positive: min clamps to 0
    yield -torch.rand(4, 50, generator=g) * 3             # all negative
    yield torch.randn(3, 40, generator=g) * 1e-6           # tiny range: ATen's scale floor
    yield torch.full((5, 8), 0.25)                         # constant
    yield torch.zeros(2, 9)                                # all zero: scale 0.1
    yield torch.randn(2, 3, 17, generator=g) * 40


@pytest.mark.parametrize("qdtype,reduce_range", [("quint8", False), ("quint8", True),
                                                 ("qint8", False)])
def test_compiled_quantize_dynamic_equals_the_eager_op(qdtype, reduce_range):
    """The decomposition inductor compiles gives the eager op's codes, scale and zero point
    bit for bit (the same qparam rule in tensor form; the quantize as one fused multiply-add)."""
    def fn(x):
        return torch.ops.torchquant.quantize_dynamic_per_tensor(x, qdtype, reduce_range)

    torch._dynamo.reset()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)
    for i, x in enumerate(_inputs()):
        codes, scale, zp = quantize_dynamic_per_tensor(x, qdtype, reduce_range)
        if i == 0:  # the compiled code is the decomposition, not a call back into the op
            (c_codes, c_scale, c_zp), code = run_and_get_code(compiled, x)
            assert "torch.ops.torchquant" not in "".join(code)
        else:
            c_codes, c_scale, c_zp = compiled(x)
        assert torch.equal(c_codes, codes), x.shape
        assert c_scale.dtype == torch.float64 and c_scale.item() == scale.item()
        assert c_zp.dtype == torch.int64 and c_zp.item() == zp.item()


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(16, 32), nn.Linear(32, 32), nn.Linear(32, 8)

    def forward(self, x):
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


@pytest.fixture(scope="module")
def dynamic_converted():
    torch.manual_seed(0)
    model = MLP().eval()
    example = (torch.randn(2, 5, 16),)
    dims = ({0: torch.export.Dim("batch", max=64)},)
    exported = torch.export.export(model, example, dynamic_shapes=dims).module()
    quantizer = X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_dynamic=True))
    prepared = prepare_pt2e(exported, quantizer)
    prepared(*example)
    return convert_pt2e(prepared)


@pytest.mark.skipif(not exactness.onednn_u8s8_exact(), reason="oneDNN u8 x s8 inexact here")
@pytest.mark.parametrize("how", ["tutorial", "torchquant.compile"])
def test_dynamic_linears_become_onednn_calls(dynamic_converted, how):
    x = torch.randn(3, 5, 16) * 2
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False), torch.no_grad():
        expected = dynamic_converted(x)
        model = copy.deepcopy(dynamic_converted)
        if how == "tutorial":
            with inductor_config.patch(freezing=True):
                out, code = run_and_get_code(torch.compile(model), x)
        else:
            out, code = run_and_get_code(torchquant.compile(model, aot=False), x)
    code = "".join(code)
    # three int8 linears reading the qparams computed in the graph; no float linear, no Python
    calls = code.count("qlinear_pointwise.tensor(") + \
        code.count("aoti_torch_cpu__qlinear_pointwise_tensor(")
    assert calls == 3
    assert "torch.ops.torchquant" not in code
    assert "extern_kernels.addmm" not in code and "aoti_torch_cpu_addmm" not in code
    # oneDNN's int8 GEMM against the eager graph's float linear on dequantized values: the
    # activation codes are the same; the float outputs differ by float32 rounding of the sums
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


class _GeluMLP(nn.Module):
    """A transformer FFN: Linear -> GELU -> Linear on a 3-d activation (a view around each)."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Linear(16, 64), nn.Linear(64, 16)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


@pytest.mark.skipif(not exactness.onednn_u8s8_exact(), reason="oneDNN u8 x s8 inexact here")
def test_gelu_after_a_dynamic_linear_is_onednns_post_op():
    """The exact GELU after a dynamic linear (in the form inductor's decomposition gives it)
    becomes the int8 call's post-op, as torchao's flow makes it: one pass over the activation
    fewer.  oneDNN's GELU is its own polynomial, not ATen's: its outputs agree with ATen's to
    float32 rounding (here the model's outputs to 5e-7), so the tolerance is that of the
    other dynamic-linear test; a next dynamic quantize could in principle pick a scale an ulp
    apart and shift a code at a tie."""
    torch.manual_seed(0)
    example = (torch.randn(2, 5, 16),)
    exported = torch.export.export(_GeluMLP().eval(), example).module()
    prepared = prepare_pt2e(exported, X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_dynamic=True)))
    prepared(*example)
    converted = convert_pt2e(prepared)
    x = torch.randn(2, 5, 16) * 2
    torch._dynamo.reset()
    with inductor_config.patch(fx_graph_cache=False, freezing=True), torch.no_grad():
        expected = converted(x)
        out, code = run_and_get_code(torch.compile(copy.deepcopy(converted)), x)
    code = "".join(code)
    assert code.count("qlinear_pointwise.tensor(") == 2
    assert "'gelu'" in code and ".erf()" not in code
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
