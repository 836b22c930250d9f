"""Predefined qconfigs and the per-backend defaults against torch.ao.quantization's."""
import warnings

import pytest
import torch
import torch.ao.quantization as tq
from torch import nn

import torchquant
from torchquant.quantization import qconfig as qc
from torchquant.quantization import observer as obs
from torchquant.quantization.fake_quantize import FakeQuantize, FakeQuantizeBase

pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_range.*:UserWarning")

PREDEFINED = [
    "default_qconfig", "default_debug_qconfig", "default_per_channel_qconfig",
    "default_dynamic_qconfig", "float16_dynamic_qconfig", "float16_static_qconfig",
    "per_channel_dynamic_qconfig", "float_qparams_weight_only_qconfig",
    "float_qparams_weight_only_qconfig_4bit", "default_quint8_weight_qconfig",
    "default_qat_qconfig", "default_dynamic_qat_qconfig", "default_weight_only_qconfig",
    "default_activation_only_qconfig", "default_qat_qconfig_v2", "default_reuse_input_qconfig",
    "default_symmetric_qnnpack_qconfig", "default_per_channel_symmetric_qnnpack_qconfig",
    "default_symmetric_qnnpack_qat_qconfig", "default_per_channel_symmetric_qnnpack_qat_qconfig",
    "default_embedding_qat_qconfig", "default_embedding_qat_qconfig_4bit",
]
BACKENDS = ["x86", "fbgemm", "qnnpack", "onednn"]
OBSERVER_SETTINGS = ("dtype", "qscheme", "quant_min", "quant_max", "reduce_range", "eps",
                     "ch_axis", "is_dynamic", "averaging_constant", "bins", "scale", "zero_point",
                     "is_per_channel", "is_symmetric_quant")


def _plain(value):
    """A library-neutral form of an observer setting (dtype/qscheme names, tensor values)."""
    if torchquant.dtypes.is_qdtype_like(value):
        return torchquant.to_qdtype(value).name
    if isinstance(value, (torchquant.QScheme, torch.qscheme)):
        return torchquant.to_qscheme(value).name
    if isinstance(value, torch.Tensor):
        return value.tolist()
    return value


def describe(constructor):
    """What a qconfig entry builds: class name and every observer setting, recursively."""
    if constructor is None:
        return None
    built = constructor()
    out = {"class": type(built).__name__}
    for setting in OBSERVER_SETTINGS:
        if hasattr(built, setting):
            out[setting] = _plain(getattr(built, setting))
    if hasattr(built, "activation_post_process"):
        out["observer"] = describe(lambda: built.activation_post_process)
    return out


def describe_keywords(constructor):
    """The factory's bound keywords (observer factories described recursively)."""
    keywords = getattr(getattr(constructor, "p", None), "keywords", None)
    if keywords is None:
        return getattr(constructor, "__name__", constructor)
    return {k: describe_keywords(v) if k == "observer" else _plain(v) for k, v in keywords.items()}


def assert_same_qconfig(ours, theirs):
    if theirs is None:
        assert ours is None
        return
    for field in ("activation", "weight"):
        a, b = getattr(ours, field), getattr(theirs, field)
        assert describe(a) == describe(b), field
        assert describe_keywords(a) == describe_keywords(b), field


@pytest.mark.parametrize("name", PREDEFINED)
def test_predefined_qconfigs_match_torch(name):
    assert_same_qconfig(getattr(qc, name), getattr(tq, name))


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_ptq_qconfig_matches_torch(backend):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same_qconfig(qc.get_default_qconfig(backend), tq.get_default_qconfig(backend))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", [0, 1])
def test_default_qat_qconfig_matches_torch(backend, version):
    assert_same_qconfig(qc.get_default_qat_qconfig(backend, version),
                        tq.get_default_qat_qconfig(backend, version))


def test_backend_specific_settings():
    x86 = qc.get_default_qconfig("x86")
    assert (x86.activation().quant_min, x86.activation().quant_max) == (0, 127)
    assert x86.weight().qscheme == torchquant.per_channel_symmetric
    qnnpack = qc.get_default_qconfig("qnnpack")
    assert qnnpack.activation().quant_max == 255
    assert qnnpack.weight().qscheme == torchquant.per_tensor_symmetric
    qat = qc.get_default_qat_qconfig("x86").activation()
    assert type(qat).__name__ == "FusedMovingAvgObsFakeQuantize" and qat.quant_max == 127


def test_bad_backend_or_version():
    with pytest.raises(AssertionError, match="backend: tpu not supported"):
        qc.get_default_qconfig("tpu")
    with pytest.raises(AssertionError, match="Version number"):
        qc.get_default_qconfig("x86", 1)
    with pytest.raises(AssertionError, match="backend"):
        qc.get_default_qat_qconfig("arm")
    with pytest.raises(AssertionError, match="Version number"):
        qc.get_default_qat_qconfig("x86", 2)


def test_qconfig_rejects_instances():
    with pytest.raises(ValueError, match="observer instance"):
        qc.QConfig(activation=obs.MinMaxObserver(), weight=obs.MinMaxObserver)
    with pytest.raises(ValueError, match="observer instance"):
        qc.QConfig(activation=obs.MinMaxObserver, weight=FakeQuantize())
    config = qc.QConfig(activation=obs.MinMaxObserver, weight=None)
    assert config.activation is obs.MinMaxObserver and config._fields == ("activation", "weight")


def test_qconfig_dynamic_is_deprecated():
    with pytest.warns(FutureWarning, match="QConfigDynamic"):
        config = qc.QConfigDynamic(weight=obs.default_weight_observer)
    assert config.activation is nn.Identity
    with pytest.warns(FutureWarning), pytest.raises(ValueError):
        qc.QConfigDynamic(weight=obs.MinMaxObserver())


def test_qconfig_equals():
    assert qc.qconfig_equals(qc.get_default_qat_qconfig("x86"), qc.get_default_qat_qconfig("x86"))
    assert not qc.qconfig_equals(qc.get_default_qat_qconfig("x86"),
                                 qc.get_default_qat_qconfig("qnnpack"))
    assert qc.qconfig_equals(qc.default_qconfig, qc.QConfig(
        activation=obs.MinMaxObserver.with_args(quant_min=0, quant_max=127),
        weight=obs.MinMaxObserver.with_args(dtype=torchquant.qint8,
                                            qscheme=torchquant.per_tensor_symmetric)))
    assert not qc.qconfig_equals(qc.default_qconfig, qc.default_per_channel_qconfig)
    assert qc.qconfig_equals(None, None) and not qc.qconfig_equals(qc.default_qconfig, None)
    assert qc.qconfig_equals(qc.default_reuse_input_qconfig, qc.default_reuse_input_qconfig)


def test_qconfig_dicts_are_deprecated_mapping_dicts():
    with pytest.warns(FutureWarning, match="get_default_qconfig_mapping"):
        ptq = qc.get_default_qconfig_dict("qnnpack")
    with pytest.warns(FutureWarning, match="get_default_qat_qconfig_mapping"):
        qat = qc.get_default_qat_qconfig_dict("x86")
    assert set(ptq) == {"", "object_type", "module_name_regex", "module_name",
                        "module_name_object_type_order"}
    assert qc.qconfig_equals(ptq[""], qc.get_default_qconfig("qnnpack"))
    assert qc.qconfig_equals(qat[""], qc.get_default_qat_qconfig("x86"))


def test_observers_follow_the_module_device():
    conv = nn.ConvTranspose2d(2, 2, 3)
    config = qc._add_module_to_qconfig_obs_ctr(qc.get_default_qat_qconfig("x86"), conv)
    weight_fq = config.weight()
    assert isinstance(weight_fq, FakeQuantizeBase)
    assert weight_fq.activation_post_process.eps.device == conv.weight.device
    assert qc._add_module_to_qconfig_obs_ctr(None, conv) is None
    assert qc._add_module_to_qconfig_obs_ctr(qc.default_weight_only_qconfig, conv).activation \
        is nn.Identity


def test_assert_valid_qconfig_rejects_per_channel_transposed_conv():
    with pytest.raises(AssertionError, match="ConvTranspose"):
        qc._assert_valid_qconfig(qc.get_default_qconfig("qnnpack")._replace(
            weight=obs.default_per_channel_weight_observer), nn.ConvTranspose2d(2, 2, 3))
    qc._assert_valid_qconfig(qc.default_qconfig, nn.ConvTranspose2d(2, 2, 3))
    qc._assert_valid_qconfig(qc.get_default_qconfig("x86"), nn.Conv2d(2, 2, 3))


def test_private_classifiers():
    assert qc._is_reuse_input_qconfig(qc.default_reuse_input_qconfig)
    assert not qc._is_reuse_input_qconfig(qc.default_qconfig)
    assert qc._activation_is_memoryless(qc.default_dynamic_qat_qconfig)
    assert not qc._activation_is_memoryless(qc.default_qat_qconfig)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", [0, 1])
def test_default_qat_fake_quants_compute_like_torch(backend, version):
    """The per-backend QAT modules give torch's outputs, gradients and qparams over batches."""
    ours = qc.get_default_qat_qconfig(backend, version)
    theirs = tq.get_default_qat_qconfig(backend, version)
    gen = torch.Generator().manual_seed(2)
    for field, shape in (("activation", (4, 6, 5)), ("weight", (6, 4, 3))):
        a, b = getattr(ours, field)(), getattr(theirs, field)()
        for step in range(4):
            x = torch.randn(shape, generator=gen) * (step + 1) + 0.2 * step
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = a(xa), b(xb)
            ya.sum().backward()
            yb.sum().backward()
            assert torch.equal(ya, yb) and torch.equal(xa.grad, xb.grad)
            assert torch.equal(a.scale, b.scale) and torch.equal(a.zero_point, b.zero_point)
