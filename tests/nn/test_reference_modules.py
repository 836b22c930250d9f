"""Reference quantized modules (torchquant.nn.quantized.reference) against torch 2.13's
torch.ao.nn.quantized.reference.

Each test builds torch's module and ours from the same float module, with weight qparams
computed by torch.ao's observer and by ours (which must agree).  Both sides then quantize the
same float weight with the same qparams -- round-half-even on the same float32 products -- so
``get_weight()`` and the quantized integers must be bit-identical.  The forwards then run the
same ATen float op (F.linear, F.conv*, F.embedding_bag, the RNN cell / sequence ops) on
bit-identical weights and inputs, which is deterministic on CPU, so they are compared with
zero tolerance as well (a tolerance would only be needed if the two sides could pick different
float kernels, which they cannot here).
"""
import copy
import io

import pytest
import torch
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.reference as ao_nnqr
import torch.ao.quantization as ao_q
import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers quantized_decomposed ops)
from torch import nn
from torch.ao.quantization.utils import get_qparam_dict as ao_qparam_dict

import torchquant as tq
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.reference as nnqr
import torchquant.quantization as tqq
from torchquant.quantization.utils import get_qparam_dict

# torch's reference LSTM / GRU re-wrap tensor qparams with torch.tensor(...), which warns
pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor")

# ---- observers: (torch.ao constructor, ours) ----------------------------------------------

PER_TENSOR = (ao_q.default_weight_observer, tqq.default_weight_observer)
PER_CHANNEL = (ao_q.default_per_channel_weight_observer,
               tqq.default_per_channel_weight_observer)


def per_channel_axis(axis):
    return (ao_q.default_per_channel_weight_observer.with_args(ch_axis=axis),
            tqq.default_per_channel_weight_observer.with_args(ch_axis=axis))


EMB_QUINT8 = (ao_q.float_qparams_weight_only_qconfig.weight,
              tqq.float_qparams_weight_only_qconfig.weight)
EMB_QUINT4X2 = (
    ao_q.PerChannelMinMaxObserver.with_args(dtype=torch.quint4x2,
                                            qscheme=torch.per_channel_affine_float_qparams,
                                            ch_axis=0),
    tqq.PerChannelMinMaxObserver.with_args(dtype=tq.quint4x2,
                                           qscheme=tq.per_channel_affine_float_qparams,
                                           ch_axis=0))


def qparams_pair(observers, weight):
    """(torch's qparams dict, ours) for ``weight``; the observers must agree exactly."""
    ao_obs, tq_obs = observers[0](), observers[1]()
    ao_obs(weight.detach())
    tq_obs(weight.detach())
    ao_p, tq_p = ao_qparam_dict(ao_obs), get_qparam_dict(tq_obs)
    assert torch.equal(torch.as_tensor(tq_p["scale"]), torch.as_tensor(ao_p["scale"]))
    assert torch.equal(torch.as_tensor(tq_p["zero_point"]), torch.as_tensor(ao_p["zero_point"]))
    assert tq_p.get("axis") == ao_p.get("axis")
    return ao_p, tq_p


# ---- comparisons ------------------------------------------------------------------------------

def assert_int_repr_equal(ours, theirs):
    assert isinstance(ours, tq.QTensor)
    assert torch.equal(ours.int_repr(), theirs.int_repr())
    if theirs.qscheme() == torch.per_tensor_affine:
        assert ours.q_scale() == theirs.q_scale()
        assert ours.q_zero_point() == theirs.q_zero_point()
    else:
        assert torch.equal(ours.q_per_channel_scales(), theirs.q_per_channel_scales())
        assert torch.equal(ours.q_per_channel_zero_points().to(torch.float64),
                           theirs.q_per_channel_zero_points().to(torch.float64))
        assert ours.q_per_channel_axis() == theirs.q_per_channel_axis()


def assert_state_dicts_match(ours, theirs):
    """Same keys in the same order; tensors with equal values and dtypes; the qscheme / dtype
    entries are our objects standing for torch's."""
    a, b = ours.state_dict(), theirs.state_dict()
    assert list(a) == list(b)
    for key, value in b.items():
        if isinstance(value, torch.Tensor):
            assert a[key].dtype == value.dtype, key
            assert torch.equal(a[key], value), key
        elif key.endswith("_qscheme"):
            assert a[key] == (None if value is None else tq.dtypes.to_qscheme(value))
        elif key.endswith("_dtype"):
            assert a[key] == (value if value.is_floating_point else tq.dtypes.to_qdtype(value))


def weights_only_round_trip(state_dict):
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# ---- Linear / Conv / ConvTranspose ------------------------------------------------------------

WEIGHTED = {
    "Linear": (lambda: nn.Linear(16, 8), (4, 16)),
    "Conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2), (2, 4, 11)),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3, padding=1, groups=2), (2, 4, 7, 7)),
    "Conv3d": (lambda: nn.Conv3d(2, 4, 3, bias=False), (1, 2, 5, 5, 5)),
    "ConvTranspose1d": (lambda: nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1),
                        (2, 4, 6)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2, groups=2), (2, 4, 5, 5)),
    "ConvTranspose3d": (lambda: nn.ConvTranspose3d(2, 4, 2, stride=2, padding=1),
                        (1, 2, 3, 3, 3)),
}


def observers_for(name, scheme):
    if scheme == "per-tensor":
        return PER_TENSOR
    # torch's ConvTranspose weights are (in, out/groups, ...): quantize along the out channels
    return per_channel_axis(1) if name.startswith("ConvTranspose") else PER_CHANNEL


@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel"])
@pytest.mark.parametrize("name", list(WEIGHTED))
def test_weighted_modules_match_torch(name, scheme):
    make, shape = WEIGHTED[name]
    float_mod = make()
    ao_p, tq_p = qparams_pair(observers_for(name, scheme), float_mod.weight)
    theirs = getattr(ao_nnqr, name).from_float(float_mod, ao_p)
    ours = getattr(nnqr, name).from_float(float_mod, tq_p)
    assert ours._IS_REFERENCE is True and isinstance(ours, type(float_mod))
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    assert_int_repr_equal(ours.get_quantized_weight(), theirs.get_quantized_weight())
    x = torch.randn(*shape)
    assert torch.equal(ours(x), theirs(x))
    assert ours._get_name() == theirs._get_name() == f"Quantized{name}(Reference)"
    assert repr(ours) == repr(theirs)
    assert ours.weight_axis_int == theirs.weight_axis_int
    assert_state_dicts_match(ours, theirs)

    # weights_only round trip into a default-built module (per-tensor quint8 until loaded)
    loaded = weights_only_round_trip(ours.state_dict())
    fresh = copy.deepcopy(getattr(nnqr, name).from_float(make(), None))
    fresh.load_state_dict(loaded)
    assert fresh.weight_qscheme == ours.weight_qscheme
    assert fresh.weight_dtype == ours.weight_dtype
    assert fresh.weight_axis_int == ours.weight_axis_int
    assert torch.equal(fresh.get_weight(), ours.get_weight())
    assert torch.equal(fresh(x), ours(x))

    # torch's own state dict (torch qscheme / dtype objects) loads into ours too
    fresh = getattr(nnqr, name).from_float(make(), None)
    fresh.load_state_dict(theirs.state_dict())
    assert fresh.weight_qscheme == tq.dtypes.to_qscheme(theirs.weight_qscheme)
    assert torch.equal(fresh.get_weight(), theirs.get_weight())


def test_conv_transpose_output_size():
    float_mod = nn.ConvTranspose2d(3, 4, 3, stride=2)
    ao_p, tq_p = qparams_pair(PER_TENSOR, float_mod.weight)
    ours = nnqr.ConvTranspose2d.from_float(float_mod, tq_p)
    x = torch.randn(1, 3, 5, 5)
    out = ours(x, output_size=[12, 12])
    assert out.shape == (1, 4, 12, 12)
    expected = nn.functional.conv_transpose2d(x, ours.get_weight(), ours.bias, 2, 0, 1)
    assert torch.equal(out, expected)


def test_conv_honours_padding_mode():
    # torch's reference conv calls F.conv2d directly and ignores padding_mode; ours runs the
    # float conv's own forward, so it matches the float module on the dequantized weight.
    float_mod = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect")
    _, tq_p = qparams_pair(PER_CHANNEL, float_mod.weight)
    ours = nnqr.Conv2d.from_float(float_mod, tq_p)
    x = torch.randn(1, 3, 6, 6)
    check = copy.deepcopy(float_mod)
    check.weight.data = ours.get_weight()
    assert torch.equal(ours(x), check(x))


def test_default_and_float_qparams_match_torch():
    float_mod = nn.Linear(6, 5)
    x = torch.randn(3, 6)
    cases = [
        (None, None),
        ({"qscheme": None, "dtype": torch.float16}, {"qscheme": None, "dtype": torch.float16}),
        ({"qscheme": torch.per_tensor_affine, "dtype": torch.float16},
         {"qscheme": tq.per_tensor_affine, "dtype": torch.float16}),
    ]
    for ao_p, tq_p in cases:
        theirs = ao_nnqr.Linear.from_float(float_mod, ao_p)
        ours = nnqr.Linear.from_float(float_mod, tq_p)
        assert torch.equal(ours.get_weight(), theirs.get_weight())
        assert torch.equal(ours(x), theirs(x))
        assert_state_dicts_match(ours, theirs)
    # float16 weights: the "quantized" weight is the half-precision tensor, as torch's
    assert ours.get_quantized_weight().dtype == torch.float16
    theirs = ao_nnqr.Linear.from_float(float_mod, None)
    ours = nnqr.Linear.from_float(float_mod, None)
    assert_int_repr_equal(ours.get_quantized_weight(), theirs.get_quantized_weight())


def test_scalar_qparams_and_decomposed_quant_range_match_torch():
    float_mod = nn.Linear(8, 4)
    with torch.no_grad():
        float_mod.weight.mul_(4.0)  # some values beyond quant_min/quant_max * scale
    base = {"scale": 0.01, "zero_point": 3, "quant_min": -64, "quant_max": 63}
    ao_p = dict(base, qscheme=torch.per_tensor_affine, dtype=torch.qint8)
    tq_p = dict(base, qscheme=tq.per_tensor_affine, dtype=tq.qint8)
    # default path: the dtype's full range (quant_min / quant_max ignored, as torch)
    theirs = ao_nnqr.Linear.from_float(float_mod, ao_p)
    ours = nnqr.Linear.from_float(float_mod, tq_p)
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    assert_state_dicts_match(ours, theirs)  # Python-number qparams: float32 / int32 buffers
    assert ours.weight_zero_point.dtype == torch.int32
    # decomposed path: integers clamped to [quant_min, quant_max]
    theirs = ao_nnqr.Linear.from_float(float_mod, dict(ao_p, is_decomposed=True))
    ours = nnqr.Linear.from_float(float_mod, dict(tq_p, is_decomposed=True))
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    q = ours.get_quantized_weight()
    assert torch.equal(q.int_repr(), theirs.get_quantized_weight())
    assert int(q.int_repr().min()) == -64 and int(q.int_repr().max()) == 63


def test_unsupported_qparams_raise():
    with pytest.raises(AssertionError, match="not supported"):
        nnqr.Linear(4, 3, weight_qparams={"qscheme": tq.per_tensor_symmetric,
                                          "dtype": tq.qint8, "scale": 0.1, "zero_point": 0})
    with pytest.raises(KeyError, match="axis"):
        nnqr.Linear(4, 3, weight_qparams={"qscheme": tq.per_channel_affine, "dtype": tq.qint8,
                                          "scale": torch.ones(3), "zero_point": torch.zeros(3)})
    m = nnqr.Linear(4, 3, weight_qparams={"qscheme": tq.per_tensor_affine,
                                          "dtype": tq.quint4x2, "scale": 0.1, "zero_point": 0})
    with pytest.raises(ValueError, match="Unsupported dtype and qscheme"):
        m.get_weight()


# ---- Embedding / EmbeddingBag -----------------------------------------------------------------

@pytest.mark.parametrize("observers", [EMB_QUINT8, EMB_QUINT4X2], ids=["quint8", "quint4x2"])
def test_embedding_matches_torch(observers):
    emb = nn.Embedding(20, 8, padding_idx=0)
    ao_p, tq_p = qparams_pair(observers, emb.weight)
    theirs = ao_nnqr.Embedding.from_float(emb, ao_p)
    ours = nnqr.Embedding.from_float(emb, tq_p)
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    assert_int_repr_equal(ours.get_quantized_weight(), theirs.get_quantized_weight())
    idx = torch.randint(0, 20, (5, 3))
    assert torch.equal(ours(idx), theirs(idx))
    assert ours._get_name() == theirs._get_name() == "QuantizedEmbedding(Reference)"
    assert_state_dicts_match(ours, theirs)
    fresh = nnqr.Embedding(20, 8, padding_idx=0)
    fresh.load_state_dict(weights_only_round_trip(ours.state_dict()))
    assert fresh.weight_qscheme == tq.per_channel_affine_float_qparams
    assert fresh.weight_dtype == ours.weight_dtype
    assert torch.equal(fresh(idx), ours(idx))


@pytest.mark.parametrize("observers", [EMB_QUINT8, EMB_QUINT4X2], ids=["quint8", "quint4x2"])
@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_matches_torch(observers, mode):
    bag = nn.EmbeddingBag(20, 8, mode=mode, include_last_offset=(mode == "mean"))
    ao_p, tq_p = qparams_pair(observers, bag.weight)
    theirs = ao_nnqr.EmbeddingBag.from_float(bag, ao_p)
    ours = nnqr.EmbeddingBag.from_float(bag, tq_p)
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    assert_int_repr_equal(ours.get_quantized_weight(), theirs.get_quantized_weight())
    flat, offsets = torch.randint(0, 20, (12,)), torch.tensor([0, 4, 9, 12])
    if mode == "sum":
        psw = torch.rand(12)
        assert torch.equal(ours(flat, offsets, per_sample_weights=psw),
                           theirs(flat, offsets, per_sample_weights=psw))
    assert torch.equal(ours(flat, offsets), theirs(flat, offsets))
    assert ours._get_name() == theirs._get_name()  # torch names the bag "QuantizedEmbedding"
    assert_state_dicts_match(ours, theirs)
    fresh = nnqr.EmbeddingBag(20, 8, mode=mode, include_last_offset=(mode == "mean"))
    fresh.load_state_dict(weights_only_round_trip(ours.state_dict()))
    assert torch.equal(fresh(flat, offsets), ours(flat, offsets))


# ---- RNN cells ------------------------------------------------------------------------------

def cell_qparams(float_cell, observers):
    ao_d, tq_d = {}, {}
    for wname in ("weight_ih", "weight_hh"):
        ao_d[wname], tq_d[wname] = qparams_pair(observers, getattr(float_cell, wname))
    ao_d["is_decomposed"] = tq_d["is_decomposed"] = False
    return ao_d, tq_d


def as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel"])
@pytest.mark.parametrize("cell", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_torch(cell, scheme):
    kwargs = {"nonlinearity": "relu"} if cell == "RNNCell" and scheme == "per-channel" else {}
    float_cell = getattr(nn, cell)(6, 5, **kwargs)
    ao_d, tq_d = cell_qparams(float_cell, PER_TENSOR if scheme == "per-tensor" else PER_CHANNEL)
    theirs = getattr(ao_nnqr, cell).from_float(float_cell, ao_d)
    ours = getattr(nnqr, cell).from_float(float_cell, tq_d)
    for kind in ("ih", "hh"):
        assert torch.equal(getattr(ours, f"get_weight_{kind}")(),
                           getattr(theirs, f"get_weight_{kind}")())
        assert_int_repr_equal(getattr(ours, f"get_quantized_weight_{kind}")(),
                              getattr(theirs, f"get_quantized_weight_{kind}")())
    x = torch.randn(3, 6)
    h = torch.randn(3, 5)
    hx = (h, torch.randn(3, 5)) if cell == "LSTMCell" else h
    for args in ((x,), (x, hx), (x[0],)):
        for p, q in zip(as_tuple(theirs(*args)), as_tuple(ours(*args))):
            assert torch.equal(p, q)
    assert ours._get_name() == theirs._get_name()
    assert_state_dicts_match(ours, theirs)
    # no qscheme / dtype in these state dicts (as torch): rebuild with the qparams, then load
    fresh = getattr(nnqr, cell)(6, 5, weight_qparams_dict=tq_d, **kwargs)
    fresh.load_state_dict(weights_only_round_trip(ours.state_dict()))
    for p, q in zip(as_tuple(fresh(x, hx)), as_tuple(ours(x, hx))):
        assert torch.equal(p, q)


def test_cell_errors_and_unquantized_weight():
    cell = nn.GRUCell(4, 3)
    _, tq_d = cell_qparams(cell, PER_TENSOR)
    with pytest.raises(ValueError, match="weight_xx"):
        nnqr.GRUCell.from_float(cell, dict(tq_d, weight_xx=tq_d["weight_ih"]))
    with pytest.raises(AssertionError, match="not supported"):
        nnqr.GRUCell(4, 3, weight_qparams_dict={
            "weight_ih": {"qscheme": tq.per_channel_affine_float_qparams, "dtype": tq.quint8,
                          "scale": torch.ones(9), "zero_point": torch.zeros(9), "axis": 0},
            "is_decomposed": False})
    # a weight without qparams stays float (torch: no buffers, get_weight_hh() is the weight)
    ours = nnqr.GRUCell.from_float(cell, {"weight_ih": tq_d["weight_ih"],
                                          "is_decomposed": False})
    assert "weight_hh_scale" not in ours.state_dict()
    assert ours.get_weight_hh() is ours.weight_hh
    with pytest.raises(AssertionError, match="1-D or 2-D"):
        ours(torch.randn(2, 2, 4))


# ---- LSTM / GRU -------------------------------------------------------------------------------

def rnn_qparams(float_rnn, observers):
    ao_d, tq_d = {"is_decomposed": False}, {"is_decomposed": False}
    for wname in float_rnn._flat_weights_names:
        if wname.startswith("weight"):
            ao_d[wname], tq_d[wname] = qparams_pair(observers, getattr(float_rnn, wname))
    return ao_d, tq_d


@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel"])
@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
def test_lstm_gru_match_torch(mode, scheme):
    float_rnn = getattr(nn, mode)(6, 5, num_layers=2, bidirectional=True)
    ao_d, tq_d = rnn_qparams(float_rnn, PER_TENSOR if scheme == "per-tensor" else PER_CHANNEL)
    theirs = getattr(ao_nnqr, mode).from_float(float_rnn, ao_d)
    ours = getattr(nnqr, mode).from_float(float_rnn, tq_d)
    for a, b in zip(ours.get_flat_weights(), theirs.get_flat_weights()):
        assert torch.equal(a, b)
    ours_q, theirs_q = ours.get_quantized_weight_bias_dict(), theirs.get_quantized_weight_bias_dict()
    assert list(ours_q) == list(theirs_q)
    for key, value in theirs_q.items():
        if key.startswith("weight"):
            assert_int_repr_equal(ours_q[key], value)
        else:
            assert ours_q[key] is value or torch.equal(ours_q[key], value)

    def check(*args):
        out_t, h_t = theirs(*args)
        out_o, h_o = ours(*args)
        assert torch.equal(out_o, out_t)
        for p, q in zip(as_tuple(h_t), as_tuple(h_o)):
            assert torch.equal(p, q)

    x = torch.randn(7, 3, 6)
    h0 = torch.randn(4, 3, 5)
    hx = (h0, torch.randn(4, 3, 5)) if mode == "LSTM" else h0
    check(x)
    check(x, hx)
    check(x[:, 0])  # unbatched
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([7, 5, 2]), enforce_sorted=False)
    out_t, _ = theirs(packed)
    out_o, _ = ours(packed)
    assert torch.equal(out_o.data, out_t.data)
    assert ours._get_name() == theirs._get_name() == f"Quantized{mode}(Reference)"
    assert_state_dicts_match(ours, theirs)
    fresh = getattr(nnqr, mode)(6, 5, num_layers=2, bidirectional=True, weight_qparams_dict=tq_d)
    fresh.load_state_dict(weights_only_round_trip(ours.state_dict()))
    assert torch.equal(fresh(x)[0], ours(x)[0])


def test_batch_first_unbatched_lstm_matches_float():
    float_rnn = nn.LSTM(4, 3, batch_first=True)
    ours = nnqr.LSTM.from_float(float_rnn, rnn_qparams(float_rnn, PER_TENSOR)[1])
    check = nn.LSTM(4, 3, batch_first=True)
    check.load_state_dict({k: v for k, v in ours.state_dict().items()
                           if not k.endswith(("_scale", "_zero_point", "_axis"))})
    for wname, w in zip(ours._flat_weights_names, ours.get_flat_weights()):
        getattr(check, wname).data = w.detach().clone()
    x = torch.randn(5, 4)  # unbatched, (L, H_in)
    out_o, (h_o, c_o) = ours(x)
    out_c, (h_c, c_c) = check(x)
    assert out_o.shape == (5, 3) and torch.equal(out_o, out_c) and torch.equal(h_o, h_c)
    with pytest.raises(AssertionError, match="2-D or 3-D"):
        ours(torch.randn(2, 2, 2, 4))


def test_dynamic_lstm_from_our_reference():
    import torchquant.nn.quantized.dynamic as nnqd
    float_rnn = nn.LSTM(6, 5)
    ao_d, tq_d = rnn_qparams(float_rnn, PER_TENSOR)
    ours = nnqd.LSTM.from_reference(nnqr.LSTM.from_float(float_rnn, tq_d))
    theirs = torch.ao.nn.quantized.dynamic.LSTM.from_reference(
        ao_nnqr.LSTM.from_float(float_rnn, ao_d))
    x = torch.randn(4, 2, 6)
    torch.testing.assert_close(ours(x)[0], theirs(x)[0], rtol=0, atol=1e-5)


# ---- lowering and the eager convert ---------------------------------------------------------

@pytest.mark.parametrize("scheme", ["per-tensor", "per-channel"])
def test_static_linear_from_reference(scheme):
    float_mod = nn.Linear(16, 8)
    ao_p, tq_p = qparams_pair(PER_TENSOR if scheme == "per-tensor" else PER_CHANNEL,
                              float_mod.weight)
    ref = nnqr.Linear.from_float(float_mod, tq_p)
    ours = nnq.Linear.from_reference(ref, 0.05, 64)
    theirs = ao_nnq.Linear.from_reference(ao_nnqr.Linear.from_float(float_mod, ao_p), 0.05, 64)
    assert_int_repr_equal(ours.weight(), theirs.weight())
    x = torch.randn(4, 16)
    q_ours = ours(tq.quantize_per_tensor(x, 0.05, 64, tq.quint8))
    q_theirs = theirs(torch.quantize_per_tensor(x, 0.05, 64, torch.quint8))
    diff = (q_ours.int_repr().long() - q_theirs.int_repr().long()).abs()
    assert int(diff.max()) <= 1  # one step where float rounding lands near a tie
    # and against the reference definition: quantize(ref(dequantize(x)))
    xq = tq.quantize_per_tensor(x, 0.05, 64, tq.quint8)
    expected = tq.quantize_per_tensor(ref(xq.dequantize()), 0.05, 64, tq.quint8)
    assert int((q_ours.int_repr().long() - expected.int_repr().long()).abs().max()) <= 1


def test_static_conv_and_embedding_from_reference():
    conv = nn.Conv2d(3, 4, 3)
    _, tq_p = qparams_pair(PER_CHANNEL, conv.weight)
    ref = nnqr.Conv2d.from_float(conv, tq_p)
    qconv = nnq.Conv2d.from_reference(ref, 0.05, 64)
    assert torch.equal(qconv.weight().int_repr(), ref.get_quantized_weight().int_repr())
    emb = nn.Embedding(10, 4)
    _, tq_p = qparams_pair(EMB_QUINT8, emb.weight)
    ref = nnqr.Embedding.from_float(emb, tq_p)
    qemb = nnq.Embedding.from_reference(ref)
    idx = torch.tensor([1, 3, 7])
    # the quantized lookup dequantizes rows in its own order of operations: torch's own
    # nnq.Embedding also differs from its reference module by up to one float32 ulp
    torch.testing.assert_close(qemb(idx).dequantize(), ref(idx), rtol=0, atol=1e-6)


def test_eager_convert_is_reference_matches_torch():
    def build(q):
        torch.manual_seed(1)
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Linear(64, 5))
        model.qconfig = q.get_default_qconfig("x86")
        return model.eval()

    calib = torch.randn(4, 3, 6, 6)
    theirs = ao_q.prepare(build(ao_q))
    ours = tqq.prepare(build(tqq))
    theirs(calib)
    ours(calib)
    theirs = ao_q.convert(theirs, is_reference=True)
    ours = tqq.convert(ours, is_reference=True)
    assert type(ours[0]) is nnqr.Conv2d and type(ours[3]) is nnqr.Linear
    for i in (0, 3):
        assert torch.equal(ours[i].get_weight(), theirs[i].get_weight())
        assert_int_repr_equal(ours[i].get_quantized_weight(), theirs[i].get_quantized_weight())
    x = torch.randn(2, 3, 6, 6)
    assert torch.equal(ours[0](x), theirs[0](x))
