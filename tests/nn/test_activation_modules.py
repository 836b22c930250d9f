"""Quantized activation, dropout and stub modules against torch.ao.nn.quantized (torch 2.13).

Outputs must match torch's bit for bit (the numerics are pinned in test_functional.py; these
tests check that each module wires its qparams and options the way torch's does), and state
dicts must round-trip through torch.save / torch.load(weights_only=True).
"""
import io

import pytest
import torch
import torch.ao.nn.quantized as nnq
from torch.ao.quantization import MinMaxObserver, QConfig, QuantStub

import torchquant as tq
from torchquant.nn.quantized.modules import activation, dropout, stubs


def make_pair(shape, scale, zero_point, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, 256, shape, generator=gen) - zero_point).float() * scale
    return (torch.quantize_per_tensor(x, scale, zero_point, torch.quint8),
            tq.quantize_per_tensor(x, scale, zero_point, tq.quint8))


def assert_same(theirs, ours):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-12)
    assert ours.q_zero_point() == theirs.q_zero_point()
    assert torch.equal(ours.int_repr(), theirs.int_repr())


def observed(module, data=None):
    """A float module with a calibrated output observer, as prepare + calibration leave it."""
    module.activation_post_process = MinMaxObserver()
    module.activation_post_process(module(torch.randn(64) * 3 if data is None else data))
    return module


def roundtrip(module):
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


PAIRS = {
    "ReLU6": (lambda: nnq.ReLU6(), lambda: activation.ReLU6()),
    "Hardswish": (lambda: nnq.Hardswish(0.03, 7), lambda: activation.Hardswish(0.03, 7)),
    "ELU": (lambda: nnq.ELU(0.03, 7, 0.7), lambda: activation.ELU(0.03, 7, 0.7)),
    "LeakyReLU": (lambda: nnq.LeakyReLU(0.1, 3, 0.5), lambda: activation.LeakyReLU(0.1, 3, 0.5)),
    "Sigmoid": (lambda: nnq.Sigmoid(1 / 256, 0), lambda: activation.Sigmoid(1 / 256, 0)),
    "Softmax": (lambda: nnq.Softmax(1, 1 / 256, 0), lambda: activation.Softmax(1, 1 / 256, 0)),
    "Softmax_default_dim": (lambda: nnq.Softmax(None, 0.004, 3),
                            lambda: activation.Softmax(None, 0.004, 3)),
    "Dropout": (lambda: nnq.Dropout(0.4), lambda: dropout.Dropout(0.4)),
}


@pytest.mark.filterwarnings("ignore:Implicit dimension choice for softmax")
@pytest.mark.parametrize("name", list(PAIRS))
def test_module_matches_torch(name):
    make_theirs, make_ours = PAIRS[name]
    theirs_mod, ours_mod = make_theirs(), make_ours()
    assert ours_mod._get_name() == theirs_mod._get_name()
    for k, (scale, zero_point) in enumerate([(0.05, 101), (0.1, 30)]):
        theirs, ours = make_pair((2, 8, 9, 9), scale, zero_point, seed=k)
        assert_same(theirs_mod(theirs), ours_mod(ours))
        cl = torch.channels_last
        assert_same(theirs_mod(theirs.contiguous(memory_format=cl)),
                    ours_mod(ours.contiguous(memory_format=cl)))


@pytest.mark.parametrize("name,float_mod,theirs_cls,ours_cls", [
    ("Hardswish", torch.nn.Hardswish, nnq.Hardswish, activation.Hardswish),
    ("ELU", lambda: torch.nn.ELU(0.6), nnq.ELU, activation.ELU),
    ("LeakyReLU", lambda: torch.nn.LeakyReLU(0.2), nnq.LeakyReLU, activation.LeakyReLU),
    ("Sigmoid", torch.nn.Sigmoid, nnq.Sigmoid, activation.Sigmoid),
    ("Softmax", lambda: torch.nn.Softmax(dim=-1), nnq.Softmax, activation.Softmax),
    ("ReLU6", torch.nn.ReLU6, nnq.ReLU6, activation.ReLU6),
    ("Dropout", lambda: torch.nn.Dropout(0.3), nnq.Dropout, dropout.Dropout),
])
def test_from_float_matches_torch(name, float_mod, theirs_cls, ours_cls):
    mod = observed(float_mod())
    theirs_mod, ours_mod = theirs_cls.from_float(mod), ours_cls.from_float(mod)
    theirs, ours = make_pair((3, 40), 0.05, 120)
    assert_same(theirs_mod(theirs), ours_mod(ours))


def test_buffers_state_dict_and_roundtrip():
    """SPEC §15.2: scale float32 0-d and zero_point int64 0-d buffers where torch has them."""
    for mod, reference in ((activation.Hardswish(0.03, 7), nnq.Hardswish(0.03, 7)),
                           (activation.LeakyReLU(0.03, 7, 0.2), nnq.LeakyReLU(0.03, 7, 0.2))):
        state = mod.state_dict()
        assert list(state) == list(reference.state_dict()) == ["scale", "zero_point"]
        assert state["scale"].dtype == torch.float32 and state["scale"].dim() == 0
        assert state["zero_point"].dtype == torch.int64 and state["zero_point"].dim() == 0
        fresh = type(mod)(1.0, 0)
        fresh.load_state_dict(roundtrip(mod))
        assert float(fresh.scale) == float(mod.scale) and int(fresh.zero_point) == 7
    for mod in (activation.ELU(0.1, 2), activation.Sigmoid(1 / 256, 0), activation.ReLU6(),
                activation.Softmax(1), dropout.Dropout()):
        assert mod.state_dict() == {}


def test_prelu_matches_torch_and_roundtrips():
    weight = torch.tensor([0.25, -0.5, 0.125])
    for w_scale in (0.01, 0.5 / 255):  # the second one cannot represent 1.0 (torch clamps it)
        theirs_mod, ours_mod = nnq.PReLU(0.04, 90, 3), activation.PReLU(0.04, 90, 3)
        theirs_mod.set_weight(torch.quantize_per_tensor(weight, w_scale, 64, torch.quint8))
        ours_mod.set_weight(tq.quantize_per_tensor(weight, w_scale, 64, tq.quint8))
        theirs, ours = make_pair((2, 3, 5, 70), 0.05, 101)
        assert_same(theirs_mod(theirs), ours_mod(ours))
    fresh = activation.PReLU(0.04, 90, 3)
    fresh.load_state_dict(roundtrip(ours_mod))
    assert torch.equal(fresh.weight.int_repr(), ours_mod.weight.int_repr())
    assert fresh.weight.q_scale() == ours_mod.weight.q_scale()
    fresh.load_state_dict({"weight": theirs_mod.weight})  # a torch-quantized checkpoint
    assert torch.equal(fresh.weight.int_repr(), theirs_mod.weight.int_repr())


def test_prelu_from_float_matches_torch():
    mod = observed(torch.nn.PReLU(3), torch.randn(4, 3, 8) * 2)
    mod.qconfig = QConfig(activation=MinMaxObserver,
                          weight=MinMaxObserver.with_args(dtype=torch.quint8))
    theirs_mod, ours_mod = nnq.PReLU.from_float(mod), activation.PReLU.from_float(mod)
    theirs, ours = make_pair((4, 3, 8), 0.03, 120)
    assert_same(theirs_mod(theirs), ours_mod(ours))


def test_quantize_and_dequantize_stubs():
    x = torch.randn(4, 5) * 2
    mod = stubs.Quantize(0.05, 3, tq.qint8)
    state = mod.state_dict()
    assert state["scale"].shape == (1,) and state["scale"].dtype == torch.float32
    assert state["zero_point"].shape == (1,) and state["zero_point"].dtype == torch.int64
    assert torch.equal(mod(x).int_repr(), nnq.Quantize(0.05, 3, torch.qint8)(x).int_repr())
    assert "scale=tensor([0.0500]), zero_point=tensor([3]), dtype=torchquant.qint8" in repr(mod)
    fresh = stubs.Quantize(1.0, 0, tq.qint8)
    fresh.load_state_dict(roundtrip(mod))
    assert torch.equal(fresh(x).int_repr(), mod(x).int_repr())

    stub = QuantStub()
    stub.activation_post_process = MinMaxObserver()
    stub.activation_post_process(x)
    converted, reference = stubs.Quantize.from_float(stub), nnq.Quantize.from_float(stub)
    assert converted.dtype == tq.quint8
    assert torch.equal(converted(x).int_repr(), reference(x).int_repr())
    with pytest.raises(AssertionError, match="activation_post_process"):
        stubs.Quantize.from_float(torch.nn.Identity())

    q = converted(x)
    assert torch.equal(stubs.DeQuantize()(q), reference(x).dequantize())
    assert isinstance(stubs.DeQuantize.from_float(stub), stubs.DeQuantize)


def test_dropout_is_identity_and_relu6_inplace():
    _, q = make_pair((2, 3, 4), 0.05, 100)
    assert dropout.Dropout(0.9)(q) is q
    assert dropout.Dropout.from_float(torch.nn.Dropout(0.2, inplace=True)).inplace
    relu6 = activation.ReLU6(inplace=True)
    assert relu6(q) is q and int(q.int_repr().min()) >= 100
