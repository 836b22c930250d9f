"""XNNPACKQuantizer against torchao 0.18's (``torchao.testing.pt2e._xnnpack_quantizer``): the
same model exported twice, annotated by each with the same config, must carry the same
annotations on the same nodes (spec fields, observer class names and arguments, sharing
targets, ``_annotated`` flags)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

from _annotation_compare import assert_same_annotations, ctr_summary, graph_annotations
from _models import MODELS, Block, export_twice
from torchquant.quantization.quantizer import QuantizationConfig, Quantizer
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn

ao_xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")
ao_xnn_utils = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer_utils")


@pytest.fixture(autouse=True, scope="module")
def _cache_torchao_qat_patterns():
    """torchao re-exports its conv+bn patterns (8 torch.export calls) on every QAT annotate;
    the patterns depend only on the closure of the pattern function, so the oracle reuses them
    across tests (a speed-up of the oracle only: each call gets a fresh copy)."""
    original = ao_xnn_utils._get_aten_graph_module_for_pattern
    cache = {}

    def cached(pattern, example_inputs, is_cuda=False, **kwargs):
        fn = getattr(pattern, "fn", None)
        if fn is None or kwargs:
            return original(pattern, example_inputs, is_cuda, **kwargs)
        key = (fn.__code__, tuple(c.cell_contents for c in fn.__closure__ or ()),
               tuple(tuple(x.shape) for x in example_inputs), is_cuda)
        if key not in cache:
            cache[key] = original(pattern, example_inputs, is_cuda)
        with warnings.catch_warnings():  # pytree's LeafSpec FutureWarning from deepcopy
            warnings.simplefilter("ignore", FutureWarning)
            return copy.deepcopy(cache[key])  # the matcher rewrites the pattern's output

    ao_xnn_utils._get_aten_graph_module_for_pattern = cached
    yield
    ao_xnn_utils._get_aten_graph_module_for_pattern = original

CONFIG_KWARGS = {
    "per_tensor": {},
    "per_channel": {"is_per_channel": True},
    "qat": {"is_qat": True},
    "qat_per_channel": {"is_qat": True, "is_per_channel": True},
    "dynamic": {"is_dynamic": True},
    "dynamic_per_channel": {"is_dynamic": True, "is_per_channel": True},
    "qat_dynamic": {"is_qat": True, "is_dynamic": True},
    "narrow": {"act_qmin": 0, "act_qmax": 100, "weight_qmin": -63, "weight_qmax": 63},
}


def _quantizers(setup):
    """(ours, torchao's) configured the same way by ``setup(quantizer, get_config)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchao: "XNNPACKQuantizer is deprecated!"
        theirs = ao_xnn.XNNPACKQuantizer()
    ours = tq_xnn.XNNPACKQuantizer()
    setup(ours, tq_xnn.get_symmetric_quantization_config)
    setup(theirs, ao_xnn.get_symmetric_quantization_config)
    return ours, theirs


def _annotate_both(model_name, setup, train=False):
    gm_ours, gm_theirs = export_twice(model_name, train=train)
    ours, theirs = _quantizers(setup)
    gm_ours = ours.transform_for_annotation(gm_ours)
    gm_theirs = theirs.transform_for_annotation(gm_theirs)
    ours.annotate(gm_ours)
    theirs.annotate(gm_theirs)
    return gm_ours, gm_theirs


@pytest.mark.parametrize("config_name", list(CONFIG_KWARGS))
def test_config_matches_torchao(config_name):
    kw = CONFIG_KWARGS[config_name]
    ours = tq_xnn.get_symmetric_quantization_config(**kw)
    theirs = ao_xnn.get_symmetric_quantization_config(**kw)
    assert isinstance(ours, QuantizationConfig)
    assert ours.is_qat == theirs.is_qat and ours.bias is None and theirs.bias is None
    for field in ("input_activation", "output_activation", "weight"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert (a is None) == (b is None), field
        if a is None:
            continue
        assert (a.dtype, a.quant_min, a.quant_max, a.ch_axis, a.is_dynamic) == \
               (b.dtype, b.quant_min, b.quant_max, b.ch_axis, b.is_dynamic)
        assert a.qscheme == b.qscheme
        assert ctr_summary(a.observer_or_fake_quant_ctr) == ctr_summary(b.observer_or_fake_quant_ctr)
    # lru-cached like torchao's: one object per argument set
    assert tq_xnn.get_symmetric_quantization_config(**kw) is ours
    if not kw.get("is_dynamic"):
        assert ours.input_activation is ours.output_activation


@pytest.mark.parametrize("config_name", ["per_tensor", "per_channel", "qat", "qat_per_channel",
                                         "qat_dynamic", "dynamic", "narrow"])
def test_observers_build_from_specs(config_name):
    """Every spec's constructor accepts the spec fields prepare_pt2e hands it."""
    config = tq_xnn.get_symmetric_quantization_config(**CONFIG_KWARGS[config_name])
    for spec in (config.input_activation, config.weight):
        kwargs = {"dtype": spec.dtype, "quant_min": spec.quant_min, "quant_max": spec.quant_max,
                  "qscheme": spec.qscheme, "is_dynamic": spec.is_dynamic}
        if "per_channel" in spec.qscheme.name:
            kwargs["ch_axis"] = spec.ch_axis
        obs = spec.observer_or_fake_quant_ctr(**kwargs)
        x = torch.randn(4, 3)
        assert obs(x).shape == x.shape


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("config_name", ["per_tensor", "per_channel", "dynamic", "narrow"])
def test_annotations_match_torchao_ptq(model_name, config_name):
    kw = CONFIG_KWARGS[config_name]
    gm_ours, gm_theirs = _annotate_both(model_name, lambda q, cfg: q.set_global(cfg(**kw)))
    annotations = assert_same_annotations(gm_ours, gm_theirs)
    has_linear = any(n.target == torch.ops.aten.linear.default for n in gm_ours.graph.nodes)
    if config_name != "dynamic" or has_linear:  # dynamic configs annotate linear only
        assert annotations, "the quantizer annotated nothing"


@pytest.mark.parametrize("model_name", ["conv_bn_relu", "residual", "conv1d_transpose",
                                        "add_mul_cat", "mlp"])
@pytest.mark.parametrize("config_name", ["qat", "qat_per_channel", "qat_dynamic"])
def test_annotations_match_torchao_qat(model_name, config_name):
    kw = CONFIG_KWARGS[config_name]
    gm_ours, gm_theirs = _annotate_both(model_name, lambda q, cfg: q.set_global(cfg(**kw)),
                                        train=True)
    assert_same_annotations(gm_ours, gm_theirs)


def test_qat_conv_bn_relu_output_on_relu():
    gm, _ = export_twice("conv_bn_relu", train=True)
    quantizer = tq_xnn.XNNPACKQuantizer().set_global(tq_xnn.get_symmetric_quantization_config(is_qat=True))
    quantizer.annotate(quantizer.transform_for_annotation(gm))
    nodes = {n.name: n for n in gm.graph.nodes}
    conv = nodes["conv2d"].meta["quantization_annotation"]
    assert conv.output_qspec is None and len(conv.input_qspec_map) == 3
    assert nodes["relu"].meta["quantization_annotation"].output_qspec is not None
    # the second conv has no relu: conv+bn, output on the batch_norm node
    assert nodes["batch_norm_1"].meta["quantization_annotation"].output_qspec is not None


def test_gru_io_only():
    """Both GRU inputs and both outputs are quantized.  torchao annotates one of the two inputs,
    chosen by set order (it varies between runs): its edges are a subset of ours, the rest
    of the graph is the same."""
    gm_ours, gm_theirs = _annotate_both("gru", lambda q, cfg: q.set_global(cfg()))
    ours, theirs = graph_annotations(gm_ours), graph_annotations(gm_theirs)
    assert sorted(ours) == sorted(theirs)
    gru_ours, gru_theirs = ours.pop("gru"), theirs.pop("gru")
    assert [name for name, _ in gru_ours["inputs"]] == ["x", "h"]
    assert set(gru_theirs["inputs"]) <= set(gru_ours["inputs"]) and len(gru_theirs["inputs"]) == 1
    assert ours == theirs
    assert ours["getitem"]["output"] is not None and ours["getitem_1"]["output"] is not None


def test_scalar_operands_become_attributes():
    gm, theirs = _annotate_both("add_mul_cat", lambda q, cfg: q.set_global(cfg()))
    attrs = [n for n in gm.graph.nodes if n.op == "get_attr" and n.target.startswith("_tensor_constant_")]
    assert [n.target for n in attrs] == ["_tensor_constant_0", "_tensor_constant_1"]
    assert float(gm._tensor_constant_0) == 1.0 and float(gm._tensor_constant_1) == 0.5
    assert all(isinstance(n.meta["val"], torch._subclasses.FakeTensor) for n in attrs)


def _module_config_setup(q, cfg):
    q.set_global(cfg())
    q.set_module_name("sub", cfg(is_per_channel=True))
    q.set_module_type(nn.Linear, cfg(act_qmin=-100, act_qmax=100))


def test_module_name_and_type_precedence_matches_torchao():
    gm_ours, gm_theirs = _annotate_both("nested", _module_config_setup)
    annotations = assert_same_annotations(gm_ours, gm_theirs)
    # module name beats module type: sub.fc is per channel; other.fc has the narrowed range
    weight_specs = {name: a["inputs"][1][1] for name, a in annotations.items()
                    if name.startswith("linear") and len(a["inputs"]) > 1}
    assert sorted(s[4] for s in weight_specs.values()).count("per_channel_symmetric") == 1


def test_module_type_only_config_matches_torchao():
    def setup(q, cfg):
        q.set_module_type(Block, cfg(is_per_channel=True))
    gm_ours, gm_theirs = _annotate_both("nested", setup)
    annotations = assert_same_annotations(gm_ours, gm_theirs)
    assert "conv2d" not in annotations  # the stem is outside every Block: no global config


def test_set_module_name_none_rejected():
    with pytest.raises(ValueError, match="quantization_config=None"):
        tq_xnn.XNNPACKQuantizer().set_module_name("sub", None)


def test_supported_operators_match_torchao():
    ours = tq_xnn.XNNPACKQuantizer
    theirs = ao_xnn.XNNPACKQuantizer
    assert len(ours.get_supported_operators()) == len(theirs.get_supported_operators())
    assert len(ours.get_supported_quantization_configs()) == 4
    assert ours.get_supported_operator_for_quantization_config(
        tq_xnn.get_symmetric_quantization_config()) == [[torch.nn.Conv2d, torch.nn.ReLU],
        [torch.nn.Conv2d, torch.nn.functional.relu], [torch.nn.functional.conv2d, torch.nn.ReLU],
        [torch.nn.functional.conv2d, torch.nn.functional.relu]]
    assert len(ours.get_supported_operator_for_quantization_config(None)) == \
           len(theirs.get_supported_operator_for_quantization_config(None))
    assert ours.STATIC_OPS == theirs.STATIC_OPS
    assert ours.STATIC_QAT_ONLY_OPS == theirs.STATIC_QAT_ONLY_OPS
    assert ours.DYNAMIC_OPS == theirs.DYNAMIC_OPS
    assert issubclass(ours, Quantizer)


def test_no_deprecation_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tq_xnn.XNNPACKQuantizer()


def test_operator_type_config_applies():
    """[TQ] torchao ignores set_operator_type; here linear nodes take the operator-type config,
    the rest the global one; a linear followed by relu falls back to the plain linear pattern."""
    gm, _ = export_twice("mlp")
    narrow = tq_xnn.get_symmetric_quantization_config(act_qmin=-100, act_qmax=100)
    quantizer = (tq_xnn.XNNPACKQuantizer()
                 .set_global(tq_xnn.get_symmetric_quantization_config())
                 .set_operator_type(torch.ops.aten.linear, narrow))
    quantizer.annotate(quantizer.transform_for_annotation(gm))
    linears = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default]
    assert len(linears) == 4
    for linear in linears:
        annotation = linear.meta["quantization_annotation"]
        assert annotation.input_qspec_map[linear.args[0]] is narrow.input_activation
        assert annotation.output_qspec is narrow.output_activation
    relu = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.relu.default)
    # the relu shares the linear's observer (propagation), it is not a linear+relu output
    assert relu.meta["quantization_annotation"].output_qspec.edge_or_node is linears[0]

    # module configs still win over operator-type configs
    gm, _ = export_twice("nested")
    quantizer = (tq_xnn.XNNPACKQuantizer()
                 .set_operator_type(torch.ops.aten.linear, narrow)
                 .set_module_name("sub", tq_xnn.get_symmetric_quantization_config(is_per_channel=True)))
    quantizer.annotate(quantizer.transform_for_annotation(gm))
    by_name = {n.name: n for n in gm.graph.nodes}
    sub_fc, other_fc = by_name["linear"], by_name["linear_1"]
    assert sub_fc.meta["quantization_annotation"].input_qspec_map[sub_fc.args[1]].qscheme == torch.per_channel_symmetric
    assert other_fc.meta["quantization_annotation"].input_qspec_map[other_fc.args[0]] is narrow.input_activation
    assert "quantization_annotation" not in by_name["conv2d"].meta  # no global config
