"""The normalization ``torch.ops.torchquant`` ops (batch_norm, layer_norm, group_norm,
instance_norm, softmax): schema and fake kernels (``opcheck``), the op equal to the eager
function beside it, and quantized norm modules under ``torch.export``."""
import pytest
import torch
import torch.nn as nn

import torchquant as tq
import torchquant.nn.quantized as tqnnq
import torchquant.quantization as tqq
from torchquant.ops import normalization as ops_norm


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply to integer outputs
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


def _ints(shape, qdtype, channels_last=False):
    x = torch.randint(qdtype.qmin, qdtype.qmax + 1, shape, dtype=torch.int64).to(
        qdtype.storage_dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _check(op, args, eager):
    _opcheck(op.default, args)
    got = op(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride() and got.dtype == eager.dtype


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("affine", [False, True])
def test_batch_norm_op(qdtype, channels_last, relu, affine):
    torch.manual_seed(0)
    x = _ints((2, 5, 4, 3), qdtype, channels_last)
    w, b = (torch.rand(5) + 0.5, torch.randn(5)) if affine else (None, None)
    mean, var = torch.randn(5), torch.rand(5) + 0.1
    zp = 10 if qdtype is tq.quint8 else -3
    args = (x, 0.05, zp, w, b, mean, var, 1e-5, 0.08, zp, qdtype.name,
            "relu" if relu else "none")
    _check(torch.ops.torchquant.batch_norm, args,
           ops_norm.batch_norm(x, 0.05, zp, w, b, mean, var, 1e-5, 0.08, zp, qdtype, relu))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("affine", [False, True])
def test_layer_norm_op(qdtype, affine):
    torch.manual_seed(0)
    x = _ints((2, 3, 6), qdtype)
    w, b = (torch.rand(3, 6) + 0.5, torch.randn(3, 6)) if affine else (None, None)
    args = (x, 0.05, 2, [3, 6], w, b, 1e-5, 0.03, 7, qdtype.name)
    _check(torch.ops.torchquant.layer_norm, args,
           ops_norm.layer_norm(x, 0.05, 2, [3, 6], w, b, 1e-5, 0.03, 7, qdtype))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_op(qdtype, channels_last):
    torch.manual_seed(0)
    x = _ints((2, 6, 4, 5), qdtype, channels_last)
    w, b = torch.rand(6) + 0.5, torch.randn(6)
    args = (x, 0.05, 2, 3, w, b, 1e-5, 0.03, 7, qdtype.name)
    _check(torch.ops.torchquant.group_norm, args,
           ops_norm.group_norm(x, 0.05, 2, 3, w, b, 1e-5, 0.03, 7, qdtype))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("shape", [(2, 4, 9), (2, 4, 3, 5), (1, 3, 2, 3, 4)])
@pytest.mark.parametrize("affine", [False, True])
def test_instance_norm_op(qdtype, shape, affine):
    torch.manual_seed(0)
    x = _ints(shape, qdtype)
    c = shape[1]
    w, b = (torch.rand(c) + 0.5, torch.randn(c)) if affine else (None, None)
    args = (x, 0.05, 2, w, b, 1e-5, 0.03, 7, qdtype.name)
    _check(torch.ops.torchquant.instance_norm, args,
           ops_norm.instance_norm(x, 0.05, 2, w, b, 1e-5, 0.03, 7, qdtype))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("channels_last", [False, True])
def test_softmax_op(qdtype, dim, channels_last):
    torch.manual_seed(0)
    x = _ints((2, 5, 3, 4), qdtype, channels_last)
    zp = 0 if qdtype is tq.quint8 else -128
    args = (x, 0.1, 3, dim, 1 / 256, zp, qdtype.name)
    _check(torch.ops.torchquant.softmax, args,
           ops_norm.softmax(x, 0.1, 3, dim, 1 / 256, zp, qdtype))


class Norms(nn.Module):
    """Conv, batch norm (+ReLU fused), group norm, layer norm, softmax (a placeholder: eager
    convert maps no float softmax, the quantized one is put in after convert)."""

    def __init__(self):
        super().__init__()
        self.quant = tqq.QuantStub()
        self.conv = nn.Conv2d(3, 6, 3, padding=1)
        self.bn = nn.BatchNorm2d(6)
        self.relu = nn.ReLU()
        self.gn = nn.GroupNorm(3, 6)
        self.ln = nn.LayerNorm([6, 6, 6])
        self.softmax = nn.Identity()
        self.dequant = tqq.DeQuantStub()

    def forward(self, x):
        x = self.relu(self.bn(self.conv(self.quant(x))))
        return self.dequant(self.softmax(self.ln(self.gn(x))))


def _targets(ep):
    return {str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"}


@pytest.fixture(scope="module")
def norms():
    torch.manual_seed(0)
    model = Norms().eval()
    with torch.no_grad():  # non-trivial running statistics and affine parameters
        model.bn.running_mean.normal_()
        model.bn.running_var.uniform_(0.5, 2.0)
        for m in (model.bn, model.gn, model.ln):
            m.weight.uniform_(0.5, 1.5)
            m.bias.normal_()
    model.qconfig = tqq.get_default_qconfig("x86")
    tqq.fuse_modules(model, [["bn", "relu"]], inplace=True)
    prepared = tqq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(2, 3, 6, 6))
    converted = tqq.convert(prepared)
    converted.softmax = tqnnq.Softmax(dim=1, scale=1 / 256, zero_point=0)
    return converted


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_export_norms(norms, context):
    x = torch.randn(2, 3, 6, 6)
    ep = torch.export.export(norms, (x,))
    targets = _targets(ep)
    for name in ("batch_norm", "group_norm", "layer_norm", "softmax"):
        assert f"torchquant.{name}.default" in targets
    with context():
        assert torch.equal(ep.module()(x), norms(x))
        x2 = torch.randn(2, 3, 6, 6) * 3
        assert torch.equal(ep.module()(x2), norms(x2))


def test_compile_fullgraph_norms(norms):
    x = torch.randn(2, 3, 6, 6)
    compiled = torch.compile(norms, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), norms(x))
