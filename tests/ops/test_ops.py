"""The registered ``torch.ops.torchquant`` ops: schema and fake kernels (``opcheck``), and the
op equal to the eager function beside it (the same kernel call, so bit-exact)."""
import pytest
import torch

import torchquant as tq
from torchquant import ops
from torchquant.ops import conv as ops_conv
from torchquant.ops import linear as ops_linear


def _weight(shape, per_channel):
    w = torch.randint(-127, 128, shape, dtype=torch.int8)
    if per_channel:
        return w, torch.rand(shape[0], dtype=torch.float64) * 0.01 + 0.001, \
            torch.zeros(shape[0], dtype=torch.int64)
    return w, torch.tensor(0.004, dtype=torch.float64), torch.tensor(0)


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply to integer outputs
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_linear_op(per_channel, relu):
    w, s, z = _weight((6, 16), per_channel)
    bias = torch.randn(6)
    x = torch.randint(0, 128, (3, 16), dtype=torch.uint8)
    args = (x, 0.05, 3, w, s, z, bias, 0.2, 100, torch.uint8, "relu" if relu else "none")
    _opcheck(torch.ops.torchquant.linear.default, args)
    packed = ops_linear.pack_linear(w, s, z, bias)
    eager = ops_linear.linear(x, 0.05, 3, packed, 0.2, 100, torch.uint8,
                              "relu" if relu else "none")
    assert torch.equal(torch.ops.torchquant.linear(*args), eager)


@pytest.mark.parametrize("op", ["linear_dynamic", "linear_per_token_dynamic"])
def test_dynamic_linear_ops(op):
    w, s, z = _weight((6, 16), True)
    bias = torch.randn(6)
    x = torch.randn(2, 5, 16)
    extra = (True, False) if op == "linear_dynamic" else (False,)
    args = (x, w, s, z, bias, *extra)
    _opcheck(getattr(torch.ops.torchquant, op).default, args)
    packed = ops_linear.pack_linear(w, s, z, bias)
    eager = (ops_linear.linear_dynamic(x, packed, True, False) if op == "linear_dynamic"
             else ops_linear.linear_per_token_dynamic(x, packed, False))
    assert torch.equal(getattr(torch.ops.torchquant, op)(*args), eager)


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_op(channels_last):
    w, s, z = _weight((8, 4, 3, 3), True)
    x = torch.randint(0, 128, (2, 4, 9, 9), dtype=torch.uint8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    args = (x, 0.05, 3, w, s, z, None, 0, [2, 2], [1, 1], [1, 1], 1, 0.3, 10, "relu")
    _opcheck(torch.ops.torchquant.conv.default, args)
    packed = ops_conv.pack_conv_weight(w, s, z, 0, None, 2, 1, 1, 1)
    eager = ops_conv.conv(x, 0.05, 3, packed, 0.3, 10, "relu")
    assert torch.equal(torch.ops.torchquant.conv(*args), eager)


def test_add_and_quantize_ops():
    a = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    b = torch.randint(0, 256, (2, 3, 5, 5), dtype=torch.uint8)
    args = (a, 0.05, 120, b, 0.04, 130, 0.07, 125, "quint8", "relu")
    _opcheck(torch.ops.torchquant.add.default, args)
    assert torch.equal(torch.ops.torchquant.add(*args),
                       ops.binary.add(a, 0.05, 120, b, 0.04, 130, 0.07, 125, tq.quint8, True))
    x = torch.randn(4, 7)
    _opcheck(torch.ops.torchquant.quantize_per_tensor.default, (x, 0.02, 7, "qint8"))
    q = tq.quantize_per_tensor(x, 0.02, 7, tq.qint8)
    assert torch.equal(torch.ops.torchquant.quantize_per_tensor(x, 0.02, 7, "qint8"), q.int_repr())
    _opcheck(torch.ops.torchquant.dequantize_per_tensor.default, (q.int_repr(), 0.02, 7))
    assert torch.equal(torch.ops.torchquant.dequantize_per_tensor(q.int_repr(), 0.02, 7),
                       q.dequantize())


def test_pack_cache_rebuilds_after_an_in_place_weight_change():
    w, s, z = _weight((4, 8), False)
    x = torch.randn(3, 8)
    before = torch.ops.torchquant.linear_dynamic(x, w, s, z, None, True, False)
    w.neg_()
    after = torch.ops.torchquant.linear_dynamic(x, w, s, z, None, True, False)
    assert torch.allclose(after, -before, atol=1e-6)
