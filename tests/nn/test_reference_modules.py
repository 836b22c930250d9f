"""Reference quantized modules against torch.ao.nn.quantized.reference.

Both sides quantize-dequantize the same float weight with the same qparams (bit-exact
affine core), so ``get_weight()`` and the quantized integers are equal; forwards run the same
float op on equal weights and are compared exactly.
"""
import io

import pytest
import torch
import torch.ao.nn.quantized.reference as ao_nnqr
import torch.ao.quantization as ao_q
from torch import nn
from torch.ao.quantization.utils import get_qparam_dict as ao_qparam_dict

import torchquant.nn.quantized.reference as nnqr
import torchquant.quantization as tqq
from torchquant.quantization.utils import get_qparam_dict

OBSERVERS = [
    pytest.param(ao_q.default_weight_observer, tqq.default_weight_observer, id="per-tensor"),
    pytest.param(ao_q.default_per_channel_weight_observer,
                 tqq.default_per_channel_weight_observer, id="per-channel"),
]


def qparams(ao_obs, tq_obs, weight):
    a, b = ao_obs(), tq_obs()
    a(weight)
    b(weight)
    return ao_qparam_dict(a), get_qparam_dict(b)


FLOATS = {
    "Linear": (lambda: nn.Linear(16, 8), (4, 16)),
    "Conv1d": (lambda: nn.Conv1d(4, 6, 3), (2, 4, 10)),
    "Conv2d": (lambda: nn.Conv2d(4, 6, 3, padding=1), (2, 4, 8, 8)),
    "Conv3d": (lambda: nn.Conv3d(2, 4, 3), (1, 2, 5, 5, 5)),
    "ConvTranspose2d": (lambda: nn.ConvTranspose2d(4, 6, 3, stride=2), (2, 4, 5, 5)),
}


@pytest.mark.parametrize("name", list(FLOATS))
@pytest.mark.parametrize("ao_obs,tq_obs", OBSERVERS)
def test_weighted_modules_match_torch(name, ao_obs, tq_obs):
    if name.startswith("ConvTranspose") and "channel" in str(tq_obs):
        tq_obs = tq_obs.with_args(ch_axis=1)
        ao_obs = ao_obs.with_args(ch_axis=1)
    make, shape = FLOATS[name]
    float_mod = make()
    ao_p, tq_p = qparams(ao_obs, tq_obs, float_mod.weight)
    theirs = getattr(ao_nnqr, name).from_float(float_mod, ao_p)
    ours = getattr(nnqr, name).from_float(float_mod, tq_p)
    assert torch.equal(ours.get_weight(), theirs.get_weight())
    assert torch.equal(ours.get_quantized_weight().int_repr(),
                       theirs.get_quantized_weight().int_repr())
    x = torch.randn(*shape)
    assert torch.equal(ours(x), theirs(x))
    assert ours._get_name() == theirs._get_name()
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_embeddings_match_torch():
    emb = nn.Embedding(20, 8)
    ao_obs = ao_q.float_qparams_weight_only_qconfig.weight()
    tq_obs = tqq.float_qparams_weight_only_qconfig.weight()
    ao_obs(emb.weight)
    tq_obs(emb.weight)
    theirs = ao_nnqr.Embedding.from_float(emb, ao_qparam_dict(ao_obs))
    ours = nnqr.Embedding.from_float(emb, get_qparam_dict(tq_obs))
    idx = torch.randint(0, 20, (5, 3))
    assert torch.equal(ours(idx), theirs(idx))
    bag = nn.EmbeddingBag(20, 8, mode="sum")
    bag.weight.data.copy_(emb.weight.data)
    theirs = ao_nnqr.EmbeddingBag.from_float(bag, ao_qparam_dict(ao_obs))
    ours = nnqr.EmbeddingBag.from_float(bag, get_qparam_dict(tq_obs))
    flat, offsets = torch.randint(0, 20, (12,)), torch.tensor([0, 4, 9])
    assert torch.equal(ours(flat, offsets), theirs(flat, offsets))
    assert list(ours.state_dict()) == list(theirs.state_dict())


@pytest.mark.parametrize("cell", ["RNNCell", "LSTMCell", "GRUCell"])
def test_cells_match_torch(cell):
    float_cell = getattr(nn, cell)(6, 5)
    ao_d, tq_d = {}, {}
    for wname in ("weight_ih", "weight_hh"):
        ao_d[wname], tq_d[wname] = qparams(ao_q.default_weight_observer,
                                           tqq.default_weight_observer,
                                           getattr(float_cell, wname))
    ao_d["is_decomposed"] = False
    theirs = getattr(ao_nnqr, cell).from_float(float_cell, ao_d)
    ours = getattr(nnqr, cell).from_float(float_cell, tq_d)
    x = torch.randn(3, 6)
    a, b = theirs(x), ours(x)
    for p, q in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
        assert torch.equal(p, q)
    assert list(ours.state_dict()) == list(theirs.state_dict())


def test_lstm_matches_float_weights_and_keys():
    lstm = nn.LSTM(6, 5, num_layers=2, bidirectional=True)
    ours = nnqr.LSTM.from_float(lstm, None)
    theirs = ao_nnqr.LSTM(6, 5, num_layers=2, bidirectional=True)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    x = torch.randn(7, 2, 6)
    out, (h, c) = ours(x)
    assert out.shape == (7, 2, 10) and h.shape == (4, 2, 5)
    with pytest.raises(ValueError, match="3-D"):
        ours(torch.randn(2, 2, 2, 6))


def test_state_dict_round_trip_weights_only():
    float_mod = nn.Linear(16, 8)
    _, tq_p = qparams(ao_q.default_per_channel_weight_observer,
                      tqq.default_per_channel_weight_observer, float_mod.weight)
    ours = nnqr.Linear.from_float(float_mod, tq_p)
    buf = io.BytesIO()
    torch.save(ours.state_dict(), buf)
    buf.seek(0)
    fresh = nnqr.Linear(16, 8)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert fresh.weight_qscheme == ours.weight_qscheme
    assert torch.equal(fresh.get_weight(), ours.get_weight())


def test_static_linear_from_reference():
    import torchquant as tq
    import torchquant.nn.quantized as nnq
    float_mod = nn.Linear(16, 8)
    _, tq_p = qparams(ao_q.default_weight_observer, tqq.default_weight_observer,
                      float_mod.weight)
    ref = nnqr.Linear.from_float(float_mod, tq_p)
    q = nnq.Linear.from_reference(ref, 0.05, 64)
    x = tq.quantize_per_tensor(torch.randn(4, 16), 0.05, 64, tq.quint8)
    expected = tq.quantize_per_tensor(ref(x.dequantize()), 0.05, 64, tq.quint8)
    diff = (q(x).int_repr().long() - expected.int_repr().long()).abs()
    assert int(diff.max()) <= 1  # one step where float rounding lands near a tie
