"""The quantizer contract (specs, annotations, configs, helpers, ComposableQuantizer) against
torchao 0.18's ``torchao.quantization.pt2e.quantizer``: same fields, same validation errors."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn

import torchquant
from torchquant.quantization import quantizer as tq
from torchquant.quantization.observer import (HistogramObserver, MinMaxObserver,
                                              PlaceholderObserver)
from torchquant.quantization.quantizer import x86_inductor_quantizer as tq_x86
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn

ao = pytest.importorskip("torchao.quantization.pt2e.quantizer")
ao_pt2e = pytest.importorskip("torchao.quantization.pt2e")


def _exported(model=None):
    model = model or nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    return torch.export.export(model, (torch.randn(2, 4),)).module()


def test_public_names_match_torchao():
    expected = set(ao.__all__) - {"DuplicateDQPass", "PortNodeMetaForQDQ"}  # convert-side passes
    assert expected <= set(tq.__all__)
    for name in expected:
        assert hasattr(tq, name), name


@pytest.mark.parametrize("cls_name", ["QuantizationSpec", "FixedQParamsQuantizationSpec",
                                      "SharedQuantizationSpec", "DerivedQuantizationSpec",
                                      "QuantizationAnnotation", "QuantizationConfig"])
def test_dataclass_fields_match_torchao(cls_name):
    ours = [(f.name, f.default if f.default is not dataclasses.MISSING else None)
            for f in dataclasses.fields(getattr(tq, cls_name))]
    theirs = [(f.name, f.default if f.default is not dataclasses.MISSING else None)
              for f in dataclasses.fields(getattr(ao, cls_name))]
    assert ours == theirs
    assert getattr(tq, cls_name).__dataclass_params__.frozen == \
           getattr(ao, cls_name).__dataclass_params__.frozen


def test_operator_config_fields():
    assert tq.OperatorConfig._fields == ao.OperatorConfig._fields == ("config", "operators")


@pytest.mark.parametrize("kwargs, message", [
    ({"quant_min": 10, "quant_max": 5}, "quant_min 10 must be <= quant_max 5"),
    ({"ch_axis": -1}, "ch_axis"),
])
def test_spec_validation_errors_match_torchao(kwargs, message):
    with pytest.raises(ValueError):
        ao.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ao_pt2e.MinMaxObserver, **kwargs)
    with pytest.raises(ValueError, match=message):
        tq.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver, **kwargs)
    with pytest.raises(ValueError, match=message):
        tq.DerivedQuantizationSpec(derived_from=[], derive_qparams_fn=lambda obs: None,
                                   dtype=torch.int32, **kwargs)


def test_spec_accepts_boundaries_and_is_frozen_and_hashable():
    spec = tq.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver,
                               quant_min=3, quant_max=3, ch_axis=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.quant_min = 0
    same = tq.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver,
                               quant_min=3, quant_max=3, ch_axis=0)
    assert spec == same and hash(spec) == hash(same)
    # torchquant / torch quantized dtype spellings are accepted as well as plain ones
    tq.QuantizationSpec(dtype=torchquant.quint8, observer_or_fake_quant_ctr=MinMaxObserver)
    tq.QuantizationSpec(dtype=torch.quint8, observer_or_fake_quant_ctr=MinMaxObserver)


def test_fixed_qparams_spec():
    spec = tq.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1 / 256, zero_point=0,
                                           quant_min=0, quant_max=255)
    assert (spec.scale, spec.zero_point, spec.is_dynamic) == (1 / 256, 0, False)
    with pytest.raises(ValueError, match="quant_min"):  # [TQ] torchao accepts it silently
        tq.FixedQParamsQuantizationSpec(dtype=torch.uint8, scale=1.0, zero_point=0,
                                        quant_min=9, quant_max=1)


def test_shared_spec_target_checked():
    gm = _exported()
    a, b = [n for n in gm.graph.nodes if n.op == "call_function"][:2]
    assert tq.SharedQuantizationSpec(a).edge_or_node is a
    assert tq.SharedQuantizationSpec((a, b)).edge_or_node == (a, b)
    with pytest.raises(TypeError, match="edge_or_node"):
        tq.SharedQuantizationSpec("linear")
    with pytest.raises(TypeError, match="edge_or_node"):
        tq.SharedQuantizationSpec((a, b, a))


def test_annotation_defaults_are_fresh():
    a, b = tq.QuantizationAnnotation(), tq.QuantizationAnnotation()
    a.input_qspec_map["x"] = None
    assert b.input_qspec_map == {} and b.output_qspec is None
    assert b.allow_implicit_sharing is True and b._annotated is False


def test_quantizer_is_abstract():
    with pytest.raises(TypeError):
        tq.Quantizer()

    class Minimal(tq.Quantizer):
        def annotate(self, model):
            return model

        def validate(self, model):
            return None

    gm = _exported()
    q = Minimal()
    assert q.transform_for_annotation(gm) is gm
    assert q.prepare_obs_or_fq_callback(gm, {}) is None


def test_annotate_helpers_match_torchao():
    spec_ours = tq.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver)
    spec_theirs = ao.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=ao_pt2e.MinMaxObserver)
    results = []
    for mod, spec in ((tq, spec_ours), (ao, spec_theirs)):
        gm = _exported()
        linear = next(n for n in gm.graph.nodes if n.op == "call_function")
        mod.annotate_input_qspec_map(linear, linear.args[0], spec)
        mod.annotate_input_qspec_map(linear, linear.args[1], None)
        mod.annotate_output_qspec(linear, spec)
        annotation = linear.meta["quantization_annotation"]
        assert mod.is_valid_annotation(annotation)
        results.append(([n.name for n in annotation.input_qspec_map],
                        [s is None for s in annotation.input_qspec_map.values()],
                        annotation.output_qspec is spec, annotation._annotated))
    assert results[0] == results[1]
    assert not tq.is_valid_annotation(None)
    assert not tq.is_valid_annotation(tq.QuantizationAnnotation(_annotated=True))


def test_module_name_filter_matches_torchao():
    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Inner()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(self.block(x))

    gm = _exported(Outer())
    for name in ("block", "block.fc", "fc", "", "blo", "other"):
        ours, theirs = tq.get_module_name_filter(name), ao.get_module_name_filter(name)
        for n in gm.graph.nodes:
            assert ours(n) == theirs(n), (name, n.name)
    linears = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert [tq.get_module_name_filter("block")(n) for n in linears] == [True, False]
    assert tq.get_module_name_filter("block.fc")(linears[0])


def test_qspec_getters():
    config = tq_xnn.get_symmetric_quantization_config()
    assert tq.get_input_act_qspec(config) is config.input_activation
    assert tq.get_output_act_qspec(config) is config.output_activation
    assert tq.get_weight_qspec(config) is config.weight
    assert tq.get_bias_qspec(config) is None
    for getter in (tq.get_input_act_qspec, tq.get_output_act_qspec, tq.get_weight_qspec,
                   tq.get_bias_qspec):
        assert getter(None) is None
    empty = tq.QuantizationConfig(None, None, None, None)
    assert tq.get_input_act_qspec(empty) is None and tq.get_weight_qspec(empty) is None


def test_weight_qspec_rejects_affine_like_torchao():
    affine = dict(dtype=torch.int8, quant_min=-128, quant_max=127, qscheme=torch.per_tensor_affine)
    ours = tq.QuantizationConfig(None, None, tq.QuantizationSpec(
        observer_or_fake_quant_ctr=MinMaxObserver, **affine), None)
    theirs = ao.QuantizationConfig(None, None, ao.QuantizationSpec(
        observer_or_fake_quant_ctr=ao_pt2e.MinMaxObserver, **affine), None)
    with pytest.raises(ValueError):
        ao.get_weight_qspec(theirs)
    with pytest.raises(ValueError, match="weight"):
        tq.get_weight_qspec(ours)
    # torch's and torchquant's qscheme spellings are both accepted
    for qscheme in (torch.per_channel_symmetric, torchquant.per_channel_symmetric):
        spec = tq.QuantizationSpec(dtype=torch.int8, observer_or_fake_quant_ctr=MinMaxObserver,
                                   qscheme=qscheme, ch_axis=0)
        assert tq.get_weight_qspec(tq.QuantizationConfig(None, None, spec, None)) is spec


def test_activation_and_bias_qspec_checks():
    per_channel_act = tq.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=MinMaxObserver,
                                          qscheme=torch.per_channel_affine, ch_axis=1)
    config = tq.QuantizationConfig(per_channel_act, per_channel_act, None, None)
    with pytest.raises(ValueError, match="per tensor"):  # torchao: AssertionError
        tq.get_input_act_qspec(config)
    with pytest.raises(ValueError, match="per tensor"):
        tq.get_output_act_qspec(config)
    int_bias = tq.QuantizationSpec(dtype=torch.int32, observer_or_fake_quant_ctr=MinMaxObserver)
    with pytest.raises(ValueError, match="float32 bias"):  # torchao: AssertionError
        tq.get_bias_qspec(tq.QuantizationConfig(None, None, None, int_bias))
    float_bias = tq.QuantizationSpec(dtype=torch.float, observer_or_fake_quant_ctr=PlaceholderObserver)
    assert tq.get_bias_qspec(tq.QuantizationConfig(None, None, None, float_bias)) is float_bias


class _Annotator(tq.Quantizer):
    """Writes a fresh output annotation on every linear node (replacing what is there)."""

    def __init__(self, overwrite=True, remove=False):
        self.overwrite, self.remove = overwrite, remove

    def annotate(self, model):
        spec = tq.QuantizationSpec(dtype=torch.uint8, observer_or_fake_quant_ctr=HistogramObserver,
                                   qscheme=torch.per_tensor_affine)
        for n in model.graph.nodes:
            if n.target != torch.ops.aten.linear.default:
                continue
            if self.remove:
                n.meta.pop("quantization_annotation", None)
            elif self.overwrite or "quantization_annotation" not in n.meta:
                n.meta["quantization_annotation"] = tq.QuantizationAnnotation(output_qspec=spec)
        return model

    def validate(self, model):
        return None


def test_composable_quantizer_order_and_conflicts():
    gm = _exported()
    xnn = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
    composed = tq.ComposableQuantizer([xnn, _Annotator(overwrite=False)])
    composed.annotate(composed.transform_for_annotation(gm))
    linear = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default)
    assert linear.meta["quantization_annotation"]._annotated  # xnnpack's, kept

    for later in (_Annotator(overwrite=True), _Annotator(remove=True)):
        gm = _exported()
        composed = tq.ComposableQuantizer([_Annotator(), later])
        verb = "removed" if later.remove else "changed"
        with pytest.raises(RuntimeError, match=f"_Annotator has {verb} annotations on node linear"):
            composed.annotate(gm)


def test_composable_quantizer_matches_torchao_on_conflict():
    gm = _exported()
    with pytest.raises(RuntimeError):
        ao.ComposableQuantizer([_Annotator(), _Annotator()]).annotate(gm)
    with pytest.raises(TypeError, match="Quantizer instances"):
        tq.ComposableQuantizer([object()])


def test_composable_of_ready_quantizers_matches_parts():
    """x86 on module "0" only, XNNPACK for the rest: the x86 annotations stay untouched."""
    gm = _exported()
    x86 = tq_x86.X86InductorQuantizer().set_module_name_qconfig(
        "0", tq_x86.get_default_x86_inductor_quantization_config())
    xnn = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config())
    tq.ComposableQuantizer([x86, xnn]).annotate(gm)
    first, second = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert first.meta["quantization_annotation"].input_qspec_map[first.args[0]].dtype == torch.uint8
    assert second.meta["quantization_annotation"].input_qspec_map[second.args[0]].dtype == torch.int8
