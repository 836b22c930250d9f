"""FloatFunctional / FXFloatFunctional / QFunctional against torch.ao.nn.quantized (torch 2.13).

QFunctional's quantized add / mul / cat / ... must match torch's bit for bit.  The operands
use related scales (equal, or output = 2 x input) so that many sums land exactly on rounding
ties, where torch's SIMD body and scalar tail round differently; sizes and layouts vary so
both paths (and the channels-last cat fast path) are exercised.
"""
import io

import pytest
import torch
import torch.ao.nn.quantized as nnq
from torch.ao.quantization import MinMaxObserver

import torchquant as tq
from torchquant.nn.quantized import _binary
from torchquant.nn.quantized.modules.functional_modules import (FloatFunctional,
                                                                 FXFloatFunctional, QFunctional)

TORCH_DTYPE = {tq.quint8: torch.quint8, tq.qint8: torch.qint8}


def make_pair(shape, scale, zero_point, qdtype=tq.quint8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ints = torch.randint(qdtype.qmin, qdtype.qmax + 1, shape, generator=gen)
    x = (ints - zero_point).float() * scale
    return (torch.quantize_per_tensor(x, scale, zero_point, TORCH_DTYPE[qdtype]),
            tq.quantize_per_tensor(x, scale, zero_point, qdtype))


def assert_same(theirs, ours):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-12)
    assert ours.q_zero_point() == theirs.q_zero_point()
    mismatch = (ours.int_repr() != theirs.int_repr()).sum().item()
    assert mismatch == 0, f"{mismatch} of {ours.numel()} elements differ"


def functional_pair(scale, zero_point):
    theirs, ours = nnq.QFunctional(), QFunctional()
    theirs.scale = ours.scale = scale
    theirs.zero_point = ours.zero_point = zero_point
    return theirs, ours


LAYOUTS = {"contiguous": lambda t: t,
           "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
           "transposed": lambda t: t.transpose(-1, -2)}
# (scale_a, scale_b, out_scale): tie-rich relations and an unrelated one
SCALES = [(0.05, 0.05, 0.1), (0.1, 0.1, 0.1), (0.025, 0.05, 0.05), (0.0731, 0.0123, 0.07)]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5, 7), (2, 16, 9, 9), (2, 8, 50, 50)],
                         ids=["small", "medium", "threaded"])
@pytest.mark.parametrize("op", ["add", "add_relu", "mul"])
def test_binary_ops_bit_exact(op, shape, qdtype):
    offset = -128 if qdtype is tq.qint8 else 0
    for k, (scale_a, scale_b, out_scale) in enumerate(SCALES):
        if op == "mul":
            out_scale = out_scale * scale_b * 3
        theirs_f, ours_f = functional_pair(out_scale, 77 + offset)
        ta, oa = make_pair(shape, scale_a, 101 + offset + k, qdtype, seed=k)
        tb, ob = make_pair(shape, scale_b, 30 + offset + k, qdtype, seed=k + 10)
        for name, view in LAYOUTS.items():
            assert_same(getattr(theirs_f, op)(view(ta), view(tb)),
                        getattr(ours_f, op)(view(oa), view(ob)))
        # mixed layouts and broadcasting
        cl = torch.channels_last
        assert_same(getattr(theirs_f, op)(ta.contiguous(memory_format=cl), tb),
                    getattr(ours_f, op)(oa.contiguous(memory_format=cl), ob))
        assert_same(getattr(theirs_f, op)(ta, tb[:1]), getattr(ours_f, op)(oa, ob[:1]))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
def test_scalar_ops_bit_exact(qdtype):
    """add_scalar shifts the zero point (or widens the scale at the range's ends); mul_scalar
    scales the scale and mirrors the integers for negative factors."""
    offset = -128 if qdtype is tq.qint8 else 0
    theirs_f, ours_f = functional_pair(1.0, 0)
    for k, scale in enumerate((0.05, 0.0137, 0.1)):
        theirs, ours = make_pair((3, 70), scale, 100 + offset, qdtype, seed=k)
        for value in (0.3, -0.3, 0.075, 2.0, -5.0, 7.7, -7.7, 0.0, 1e-4):
            assert_same(theirs_f.add_scalar(theirs, value), ours_f.add_scalar(ours, value))
            assert_same(torch.ops.quantized.add_scalar_relu(theirs, value),
                        _binary.add_scalar(ours, value, relu=True))
            assert_same(theirs_f.mul_scalar(theirs, value), ours_f.mul_scalar(ours, value))


@pytest.mark.parametrize("shapes,dim,channels_last", [
    (((2, 3, 4, 5), (2, 5, 4, 5)), 1, False),
    (((2, 12, 4, 5), (2, 21, 4, 5)), 1, True),   # torch's channels-last fast path
    (((2, 12, 4, 5), (2, 21, 4, 5)), -3, True),  # same data, general path
    (((2, 3, 4, 5), (2, 3, 4, 5)), 0, True),
    (((3, 4), (3, 9)), 1, False),
])
def test_cat_bit_exact(shapes, dim, channels_last):
    for k, (scale_a, scale_b, out_scale) in enumerate(SCALES):
        theirs_f, ours_f = functional_pair(out_scale, 20 + k)
        ta, oa = make_pair(shapes[0], scale_a, 101 + k, seed=k)
        tb, ob = make_pair(shapes[1], scale_b, 30, seed=k + 10)
        if channels_last:
            ta, oa, tb, ob = [t.contiguous(memory_format=torch.channels_last)
                              for t in (ta, oa, tb, ob)]
        assert_same(theirs_f.cat([ta, tb], dim), ours_f.cat([oa, ob], dim))


def test_matmul_bit_exact():
    theirs_f, ours_f = functional_pair(0.2, 10)
    ta, oa = make_pair((2, 4, 16, 32), 0.05, 101)
    tb, ob = make_pair((2, 4, 32, 16), 0.04, 90, seed=1)
    assert_same(theirs_f.matmul(ta, tb), ours_f.matmul(oa, ob))


def test_qfunctional_state_dict_repr_and_from_float():
    _, ours_f = functional_pair(0.25, 7)
    assert repr(ours_f) == ("QFunctional(\n  scale=0.25, zero_point=7\n"
                            "  (activation_post_process): Identity()\n)")
    buffer = io.BytesIO()
    torch.save(ours_f.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    assert list(state) == ["scale", "zero_point"]
    assert state["scale"].dtype == torch.float32 and state["scale"].dim() == 0
    assert state["zero_point"].dtype == torch.int64 and state["zero_point"].dim() == 0
    fresh = QFunctional()
    fresh.load_state_dict(state)
    assert (fresh.scale, fresh.zero_point) == (0.25, 7)

    observed = FloatFunctional()
    observed.activation_post_process = MinMaxObserver()
    x, y = torch.randn(4, 5), torch.randn(4, 5)
    observed.add(x, y)
    converted, reference = QFunctional.from_float(observed), nnq.QFunctional.from_float(
        _torch_float_functional(observed.activation_post_process))
    assert (converted.scale, converted.zero_point) == (reference.scale, reference.zero_point)
    with pytest.raises(AssertionError, match="FloatFunctional"):
        QFunctional.from_float(FXFloatFunctional())


def _torch_float_functional(observer):
    mod = nnq.FloatFunctional()
    mod.activation_post_process = observer
    return mod


def test_float_functional_ops_and_observer_hook():
    seen = []

    class Recorder(torch.nn.Module):
        def forward(self, t):
            seen.append(t.shape)
            return t

    ff, fx = FloatFunctional(), FXFloatFunctional()
    ff.activation_post_process = Recorder()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    for mod in (ff, fx):
        assert torch.equal(mod.add(x, y), x + y)
        assert torch.equal(mod.add_scalar(x, 2.0), x + 2.0)
        assert torch.equal(mod.mul(x, y), x * y)
        assert torch.equal(mod.mul_scalar(x, 2.0), x * 2.0)
        assert torch.equal(mod.cat([x, y], 1), torch.cat([x, y], 1))
        assert torch.equal(mod.add_relu(x, y), torch.relu(x + y))
        assert torch.equal(mod.matmul(x, y.t()), x @ y.t())
        with pytest.raises(RuntimeError, match="not intended to use the 'forward'"):
            mod(x)
    assert len(seen) == 5  # add, mul, cat, add_relu, matmul; the scalar ops are not observed
    assert not hasattr(fx, "activation_post_process")
    assert not isinstance(ff, FXFloatFunctional)


@pytest.mark.parametrize("op", ["add", "add_relu", "mul"])
def test_per_channel_inputs_raise_runtime_error_as_torch(op):
    """torch's quantized add / mul refuse per-channel inputs with a RuntimeError; ours too
    (NotImplementedError, a RuntimeError), naming the op and the scheme (add raised a
    scalar-conversion ValueError from deep inside before)."""
    x = torch.randn(4, 3)
    scales, zps = torch.tensor([0.1, 0.2, 0.3]), torch.tensor([0, 0, 0])
    q_torch = torch.quantize_per_channel(x, scales, zps, 1, torch.qint8)
    with pytest.raises(RuntimeError):
        getattr(nnq.QFunctional(), op)(q_torch, q_torch)
    q = tq.quantize_per_channel(x, scales, zps, 1, tq.qint8)
    with pytest.raises(RuntimeError, match=f"quantized.{op} supports per-tensor"):
        getattr(QFunctional(), op)(q, q)
