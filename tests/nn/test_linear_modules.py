"""Quantized Linear / LinearReLU / LinearLeakyReLU / LinearTanh and functional linear against
torch 2.13 (engine x86).

Both sides compute the same integer accumulator; they differ only in how the float
requantization rounds: torch's fbgemm multiplies by a float32 ``x_scale * w_scale /
out_scale`` and our kernels by a differently associated product (oneDNN) or a float32
epilogue (``_int_mm``).  A value within float rounding of a .5 tie can then land one step
apart, so outputs may differ by one LSB on at most 1 % of the elements.
"""
import contextlib
import copy
import io

import pytest
import torch
import torch.ao.nn.intrinsic as ao_nni
import torch.ao.nn.intrinsic.quantized as ao_nniq
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.functional as ao_qF
import torch.ao.quantization as ao_q

import torchquant as tq
import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.functional as qF
import torchquant.quantization as tqq
from torchquant import kernels

from conftest import oracle_input


@contextlib.contextmanager
def engine(name):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def assert_close_int(theirs, ours, max_frac=0.01):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-7)
    assert ours.q_zero_point() == theirs.q_zero_point()
    a, b = theirs.int_repr().long(), ours.int_repr().long()
    assert a.shape == b.shape
    diff = (a - b).abs()
    assert int(diff.max()) <= 1
    assert float((diff > 0).float().mean()) <= max_frac


def observe(ao_mod, tq_mod, ao_qconfig, tq_qconfig, data):
    """Attach output observers from the two qconfigs and run the same calibration data."""
    ao_mod.qconfig, tq_mod.qconfig = ao_qconfig, tq_qconfig
    ao_mod.activation_post_process = ao_qconfig.activation()
    tq_mod.activation_post_process = tq_qconfig.activation()
    with torch.no_grad():
        ao_mod.activation_post_process(ao_mod(data))
        tq_mod.activation_post_process(tq_mod(data))


def quantized_inputs(x, scale=0.05, zero_point=64):
    return (torch.quantize_per_tensor(x, scale, zero_point, torch.quint8),
            tq.quantize_per_tensor(x, scale, zero_point, tq.quint8))


def oracle_inputs(x, scale=0.05, zero_point=64):
    """:func:`quantized_inputs` for a comparison with torch's x86 / fbgemm / onednn GEMM or
    conv: where those saturate int16 pairs of u8 x s8 products (CPUs without VNNI, see
    tests/conftest.py) ``x`` is clamped to what quantizes to at most 127, which torch computes
    exactly; unchanged elsewhere."""
    return quantized_inputs(oracle_input(x, scale, zero_point), scale, zero_point)


QCONFIGS = [
    pytest.param(ao_q.get_default_qconfig("x86"), tqq.get_default_qconfig("x86"), id="x86"),
    pytest.param(ao_q.default_qconfig, tqq.default_qconfig, id="per-tensor"),
    pytest.param(ao_q.get_default_qconfig("qnnpack"), tqq.get_default_qconfig("qnnpack"),
                 id="qnnpack"),
]


def make_linear(cls_ao, cls_tq, in_f=64, out_f=48, bias=True, *extra):
    torch.manual_seed(1)
    float_mod = torch.nn.Linear(in_f, out_f, bias=bias)
    ao_float = cls_ao(float_mod, *extra) if cls_ao else float_mod
    tq_linear = copy.deepcopy(float_mod)
    tq_float = cls_tq(tq_linear, *extra) if cls_tq else tq_linear
    return ao_float, tq_float


@pytest.mark.parametrize("ao_qc,tq_qc", QCONFIGS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 7, 64])
def test_linear_matches_torch(ao_qc, tq_qc, bias, rows):
    ao_float, tq_float = make_linear(None, None, bias=bias)
    data = torch.randn(128, 64) * 2
    observe(ao_float, tq_float, ao_qc, tq_qc, data)
    ao_mod = ao_nnq.Linear.from_float(ao_float)
    tq_mod = nnq.Linear.from_float(tq_float)
    assert torch.equal(tq_mod.weight().int_repr(), ao_mod.weight().int_repr())
    x = torch.randn(rows, 64) * 2
    ao_x, tq_x = oracle_inputs(x)
    with engine("x86"):
        theirs = ao_mod(ao_x)
    assert_close_int(theirs, tq_mod(tq_x))
    assert repr(tq_mod).startswith("QuantizedLinear(in_features=64, out_features=48")


def test_linear_batched_input_and_reference_kernel_agree():
    ao_float, tq_float = make_linear(None, None)
    data = torch.randn(64, 64)
    observe(ao_float, tq_float, ao_q.default_per_channel_qconfig,
            tqq.default_per_channel_qconfig, data)
    tq_mod = nnq.Linear.from_float(tq_float)
    _, x = quantized_inputs(torch.randn(3, 5, 64))
    fast = tq_mod(x)
    with kernels.reference_only():
        ref = tq_mod(x)
    assert fast.shape == (3, 5, 48)
    diff = (fast.int_repr().long() - ref.int_repr().long()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01


@pytest.mark.parametrize("kind", ["relu", "leaky", "tanh"])
def test_fused_linear_matches_torch(kind):
    fused, quantized, extra = {  # (torch's, ours) pairs
        "relu": ((ao_nni.LinearReLU, nni.LinearReLU), (ao_nniq.LinearReLU, nniq.LinearReLU),
                 torch.nn.ReLU()),
        "leaky": ((ao_nni.LinearLeakyReLU, nni.LinearLeakyReLU),
                  (ao_nniq.LinearLeakyReLU, nniq.LinearLeakyReLU), torch.nn.LeakyReLU(0.2)),
        "tanh": ((ao_nni.LinearTanh, nni.LinearTanh), (ao_nniq.LinearTanh, nniq.LinearTanh),
                 torch.nn.Tanh()),
    }[kind]
    ao_float, tq_float = make_linear(fused[0], fused[1], 64, 48, True, extra)
    data = torch.randn(128, 64)
    ao_qc = ao_q.QConfig(activation=ao_q.MinMaxObserver.with_args(reduce_range=False),
                         weight=ao_q.default_per_channel_weight_observer)
    tq_qc = tqq.QConfig(activation=tqq.MinMaxObserver.with_args(reduce_range=False),
                        weight=tqq.default_per_channel_weight_observer)
    observe(ao_float, tq_float, ao_qc, tq_qc, data)
    ao_float[0].qconfig = ao_float.qconfig  # what propagate_qconfig_ does
    ao_x, tq_x = oracle_inputs(torch.randn(16, 64))
    with engine("onednn"):  # torch packs the weight for the engine current at from_float
        ao_mod = quantized[0].from_float(ao_float)
        theirs = ao_mod(ao_x)
    tq_mod = quantized[1].from_float(tq_float)
    assert_close_int(theirs, tq_mod(tq_x))
    assert tq_mod._get_name() == ao_mod._get_name()


def test_state_dict_keys_and_weights_only_round_trip():
    _, tq_float = make_linear(None, None)
    tq_float.qconfig = tqq.get_default_qconfig("x86")
    tq_float.activation_post_process = tq_float.qconfig.activation()
    tq_float.activation_post_process(tq_float(torch.randn(32, 64)))
    mod = nnq.Linear.from_float(tq_float)
    assert list(mod.state_dict()) == list(ao_nnq.Linear(64, 48).state_dict())
    buf = io.BytesIO()
    torch.save(mod.state_dict(), buf)
    buf.seek(0)
    fresh = nnq.Linear(64, 48)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    _, x = quantized_inputs(torch.randn(4, 64))
    assert torch.equal(fresh(x).int_repr(), mod(x).int_repr())
    assert fresh.scale == mod.scale and fresh.zero_point == mod.zero_point
    assert torch.equal(fresh.weight().int_repr(), mod.weight().int_repr())
    assert torch.equal(fresh.weight().q_per_channel_scales(), mod.weight().q_per_channel_scales())


def test_load_state_dict_with_wrong_shape_raises():
    sd = nnq.Linear(8, 4).state_dict()
    with pytest.raises(RuntimeError, match="size mismatch"):
        nnq.Linear(8, 5).load_state_dict(sd)


def test_bad_inputs_raise():
    mod = nnq.Linear(8, 4)
    with pytest.raises(ValueError, match="must be quantized"):
        mod(torch.randn(2, 8))
    _, x = quantized_inputs(torch.randn(2, 6))
    with pytest.raises(ValueError, match="in_features=8"):
        mod(x)
    with pytest.raises(TypeError, match="qint8"):
        mod.set_weight_bias(tq.quantize_per_tensor(torch.randn(4, 8), 0.1, 0, tq.quint8), None)
    with pytest.raises(TypeError):
        nnq.Linear(8, 4, dtype=tq.quint8)
    float_mod = torch.nn.Linear(8, 4)
    with pytest.raises(AssertionError, match="qconfig"):
        nnq.Linear.from_float(float_mod)
    with pytest.raises(AssertionError, match="only works for"):
        nnq.Linear.from_float(torch.nn.Conv2d(1, 1, 1))


def test_functional_linear_matches_torch():
    w = torch.randn(16, 32)
    ao_w = torch.quantize_per_tensor(w, 0.02, 0, torch.qint8)
    tq_w = tq.quantize_per_tensor(w, 0.02, 0, tq.qint8)
    b = torch.randn(16)
    ao_x, tq_x = oracle_inputs(torch.randn(8, 32), 0.03, 100)
    with engine("x86"):
        theirs = ao_qF.linear(ao_x, ao_w, b, 0.2, 60)
    assert_close_int(theirs, qF.linear(tq_x, tq_w, b, 0.2, 60))
