"""The binary ``torch.ops.torchquant`` ops (mul, cat, add_scalar, mul_scalar, matmul, prelu):
schema and fake kernels (``opcheck``), the op equal to the eager function beside it, and an
eager-converted model with ``FloatFunctional.cat`` / ``.mul`` under ``torch.export``."""
import pytest
import torch
import torch.nn as nn

import torchquant as tq
import torchquant.quantization as tqq
import torchquant.nn.quantized as tqnnq
from torchquant.ops import binary as ops_binary


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply to integer outputs
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


def _ints(shape, qdtype, layout="contiguous"):
    x = torch.randint(qdtype.qmin, qdtype.qmax + 1, shape, dtype=torch.int64).to(
        qdtype.storage_dtype)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        x = x.transpose(-1, -2)
    return x


_LAYOUTS = ["contiguous", "channels_last", "transposed"]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32])
@pytest.mark.parametrize("layout", _LAYOUTS)
@pytest.mark.parametrize("relu", [False, True])
def test_mul_op(qdtype, layout, relu):
    torch.manual_seed(0)
    a = _ints((2, 11, 5, 5), qdtype, layout)
    b = _ints((2, 11, 5, 5), qdtype, layout)
    zp = 0 if qdtype is tq.qint32 else 3
    args = (a, 0.05, zp, b, 0.04, -zp, 0.07, zp, qdtype.name, "relu" if relu else "none")
    _opcheck(torch.ops.torchquant.mul.default, args)
    eager = ops_binary.mul(a, 0.05, zp, b, 0.04, -zp, 0.07, zp, qdtype, relu)
    got = torch.ops.torchquant.mul(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()


def test_mul_op_broadcasts():
    a = _ints((2, 3, 4), tq.quint8)
    b = _ints((3, 1), tq.quint8)
    args = (a, 0.05, 120, b, 0.02, 130, 0.1, 128, "quint8", "none")
    _opcheck(torch.ops.torchquant.mul.default, args)
    assert torch.equal(torch.ops.torchquant.mul(*args),
                       ops_binary.mul(a, 0.05, 120, b, 0.02, 130, 0.1, 128, tq.quint8))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("layout,dim", [("contiguous", 0), ("contiguous", 1),
                                        ("channels_last", 1), ("channels_last", 3),
                                        ("transposed", 2)])
def test_cat_op(qdtype, layout, dim):
    torch.manual_seed(0)
    # sizes 11 / 4 / 9 along dim: on the channels-last fast path (dim 1), 8-channel vectors
    # and a scalar remainder
    xs = []
    for size in (11, 4, 9):
        shape = [2, 6, 5, 7]
        shape[dim] = size
        xs.append(_ints(shape[:-2] + shape[-2:][::-1], qdtype).transpose(-1, -2)
                  if layout == "transposed" else _ints(shape, qdtype, layout))
    scales, zps = [0.05, 0.1, 0.1], [3, 10, 10]
    args = (xs, scales, zps, dim, 0.1, 10, qdtype.name)
    _opcheck(torch.ops.torchquant.cat.default, args)
    eager = ops_binary.cat(xs, scales, zps, dim, 0.1, 10, qdtype)
    got = torch.ops.torchquant.cat(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32])
@pytest.mark.parametrize("other", [0.3, -2.0, 40.0, -40.0])
@pytest.mark.parametrize("relu", [False, True])
def test_add_scalar_op(qdtype, other, relu):
    torch.manual_seed(0)
    x = _ints((3, 6, 4), qdtype)
    scale, zp = 0.1, (0 if qdtype is tq.qint32 else 5)
    out_scale, out_zp = ops_binary.add_scalar_qparams(scale, zp, other, qdtype)
    args = (x, scale, zp, other, out_scale, out_zp, qdtype.name, "relu" if relu else "none")
    _opcheck(torch.ops.torchquant.add_scalar.default, args)
    assert torch.equal(torch.ops.torchquant.add_scalar(*args),
                       ops_binary.add_scalar(x, scale, zp, other, out_scale, out_zp, qdtype,
                                             relu))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("other", [2.5, 0.0, -1.5])
@pytest.mark.parametrize("layout", _LAYOUTS)
def test_mul_scalar_op(qdtype, other, layout):
    x = _ints((2, 3, 4, 5), qdtype, layout)
    args = (x, other, qdtype.name)
    _opcheck(torch.ops.torchquant.mul_scalar.default, args)
    eager = ops_binary.mul_scalar(x, other, qdtype)
    got = torch.ops.torchquant.mul_scalar(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (2, 4, 6)), ((2, 3, 4), (4,))])
def test_matmul_op(qdtype, shapes):
    torch.manual_seed(0)
    a, b = _ints(shapes[0], qdtype), _ints(shapes[1], qdtype)
    args = (a, 0.05, 3, b, 0.02, -4, 0.5, 7, qdtype.name)
    _opcheck(torch.ops.torchquant.matmul.default, args)
    eager = ops_binary.matmul(a, 0.05, 3, b, 0.02, -4, 0.5, 7, qdtype)
    got = torch.ops.torchquant.matmul(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()


@pytest.mark.parametrize("shape,num_weights", [((2, 5, 4, 3), 5), ((2, 5, 4, 3), 1), ((7,), 1),
                                               ((3, 6), 6)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_prelu_op(shape, num_weights, layout):
    if layout == "channels_last" and len(shape) != 4:
        pytest.skip("4-D only")
    torch.manual_seed(0)
    x = _ints(shape, tq.quint8, layout)
    w = _ints((num_weights,), tq.quint8)
    args = (x, 0.05, 120, w, 0.01, 100, 0.04, 110, "quint8")
    _opcheck(torch.ops.torchquant.prelu.default, args)
    eager = ops_binary.prelu(x, 0.05, 120, w, 0.01, 100, 0.04, 110, tq.quint8)
    got = torch.ops.torchquant.prelu(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()


class CatMul(nn.Module):
    """Two conv branches joined by FloatFunctional.cat along channels (channels-last fast path
    after the convs), then a FloatFunctional.mul of the two halves of the join."""

    def __init__(self):
        super().__init__()
        self.quant = tqq.QuantStub()
        self.a = nn.Conv2d(3, 10, 3, padding=1)
        self.b = nn.Conv2d(3, 10, 3, padding=1)
        self.join = tqnnq.FloatFunctional()
        self.prod = tqnnq.FloatFunctional()
        self.dequant = tqq.DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        y = self.join.cat([self.a(x), self.b(x)], 1)
        return self.dequant(self.prod.mul(y, y))


@pytest.fixture(scope="module")
def cat_mul():
    torch.manual_seed(0)
    model = CatMul().eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    prepared = tqq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(2, 3, 8, 8))
    return tqq.convert(prepared)


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_export_float_functional_cat_and_mul(cat_mul, context):
    x = torch.randn(2, 3, 8, 8)
    ep = torch.export.export(cat_mul, (x,))
    targets = [str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    assert "torchquant.cat.default" in targets and "torchquant.mul.default" in targets
    with context():
        assert torch.equal(ep.module()(x), cat_mul(x))
        x2 = torch.randn(2, 3, 8, 8) * 3  # saturates
        assert torch.equal(ep.module()(x2), cat_mul(x2))


def test_compile_fullgraph_float_functional_cat_and_mul(cat_mul):
    x = torch.randn(2, 3, 8, 8)
    compiled = torch.compile(cat_mul, fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), cat_mul(x))
