"""The PT2E numeric debugger against torchao 0.18's (``torchao.quantization.pt2e``).

torchao 0.18 keys its results by ``NodeSourceDebugInfo(name, graph_id)`` (the float node a
logged node descends from); so does torchquant, with the integer handle of that float node
kept as ``.handle`` (``graph_id`` is the graph's index, where torchao's is an object id, so
the oracle tests compare names): the same set of keys, and SQNR per key within 0.1 dB (both flows quantize identically; the tolerance only absorbs
float32 summation order in the norms).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from _models import MODELS
from torchquant.quantization import pt2e
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer import x86_inductor_quantizer as tq_x86
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn

ao = pytest.importorskip("torchao.quantization.pt2e")
ao_q = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ao_xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
ao_x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")

pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")


def _export(name):
    cls, make_inputs = MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    args = make_inputs()
    return model, args


def _handles_by_name(gm):
    return {n.name: pt2e._numeric_debugger.get_debug_handle(n) for n in gm.graph.nodes
            if pt2e._numeric_debugger.get_debug_handle(n) is not None}


def test_keys_are_torchaos():
    assert (pt2e.CUSTOM_KEY, pt2e.NUMERIC_DEBUG_HANDLE_KEY, pt2e.FROM_NODE_KEY) == (
        ao.CUSTOM_KEY, ao.NUMERIC_DEBUG_HANDLE_KEY, ao.FROM_NODE_KEY)


@pytest.mark.parametrize("name", ["residual", "add_mul_cat"])
def test_generate_handles_matches_torchao(name):
    model, args = _export(name)
    ours, theirs = torch.export.export(model, args), torch.export.export(model, args)
    pt2e.generate_numeric_debug_handle(ours)
    ao.generate_numeric_debug_handle(theirs)
    assert _handles_by_name(ours.graph_module) == _handles_by_name(theirs.graph_module)
    handles = list(_handles_by_name(ours.graph_module).values())
    assert len(handles) == len(set(handles)) == sum(
        n.op not in ("placeholder", "output") for n in ours.graph.nodes)


class CondModel(nn.Module):
    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda t: t.sin() + 1, lambda t: t.cos() * 2, (x,)) + x


def test_generate_handles_reaches_subgraphs_and_counts_past_existing():
    args = (torch.randn(3),)
    ours, theirs = (torch.export.export(CondModel(), args) for _ in range(2))
    first = next(n for n in ours.graph.nodes if n.op == "call_function")
    first.meta[pt2e.CUSTOM_KEY] = {pt2e.NUMERIC_DEBUG_HANDLE_KEY: 100}
    first_theirs = next(n for n in theirs.graph.nodes if n.op == "call_function")
    first_theirs.meta[ao.CUSTOM_KEY] = {ao.NUMERIC_DEBUG_HANDLE_KEY: 100}
    pt2e.generate_numeric_debug_handle(ours)
    ao.generate_numeric_debug_handle(theirs)

    def all_handles(ep):
        result = []
        for gm in [ep.graph_module] + [m for m in ep.graph_module.modules()
                                       if isinstance(m, torch.fx.GraphModule)][1:]:
            result += [(gm.__class__.__name__, n.name, n.meta.get("custom", {}).get(
                "numeric_debug_handle")) for n in gm.graph.nodes
                if n.op not in ("placeholder", "output")]
        return result

    mine = all_handles(ours)
    assert mine == all_handles(theirs)
    assert len(mine) > sum(n.op not in ("placeholder", "output") for n in ours.graph.nodes)
    assert min(h for *_, h in mine) == 100 and sorted(h for *_, h in mine)[1] == 101


def test_generate_handles_rejects_non_programs():
    with pytest.raises(ValueError, match="ExportedProgram"):
        pt2e.generate_numeric_debug_handle(nn.Linear(2, 2))


def _quantized(name, flow):
    """(float gm with handles, our converted gm, torchao's float gm, torchao's converted gm,
    args): one seeded float model through both flows."""
    model, args = _export(name)
    ep, ep_ao = torch.export.export(model, args), torch.export.export(model, args)
    pt2e.generate_numeric_debug_handle(ep)
    ao.generate_numeric_debug_handle(ep_ao)
    if flow == "xnnpack":
        q = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
        q_ao = ao_xnn.XNNPACKQuantizer().set_global(ao_xnn.get_symmetric_quantization_config())
    else:
        q = tq_x86.X86InductorQuantizer().set_global(
            tq_x86.get_default_x86_inductor_quantization_config())
        q_ao = ao_x86.X86InductorQuantizer().set_global(
            ao_x86.get_default_x86_inductor_quantization_config())
    prepared, prepared_ao = prepare_pt2e(ep.module(), q), ao_q.prepare_pt2e(ep_ao.module(), q_ao)
    calib = [tuple(torch.randn_like(a) for a in args) for _ in range(3)]
    for batch in calib:
        prepared(*batch)
        prepared_ao(*batch)
    return ep.module(), convert_pt2e(prepared), ep_ao.module(), ao_q.convert_pt2e(prepared_ao), args


_TIE_SENSITIVE = {("residual", "adaptive_avg_pool2d"), ("residual", "flatten"),
                  ("residual", "linear")}


@pytest.mark.parametrize("name,flow", [("residual", "xnnpack"), ("mlp", "xnnpack"),
                                       ("conv_bn_relu", "x86"), ("add_mul_cat", "x86")])
def test_compare_results_matches_torchao(name, flow):
    float_gm, quant_gm, float_ao, quant_ao, args = _quantized(name, flow)
    inputs = [args, tuple(torch.randn_like(a) for a in args)]

    def run(gm, prepare):
        logged = prepare(gm)
        for batch in inputs:
            logged(*batch)
        return logged

    ours = pt2e.compare_results(
        pt2e.extract_results_from_loggers(run(float_gm, pt2e.prepare_for_propagation_comparison)),
        pt2e.extract_results_from_loggers(run(quant_gm, pt2e.prepare_for_propagation_comparison)))
    theirs = ao.compare_results(
        ao.extract_results_from_loggers(run(float_ao, ao.prepare_for_propagation_comparison)),
        ao.extract_results_from_loggers(run(quant_ao, ao.prepare_for_propagation_comparison)))
    handles = _handles_by_name(float_gm)
    ours_by_name = {k.name: s for k, s in ours.items()}
    theirs_by_name = {k.name: s for k, s in theirs.items()}
    for key, summary in ours.items():  # torchao's shape, the integer handle kept
        assert isinstance(key, pt2e.NodeSourceDebugInfo) and key.graph_id == 0
        assert summary.debug_info is key and summary.handle == key.handle == handles[key.name]
        assert ours[pt2e.NodeSourceDebugInfo(name=key.name, graph_id=0)] is summary
    assert set(ours_by_name) == set(theirs_by_name)
    assert len(ours_by_name) >= 3
    for node_name, summary in ours_by_name.items():
        assert isinstance(summary, pt2e.NodeAccuracySummary)
        assert summary.ref_node_name == node_name
        other = theirs_by_name[node_name]
        assert len(summary.results) == len(other.results) == len(inputs)
        # residual: adaptive_avg_pool2d averages 8x8 codes, so its output can sit exactly
        # half-way between two codes; torchquant's quantize (torch eager's rounding of
        # x / scale + zero_point) and torchao's quantized_decomposed (round(x / scale), then
        # + zero_point) break such ties differently, one code on a 16-element tensor
        tol = 0.5 if (name, node_name) in _TIE_SENSITIVE else 0.1
        for a, b in zip(summary.results, other.results):
            sa, sb = float(a.sqnr), float(b.sqnr)
            assert (math.isinf(sa) and math.isinf(sb)) or abs(sa - sb) < tol, node_name
            if tol == 0.1:
                assert float(a.mse_loss) == pytest.approx(float(b.mse_loss), rel=1e-3,
                                                          abs=1e-9)


def test_handles_survive_prepare_and_convert():
    model, args = _export("residual")
    ep = torch.export.export(model, args)
    pt2e.generate_numeric_debug_handle(ep)
    float_handles = _handles_by_name(ep.module())
    quantizer = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
    prepared = prepare_pt2e(ep.module(), quantizer)
    modules = dict(prepared.named_modules())
    observers = [n for n in prepared.graph.nodes if n.op == "call_module"
                 and "activation_post_process" in str(n.target)]
    get = pt2e._numeric_debugger.get_debug_handle
    # output observers carry the handle of the node they observe, input-edge observers that
    # of their consumer
    assert observers and all(get(o) is not None for o in observers)
    for obs in observers:
        consumers = {get(u) for u in obs.users}
        assert get(obs) in consumers | {get(obs.args[0])}, obs.name
    assert modules
    prepared(*args)
    converted = convert_pt2e(prepared)
    qdq = [n for n in converted.graph.nodes if n.op == "call_function"
           and "quantize" in str(n.target)]
    relu_qdq = [n for n in qdq if get(n) == float_handles["relu"]]
    assert len(relu_qdq) >= 2  # quantize + dequantize(s) of relu's output
    assert all(get(n) is not None for n in qdq)
    # every op that is still in the graph keeps its handle (batch norms are folded away)
    for node in converted.graph.nodes:
        if node.name in float_handles:
            assert pt2e._numeric_debugger.get_debug_handle(node) == float_handles[node.name]
    # the logger of a quantized op sits after the dequantize of its output
    logged = pt2e.prepare_for_propagation_comparison(converted)
    relu_handle = float_handles["relu"]
    logger = next(m for m in logged.children() if isinstance(m, pt2e.OutputLogger)
                  and m.debug_handle == relu_handle)
    assert "dequantize" in logger.node_name


def test_logger_extract_and_compare_semantics():
    model, args = _export("mlp")
    ep = torch.export.export(model, args)
    pt2e.generate_numeric_debug_handle(ep)
    gm = ep.module()
    logged = pt2e.prepare_for_propagation_comparison(gm)
    assert logged is not gm
    assert not any(isinstance(m, pt2e.OutputLogger) for m in gm.children())
    torch.testing.assert_close(logged(*args), gm(*args))
    logged(*args)
    results = pt2e.extract_results_from_loggers(logged)
    assert {k.handle for k in results} == set(_handles_by_name(gm).values())
    assert {k.name for k in results} == set(_handles_by_name(gm))
    first, last = (min(results, key=lambda k: k.handle), max(results, key=lambda k: k.handle))
    name, stack, stats = results[first]
    assert isinstance(name, str) and len(stats) == 2
    # a key only one side recorded is skipped
    partial = dict(results)
    dropped = partial.pop(last)
    summary = pt2e.compare_results(results, partial)
    assert last not in summary and dropped
    same = summary[first]
    assert all(math.isinf(float(r.sqnr)) and float(r.mse_loss) == 0 for r in same.results)
    # results keyed by integer handles (torchquant's earlier shape) are still accepted
    by_handle = {k.handle: v for k, v in results.items()}
    assert pt2e.compare_results(by_handle, by_handle)[first.handle].handle == first.handle
    logger = pt2e.OutputLogger(7, "n", None)
    x = torch.randn(3, requires_grad=True)
    assert logger(x) is x and not logger.stats[0].requires_grad


def test_comparison_result_matches_torchao():
    torch.manual_seed(1)
    ref = torch.randn(4, 5)
    actual = ref + 0.01 * torch.randn(4, 5)
    ours = pt2e.QuantizationComparisonResult(actual=actual, ref=ref)
    from torchao.quantization.pt2e._numeric_debugger import QuantizationComparisonResult
    theirs = QuantizationComparisonResult(actual=actual, ref=ref)
    assert float(ours.sqnr) == pytest.approx(float(theirs.sqnr), rel=1e-6)
    assert float(ours.mse_loss) == float(F.mse_loss(actual, ref))
    # loss functions are called as fn(actual, ref) like torchao
    assert float(ours.loss(lambda a, r: (a - r).sum())) == pytest.approx(
        float(theirs.loss(lambda a, r: (a - r).sum())))
    nested = pt2e.QuantizationComparisonResult(actual=[actual, {"k": actual}],
                                               ref=[ref, {"k": ref}])
    assert isinstance(nested.sqnr, list) and isinstance(nested.sqnr[1], dict)
    assert float(nested.sqnr[1]["k"]) == pytest.approx(float(theirs.sqnr))
    ints = pt2e.QuantizationComparisonResult(actual=[1], ref=[1])
    assert ints.sqnr == [None]
    with pytest.raises(ValueError, match="shape"):
        pt2e.QuantizationComparisonResult(actual=torch.zeros(2), ref=torch.zeros(3))
    with pytest.raises(ValueError):
        pt2e.QuantizationComparisonResult(actual=1.0, ref=torch.zeros(3))
    assert "sqnr" in repr(ours)
