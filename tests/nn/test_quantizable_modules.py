"""Quantizable LSTM / MultiheadAttention and their static quantized forms, against torch 2.13.

Observed modules must compute what the float module computes (they only rearrange it into
observable parts).  The quantized ones go through the whole eager custom-module flow on both
stacks (prepare with the custom config, calibrate, convert); the two calibrate identically,
so outputs are compared by SQNR against torch's converted model (>= 30 dB; in practice they
are bit-exact) and module types must correspond one to one.

Known deviations from torch, asserted here: torch's quantizable MHA scrambles heads for
``batch_first=True`` (it views (B*H, L, d) as (B, L, E)); ours matches the float module, so
that case is compared with float only.  Quantized ``bias_k`` / ``bias_v`` are state-dict
buffers here (torch drops them from the state dict).
"""
import io
import warnings

import pytest
import torch
import torch.ao.nn.quantizable as ao_nnqa
import torch.ao.nn.quantized as ao_nnq
import torch.ao.quantization as ao_q
from torch import nn

import torchquant as tq
import torchquant.nn.quantizable as nnqa
import torchquant.quantization as tqq
from torchquant.nn.quantized.modules.activation_mha import MultiheadAttention as QMHA
from torchquant.nn.quantized.modules.rnn import LSTM as QLSTM

warnings.filterwarnings("ignore", category=DeprecationWarning, module="torch.ao")

OURS_CFG = ({"float_to_observed_custom_module_class": {nn.LSTM: nnqa.LSTM,
                                                       nn.MultiheadAttention:
                                                           nnqa.MultiheadAttention}},
            {"observed_to_quantized_custom_module_class": {nnqa.LSTM: QLSTM,
                                                           nnqa.MultiheadAttention: QMHA}})
AO_CFG = ({"float_to_observed_custom_module_class": {nn.LSTM: ao_nnqa.LSTM,
                                                     nn.MultiheadAttention:
                                                         ao_nnqa.MultiheadAttention}},
          {"observed_to_quantized_custom_module_class": {ao_nnqa.LSTM: ao_nnq.LSTM,
                                                         ao_nnqa.MultiheadAttention:
                                                             ao_nnq.MultiheadAttention}})


def sqnr(ref, x):
    ref, x = ref.float(), x.float()
    return float(10 * torch.log10(ref.pow(2).mean() / (ref - x).pow(2).mean().clamp_min(1e-20)))


def lib(which):
    return ao_q if which == "ao" else tqq


class LSTMModel(nn.Module):
    def __init__(self, lstm, which):
        super().__init__()
        self.quant = lib(which).QuantStub()
        self.lstm = lstm
        self.dequant = lib(which).DeQuantStub()

    def forward(self, x):
        y, (h, c) = self.lstm(self.quant(x))
        return self.dequant(y), self.dequant(h), self.dequant(c)


class MHAModel(nn.Module):
    def __init__(self, mha, which):
        super().__init__()
        self.quant = lib(which).QuantStub()
        self.mha = mha
        self.dequant = lib(which).DeQuantStub()

    def forward(self, q, kv):
        out, weights = self.mha(self.quant(q), self.quant(kv), self.quant(kv))
        return self.dequant(out), self.dequant(weights)


def run_flow(model, which, calib):
    """Eager static flow with the custom-module configs of one stack."""
    prep_cfg, conv_cfg = AO_CFG if which == "ao" else OURS_CFG
    model = model.eval()
    model.qconfig = lib(which).default_qconfig
    prepared = lib(which).prepare(model, prepare_custom_config_dict=prep_cfg)
    with torch.no_grad():
        for args in calib:
            prepared(*args)
    return prepared, lib(which).convert(prepared, convert_custom_config_dict=conv_cfg)


def module_names(model):
    return {name: m._get_name() for name, m in model.named_modules()
            if "activation_post_process" not in name}


def state_roundtrip(module):
    buf = io.BytesIO()
    torch.save(module.state_dict(), buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


# --------------------------------------------------------------------------------------------
# LSTM
# --------------------------------------------------------------------------------------------

LSTM_CASES = [
    dict(),
    dict(num_layers=2, bidirectional=True),
    dict(batch_first=True),
    dict(bias=False, num_layers=2),
]


@pytest.mark.parametrize("kwargs", LSTM_CASES, ids=lambda k: ",".join(k) or "default")
@pytest.mark.parametrize("split_gates", [False, True])
def test_observed_lstm_matches_float_and_torch(kwargs, split_gates):
    lstm = nn.LSTM(4, 6, **kwargs).eval()
    lstm.qconfig = tqq.default_qconfig
    ours = nnqa.LSTM.from_float(lstm, split_gates=split_gates)
    lstm.qconfig = ao_q.default_qconfig
    theirs = ao_nnqa.LSTM.from_float(lstm, split_gates=split_gates)
    assert ours._get_name() == "QuantizableLSTM"
    x = torch.randn(3, 5, 4) if kwargs.get("batch_first") else torch.randn(5, 3, 4)
    d = 2 if kwargs.get("bidirectional") else 1
    hidden = (torch.randn(kwargs.get("num_layers", 1) * d, 3, 6),
              torch.randn(kwargs.get("num_layers", 1) * d, 3, 6))
    for h in (None, hidden):
        with torch.no_grad():
            ref = lstm(x, h)
            got = ours(x, h)
            tor = theirs(x, h)
        for r, g, t in zip((ref[0], *ref[1]), (got[0], *got[1]), (tor[0], *tor[1])):
            assert g.shape == r.shape
            torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(g, t, atol=1e-6, rtol=1e-6)
    assert module_names(ours) == module_names(theirs)


def test_lstm_cell_from_float_matches_float():
    cell = nn.LSTMCell(4, 5)
    cell.qconfig = tqq.default_qconfig
    ours = nnqa.LSTMCell.from_float(cell)
    assert ours._get_name() == "QuantizableLSTMCell" and ours.igates.qconfig is cell.qconfig
    x, h, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5)
    with torch.no_grad():
        for hidden in (None, (h, c)):
            ref = cell(x, hidden)
            got = ours(x, hidden)
            torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", LSTM_CASES[:3], ids=lambda k: ",".join(k) or "default")
def test_lstm_eager_flow_matches_torch(kwargs):
    lstm = nn.LSTM(4, 6, **kwargs)
    shape = (3, 7, 4) if kwargs.get("batch_first") else (7, 3, 4)
    calib = [(torch.randn(shape),) for _ in range(4)]
    x = torch.randn(shape)
    ao_prep, ao_conv = run_flow(LSTMModel(lstm, "ao"), "ao", calib)
    tq_prep, tq_conv = run_flow(LSTMModel(lstm, "tq"), "tq", calib)
    # no output observer on the custom module itself (no_observer_set), observers inside
    assert not hasattr(tq_prep.lstm, "activation_post_process")
    assert isinstance(tq_prep.lstm, nnqa.LSTM)
    assert type(tq_conv.lstm) is QLSTM and tq_conv.lstm._get_name() == "QuantizedLSTM"
    assert module_names(tq_conv) == module_names(ao_conv)
    with torch.no_grad():
        theirs, ours, ref = ao_conv(x), tq_conv(x), lstm.eval()(x)[0]
    for t, o in zip(theirs, ours):
        assert o.shape == t.shape
        assert sqnr(t, o) >= 30
    assert sqnr(ref, ours[0]) >= 20  # and it is still the LSTM


def test_quantized_lstm_state_dict_roundtrip():
    lstm = nn.LSTM(4, 6, num_layers=2, bidirectional=True)
    calib = [(torch.randn(6, 2, 4),) for _ in range(2)]
    _, ao_conv = run_flow(LSTMModel(lstm, "ao"), "ao", calib)
    _, tq_conv = run_flow(LSTMModel(lstm, "tq"), "tq", calib)
    assert list(tq_conv.lstm.state_dict()) == list(ao_conv.lstm.state_dict())
    fresh = QLSTM(4, 6, num_layers=2, bidirectional=True)
    fresh.load_state_dict(state_roundtrip(tq_conv.lstm))
    xq = tq.quantize_per_tensor(torch.randn(6, 2, 4), 0.05, 128, tq.quint8)
    y_ref, (h_ref, c_ref) = tq_conv.lstm(xq)
    y, (h, c) = fresh(xq)
    for a, b in ((y, y_ref), (h, h_ref), (c, c_ref)):
        assert torch.equal(a.int_repr(), b.int_repr()) and a.q_scale() == b.q_scale()


def test_lstm_bad_inputs_raise():
    lstm = nn.LSTM(4, 6)
    lstm.qconfig = tqq.default_qconfig
    observed = nnqa.LSTM.from_float(lstm)
    with pytest.raises(ValueError, match="3-D"):
        observed(torch.randn(5, 4))
    with pytest.raises(ValueError, match="input_size"):
        observed(torch.randn(5, 3, 3))
    with pytest.raises(ValueError, match="h_0"):
        observed(torch.randn(5, 3, 4), (torch.zeros(2, 3, 6), torch.zeros(2, 3, 6)))
    with pytest.raises(ValueError, match="2-D"):
        observed.layers[0].layer_fw.cell(torch.randn(3, 2, 4))
    with pytest.raises(AssertionError):
        nnqa.LSTM.from_float(nn.GRU(4, 6))
    with pytest.raises(AssertionError, match="qconfig"):
        nnqa.LSTM.from_float(nn.LSTM(4, 6))
    with pytest.raises(NotImplementedError):
        QLSTM.from_float(lstm)
    with pytest.raises(NotImplementedError):
        nnqa.LSTM.from_observed(observed)
    _, conv = run_flow(LSTMModel(lstm, "tq"), "tq", [(torch.randn(5, 3, 4),)])
    with pytest.raises(ValueError, match="quantized"):
        conv.lstm(torch.randn(5, 3, 4))  # float input to the quantized LSTM


def test_training_lstm_prepares_for_qat_like_torch():
    lstm = nn.LSTM(4, 6).train()
    lstm.qconfig = ao_q.get_default_qat_qconfig("x86")
    theirs = ao_nnqa.LSTM.from_float(lstm)
    lstm.qconfig = tqq.get_default_qat_qconfig("x86")
    ours = nnqa.LSTM.from_float(lstm)
    assert ours.training
    assert module_names(ours) == module_names(theirs)


# --------------------------------------------------------------------------------------------
# MultiheadAttention
# --------------------------------------------------------------------------------------------

MHA_CASES = [
    dict(),
    dict(add_bias_kv=True),
    dict(add_zero_attn=True, bias=False),
    dict(kdim=6, vdim=6),
]


def mha_inputs(kwargs, batch_first=False, gen_seed=0):
    g = torch.Generator().manual_seed(gen_seed)
    kdim = kwargs.get("kdim", 8)
    q_shape, kv_shape = ((3, 5, 8), (3, 4, kdim)) if batch_first else ((5, 3, 8), (4, 3, kdim))
    return torch.randn(q_shape, generator=g), torch.randn(kv_shape, generator=g)


@pytest.mark.parametrize("kwargs", MHA_CASES, ids=lambda k: ",".join(k) or "default")
def test_observed_mha_matches_float_and_torch(kwargs):
    mha = nn.MultiheadAttention(8, 2, **kwargs).eval()
    mha.qconfig = tqq.default_qconfig
    ours = nnqa.MultiheadAttention.from_float(mha)
    mha.qconfig = ao_q.default_qconfig
    theirs = ao_nnqa.MultiheadAttention.from_float(mha)
    assert ours._get_name() == "QuantizableMultiheadAttention"
    assert module_names(ours) == module_names(theirs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    q, kv = mha_inputs(kwargs)
    bool_mask = torch.rand(5, 4) > 0.7
    bool_mask[:, 0] = False
    for extra in ({}, {"average_attn_weights": False}, {"need_weights": False},
                  {"attn_mask": bool_mask}, {"attn_mask": torch.randn(5, 4)},
                  {"key_padding_mask": torch.tensor([[False, False, True, True]] * 3)}):
        with torch.no_grad():
            ref = mha(q, kv, kv, **extra)
            got = ours(q, kv, kv, **extra)
            tor = theirs(q, kv, kv, **extra)
        torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(got[0], tor[0], atol=1e-6, rtol=1e-6)
        if ref[1] is None:
            assert got[1] is None
        else:
            torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)


def test_observed_mha_batch_first_matches_float():
    # torch's quantizable MHA is wrong here (heads scrambled); we follow nn.MultiheadAttention
    mha = nn.MultiheadAttention(8, 2, batch_first=True).eval()
    mha.qconfig = tqq.default_qconfig
    ours = nnqa.MultiheadAttention.from_float(mha)
    q, kv = mha_inputs({}, batch_first=True)
    with torch.no_grad():
        ref, got = mha(q, kv, kv), ours(q, kv, kv)
    torch.testing.assert_close(got[0], ref[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], ref[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kwargs", MHA_CASES, ids=lambda k: ",".join(k) or "default")
def test_mha_eager_flow_matches_torch(kwargs):
    mha = nn.MultiheadAttention(8, 2, **kwargs)
    calib = [mha_inputs(kwargs, gen_seed=s) for s in range(1, 5)]
    ao_prep, ao_conv = run_flow(MHAModel(mha, "ao"), "ao", calib)
    tq_prep, tq_conv = run_flow(MHAModel(mha, "tq"), "tq", calib)
    assert not hasattr(tq_prep.mha, "activation_post_process")
    assert type(tq_conv.mha) is QMHA and tq_conv.mha._get_name() == "QuantizedMultiheadAttention"
    assert module_names(tq_conv) == module_names(ao_conv)
    keys, ao_keys = set(tq_conv.mha.state_dict()), set(ao_conv.mha.state_dict())
    assert keys - ao_keys == ({"bias_k", "bias_v"} if kwargs.get("add_bias_kv") else set())
    assert ao_keys <= keys
    q, kv = mha_inputs(kwargs, gen_seed=9)
    with torch.no_grad():
        theirs, ours = ao_conv(q, kv), tq_conv(q, kv)
        ref = mha.eval()(q, kv, kv)
    for t, o in zip(theirs, ours):
        assert o.shape == t.shape
        assert sqnr(t, o) >= 30
    assert sqnr(ref[0], ours[0]) >= 15


def test_quantized_mha_state_dict_and_dequantize():
    mha = nn.MultiheadAttention(8, 2, add_bias_kv=True)
    calib = [mha_inputs({}, gen_seed=s) for s in range(1, 3)]
    _, conv = run_flow(MHAModel(mha, "tq"), "tq", calib)
    qmha = conv.mha
    assert isinstance(qmha.bias_k, tq.QTensor) and not hasattr(qmha, "in_proj_weight")
    fresh = QMHA(8, 2, add_bias_kv=True)
    fresh.load_state_dict(state_roundtrip(qmha))
    q, kv = mha_inputs({}, gen_seed=7)
    qq = tq.quantize_per_tensor(q, 0.03, 128, tq.quint8)
    qkv = tq.quantize_per_tensor(kv, 0.03, 128, tq.quint8)
    for a, b in zip(qmha(qq, qkv, qkv), fresh(qq, qkv, qkv)):
        assert torch.equal(a.int_repr(), b.int_repr()) and a.q_scale() == b.q_scale()
    # dequantize(): a float nn.MultiheadAttention with the quantized weights
    fp = qmha.dequantize()
    assert type(fp) is nn.MultiheadAttention
    w_q = qmha.linear_Q.weight().dequantize()
    torch.testing.assert_close(fp.in_proj_weight[:8], w_q)
    torch.testing.assert_close(fp.out_proj.bias, qmha.out_proj.bias())
    torch.testing.assert_close(fp.bias_k, qmha.bias_k.dequantize())
    with torch.no_grad():
        assert sqnr(mha.eval()(q, kv, kv)[0], fp.eval()(q, kv, kv)[0]) >= 25


def test_mha_bad_inputs_raise():
    mha = nn.MultiheadAttention(8, 2)
    mha.qconfig = tqq.default_qconfig
    observed = nnqa.MultiheadAttention.from_float(mha)
    q, kv = mha_inputs({})
    with pytest.raises(ValueError, match="3-D"):
        observed(q[0], kv[0], kv[0])
    with pytest.raises(ValueError, match="features"):
        observed(q[..., :6], kv, kv)
    with pytest.raises(ValueError, match="attn_mask"):
        observed(q, kv, kv, attn_mask=torch.zeros(3, 3))
    with pytest.raises(NotImplementedError):
        observed(q, kv, kv, is_causal=True)
    with pytest.raises(AssertionError):
        nnqa.MultiheadAttention.from_float(nn.Linear(8, 8))
    with pytest.raises(NotImplementedError):
        QMHA.from_float(mha)
    _, conv = run_flow(MHAModel(nn.MultiheadAttention(8, 2), "tq"), "tq", [mha_inputs({})])
    with pytest.raises(ValueError, match="quantized"):
        conv.mha(q, kv, kv)


def test_default_custom_config_uses_quantizable_classes():
    cfg = tqq.get_default_custom_config_dict()
    assert cfg["float_to_observed_custom_module_class"] == {
        nn.LSTM: nnqa.LSTM, nn.MultiheadAttention: nnqa.MultiheadAttention}
    assert cfg["observed_to_quantized_custom_module_class"] == {
        nnqa.LSTM: QLSTM, nnqa.MultiheadAttention: QMHA}
    assert tqq.no_observer_set() >= {nnqa.LSTM, nnqa.MultiheadAttention}
    # prepare / convert without explicit custom configs pick them up
    model = LSTMModel(nn.LSTM(4, 6), "tq").eval()
    model.qconfig = tqq.default_qconfig
    prepared = tqq.prepare(model)
    prepared(torch.randn(5, 3, 4))
    assert type(tqq.convert(prepared).lstm) is QLSTM
