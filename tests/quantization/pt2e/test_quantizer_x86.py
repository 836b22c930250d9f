"""X86InductorQuantizer against torchao 0.18's: the same model exported twice, annotated by each
with the same configs, must carry the same annotations on the same nodes (spec fields, observer
class names and arguments, sharing targets, ``_annotated`` and ``_is_output_of_quantized_pattern``
flags)."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from _annotation_compare import assert_same_annotations, ctr_summary
from _models import MODELS, export_twice
from torchquant.quantization.quantizer import QuantizationConfig
from torchquant.quantization.quantizer import x86_inductor_quantizer as tq_x86

ao_x86 = pytest.importorskip("torchao.quantization.pt2e.quantizer.x86_inductor_quantizer")

CONFIG_KWARGS = {
    "static": {},
    "qat": {"is_qat": True},
    "dynamic": {"is_dynamic": True},
    "qat_dynamic": {"is_qat": True, "is_dynamic": True},
    "reduce_range": {"reduce_range": True},
}


def _annotate_both(model_name, setup, train=False):
    gm_ours, gm_theirs = export_twice(model_name, train=train)
    ours, theirs = tq_x86.X86InductorQuantizer(), ao_x86.X86InductorQuantizer()
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        setup(ours, tq_x86)
        ours.annotate(ours.transform_for_annotation(gm_ours))
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        setup(theirs, ao_x86)
        theirs.annotate(theirs.transform_for_annotation(gm_theirs))
    ours_messages = sorted(str(w.message) for w in ours_warned if "Skip" in str(w.message)
                           or "Unable" in str(w.message) or "not quantized" in str(w.message))
    theirs_messages = sorted(str(w.message) for w in theirs_warned if "Skip" in str(w.message)
                             or "Unable" in str(w.message) or "not quantized" in str(w.message))
    assert len(ours_messages) == len(theirs_messages), (ours_messages, theirs_messages)
    return gm_ours, gm_theirs


@pytest.mark.parametrize("config_name", list(CONFIG_KWARGS))
def test_default_config_matches_torchao(config_name):
    kw = CONFIG_KWARGS[config_name]
    ours = tq_x86.get_default_x86_inductor_quantization_config(**kw)
    theirs = ao_x86.get_default_x86_inductor_quantization_config(**kw)
    assert isinstance(ours, QuantizationConfig) and ours.is_qat == theirs.is_qat
    assert ours.input_activation is ours.output_activation and ours.bias is None
    for field in ("input_activation", "weight"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert (a.dtype, a.quant_min, a.quant_max, a.ch_axis, a.is_dynamic) == \
               (b.dtype, b.quant_min, b.quant_max, b.ch_axis, b.is_dynamic)
        assert a.qscheme == b.qscheme
        assert ctr_summary(a.observer_or_fake_quant_ctr) == ctr_summary(b.observer_or_fake_quant_ctr)


def test_fp16_config_matches_torchao():
    ours = tq_x86.get_x86_inductor_linear_dynamic_fp16_config()
    theirs = ao_x86.get_x86_inductor_linear_dynamic_fp16_config()
    assert ours.input_activation is None and ours.output_activation is None and ours.bias is None
    assert ours.weight.dtype == theirs.weight.dtype == torch.float16
    assert ctr_summary(ours.weight.observer_or_fake_quant_ctr) == \
           ctr_summary(theirs.weight.observer_or_fake_quant_ctr)


@pytest.mark.parametrize("config_name", ["static", "qat", "dynamic", "reduce_range"])
def test_observers_build_from_specs(config_name):
    config = tq_x86.get_default_x86_inductor_quantization_config(**CONFIG_KWARGS[config_name])
    for spec in (config.input_activation, config.weight):
        kwargs = {"dtype": spec.dtype, "quant_min": spec.quant_min, "quant_max": spec.quant_max,
                  "qscheme": spec.qscheme, "is_dynamic": spec.is_dynamic}
        if spec.ch_axis is not None:
            kwargs["ch_axis"] = spec.ch_axis
        obs = spec.observer_or_fake_quant_ctr(**kwargs)
        x = torch.randn(4, 3)
        assert obs(x).shape == x.shape


@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("config_name", ["static", "dynamic", "reduce_range"])
def test_annotations_match_torchao_ptq(model_name, config_name):
    kw = CONFIG_KWARGS[config_name]
    gm_ours, gm_theirs = _annotate_both(
        model_name, lambda q, m: q.set_global(m.get_default_x86_inductor_quantization_config(**kw)))
    assert assert_same_annotations(gm_ours, gm_theirs)


@pytest.mark.parametrize("model_name", ["conv_bn_relu", "residual", "pooling", "linear_binary"])
@pytest.mark.parametrize("config_name", ["qat", "qat_dynamic"])
def test_annotations_match_torchao_qat(model_name, config_name):
    kw = CONFIG_KWARGS[config_name]
    gm_ours, gm_theirs = _annotate_both(
        model_name, lambda q, m: q.set_global(m.get_default_x86_inductor_quantization_config(**kw)),
        train=True)
    assert assert_same_annotations(gm_ours, gm_theirs)


def test_int8_propagation_through_pooling_and_cat():
    """max_pool2d after a quantized conv takes int8 in and shares its input edge's observer
    out; a cat of quantized inputs shares the first input edge's observer everywhere."""
    gm, _ = _annotate_both(
        "pooling", lambda q, m: q.set_global(m.get_default_x86_inductor_quantization_config()))
    nodes = {n.name: n for n in gm.graph.nodes}
    pool = nodes["max_pool2d"].meta["quantization_annotation"]
    conv = nodes["conv2d"]
    assert list(pool.input_qspec_map) == [conv]
    assert pool.output_qspec.edge_or_node == (conv, nodes["max_pool2d"])
    assert pool._is_output_of_quantized_pattern
    cat = nodes["cat"].meta["quantization_annotation"]
    first = nodes["cat"].args[0][0]
    assert cat.output_qspec.edge_or_node == (first, nodes["cat"])
    assert all(s.edge_or_node == (first, nodes["cat"])
               for n, s in cat.input_qspec_map.items() if n is not first)


def test_shared_relu_module_rejected_like_torchao():
    """One ReLU module applied twice is one partition with two outputs: both raise."""
    class TwoUses(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2, self.relu = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1), nn.ReLU()

        def forward(self, x):
            return self.relu(self.conv1(x)), self.relu(self.conv2(x))

    x = (torch.randn(1, 3, 4, 4),)
    for module in (tq_x86, ao_x86):
        gm = torch.export.export(TwoUses(), x).module()
        quantizer = module.X86InductorQuantizer().set_global(
            module.get_default_x86_inductor_quantization_config())
        with pytest.raises(ValueError, match="more than one output node"):
            quantizer.annotate(gm)


SETUPS = {
    "module_name_none": lambda q, m: (
        q.set_global(m.get_default_x86_inductor_quantization_config()),
        q.set_module_name_qconfig("sub", None)),
    "module_name_over_type": lambda q, m: (
        q.set_global(m.get_default_x86_inductor_quantization_config()),
        q.set_module_type_qconfig(nn.Linear, None),
        q.set_module_name_qconfig("other", m.get_default_x86_inductor_quantization_config(reduce_range=True))),
    "function_type": lambda q, m: (
        q.set_function_type_qconfig(F.conv2d, m.get_default_x86_inductor_quantization_config()),),
    "module_type_conv": lambda q, m: (
        q.set_module_type_qconfig(nn.Conv2d, m.get_default_x86_inductor_quantization_config(reduce_range=True)),
        q.set_global(m.get_default_x86_inductor_quantization_config())),
    "mixed_qat_skipped": lambda q, m: (
        q.set_global(m.get_default_x86_inductor_quantization_config()),
        q.set_module_name_qconfig("sub", m.get_default_x86_inductor_quantization_config(is_qat=True))),
    "mixed_dynamic_skipped": lambda q, m: (
        q.set_global(m.get_default_x86_inductor_quantization_config()),
        q.set_module_type_qconfig(nn.Linear, m.get_default_x86_inductor_quantization_config(is_dynamic=True))),
    "unsupported_type_warns": lambda q, m: (
        q.set_global(m.get_default_x86_inductor_quantization_config()),
        q.set_module_type_qconfig(nn.ReLU, m.get_default_x86_inductor_quantization_config()),
        q.set_function_type_qconfig(F.relu, m.get_default_x86_inductor_quantization_config())),
    "fp16_linear": lambda q, m: (
        q.set_module_type_qconfig(nn.Linear, m.get_x86_inductor_linear_dynamic_fp16_config()),),
}


@pytest.mark.parametrize("setup_name", list(SETUPS))
@pytest.mark.parametrize("model_name", ["nested", "attention", "mlp"])
def test_precedence_matches_torchao(model_name, setup_name):
    gm_ours, gm_theirs = _annotate_both(model_name, SETUPS[setup_name])
    assert_same_annotations(gm_ours, gm_theirs)


def test_matmul_only_through_function_type():
    """The global config leaves matmul float (torchao's default op set excludes it);
    ``set_function_type_qconfig(torch.matmul, ...)`` quantizes both operands."""
    def setup(q, m):
        q.set_global(m.get_default_x86_inductor_quantization_config())
        q.set_function_type_qconfig(torch.matmul, m.get_default_x86_inductor_quantization_config())
    gm_ours, gm_theirs = _annotate_both("attention", setup)
    annotations = assert_same_annotations(gm_ours, gm_theirs)
    assert len(annotations["matmul"]["inputs"]) == 2

    gm_ours, _ = _annotate_both(
        "attention", lambda q, m: q.set_global(m.get_default_x86_inductor_quantization_config()))
    node = next(n for n in gm_ours.graph.nodes if n.name == "matmul")
    assert "quantization_annotation" not in node.meta


def test_mode_helpers():
    q = tq_x86.X86InductorQuantizer()
    with pytest.warns(UserWarning, match="global_config"):
        assert q.get_global_quantization_config() is None
    config = tq_x86.get_default_x86_inductor_quantization_config()
    assert q.set_global(config) is q and q.get_global_quantization_config() is config
    with pytest.warns(UserWarning, match="Mixed QAT"):
        q.set_global(tq_x86.get_default_x86_inductor_quantization_config(is_qat=True))
    assert q.global_config is config
    assert q.set_module_name_qconfig("a", None) is q and q.module_name_qconfig == {"a": None}


class _DeadHead(nn.Module):
    """A live Linear + ReLU and a Linear + Tanh whose output nobody reads (the shape of a HF
    BertModel's pooler when only ``last_hidden_state`` is used)."""

    def __init__(self) -> None:
        super().__init__()
        self.body, self.pooler, self.activation = nn.Linear(8, 8), nn.Linear(8, 8), nn.Tanh()

    def forward(self, x):
        y = torch.relu(self.body(x))
        self.activation(self.pooler(y))  # dead
        return y


def test_dead_linear_tanh_is_skipped_where_torchao_raises():
    """[TQ] torchao's X86InductorQuantizer raises IndexError on a dead Linear + Tanh partition
    (no output node); ours skips it and quantizes the rest."""
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    torch.manual_seed(0)
    model, x = _DeadHead().eval(), torch.randn(4, 8)
    theirs = torch.export.export(model, (x,)).module()
    quantizer = ao_x86.X86InductorQuantizer().set_global(
        ao_x86.get_default_x86_inductor_quantization_config())
    with pytest.raises(IndexError):
        quantizer.annotate(quantizer.transform_for_annotation(theirs))
    ours = torch.export.export(model, (x,)).module()
    prepared = prepare_pt2e(ours, tq_x86.X86InductorQuantizer().set_global(
        tq_x86.get_default_x86_inductor_quantization_config()))
    prepared(x)
    converted = convert_pt2e(prepared)
    names = [str(n.target) for n in converted.graph.nodes]
    assert any("quantize_per_tensor" in name for name in names)
    out, ref = converted(x), model(x)
    sqnr = 20 * torch.log10(ref.norm() / (ref - out).norm())
    assert sqnr > 20


def test_conv_plus_a_number_quantizes():
    """``conv(x) + 0.5`` is no conv-binary pattern (torchao 0.18's quantizer fails an assertion
    on it): the conv and the scalar add are annotated on their own, and the converted model is
    close to float."""
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e

    class ConvPlusHalf(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return F.leaky_relu(self.conv(x) + 0.5, 0.1)

    torch.manual_seed(0)
    model, x = ConvPlusHalf().eval(), torch.randn(2, 3, 8, 8)
    gm = prepare_pt2e(torch.export.export(model, (x,)).module(), tq_x86.X86InductorQuantizer()
                      .set_global(tq_x86.get_default_x86_inductor_quantization_config()))
    gm(x)
    out = convert_pt2e(gm)(x)
    ref = model(x)
    assert (20 * torch.log10(ref.norm() / (ref - out).norm())).item() > 25
