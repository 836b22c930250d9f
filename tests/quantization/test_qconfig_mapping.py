"""QConfigMapping: setters, dict round trip, precedence and the default mappings (torch oracle)."""
import itertools
import random

import pytest
import torch
import torch.ao.quantization as tq
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization.fx import qconfig_mapping_utils as torch_fx_utils

import torchquant
from torchquant.quantization import QConfigMapping
from torchquant.quantization import qconfig_mapping as qm
from torchquant.quantization.qconfig import QConfig, default_qconfig, qconfig_equals

pytestmark = pytest.mark.filterwarnings("ignore:.*reduce_range.*:UserWarning")

A, B, C, D = (QConfig(activation=nn.Identity, weight=w) for w in
              (nn.ReLU, nn.Tanh, nn.Sigmoid, nn.GELU))


def observer_settings(constructor):
    """Class and settings of what a constructor builds (None for a missing weight)."""
    if constructor is None:
        return None
    built = constructor()
    settings = [type(built).__name__]
    for name in ("dtype", "qscheme", "quant_min", "quant_max", "reduce_range", "ch_axis",
                 "is_dynamic", "scale", "zero_point"):
        value = getattr(built, name, None)
        if torchquant.dtypes.is_qdtype_like(value):
            value = torchquant.to_qdtype(value).name
        elif isinstance(value, (torchquant.QScheme, torch.qscheme)):
            value = torchquant.to_qscheme(value).name
        elif isinstance(value, torch.Tensor):
            value = value.tolist()
        settings.append(value)
    if hasattr(built, "activation_post_process"):
        settings.append(observer_settings(lambda: built.activation_post_process))
    return settings


def test_setters_chain_and_overwrite_in_place():
    mapping = (QConfigMapping().set_global(A).set_object_type(nn.Linear, A)
               .set_object_type(F.relu, B).set_object_type(nn.Linear, C)
               .set_module_name_regex("foo.*", A).set_module_name_regex("bar", B)
               .set_module_name_regex("foo.*", D)
               .set_module_name("a.b", A).set_module_name_object_type_order("a", F.linear, 0, B))
    assert mapping.global_qconfig is A
    assert list(mapping.object_type_qconfigs.items()) == [(nn.Linear, C), (F.relu, B)]
    assert list(mapping.module_name_regex_qconfigs.items()) == [("foo.*", D), ("bar", B)]
    assert mapping.module_name_qconfigs == {"a.b": A}
    assert mapping.module_name_object_type_order_qconfigs == {("a", F.linear, 0): B}


def test_to_dict_from_dict_round_trip_and_torch_format():
    mapping = (QConfigMapping().set_global(A).set_object_type("reshape", None)
               .set_object_type(nn.Conv2d, B).set_module_name_regex("x.*", C)
               .set_module_name("y", D).set_module_name_object_type_order("y", F.linear, 2, A))
    as_dict = mapping.to_dict()
    theirs = tq.QConfigMapping.from_dict(as_dict)
    assert as_dict == theirs.to_dict()
    again = QConfigMapping.from_dict(as_dict)
    assert again.to_dict() == as_dict
    assert QConfigMapping.from_dict({}).to_dict() == QConfigMapping().to_dict()
    assert QConfigMapping.from_dict({"module_name": [("z", A)]}).module_name_qconfigs == {"z": A}
    assert repr(mapping) == repr(theirs).replace(type(theirs).__name__, "QConfigMapping")


def test_precedence_matches_torch_fx_resolution():
    """Random mappings over a few names/types, resolved like torch's FX prepare does."""
    rng = random.Random(0)
    qconfigs = [A, B, C, D, None]
    types = [nn.Linear, nn.Conv2d, F.linear, "reshape"]
    names = ["", "a", "a.b", "a.b.c", "ab", "x.y"]
    regexes = ["a.*", "a\\.b.*", ".*c", "x"]
    for _ in range(40):
        mapping = QConfigMapping().set_global(rng.choice(qconfigs))
        for t in rng.sample(types, rng.randint(0, len(types))):
            mapping.set_object_type(t, rng.choice(qconfigs))
        for r in rng.sample(regexes, rng.randint(0, len(regexes))):
            mapping.set_module_name_regex(r, rng.choice(qconfigs))
        for n in rng.sample(names[1:], rng.randint(0, 3)):
            mapping.set_module_name(n, rng.choice(qconfigs))
        for n, t, i in rng.sample(list(itertools.product(names, types, range(2))), 3):
            mapping.set_module_name_object_type_order(n, t, i, rng.choice(qconfigs))
        theirs = tq.QConfigMapping.from_dict(mapping.to_dict())
        for t, n, i in itertools.product(types, names, range(2)):
            expected = torch_fx_utils._maybe_adjust_qconfig_for_module_type_or_name(
                theirs, t, n, theirs.global_qconfig)
            assert qm._get_qconfig(mapping, t, n) is expected
            expected = torch_fx_utils._maybe_adjust_qconfig_for_module_name_object_type_order(
                theirs, n, t, i, expected)
            assert qm._get_qconfig(mapping, t, n, call_index=i) is expected


def test_precedence_levels_and_none_disables():
    mapping = (QConfigMapping().set_global(A).set_object_type(nn.Linear, B)
               .set_module_name_regex("enc.*", C).set_module_name("enc.fc", D)
               .set_module_name("enc.skip", None)
               .set_module_name_object_type_order("enc", F.linear, 1, A))
    assert qm._get_qconfig(mapping, nn.Conv2d, "head") is A
    assert qm._get_qconfig(mapping, nn.Linear, "head") is B
    assert qm._get_qconfig(mapping, nn.Linear, "enc.other") is C
    assert qm._get_qconfig(mapping, nn.Linear, "enc.fc") is D
    assert qm._get_qconfig(mapping, nn.Linear, "enc.fc.inner") is D  # parent's name entry
    assert qm._get_qconfig(mapping, nn.Linear, "enc.skip") is None
    assert qm._get_qconfig(mapping, F.linear, "enc", call_index=0) is C
    assert qm._get_qconfig(mapping, F.linear, "enc", call_index=1) is A
    assert qm._get_qconfig(mapping, nn.Linear, "enc.l2", call_index=1, call_scope="enc") is C


@pytest.mark.parametrize("backend", ["x86", "fbgemm", "qnnpack", "onednn"])
@pytest.mark.parametrize("is_qat", [False, True])
def test_default_mappings_match_torch(backend, is_qat, recwarn):
    if is_qat:
        ours = qm.get_default_qat_qconfig_mapping(backend)
        theirs = tq.get_default_qat_qconfig_mapping(backend)
    else:
        ours = qm.get_default_qconfig_mapping(backend)
        theirs = tq.get_default_qconfig_mapping(backend)
    assert list(ours.object_type_qconfigs) == list(theirs.object_type_qconfigs)
    pairs = [(ours.global_qconfig, theirs.global_qconfig)] + [
        (ours.object_type_qconfigs[k], theirs.object_type_qconfigs[k])
        for k in theirs.object_type_qconfigs]
    for a, b in pairs:
        assert observer_settings(a.activation) == observer_settings(b.activation)
        assert observer_settings(a.weight) == observer_settings(b.weight)
    assert not ours.module_name_qconfigs and not ours.module_name_regex_qconfigs


def test_default_mapping_fixed_qparams_and_sharing():
    mapping = qm.get_default_qconfig_mapping()
    sigmoid = mapping.object_type_qconfigs[torch.sigmoid].activation()
    tanh = mapping.object_type_qconfigs["tanh"].activation()
    assert (sigmoid.scale.item(), sigmoid.zero_point.item()) == (1 / 256, 0)
    assert (tanh.scale.item(), tanh.zero_point.item()) == (2 / 256, 128)
    assert mapping.object_type_qconfigs[nn.Sigmoid] is mapping.object_type_qconfigs[nn.Softmax]
    qat = qm.get_default_qat_qconfig_mapping()
    assert type(qat.object_type_qconfigs[nn.Tanh].activation()).__name__ == \
        "FixedQParamsFakeQuantize"
    transpose = mapping.object_type_qconfigs[nn.ConvTranspose2d]
    assert transpose.weight().qscheme == torchquant.per_tensor_symmetric
    assert qconfig_equals(mapping.object_type_qconfigs[nn.PReLU],
                          QConfig(activation=torchquant.quantization.HistogramObserver,
                                  weight=torchquant.quantization.MinMaxObserver))


def test_default_mapping_errors():
    with pytest.raises(AssertionError, match="backend"):
        qm.get_default_qconfig_mapping("tpu")
    with pytest.raises(AssertionError, match="Version"):
        qm.get_default_qat_qconfig_mapping("x86", 3)
    assert qm.QConfigMapping().set_global(default_qconfig).global_qconfig is default_qconfig
