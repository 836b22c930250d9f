"""Dynamic (and weight-only) qconfigs under FX graph mode, against torch.ao's FX (torch 2.13).

Placement of the (placeholder) observers after ``prepare_fx`` and module types after
``convert_fx`` must equal torch's.  Outputs: the dynamic Linear outputs are bit-exact (same
per-call activation qparams, reduce_range, exact int32 accumulation); the LSTM / GRU / cell
outputs differ from fbgemm's by float rounding only (the gates are computed in float from the
int32 accumulators in a different order), so those are compared by SQNR (>= 35 dB, the issue's
bar; in practice ~140 dB) and a 1e-5 absolute bound.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils._pytree as pytree

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx

import torchquant.nn.intrinsic.quantized.dynamic as nniqd
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.dynamic as nnqd
import torchquant.nn.quantized.reference as nnqr
from torchquant.quantization import qconfig as tq_qconfig
from torchquant.quantization import quantize_fx
from torchquant.quantization.fx.convert import quantize_per_tensor_dynamic, round_to_float16
from torchquant.quantization.summary import summary


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class RecurrentModel(nn.Module):
    """The issue's fourth model: nn.LSTM feeding Linear (+ F.relu, fused), a functional
    F.linear, a GRU and an LSTMCell on a slice of the input."""

    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True)
        self.fc = nn.Linear(16, 6)
        self.w = nn.Parameter(torch.randn(4, 6) * 0.3)
        self.gru = nn.GRU(8, 8)
        self.cell = nn.LSTMCell(8, 8)

    def forward(self, x):
        y, _ = self.lstm(x)
        z = F.relu(self.fc(y))
        g, _ = self.gru(x)
        h, c = self.cell(x[:, 0])
        return F.linear(z, self.w), g, h, c


class EmbeddingLSTM(nn.Module):
    """Embedding (weight-only) -> LSTM with an explicit (h, c) state -> Linear."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.lstm = nn.LSTM(8, 8)
        self.fc = nn.Linear(8, 4)

    def forward(self, idx, h, c):
        y, _ = self.lstm(self.emb(idx), (h, c))
        return self.fc(y)


def _placement(gm):
    modules = dict(gm.named_modules(remove_duplicate=False))
    return [(str(n.target), type(modules[str(n.target)]).__name__,
             str(modules[str(n.target)].dtype).rpartition(".")[2], n.args[0].name,
             sorted(u.name for u in n.users))
            for n in gm.graph.nodes
            if n.op == "call_module" and str(n.target).startswith("activation_post_process")]


def _sqnr(reference, other):
    return (20 * torch.log10(reference.norm() / (reference - other).norm())).item()


def _leaves(out):
    return pytree.tree_leaves(out)


QCONFIG_NAMES = ["default_dynamic_qconfig", "per_channel_dynamic_qconfig",
                 "float16_dynamic_qconfig"]


def _prepare_both(model, ours_map, theirs_map, example, calib):
    ours = quantize_fx.prepare_fx(model, ours_map, example)
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), theirs_map, example)
    for inputs in calib:
        ours(*inputs)
        theirs(*inputs)
    return ours, theirs


def _recurrent(qconfig_name):
    torch.manual_seed(0)
    model = RecurrentModel().eval()
    example = (torch.randn(3, 5, 8),)
    ours_map = tq_qconfig.QConfigMapping().set_global(getattr(tq_qconfig, qconfig_name))
    theirs_map = ao.QConfigMapping().set_global(getattr(ao, qconfig_name))
    ours, theirs = _prepare_both(model, ours_map, theirs_map, example, [example])
    return model, ours, theirs


@pytest.mark.parametrize("qconfig_name", QCONFIG_NAMES)
def test_dynamic_prepare_places_observers_like_torch(qconfig_name):
    _, ours, theirs = _recurrent(qconfig_name)
    placement = _placement(ours)
    assert placement == _placement(theirs)
    # inputs of lstm / gru (shared), fc, cell, F.linear, and F.linear's weight; no outputs
    assert len(placement) == 5


@pytest.mark.parametrize("qconfig_name", QCONFIG_NAMES)
def test_dynamic_convert_module_types_and_outputs_match_torch(qconfig_name):
    model, ours, theirs = _recurrent(qconfig_name)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    assert type(q_ours.lstm) is nnqd.LSTM and type(q_ours.gru) is nnqd.GRU
    assert type(q_ours.cell) is nnqd.LSTMCell and type(q_ours.fc) is nniqd.LinearReLU
    # torch keeps F.linear a functional torch.ops.quantized.linear_dynamic(_fp16) call on a
    # _packed_weight_0 attribute; ours a torchquant.linear_dynamic(_fp16) call on
    # _packed_weight_0* buffers -- no new submodule
    assert [n for n, _ in q_ours.named_children()] == [n for n, _ in q_theirs.named_children()]
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    expected_dtype = torch.float16 if "float16" in qconfig_name else torch.qint8
    op = (torch.ops.torchquant.linear_dynamic_fp16.default if expected_dtype is torch.float16
          else torch.ops.torchquant.linear_dynamic.default)
    (call,) = [n for n in q_ours.graph.nodes if n.op == "call_function" and n.target is op]
    assert call.args[1].op == "get_attr" and call.args[1].target == "_packed_weight_0"
    (theirs_call,) = [n for n in q_theirs.graph.nodes if n.op == "call_function"
                      and "linear_dynamic" in str(n.target)]
    assert theirs_call.args[1].target == "_packed_weight_0"
    assert (q_ours.lstm.dtype is torch.float16) == (expected_dtype is torch.float16)
    torch.manual_seed(3)
    for _ in range(2):
        x = torch.randn(3, 5, 8)
        outs = zip(_leaves(q_ours(x)), _leaves(q_theirs(x)), _leaves(model(x)))
        for i, (a, b, f) in enumerate(outs):
            if i == 0 and expected_dtype is torch.qint8:
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert _sqnr(b, a) >= 35
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            assert _sqnr(f, a) >= 20


def test_dynamic_reference_model_uses_reference_modules_and_dynamic_quantize():
    model, ours, theirs = _recurrent("default_dynamic_qconfig")
    ref = quantize_fx.convert_to_reference_fx(ours)
    assert type(ref.lstm) is nnqr.LSTM and type(ref.gru) is nnqr.GRU
    assert type(ref.cell) is nnqr.LSTMCell and type(ref.fc[0]) is nnqr.Linear
    functions = [n.target for n in ref.graph.nodes if n.op == "call_function"]
    assert functions.count(quantize_per_tensor_dynamic) == 4
    ref_theirs = ao_fx.convert_to_reference_fx(theirs)
    x = torch.randn(3, 5, 8)
    for a, b in zip(_leaves(ref(x)), _leaves(ref_theirs(x))):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    ref16 = quantize_fx.convert_to_reference_fx(_recurrent("float16_dynamic_qconfig")[1])
    functions = [n.target for n in ref16.graph.nodes if n.op == "call_function"]
    assert functions.count(round_to_float16) == 5       # 4 activations + F.linear's weight


def test_static_global_with_dynamic_lstm_and_weight_only_embedding_match_torch():
    torch.manual_seed(0)
    model = EmbeddingLSTM().eval()

    def inputs():
        return (torch.randint(0, 20, (5, 2)), torch.randn(1, 2, 8), torch.randn(1, 2, 8))

    ours_map = (tq_qconfig.get_default_qconfig_mapping("x86")
                .set_object_type(nn.LSTM, tq_qconfig.default_dynamic_qconfig)
                .set_object_type(nn.Embedding, tq_qconfig.float_qparams_weight_only_qconfig))
    theirs_map = (ao.get_default_qconfig_mapping("x86")
                  .set_object_type(nn.LSTM, ao.default_dynamic_qconfig)
                  .set_object_type(nn.Embedding, ao.float_qparams_weight_only_qconfig))
    example = inputs()
    ours, theirs = _prepare_both(model, ours_map, theirs_map, example,
                                 [inputs() for _ in range(3)])
    assert _placement(ours) == _placement(theirs)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    assert type(q_ours.emb) is nnq.Embedding and type(q_ours.lstm) is nnqd.LSTM
    assert type(q_ours.fc) is nnq.Linear                        # static
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    x = inputs()
    a, b, f = q_ours(*x), q_theirs(*x), model(*x)
    assert _sqnr(b, a) >= 35 and _sqnr(f, a) >= 20


def test_converted_dynamic_model_exports_and_compiles():
    _, ours, _ = _recurrent("default_dynamic_qconfig")
    q = quantize_fx.convert_fx(ours)
    x = torch.randn(3, 5, 8)
    expected = _leaves(q(x))
    exported = torch.export.export(q, (x,))
    targets = {str(n.target) for n in exported.graph.nodes if n.op == "call_function"}
    assert "torchquant.linear_dynamic.default" in targets
    for a, b in zip(_leaves(exported.module()(x)), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(_leaves(torch.compile(q, fullgraph=True)(x)), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def test_global_dynamic_qconfig_leaves_other_ops_float_without_prepare_warnings():
    class ConvThenLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3)
            self.fc = nn.Linear(4, 2)

        def forward(self, x):
            return self.fc(torch.add(self.conv(x), 1.0).mean((2, 3)))

    model = ConvThenLinear().eval()
    mapping = tq_qconfig.QConfigMapping().set_global(tq_qconfig.default_dynamic_qconfig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")          # torch is silent here too
        prepared = quantize_fx.prepare_fx(model, mapping, (torch.randn(1, 3, 6, 6),))
    q = quantize_fx.convert_fx(prepared)
    assert type(q.conv) is nn.Conv2d and type(q.fc) is nnqd.Linear


class FunctionalLinears(nn.Module):
    """F.relu(F.linear(x, w1, b1)) (torch: linear_relu_dynamic) and F.linear(., w2) without a
    bias (torch: linear_dynamic)."""

    def __init__(self):
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(6, 8) * 0.3)
        self.b1 = nn.Parameter(torch.randn(6) * 0.1)
        self.w2 = nn.Parameter(torch.randn(4, 6) * 0.3)

    def forward(self, x):
        h = F.relu(F.linear(x, self.w1, self.b1))
        return F.linear(h, self.w2), h


def _functional(qconfig_name, seed=0, **convert_kwargs):
    torch.manual_seed(seed)
    model = FunctionalLinears().eval()
    example = (torch.randn(3, 8),)
    ours_map = tq_qconfig.QConfigMapping().set_global(getattr(tq_qconfig, qconfig_name))
    theirs_map = ao.QConfigMapping().set_global(getattr(ao, qconfig_name))
    ours, theirs = _prepare_both(model, ours_map, theirs_map, example, [example])
    return (model, quantize_fx.convert_fx(ours, **convert_kwargs),
            ao_fx.convert_fx(theirs, **convert_kwargs))


def _calls(gm):
    return [n for n in gm.graph.nodes if n.op in ("call_function", "call_module")]


@pytest.mark.parametrize("qconfig_name", QCONFIG_NAMES)
def test_dynamic_functional_linear_stays_a_functional_call_as_torch(qconfig_name):
    model, ours, theirs = _functional(qconfig_name)
    fp16 = "float16" in qconfig_name
    assert not list(ours.named_children()) and not list(theirs.named_children())
    op = (torch.ops.torchquant.linear_dynamic_fp16.default if fp16
          else torch.ops.torchquant.linear_dynamic.default)
    theirs_ops = ([torch.ops.quantized.linear_relu_dynamic_fp16,
                   torch.ops.quantized.linear_dynamic_fp16] if fp16 else
                  [torch.ops.quantized.linear_relu_dynamic, torch.ops.quantized.linear_dynamic])
    assert [n.target for n in _calls(theirs)] == theirs_ops
    first, second = _calls(ours)           # F.relu fused into the first, as torch
    assert first.target is op and second.target is op
    # the op's argument list: x, weight (, scale, zero point), bias, (reduce_range,) relu
    for call, bias, relu, n in ((first, True, True, 0), (second, False, False, 1)):
        holder = f"_packed_weight_{n}"
        names = [a.target if isinstance(a, torch.fx.Node) and a.op == "get_attr" else a
                 for a in call.args[1:]]
        qparams = [] if fp16 else [holder + "_scale", holder + "_zero_point"]
        assert names == [holder, *qparams, holder + "_bias" if bias else None,
                         *([] if fp16 else [True]), relu]
    weight = ours._packed_weight_0
    assert weight.dtype is (torch.float16 if fp16 else torch.int8)
    if not fp16:
        per_channel = "per_channel" in qconfig_name
        assert ours._packed_weight_0_scale.dim() == (1 if per_channel else 0)
        assert ours._packed_weight_0_zero_point.shape == ours._packed_weight_0_scale.shape
        # the same int8 weight as torch's packed one
        w_theirs, b_theirs = torch.ops.quantized.linear_unpack(theirs._packed_weight_0)
        assert torch.equal(weight, w_theirs.int_repr())
        assert torch.equal(ours._packed_weight_0_bias, b_theirs)
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 8)
        for a, b, f in zip(ours(x), theirs(x), model(x)):
            if fp16:    # fbgemm's fp16 GEMM sums in another order
                torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
            else:
                torch.testing.assert_close(a, b, rtol=0, atol=0)
            assert _sqnr(f, a) >= 20
    with torch.inference_mode():
        for a, b in zip(ours(x), theirs(x)):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5 if fp16 else 0)
    # the coverage line counts the two functional calls as quantized (it said "0 of 0")
    report = summary(ours)
    assert [(m.name, m.state) for m in report.modules] == \
        [(first.name, "quantized"), (second.name, "quantized")]


@pytest.mark.parametrize("qconfig_name", QCONFIG_NAMES)
def test_dynamic_functional_linear_keeps_original_weights_as_torch(qconfig_name):
    model, ours, theirs = _functional(qconfig_name, keep_original_weights=True)
    lookup, theirs_lookup = ours.original_weights_lookup, theirs.original_weights_lookup
    assert list(lookup) == list(theirs_lookup) == ["_packed_weight_0", "_packed_weight_1"]
    for name in lookup:     # torch's lists carry the weight's qparams after [weight, bias]
        assert torch.equal(lookup[name][0], theirs_lookup[name][0])
    assert torch.equal(lookup["_packed_weight_0"][0], model.w1)
    assert torch.equal(lookup["_packed_weight_0"][1], model.b1)
    assert torch.equal(lookup["_packed_weight_1"][0], model.w2)
    assert lookup["_packed_weight_1"][1] is None


@pytest.mark.parametrize("qconfig_name", QCONFIG_NAMES)
def test_dynamic_functional_linear_state_dict_round_trip_and_load(qconfig_name, tmp_path):
    _, ours, _ = _functional(qconfig_name, seed=0)
    _, other, _ = _functional(qconfig_name, seed=5)       # other weights (and qparams)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    expected, other_expected = ours(x), other(x)
    assert not torch.equal(expected[0], other_expected[0])
    path = tmp_path / "sd.pt"
    torch.save(ours.state_dict(), path)
    loaded = torch.load(path, weights_only=True)
    assert {k for k in loaded if k.startswith("_packed_weight_")} >= {
        "_packed_weight_0", "_packed_weight_0_bias", "_packed_weight_1"}
    for key, value in ours.state_dict().items():
        assert torch.equal(loaded[key], value) and loaded[key].dtype == value.dtype
    ours.load_state_dict(other.state_dict())              # repacks: the other's outputs
    for a, b in zip(ours(x), other_expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    ours.load_state_dict(loaded)                          # and back
    for a, b in zip(ours(x), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    with torch.inference_mode():
        for a, b in zip(ours(x), expected):
            torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("qconfig_name", ["default_dynamic_qconfig", "float16_dynamic_qconfig"])
def test_dynamic_functional_linear_exports_and_compiles(qconfig_name):
    _, ours, _ = _functional(qconfig_name)
    x = torch.randn(3, 8)
    expected = ours(x)
    exported = torch.export.export(ours, (x,))
    name = ("torchquant.linear_dynamic_fp16.default" if "float16" in qconfig_name
            else "torchquant.linear_dynamic.default")
    targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
    assert targets.count(name) == 2
    for a, b in zip(exported.module()(x), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(torch.compile(ours, fullgraph=True)(x), expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
