"""FuseCustomConfig, PrepareCustomConfig, ConvertCustomConfig and StandaloneModuleConfigEntry
against torch 2.13's ``torch.ao.quantization.fx.custom_config``: same fields, same dicts (keys
and order), round trips, and the bad inputs torchquant rejects where torch is silent."""
from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import torch.ao.quantization as ao
import torch.ao.quantization.backend_config.utils  # noqa: F401  (torch 2.13 needs it loaded)
import torch.ao.quantization.fx.custom_config as ao_cc

from torchquant.quantization import QConfigMapping, QuantType, default_qconfig
from torchquant.quantization.backend_config import BackendConfig, get_native_backend_config
from torchquant.quantization.fx import custom_config as cc
from torchquant.quantization.fx.custom_config import (
    ConvertCustomConfig,
    FuseCustomConfig,
    PrepareCustomConfig,
    StandaloneModuleConfigEntry,
)


class _FloatCustom(nn.Module):
    pass


class _ObservedCustom(nn.Module):
    @classmethod
    def from_float(cls, mod):
        return cls()


class _QuantizedCustom(nn.Module):
    @classmethod
    def from_observed(cls, mod):
        return cls()


class _Standalone(nn.Module):
    pass


class _Untraceable(nn.Module):
    pass


def _comparable(x):
    """A BackendConfig (ours or torch's) as (name, number of configs), a tensor as its values;
    containers recursed."""
    if isinstance(x, torch.Tensor):
        return ("tensor", x.tolist())
    if isinstance(x, (BackendConfig, ao.backend_config.BackendConfig)):
        return ("BackendConfig", x.name, len(x.configs))
    if isinstance(x, dict):
        return {k: _comparable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_comparable(v) for v in x)
    return x


def _prepare_config(m, with_backend_config=True):
    """The same PrepareCustomConfig built with torch's module ``m`` or ours; qconfigs are
    None so that both sides' QConfigMapping dicts compare equal."""
    native = (m is cc and get_native_backend_config()
              or ao.backend_config.get_native_backend_config()) if with_backend_config else None
    qconfig_mapping_cls = QConfigMapping if m is cc else ao.QConfigMapping
    quant_type = QuantType if m is cc else ao.QuantType
    inner = m.PrepareCustomConfig().set_non_traceable_module_names(["inner.x"])
    return (m.PrepareCustomConfig()
            .set_standalone_module_name(
                "block", qconfig_mapping_cls().set_global(None).set_object_type(nn.Linear, None),
                (torch.ones(1, 3),), inner, native)
            .set_standalone_module_name("other", None, (), None, None)
            .set_standalone_module_class(_Standalone, None, (torch.zeros(2),), None, native)
            .set_float_to_observed_mapping(_FloatCustom, _ObservedCustom, quant_type.STATIC)
            .set_non_traceable_module_names(["head", "tail.0"])
            .set_non_traceable_module_classes([_Untraceable])
            .set_input_quantized_indexes([0])
            .set_output_quantized_indexes([0, 1])
            .set_preserved_attributes(["attr1", "attr2"]))


def test_names_are_torchs():
    assert sorted(cc.__all__) == sorted(ao_cc.__all__)


def test_standalone_entry_fields_match_torch():
    assert [f.name for f in dataclasses.fields(StandaloneModuleConfigEntry)] == \
        [f.name for f in dataclasses.fields(ao_cc.StandaloneModuleConfigEntry)]
    with pytest.raises(TypeError):  # all four are required, as in torch
        StandaloneModuleConfigEntry(None, ())


def test_prepare_custom_config_fields():
    conf = _prepare_config(cc)
    entry = conf.standalone_module_names["block"]
    assert isinstance(entry, StandaloneModuleConfigEntry)
    assert isinstance(entry.prepare_custom_config, PrepareCustomConfig)
    assert entry.backend_config.name == "native"
    assert conf.standalone_module_names["other"] == StandaloneModuleConfigEntry(None, (), None, None)
    assert list(conf.standalone_module_classes) == [_Standalone]
    assert conf.float_to_observed_mapping == {QuantType.STATIC: {_FloatCustom: _ObservedCustom}}
    assert conf.non_traceable_module_names == ["head", "tail.0"]
    assert conf.non_traceable_module_classes == [_Untraceable]
    assert (conf.input_quantized_indexes, conf.output_quantized_indexes) == ([0], [0, 1])
    assert conf.preserved_attributes == ["attr1", "attr2"]


def test_prepare_custom_config_dict_matches_torch():
    ours, theirs = _prepare_config(cc).to_dict(), _prepare_config(ao_cc).to_dict()
    assert list(ours) == list(theirs) == [
        "standalone_module_name", "standalone_module_class",
        "float_to_observed_custom_module_class", "non_traceable_module_name",
        "non_traceable_module_class", "input_quantized_idxs", "output_quantized_idxs",
        "preserved_attributes"]
    assert _comparable(ours) == _comparable(theirs)
    # the backend config stays an object in the dict, the other two become dicts (as torch)
    name, qconfig_dict, example_inputs, prepare_dict, backend_config = ours["standalone_module_name"][0]
    assert isinstance(qconfig_dict, dict) and isinstance(prepare_dict, dict)
    assert isinstance(backend_config, BackendConfig)
    assert ours["float_to_observed_custom_module_class"] == {"static": {_FloatCustom: _ObservedCustom}}


def test_prepare_custom_config_round_trip():
    original = _prepare_config(cc)
    rebuilt = PrepareCustomConfig.from_dict(original.to_dict())
    assert _comparable(rebuilt.to_dict()) == _comparable(original.to_dict())
    entry = rebuilt.standalone_module_names["block"]
    assert isinstance(entry.qconfig_mapping, QConfigMapping)
    assert entry.prepare_custom_config.non_traceable_module_names == ["inner.x"]
    assert entry.backend_config is original.standalone_module_names["block"].backend_config
    # a torch-built dict (without torch objects inside) builds the same config
    theirs = _prepare_config(ao_cc, with_backend_config=False).to_dict()
    assert _comparable(PrepareCustomConfig.from_dict(theirs).to_dict()) == \
        _comparable(_prepare_config(cc, with_backend_config=False).to_dict())


def test_prepare_custom_config_standalone_sub_configs_as_dicts():
    d = {"standalone_module_name": [
        ("block", {"": default_qconfig}, (torch.ones(1),), {"preserved_attributes": ["a"]},
         get_native_backend_config().to_dict())]}
    entry = PrepareCustomConfig.from_dict(d).standalone_module_names["block"]
    assert entry.qconfig_mapping.global_qconfig is default_qconfig
    assert entry.prepare_custom_config.preserved_attributes == ["a"]
    assert isinstance(entry.backend_config, BackendConfig)
    assert len(entry.backend_config.configs) == 194
    with pytest.raises(ValueError, match="QConfigMapping"):
        PrepareCustomConfig.from_dict(
            {"standalone_module_name": [("block", default_qconfig, (), None, None)]})
    with pytest.raises(ValueError, match="example_inputs"):
        PrepareCustomConfig.from_dict({"standalone_module_name": [("block", None, ())]})


def test_float_to_observed_mapping_forms():
    flat = PrepareCustomConfig.from_dict(
        {"float_to_observed_custom_module_class": {_FloatCustom: _ObservedCustom}})
    nested = PrepareCustomConfig.from_dict(
        {"float_to_observed_custom_module_class": {"static": {_FloatCustom: _ObservedCustom}}})
    assert flat.float_to_observed_mapping == nested.float_to_observed_mapping == \
        {QuantType.STATIC: {_FloatCustom: _ObservedCustom}}
    # only static custom modules at prepare, as torch
    for m, quant_type in ((cc, QuantType.DYNAMIC), (ao_cc, ao.QuantType.DYNAMIC)):
        with pytest.raises(ValueError, match="only supported for static"):
            m.PrepareCustomConfig().set_float_to_observed_mapping(
                _FloatCustom, _ObservedCustom, quant_type)
    with pytest.raises(ValueError, match="static"):
        PrepareCustomConfig.from_dict(
            {"float_to_observed_custom_module_class": {"statc": {_FloatCustom: _ObservedCustom}}})


def _convert_config(m):
    quant_type = QuantType if m is cc else ao.QuantType
    return (m.ConvertCustomConfig()
            .set_observed_to_quantized_mapping(_ObservedCustom, _QuantizedCustom)
            .set_observed_to_quantized_mapping(_FloatCustom, _QuantizedCustom, quant_type.DYNAMIC)
            .set_preserved_attributes(["attr1"]))


def test_convert_custom_config_matches_torch_and_round_trips():
    ours, theirs = _convert_config(cc).to_dict(), _convert_config(ao_cc).to_dict()
    assert ours == theirs == {
        "observed_to_quantized_custom_module_class": {
            "static": {_ObservedCustom: _QuantizedCustom},
            "dynamic": {_FloatCustom: _QuantizedCustom}},
        "preserved_attributes": ["attr1"]}
    rebuilt = ConvertCustomConfig.from_dict(ours)
    assert rebuilt.observed_to_quantized_mapping == {
        QuantType.STATIC: {_ObservedCustom: _QuantizedCustom},
        QuantType.DYNAMIC: {_FloatCustom: _QuantizedCustom}}
    assert rebuilt.to_dict() == ours
    assert ConvertCustomConfig.from_dict(theirs).to_dict() == ours


def test_fuse_custom_config_matches_torch_and_round_trips():
    ours = FuseCustomConfig().set_preserved_attributes(["a", "b"])
    assert ours.to_dict() == ao_cc.FuseCustomConfig().set_preserved_attributes(["a", "b"]).to_dict() \
        == {"preserved_attributes": ["a", "b"]}
    assert FuseCustomConfig.from_dict(ours.to_dict()).preserved_attributes == ["a", "b"]


@pytest.mark.parametrize("name", ["FuseCustomConfig", "PrepareCustomConfig", "ConvertCustomConfig"])
def test_empty_configs(name):
    ours, theirs = getattr(cc, name)(), getattr(ao_cc, name)()
    assert ours.to_dict() == theirs.to_dict() == {}
    assert getattr(cc, name).from_dict({}).to_dict() == {}
    assert repr(ours) == repr(theirs) == f"{name}({{}})"


@pytest.mark.parametrize("name, key", [
    ("FuseCustomConfig", "preserved_attribute"),
    ("PrepareCustomConfig", "non_traceable_module_names"),
    ("ConvertCustomConfig", "observed_to_quantized_mapping"),
])
def test_from_dict_rejects_unknown_keys(name, key):
    # [TQ] torch drops a misspelt key silently; the user's option would then do nothing.
    with pytest.raises(ValueError, match=key):
        getattr(cc, name).from_dict({key: []})


def test_repr_lists_nonempty_fields():
    text = repr(PrepareCustomConfig().set_preserved_attributes(["x"]))
    assert text == "PrepareCustomConfig({'preserved_attributes': ['x']})"
