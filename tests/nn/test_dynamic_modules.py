"""Dynamic quantized Linear / LinearReLU / LSTM / GRU / cells against torch.ao (engine x86).

Both sides are built with ``from_float`` from the same float module and equivalent qconfigs.
Our kernels reproduce fbgemm's arithmetic (same activation qparams, same int8 weights, exact
integer accumulation, one float epilogue), so the outputs agree to float rounding -- a few ulps
after a 64-step recurrence.  The tests assert that (max |diff| <= 1e-5 relative to the output
range) as well as the brief's SQNR floors (>= 35 dB vs torch, >= 25 dB vs float).

Two CPU dependencies of torch's side (see tests/conftest.py): on CPUs without VNNI / AMX its
fbgemm GEMM saturates int16 pairs of u8 x s8 products once activations exceed 128
(reduce_range=False), and its fp16 GEMM sums in another order than ours
(conftest.assert_fp16_linear_close).
"""
import copy
import io

import pytest
import torch
import torch.ao.nn.intrinsic as ao_nni
import torch.ao.nn.intrinsic.quantized.dynamic as ao_nniqd
import torch.ao.nn.quantized.dynamic as ao_nnqd
import torch.ao.quantization as aoq
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchquant as tq
import torchquant.kernels as tqk
import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.quantized.dynamic as nniqd
import torchquant.nn.quantized.dynamic as nnqd
import torchquant.quantization as tqq

from conftest import assert_fp16_linear_close


@pytest.fixture(autouse=True)
def _x86_engine():
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    yield
    torch.backends.quantized.engine = old


def sqnr(ours, ref):
    ours, ref = ours.detach().float(), ref.detach().float()
    err = (ours - ref).norm()
    return float("inf") if err == 0 else float(20 * torch.log10(ref.norm() / err))


def with_qconfig(mod, qconfig):
    mod = copy.deepcopy(mod)
    mod.qconfig = qconfig
    return mod


def assert_close_to_torch(ours, theirs, flt=None, rel=1e-5, min_float_db=25.0):
    """Near bit-exact vs torch; the brief's SQNR floors too."""
    scale = theirs.abs().max().clamp_min(1e-6)
    assert (ours - theirs).abs().max() <= rel * scale
    assert sqnr(ours, theirs) >= 35
    if flt is not None:
        assert sqnr(ours, flt) >= min_float_db


def ao_fused(lin, qconfig):
    """torch's LinearReLU.from_float reads the qconfig off child 0: set it on both."""
    fused = with_qconfig(ao_nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), qconfig)
    fused[0].qconfig = qconfig
    return fused


def roundtrip(mod, fresh):
    buf = io.BytesIO()
    torch.save(mod.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    fresh.load_state_dict(state)
    return fresh


QCONFIGS = {  # ours, torch's
    "per_tensor": (tqq.default_dynamic_qconfig, aoq.default_dynamic_qconfig),
    "per_channel": (tqq.per_channel_dynamic_qconfig, aoq.per_channel_dynamic_qconfig),
}


# --------------------------------------------------------------------------------------------
# Linear
# --------------------------------------------------------------------------------------------

def torch_dynamic_truth(x, theirs, reduce_range):
    """torch's dynamic Linear with an exact integer GEMM: ``x`` quantized by torch itself
    (``_choose_qparams_per_tensor`` + ``quantize_per_tensor``, quint8), then the float64
    ``linear`` of the dequantized activations and weights.  It agrees with fbgemm where
    fbgemm is exact (measured: <= 2e-7 relative on these shapes, reduce_range=True)."""
    x2d = x.reshape(-1, x.shape[-1])
    scale, zero_point = torch._choose_qparams_per_tensor(x2d, reduce_range)
    x_hat = torch.quantize_per_tensor(x2d, scale, zero_point, torch.quint8).dequantize()
    y = F.linear(x_hat.double(), theirs.weight().dequantize().double(), theirs.bias().double())
    return y.float().reshape(*x.shape[:-1], -1)


@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("reduce_range", [True, False])
@pytest.mark.parametrize("shape", [(1, 96), (16, 96), (4, 7, 96)])
def test_linear_matches_torch(qconfig, reduce_range, shape, torch_oracle_exact_u8):
    lin = nn.Linear(96, 40)
    x = torch.randn(*shape) * 2 + 0.3
    ours = nnqd.Linear.from_float(with_qconfig(lin, QCONFIGS[qconfig][0]))
    theirs = ao_nnqd.Linear.from_float(with_qconfig(lin, QCONFIGS[qconfig][1]))
    assert torch.equal(ours.weight().int_repr(), theirs.weight().int_repr())
    ours.reduce_range = reduce_range
    with torch.no_grad():
        if reduce_range or torch_oracle_exact_u8:
            ref = torch.ops.quantized.linear_dynamic(x, theirs._packed_params._packed_params,
                                                     reduce_range)
        else:  # activations up to 255: fbgemm saturates int16 pairs on this CPU (no VNNI)
            ref = torch_dynamic_truth(x, theirs, reduce_range)
        assert_close_to_torch(ours(x), ref, lin(x))
        if reduce_range:  # the module's own default is torch's module
            assert_close_to_torch(ours(x), theirs(x))


def test_linear_reduce_range_false_is_qnnpack():
    lin = nn.Linear(64, 32)
    x = torch.randn(8, 64)
    ours = nnqd.Linear.from_float(with_qconfig(lin, tqq.default_dynamic_qconfig))
    ours.reduce_range = False
    torch.backends.quantized.engine = "qnnpack"
    theirs = ao_nnqd.Linear.from_float(with_qconfig(lin, aoq.default_dynamic_qconfig))
    with torch.no_grad():
        assert_close_to_torch(ours(x), theirs(x))


@pytest.mark.parametrize("rows", [8, 64])
@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
def test_linear_384_bit_exact_with_torch(rows, qconfig):
    """Issue 27's case (MiniLM's Linear(384, 384)): bit for bit torch.ao's, on every path --
    the exact accumulator (oneDNN, its two halves, or the small-M float32 GEMM) followed by
    fbgemm's epilogue ``fma(acc, x_scale * w_scale, bias)``; oneDNN's own epilogue (multiply,
    then add) left 36-59 % of outputs an ulp off.  reduce_range activations: torch.ao is exact
    on every CPU."""
    lin = nn.Linear(384, 384)
    x = torch.randn(rows, 384)
    ours = nnqd.Linear.from_float(with_qconfig(lin, QCONFIGS[qconfig][0]))
    theirs = ao_nnqd.Linear.from_float(with_qconfig(lin, QCONFIGS[qconfig][1]))
    with torch.no_grad():
        assert torch.equal(ours(x), theirs(x))
        relu_ours = nniqd.LinearReLU.from_float(with_qconfig(
            nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), QCONFIGS[qconfig][0]))
        relu_theirs = ao_nniqd.LinearReLU.from_float(ao_fused(lin, QCONFIGS[qconfig][1]))
        assert torch.equal(relu_ours(x), relu_theirs(x))


def test_linear_float16_and_relu():
    lin = nn.Linear(48, 24)
    lin.weight.data[0, 0] = 1e6  # saturates to float16's max, as torch's fp16 prepack
    x = torch.randn(5, 48)
    ours = nnqd.Linear.from_float(with_qconfig(lin, tqq.float16_dynamic_qconfig))
    theirs = ao_nnqd.Linear.from_float(with_qconfig(lin, aoq.float16_dynamic_qconfig))
    weight16 = theirs.weight().float()
    with torch.no_grad():
        assert_fp16_linear_close(ours(x), theirs(x), x, weight16)
    assert torch.equal(ours.weight(), theirs.weight())
    assert repr(ours) == ("DynamicQuantizedLinear(in_features=48, out_features=24, "
                          "dtype=torch.float16)")
    fused_ours = nniqd.LinearReLU.from_float(
        with_qconfig(nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), tqq.default_dynamic_qconfig))
    fused_theirs = ao_nniqd.LinearReLU.from_float(ao_fused(lin, aoq.default_dynamic_qconfig))
    with torch.no_grad():
        y = fused_ours(x)
        assert_close_to_torch(y, fused_theirs(x))
        assert (y >= 0).all() and (y == 0).any()
    assert fused_ours._get_name() == "DynamicQuantizedLinearReLU"
    fp16_relu = nniqd.LinearReLU.from_float(
        with_qconfig(nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), tqq.float16_dynamic_qconfig))
    fp16_theirs = ao_nniqd.LinearReLU.from_float(ao_fused(lin, aoq.float16_dynamic_qconfig))
    with torch.no_grad():
        assert_fp16_linear_close(fp16_relu(x), fp16_theirs(x), x, weight16)


def test_linear_repr_state_dict_and_roundtrip():
    lin = nn.Linear(20, 10)
    for qconfig, dtype in ((tqq.per_channel_dynamic_qconfig, tq.qint8),
                           (tqq.float16_dynamic_qconfig, torch.float16)):
        ours = nnqd.Linear.from_float(with_qconfig(lin, qconfig))
        theirs = ao_nnqd.Linear.from_float(with_qconfig(
            lin, aoq.per_channel_dynamic_qconfig if dtype is tq.qint8
            else aoq.float16_dynamic_qconfig))
        assert list(ours.state_dict()) == list(theirs.state_dict())
        fresh = roundtrip(ours, nnqd.Linear(20, 10, dtype=dtype))
        x = torch.randn(3, 20)
        assert torch.equal(fresh(x), ours(x))
        assert torch.equal(fresh.bias(), ours.bias())
    q = nnqd.Linear.from_float(with_qconfig(lin, tqq.default_dynamic_qconfig))
    assert ours._get_name() == "DynamicQuantizedLinear"
    assert repr(q) == ("DynamicQuantizedLinear(in_features=20, out_features=10, "
                       "dtype=torchquant.qint8, qscheme=torchquant.per_tensor_affine)")
    assert torch.equal(q.weight().int_repr(), q.state_dict()["_packed_params._packed_params"][0]
                       .int_repr())


def test_linear_from_float_sources_and_errors():
    lin = nn.Linear(8, 4)
    # qconfig None -> default_dynamic_qconfig; a missing qconfig attribute is an error
    q = nnqd.Linear.from_float(with_qconfig(lin, None))
    assert q.weight().qscheme() == tq.per_tensor_affine
    with pytest.raises(AssertionError, match="qconfig"):
        nnqd.Linear.from_float(copy.deepcopy(lin))
    fused = with_qconfig(nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), tqq.default_dynamic_qconfig)
    assert type(nnqd.Linear.from_float(fused)) is nnqd.Linear  # torch accepts it too
    with pytest.raises(AssertionError, match="only works for"):
        nniqd.LinearReLU.from_float(with_qconfig(lin, tqq.default_dynamic_qconfig))
    with pytest.raises(AssertionError, match="only works for"):
        nnqd.Linear.from_float(with_qconfig(nn.Conv1d(1, 1, 1), tqq.default_dynamic_qconfig))
    quint8_weights = tqq.QConfig(activation=tqq.default_dynamic_quant_observer,
                                 weight=tqq.MinMaxObserver.with_args(dtype=tq.quint8))
    with pytest.raises(AssertionError, match="qint8 and float16"):
        nnqd.Linear.from_float(with_qconfig(lin, quint8_weights))
    with pytest.raises(RuntimeError, match="qint8 or float16"):
        nnqd.Linear(8, 4, dtype=tq.quint8)
    with pytest.raises(TypeError, match="float input"):
        q(tq.quantize_per_tensor(torch.randn(2, 8), 0.1, 0, tq.quint8))
    with pytest.raises(ValueError, match="in_features=8"):
        q(torch.randn(2, 9))
    qat = tq.nn.qat.dynamic.Linear(8, 4, qconfig=tqq.default_dynamic_qat_qconfig)
    assert type(nnqd.Linear.from_float(qat)) is nnqd.Linear


def test_per_token_qconfig():
    lin = nn.Linear(128, 64)
    x = torch.randn(32, 128) * torch.logspace(-2, 1, 32).unsqueeze(1)  # rows of very different range
    tok = nnqd.Linear.from_float(with_qconfig(lin, tqq.per_token_dynamic_qconfig))
    per_tensor = nnqd.Linear.from_float(with_qconfig(lin, tqq.default_dynamic_qconfig))
    assert tok.per_token and "activation=per_token_symmetric" in repr(tok)
    assert tok.weight().qscheme() == tq.per_channel_affine
    observer = tqq.per_token_dynamic_qconfig.activation()
    assert observer.is_per_token and observer.is_dynamic and observer.dtype is tq.qint8
    with torch.no_grad():
        y_float = lin(x)
        assert sqnr(tok(x), y_float) >= 35
        assert sqnr(tok(x), y_float) > sqnr(per_tensor(x), y_float) + 5
        relu = nniqd.LinearReLU.from_float(with_qconfig(
            nni.LinearReLU(copy.deepcopy(lin), nn.ReLU()), tqq.per_token_dynamic_qconfig))
        assert torch.equal(relu(x), torch.relu(tok(x)))
    fresh = roundtrip(tok, nnqd.Linear(128, 64, per_token=True))
    assert torch.equal(fresh(x), tok(x))


def test_fast_kernels_match_reference():
    lin = nn.Linear(64, 48)
    lstm = nn.LSTM(16, 24)
    x, xs = torch.randn(12, 64), torch.randn(6, 3, 16)
    mods = [nnqd.Linear.from_float(with_qconfig(lin, tqq.default_dynamic_qconfig)),
            nnqd.Linear.from_float(with_qconfig(lin, tqq.per_token_dynamic_qconfig)),
            nnqd.LSTM.from_float(with_qconfig(lstm, tqq.per_channel_dynamic_qconfig))]
    with torch.no_grad():
        fast = [mods[0](x), mods[1](x), mods[2](xs)[0]]
        with tqk.reference_only():
            ref = [mods[0](x), mods[1](x), mods[2](xs)[0]]
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------------------------
# LSTM / GRU
# --------------------------------------------------------------------------------------------

def _pair(mode, qconfig, **kwargs):
    flt = getattr(nn, mode)(24, 32, **kwargs).eval()
    ours = getattr(nnqd, mode).from_float(with_qconfig(flt, QCONFIGS[qconfig][0]))
    theirs = getattr(ao_nnqd, mode).from_float(with_qconfig(flt, QCONFIGS[qconfig][1]))
    return flt, ours, theirs


def _h(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
@pytest.mark.parametrize("kwargs", [{}, {"num_layers": 2, "bidirectional": True},
                                    {"batch_first": True, "num_layers": 2}])
def test_rnn_matches_torch(mode, qconfig, kwargs):
    flt, ours, theirs = _pair(mode, qconfig, **kwargs)
    x = torch.randn(5, 20, 24) if kwargs.get("batch_first") else torch.randn(20, 5, 24)
    layers = flt.num_layers * (2 if flt.bidirectional else 1)
    h0 = torch.randn(layers, 5, 32) * 0.5
    hx = (h0, torch.randn(layers, 5, 32) * 0.5) if mode == "LSTM" else h0
    with torch.no_grad():
        for given in (None, hx):
            (y, h), (y_t, h_t), (y_f, h_f) = ours(x, given), theirs(x, given), flt(x, given)
            assert y.shape == y_f.shape
            assert_close_to_torch(y, y_t, y_f)
            assert_close_to_torch(_h(h), _h(h_t), _h(h_f))
            if mode == "LSTM":
                assert_close_to_torch(h[1], h_t[1], h_f[1])


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_rnn_packed_sequence(mode, bidirectional):
    flt, ours, theirs = _pair(mode, "per_tensor", num_layers=2, bidirectional=bidirectional)
    x = torch.randn(9, 4, 24)
    lengths = torch.tensor([6, 9, 2, 5])
    packed = pack_padded_sequence(x, lengths, enforce_sorted=False)
    layers = 4 if bidirectional else 2
    h0 = torch.randn(layers, 4, 32) * 0.5
    hx = (h0, h0 * 0.3) if mode == "LSTM" else h0
    with torch.no_grad():
        for given in (None, hx):
            (y, h), (y_t, h_t), (y_f, h_f) = ours(packed, given), theirs(packed, given), \
                flt(packed, given)
            assert isinstance(y, torch.nn.utils.rnn.PackedSequence)
            assert torch.equal(y.batch_sizes, y_f.batch_sizes)
            assert_close_to_torch(y.data, y_t.data, y_f.data)
            assert_close_to_torch(_h(h), _h(h_t), _h(h_f))
            padded, out_lengths = pad_packed_sequence(y)
            assert torch.equal(out_lengths, lengths)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_rnn_float16(mode):
    flt = getattr(nn, mode)(24, 32, num_layers=2).eval()
    ours = getattr(nnqd, mode).from_float(with_qconfig(flt, tqq.float16_dynamic_qconfig))
    theirs = getattr(ao_nnqd, mode).from_float(with_qconfig(flt, aoq.float16_dynamic_qconfig))
    x = torch.randn(10, 3, 24)
    with torch.no_grad():
        assert_close_to_torch(ours(x)[0], theirs(x)[0], flt(x)[0], rel=1e-6)
    assert "dtype=torch.float16" in repr(ours)


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_rnn_realistic_scale(mode):
    """Hidden 256, 2 layers, 40 steps.  Over a long recurrence an ulp of difference in a gate
    would eventually move one hidden value across a quantization tie and from there the runs
    drift apart by quantization steps; the projections use fbgemm's fused epilogue on the exact
    accumulator and the gates torch's ATen ops in torch's order, so there is no such ulp: the
    outputs are torch.ao's bit for bit."""
    flt = getattr(nn, mode)(128, 256, num_layers=2).eval()
    ours = getattr(nnqd, mode).from_float(with_qconfig(flt, tqq.default_dynamic_qconfig))
    theirs = getattr(ao_nnqd, mode).from_float(with_qconfig(flt, aoq.default_dynamic_qconfig))
    x = torch.randn(40, 8, 128)
    with torch.no_grad():
        y, y_t, y_f = ours(x)[0], theirs(x)[0], flt(x)[0]
    assert torch.equal(y, y_t)
    assert sqnr(y, y_f) >= 25


def test_rnn_state_dict_repr_and_weights():
    flt, ours, theirs = _pair("LSTM", "per_channel", num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert repr(ours) == repr(theirs) == "DynamicQuantizedLSTM(24, 32, num_layers=2, " \
                                         "bidirectional=True)"
    fresh = roundtrip(ours, nnqd.LSTM(24, 32, num_layers=2, bidirectional=True))
    x = torch.randn(7, 2, 24)
    with torch.no_grad():
        assert torch.equal(fresh(x)[0], ours(x)[0])
    w_ours, w_theirs = ours.get_weight(), theirs.get_weight()
    assert list(w_ours) == list(w_theirs)
    for k in w_ours:
        assert torch.equal(w_ours[k].int_repr(), w_theirs[k].int_repr())
    assert list(ours.get_bias()) == list(theirs.get_bias())
    gru_flt, gru, gru_t = _pair("GRU", "per_tensor")
    assert list(gru.state_dict()) == list(gru_t.state_dict())
    fresh = roundtrip(gru, nnqd.GRU(24, 32))
    with torch.no_grad():
        assert torch.equal(fresh(x)[0], gru(x)[0])
    with pytest.raises(RuntimeError, match="size mismatch"):
        nnqd.GRU(24, 16).load_state_dict(gru.state_dict())


def test_rnn_bad_inputs():
    _, lstm, _ = _pair("LSTM", "per_tensor")
    with pytest.raises(RuntimeError, match="must have 3 dimensions.*got 2"):
        lstm(torch.randn(5, 24))
    with pytest.raises(RuntimeError, match="must have 3 dimensions.*got 4"):
        lstm(torch.randn(2, 5, 3, 24))
    with pytest.raises(RuntimeError, match="input_size. Expected 24, got 23"):
        lstm(torch.randn(4, 2, 23))
    with pytest.raises(RuntimeError, match=r"hidden\[0\] size"):
        lstm(torch.randn(4, 2, 24), (torch.zeros(1, 3, 32), torch.zeros(1, 3, 32)))
    with pytest.raises(TypeError, match="quantized tensor"):
        lstm(tq.quantize_per_tensor(torch.randn(4, 2, 24), 0.1, 0, tq.quint8))
    quint8_weights = tqq.QConfig(activation=tqq.default_dynamic_quant_observer,
                                 weight=tqq.MinMaxObserver.with_args(dtype=tq.quint8))
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        nnqd.LSTM.from_float(with_qconfig(nn.LSTM(4, 4), quint8_weights))
    with pytest.raises(RuntimeError, match="Unsupported dtype"):
        nnqd.GRUCell.from_float(with_qconfig(nn.GRUCell(4, 4), quint8_weights))
    with pytest.raises(RuntimeError, match="qint8 or float16"):
        nnqd.GRU(4, 4, dtype=tq.quint8)
    with pytest.raises(AssertionError, match="only works for"):
        nnqd.LSTM.from_float(with_qconfig(nn.RNN(4, 4), tqq.default_dynamic_qconfig))


# --------------------------------------------------------------------------------------------
# Cells
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cell,kwargs", [("LSTMCell", {}), ("GRUCell", {}),
                                         ("RNNCell", {}), ("RNNCell", {"nonlinearity": "relu"})])
@pytest.mark.parametrize("qconfig", ["per_tensor", "per_channel"])
def test_cells_match_torch(cell, kwargs, qconfig):
    flt = getattr(nn, cell)(24, 32, **kwargs)
    ours = getattr(nnqd, cell).from_float(with_qconfig(flt, QCONFIGS[qconfig][0]))
    theirs = getattr(ao_nnqd, cell).from_float(with_qconfig(flt, QCONFIGS[qconfig][1]))
    assert repr(ours) == repr(theirs)
    x, h = torch.randn(6, 24), torch.randn(6, 32) * 0.5
    hx = (h, h * 0.5) if cell == "LSTMCell" else h
    with torch.no_grad():
        for given in (None, hx):
            a, b, f = ours(x, given), theirs(x, given), flt(x, given)
            assert_close_to_torch(_h(a), _h(b), _h(f))
            if cell == "LSTMCell":
                assert_close_to_torch(a[1], b[1], f[1])
    assert list(ours.state_dict()) == list(theirs.state_dict())
    fresh = roundtrip(ours, getattr(nnqd, cell)(24, 32, **kwargs))
    with torch.no_grad():
        assert torch.equal(_h(fresh(x, hx)), _h(ours(x, hx)))
    with pytest.raises(RuntimeError, match="2 dimensions"):
        ours(torch.randn(24))


def test_cells_float16():
    flt = nn.GRUCell(24, 32)
    ours = nnqd.GRUCell.from_float(with_qconfig(flt, tqq.float16_dynamic_qconfig))
    theirs = ao_nnqd.GRUCell.from_float(with_qconfig(flt, aoq.float16_dynamic_qconfig))
    x = torch.randn(4, 24)
    with torch.no_grad():
        assert_close_to_torch(ours(x), theirs(x), flt(x), rel=1e-6)


def test_quantize_dynamic_uses_these_modules():
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    q = tqq.quantize_dynamic(model, {nn.Linear}, dtype=tq.qint8)
    assert type(q[0]) is nnqd.Linear and type(q[2]) is nnqd.Linear
    x = torch.randn(3, 8)
    with torch.no_grad():
        assert sqnr(q(x), model(x)) >= 25


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_rnn_compiles_nothing_and_every_call_takes_one_path(mode):
    """The time step runs eagerly: no call waits on a compiler (the first included), and the
    first call of a shape returns what later calls do."""
    from torchquant.kernels import cpu_compiled
    flt = getattr(nn, mode)(24, 64, num_layers=2).eval()
    ours = getattr(nnqd, mode).from_float(with_qconfig(flt, tqq.default_dynamic_qconfig))
    x = torch.randn(7, 3, 24)
    calls = []
    original = cpu_compiled.compiled
    cpu_compiled.compiled = lambda op, *a, **k: calls.append(op) or original(op, *a, **k)
    try:
        with torch.no_grad():
            outs = [ours(x)[0] for _ in range(3)]
    finally:
        cpu_compiled.compiled = original
    assert not any("lstm" in op or "gru" in op for op in calls)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])
