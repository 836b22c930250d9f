"""No silent no-op in PT2E: prepare_pt2e / convert_pt2e warn naming annotated ops that end up
without observers / quantize-dequantize, and torchquant.quantization.summary lists, for an
exported model, which ops are quantized and which stayed float and why."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

from torchquant.quantization import observer as tq_obs
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer import QuantizationAnnotation, QuantizationSpec, Quantizer
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn
from torchquant.quantization.summary import summary


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.q = nn.Linear(8, 8)
        self.k = nn.Linear(8, 8)

    def forward(self, x):
        h = self.norm(x)
        att = torch.softmax(torch.matmul(self.q(h), self.k(h).transpose(-1, -2)), dim=-1)
        return torch.relu(att)


def _exported():
    torch.manual_seed(0)
    inputs = (torch.randn(2, 4, 8),)
    return torch.export.export(Attention().eval(), inputs).module(), inputs


def _states(report):
    return {m.name: (m.type_name, m.state, m.reason) for m in report.modules}


def test_summary_of_prepared_and_converted_model():
    gm, inputs = _exported()
    gm = prepare_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config()))
    gm(*inputs)
    prepared = _states(summary(gm))
    assert prepared["linear"][1] == "observed"
    converted = convert_pt2e(gm)
    report = summary(converted)
    states = _states(report)
    assert states["linear"] == ("linear.default", "quantized", None)
    assert states["linear_1"][1] == "quantized"
    # XNNPACK has no pattern for layer_norm / matmul / softmax: float, and the reason says so
    for name in ("layer_norm", "matmul", "softmax"):
        assert states[name][1] == "float"
        assert "not annotated" in states[name][2]
    assert report.count("quantized") == 2  # the two linears (nothing annotates the relu)
    assert "left in float" in report.line() and "softmax" in str(report)


class _FloatSpecQuantizer(Quantizer):
    """Annotates every linear with a float32 spec: convert removes float observers, so the
    linears end up with no quantize / dequantize."""

    def annotate(self, gm):
        spec = QuantizationSpec(dtype=torch.float32,
                                observer_or_fake_quant_ctr=tq_obs.PlaceholderObserver)
        for n in gm.graph.nodes:
            if n.target is torch.ops.aten.linear.default:
                n.meta["quantization_annotation"] = QuantizationAnnotation(
                    input_qspec_map={n.args[0]: spec}, output_qspec=spec, _annotated=True)
        return gm

    def validate(self, gm):
        pass


def test_convert_warns_when_annotated_ops_get_no_qdq():
    gm, inputs = _exported()
    gm = prepare_pt2e(gm, _FloatSpecQuantizer())
    gm(*inputs)
    with pytest.warns(UserWarning, match=r"convert_pt2e: .*stay float: linear \(linear.default\), "
                                         r"linear_1 \(linear.default\)"):
        converted = convert_pt2e(gm)
    states = _states(summary(converted))
    assert states["linear"][1] == "float"
    assert "no quantize / dequantize" in states["linear"][2]


def test_prepare_warns_when_annotated_op_gets_no_observer():
    """An annotation whose only input key is not an argument of the node: no observer at all."""

    class Wrong(Quantizer):
        def annotate(self, gm):
            spec = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127,
                                    qscheme=torch.per_tensor_affine,
                                    observer_or_fake_quant_ctr=tq_obs.MinMaxObserver)
            x = next(n for n in gm.graph.nodes if n.op == "placeholder")
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.softmax.int:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={x: spec}, _annotated=True)
            return gm

        def validate(self, gm):
            pass

    gm, inputs = _exported()
    with pytest.warns(UserWarning, match=r"prepare_pt2e: .*no observer.*softmax \(softmax.int\)"):
        prepare_pt2e(gm, Wrong())


def test_no_warning_on_a_fully_quantized_model():
    gm, inputs = _exported()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        gm = prepare_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
            tq_xnn.get_symmetric_quantization_config(is_dynamic=True)))
        gm(*inputs)
        convert_pt2e(gm)


# --------------------------------------------------------------------------------------------
# bad input: clear errors, the user's model unchanged
# --------------------------------------------------------------------------------------------

def _int8_spec():
    return QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127,
                            qscheme=torch.per_tensor_affine,
                            observer_or_fake_quant_ctr=tq_obs.MinMaxObserver)


def _shared_quantizer(target_fn):
    from torchquant.quantization.quantizer import SharedQuantizationSpec

    class Shared(Quantizer):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.linear.default:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={n.args[0]: _int8_spec()},
                        output_qspec=SharedQuantizationSpec(target_fn(gm, n)), _annotated=True)
            return gm

        def validate(self, gm):
            pass

    return Shared()


def _foreign_edge(gm, n):
    other, _ = _exported()
    linear = next(m for m in other.graph.nodes if m.target is torch.ops.aten.linear.default)
    return (linear.args[0], linear)


def _not_an_edge(gm, n):
    x = next(m for m in gm.graph.nodes if m.op == "placeholder")
    return (x, n)  # x feeds layer_norm, not the linear


def _assert_unchanged(gm, code, inputs, expected):
    assert gm.code == code
    assert not any("quantization_annotation" in n.meta for n in gm.graph.nodes)
    assert not any(name.startswith("activation_post_process") for name, _ in gm.named_modules())
    assert torch.equal(gm(*inputs), expected)


@pytest.mark.parametrize("target_fn,message", [
    (_foreign_edge, "is not a node of the model's graph"),
    (_not_an_edge, "not an edge of the graph"),
], ids=["foreign_edge", "not_an_edge"])
def test_shared_spec_pointing_outside_the_graph(target_fn, message):
    gm, inputs = _exported()
    code, expected = gm.code, gm(*inputs)
    with pytest.raises(ValueError, match=message):
        prepare_pt2e(gm, _shared_quantizer(target_fn))
    _assert_unchanged(gm, code, inputs, expected)


def test_composable_quantizer_conflict_leaves_model_unchanged():
    from torchquant.quantization.quantizer import ComposableQuantizer

    class Rewrites(Quantizer):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.target is torch.ops.aten.linear.default:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        output_qspec=_int8_spec(), _annotated=True)
            return gm

        def validate(self, gm):
            pass

    gm, inputs = _exported()
    code, expected = gm.code, gm(*inputs)
    xnn = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
    with pytest.raises(RuntimeError, match="Rewrites has changed annotations on node linear"):
        prepare_pt2e(gm, ComposableQuantizer([xnn, Rewrites()]))
    _assert_unchanged(gm, code, inputs, expected)


def test_bad_spec_and_train_eval_errors():
    with pytest.raises(ValueError, match="quant_min"):
        QuantizationSpec(dtype=torch.int8, quant_min=10, quant_max=-10,
                         observer_or_fake_quant_ctr=tq_obs.MinMaxObserver)
    with pytest.raises(ValueError, match="ch_axis"):
        QuantizationSpec(dtype=torch.int8, ch_axis=-1,
                         observer_or_fake_quant_ctr=tq_obs.PerChannelMinMaxObserver)
    gm, inputs = _exported()
    prepared = prepare_pt2e(gm, tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config()))
    with pytest.raises(NotImplementedError, match="move_exported_model_to_train"):
        prepared.train()
    with pytest.raises(NotImplementedError, match="move_exported_model_to_eval"):
        prepared.eval()


def test_summary_counts_ops_and_calls_fused_activations_fused():
    """x86: conv + ReLU and linear + ReLU are fused patterns; their ReLUs are "fused into" the
    quantized op, not left in float, and the line counts ops, not modules."""
    from torchquant.quantization.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Conv2d(4, 4, 1), nn.Flatten(),
                          nn.Linear(64, 4), nn.ReLU()).eval()
    x = torch.randn(2, 3, 6, 6)
    prepared = prepare_pt2e(torch.export.export(model, (x,)).module(),
                            X86InductorQuantizer().set_global(
                                get_default_x86_inductor_quantization_config()))
    prepared(x)
    report = summary(convert_pt2e(prepared))
    states = _states(report)
    assert states["relu"][1:] == ("fused", "fused into conv2d")
    assert states["relu_1"][1:] == ("fused", "fused into linear")
    assert not report.float_modules
    line = report.line()
    assert line == "quantized 4 of 4 ops (2 activations fused into them)", line
    assert str(report).splitlines()[0].split()[:2] == ["node", "op"]
