"""The dynamic recurrent time-step ops (``torchquant::lstm_step_dynamic``, ``gru_step_dynamic``,
``rnn_step_dynamic``): fake kernels (``opcheck``), the op equal to the eager function and to the
dynamic cell modules (the same code, so bit-exact), and ``torch.export`` of the dynamic LSTM /
GRU (int8 and float16 weights): one ``rnn_input_projection_dynamic`` (or
``linear_dynamic_fp16``) node per layer x direction for the input projection, one step node per
time step, outputs equal eager.  torch's modules are the oracle of
tests/nn/test_dynamic_modules.py; the exported LSTM equals torch.ao's bit for bit here too (the
projections use fbgemm's fused epilogue, the gates torch's own ATen ops in torch's order)."""
import pytest
import torch
import torch.nn as nn
import torch.ao.nn.quantized.dynamic as ao_nnqd
import torch.ao.quantization as aoq

import torchquant.nn.quantized.dynamic as nnqd
from torchquant import quantization as tqq
from torchquant.ops import linear_fp16 as ops_fp16
from torchquant.ops import rnn as ops_rnn

QCONFIGS = {"int8": tqq.default_dynamic_qconfig,
            "int8_per_channel": tqq.per_channel_dynamic_qconfig,
            "fp16": tqq.float16_dynamic_qconfig}
IN, HIDDEN, BATCH = 12, 8, 3


def _opcheck(op, args):
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


def _cell(kind, weights, **kw):
    torch.manual_seed(6)
    flt = getattr(nn, kind)(IN, HIDDEN, **kw)
    flt.qconfig = QCONFIGS[weights]
    return getattr(nnqd, kind).from_float(flt)


def _input_projection(cell, x):
    packed = cell._packed_weight_ih.packed
    if isinstance(packed, ops_fp16.PackedLinearFp16Weight):
        return ops_fp16.linear_dynamic_fp16(x, packed)
    return ops_rnn.input_projection(x, packed, reduce_range=True)


@pytest.mark.parametrize("weights", ["int8", "int8_per_channel", "fp16"])
def test_lstm_step_op(weights):
    cell = _cell("LSTMCell", weights)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(BATCH, IN, generator=gen)
    h, c = torch.randn(BATCH, HIDDEN, generator=gen), torch.randn(BATCH, HIDDEN, generator=gen)
    packed = cell._packed_weight_hh.packed
    ih = _input_projection(cell, x)
    args = (ih, h, c, *ops_rnn._graph_args(packed), True)
    _opcheck(torch.ops.torchquant.lstm_step_dynamic.default, args)
    got = torch.ops.torchquant.lstm_step_dynamic(*args)
    eager = ops_rnn.lstm_step(ih, h, c, packed, True)
    with torch.no_grad():
        module = cell(x, (h, c))
    for g, e, m in zip(got, eager, module):
        assert g.shape == (BATCH, HIDDEN)
        assert torch.equal(g, e) and torch.equal(g, m)


@pytest.mark.parametrize("weights", ["int8", "int8_per_channel", "fp16"])
@pytest.mark.parametrize("kind", ["GRUCell", "RNNCell_tanh", "RNNCell_relu"])
def test_gru_and_rnn_step_ops(kind, weights):
    kwargs = {} if kind == "GRUCell" else {"nonlinearity": kind.split("_")[1]}
    cell = _cell(kind.split("_")[0], weights, **kwargs)
    gen = torch.Generator().manual_seed(8)
    x, h = torch.randn(BATCH, IN, generator=gen), torch.randn(BATCH, HIDDEN, generator=gen)
    packed = cell._packed_weight_hh.packed
    ih = _input_projection(cell, x)
    if kind == "GRUCell":
        op, extra = torch.ops.torchquant.gru_step_dynamic, ()
        eager = ops_rnn.gru_step(ih, h, packed, True)
    else:
        op, extra = torch.ops.torchquant.rnn_step_dynamic, (kwargs["nonlinearity"],)
        eager = ops_rnn.rnn_step(ih, h, packed, True, *extra)
    args = (ih, h, *ops_rnn._graph_args(packed), True, *extra)
    _opcheck(op.default, args)
    got = op(*args)
    with torch.no_grad():
        assert torch.equal(got, eager) and torch.equal(got, cell(x, h))
    if kind == "RNNCell_relu":
        assert (got >= 0).all() and (got == 0).any()


def test_rnn_step_op_rejects_an_unknown_nonlinearity():
    cell = _cell("RNNCell", "int8")
    ih, h = torch.randn(BATCH, HIDDEN), torch.randn(BATCH, HIDDEN)
    with pytest.raises(ValueError, match="'tanh' or 'relu'"):
        torch.ops.torchquant.rnn_step_dynamic(
            ih, h, *ops_rnn._graph_args(cell._packed_weight_hh.packed), True, "gelu")


def _step_nodes(ep):
    targets = [str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    return {t: targets.count(t) for t in set(targets) if t.startswith("torchquant.")}


@pytest.mark.parametrize("mode", ["LSTM", "GRU"])
@pytest.mark.parametrize("weights", ["int8", "fp16"])
def test_export_dynamic_rnn(mode, weights):
    torch.manual_seed(9)
    flt = getattr(nn, mode)(IN, HIDDEN, num_layers=2, bidirectional=True).eval()
    flt.qconfig = QCONFIGS[weights]
    model = getattr(nnqd, mode).from_float(flt)
    steps = 5
    x = torch.randn(steps, BATCH, IN)
    ep = torch.export.export(model, (x,))
    projection = ("torchquant.linear_dynamic_fp16.default" if weights == "fp16"
                  else "torchquant.rnn_input_projection_dynamic.default")
    step = f"torchquant.{mode.lower()}_step_dynamic.default"
    assert _step_nodes(ep) == {projection: 2 * 2, step: 2 * 2 * steps}
    with torch.no_grad():
        expected = model(x)
        got = ep.module()(x)
        x2 = torch.randn(steps, BATCH, IN) * 3
        expected2, got2 = model(x2), ep.module()(x2)
    for a, b in ((got, expected), (got2, expected2)):
        assert torch.equal(a[0], b[0])
        hidden_a = a[1] if mode == "LSTM" else (a[1],)
        hidden_b = b[1] if mode == "LSTM" else (b[1],)
        for s, t in zip(hidden_a, hidden_b):
            assert torch.equal(s, t)


def test_exported_dynamic_lstm_matches_torch():
    torch.manual_seed(10)
    flt = nn.LSTM(IN, HIDDEN, num_layers=2).eval()
    flt.qconfig = tqq.default_dynamic_qconfig
    ours = nnqd.LSTM.from_float(flt)
    flt.qconfig = aoq.default_dynamic_qconfig
    theirs = ao_nnqd.LSTM.from_float(flt)
    x = torch.randn(6, BATCH, IN)
    ep = torch.export.export(ours, (x,))
    with torch.no_grad():
        got, expected = ep.module()(x)[0], theirs(x)[0]
    assert torch.equal(got, expected)


@pytest.mark.parametrize("weights", ["int8", "int8_per_channel"])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_input_projection_op_matches_torch(weights, rows):
    """``rnn_input_projection_dynamic``: fake kernel, op == eager, and torch.ao's dynamic
    Linear (fbgemm, reduce_range) bit for bit -- a few rows through the exact float32 GEMM,
    many through oneDNN's accumulator, both with fbgemm's fused epilogue."""
    torch.manual_seed(11)
    flt = nn.Linear(IN, 4 * HIDDEN)
    flt.qconfig = QCONFIGS[weights]
    packed = nnqd.Linear.from_float(flt)._packed_params.packed
    flt.qconfig = (aoq.default_dynamic_qconfig if weights == "int8"
                   else aoq.per_channel_dynamic_qconfig)
    theirs = ao_nnqd.Linear.from_float(flt)
    x = torch.randn(rows, IN, generator=torch.Generator().manual_seed(11)) * 2
    args = (x, *ops_rnn._graph_args(packed), True)
    _opcheck(torch.ops.torchquant.rnn_input_projection_dynamic.default, args)
    got = torch.ops.torchquant.rnn_input_projection_dynamic(*args)
    assert torch.equal(got, ops_rnn.input_projection(x, packed, True))
    with torch.no_grad():
        assert torch.equal(got, theirs(x))


@pytest.mark.parametrize("hidden", [33, 64])
@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_cells_equal_torch_bit_for_bit(kind, hidden):
    """The cells (input projection, hidden projection, torch's gate ops in torch's order) give
    torch.ao's cells' outputs exactly -- hidden 33 takes torch's per-chunk gate ops (vector
    tails), 64 the merged ones."""
    torch.manual_seed(12)
    flt = getattr(nn, kind)(IN, hidden)
    flt.qconfig = tqq.default_dynamic_qconfig
    ours = getattr(nnqd, kind).from_float(flt)
    flt.qconfig = aoq.default_dynamic_qconfig
    theirs = getattr(ao_nnqd, kind).from_float(flt)
    for batch in (1, 5):
        x, h = torch.randn(batch, IN), torch.randn(batch, hidden) * 0.5
        hx = (h, h * 0.7) if kind == "LSTMCell" else h
        with torch.no_grad():
            got, want = ours(x, hx), theirs(x, hx)
        for g, w in zip(got if kind == "LSTMCell" else (got,),
                        want if kind == "LSTMCell" else (want,)):
            assert torch.equal(g, w)


# ---- under torch.compile: one opaque op per direction ---------------------------------------

def _compiled_graph_targets(model, x):
    """The ops in the graph dynamo hands its backend (the whole model in one graph)."""
    targets = []

    def backend(gm, example_inputs):
        targets.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward
    torch._dynamo.reset()
    out = torch.compile(model, backend=backend, fullgraph=True)(x)
    return targets, out


@pytest.mark.parametrize("cls, op", [(torch.nn.LSTM, "lstm_sequence_dynamic"),
                                     (torch.nn.GRU, "gru_sequence_dynamic")])
@pytest.mark.parametrize("native", [True, False])
def test_compiled_dynamic_rnn_is_one_sequence_op_per_direction(cls, op, native, monkeypatch):
    """Stepping under compile made T opaque step calls (slower than float); the sequence op
    runs the native loop, or the step functions where it cannot: eager's numbers either way."""
    import torchquant.quantization as tq
    from torchquant.ops import rnn as ops_rnn
    if not native:
        monkeypatch.setattr(ops_rnn, "_sequence_at_run_time", lambda *a, **k: None)
    torch.manual_seed(0)
    model = tq.quantize_dynamic(torch.nn.Sequential(cls(32, 32, 2, bidirectional=True)).eval(),
                                {cls}, dtype=torch.qint8)
    x = torch.randn(5, 3, 32)
    with torch.no_grad():
        expected = model(x)
        targets, got = _compiled_graph_targets(model, x)
    assert sum(op in t for t in targets) == 4  # 2 layers x 2 directions
    assert not any("step_dynamic" in t for t in targets)
    assert torch.equal(got[0], expected[0])
    for g, e in zip(got[1] if isinstance(got[1], tuple) else (got[1],),
                    expected[1] if isinstance(expected[1], tuple) else (expected[1],)):
        assert torch.equal(g, e)
