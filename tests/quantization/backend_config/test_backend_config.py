"""ObservationType, DTypeWithConstraints, DTypeConfig, BackendPatternConfig and BackendConfig
against torch 2.13's classes: same fields, same dicts (keys included), same errors, plus the
bad inputs torchquant rejects where torch is silent (unknown keys, a config without pattern)."""
from __future__ import annotations

import operator

import pytest
import torch
from torch import nn

import torch.ao.quantization.backend_config as ao_bc
from torch.ao.quantization.utils import MatchAllNode as AOMatchAllNode

import torchquant
from torchquant.quantization import backend_config as bc
from torchquant.quantization.backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from torchquant.quantization.utils import MatchAllNode

from ao_to_torchquant import to_torchquant


class _MyFused(nn.Sequential):
    pass


class _MyQAT(nn.Linear):
    pass


class _MyReference(nn.Linear):
    pass


def _my_fuser(is_qat, linear, relu):
    return _MyFused(linear, relu)


def _my_root_node_getter(pattern):
    return pattern[-1]


def _my_extra_inputs_getter(pattern):
    return [pattern[1]]


def test_observation_type_members_match_torch():
    assert [(m.name, m.value) for m in ObservationType] == \
        [(m.name, m.value) for m in ao_bc.ObservationType]


def test_dtype_with_constraints_fields_and_defaults():
    import dataclasses
    ours = [(f.name, f.default) for f in dataclasses.fields(DTypeWithConstraints)]
    theirs = [(f.name, f.default) for f in dataclasses.fields(ao_bc.DTypeWithConstraints)]
    assert ours == theirs
    # torch's quantized dtypes are accepted and stored as torchquant's
    assert DTypeWithConstraints(dtype=torch.quint8).dtype is torchquant.quint8
    assert DTypeWithConstraints(torch.qint8, -127, 127) == DTypeWithConstraints(
        dtype=torchquant.qint8, quant_min_lower_bound=-127, quant_max_upper_bound=127)
    assert DTypeWithConstraints(dtype=torch.float).dtype is torch.float


def test_dtype_config_properties():
    constrained = DTypeWithConstraints(dtype=torchquant.qint8, quant_min_lower_bound=-127,
                                       quant_max_upper_bound=127)
    dc = DTypeConfig(input_dtype=torch.quint8, output_dtype=torchquant.quint8,
                     weight_dtype=constrained, bias_dtype=torch.float)
    assert dc.input_dtype is torchquant.quint8 and dc.output_dtype is torchquant.quint8
    assert dc.weight_dtype is torchquant.qint8
    assert dc.weight_dtype_with_constraints is constrained
    assert dc.input_dtype_with_constraints == DTypeWithConstraints(dtype=torchquant.quint8)
    assert dc.bias_dtype is torch.float and dc.is_dynamic is None
    empty = DTypeConfig()
    assert (empty.input_dtype, empty.output_dtype, empty.weight_dtype) == (None, None, None)


@pytest.mark.parametrize("kwargs", [
    {},
    dict(input_dtype=torch.quint8, output_dtype=torch.quint8),
    dict(input_dtype=torch.quint8, output_dtype=torch.float, weight_dtype=torch.qint8,
         bias_dtype=torch.float, is_dynamic=True),
    dict(input_dtype=torch.float, output_dtype=torch.float, weight_dtype=torch.quint4x2),
    dict(input_dtype=torch.float16, output_dtype=torch.float16, is_dynamic=False),
])
def test_dtype_config_dicts_match_torch(kwargs):
    ours = DTypeConfig(**kwargs)
    theirs = ao_bc.DTypeConfig(**kwargs)
    assert to_torchquant(ours.to_dict()) == to_torchquant(theirs.to_dict())
    assert list(ours.to_dict()) == list(theirs.to_dict())
    assert DTypeConfig.from_dict(ours.to_dict()) == ours
    # torch's dict (mapped) builds the same config
    assert DTypeConfig.from_dict(to_torchquant(theirs.to_dict())) == ours


def test_dtype_config_from_dict_with_constraints_and_plain_dtypes():
    d = {"input_dtype": torch.quint8,
         "weight_dtype": DTypeWithConstraints(dtype=torch.qint8, scale_min_lower_bound=2 ** -12),
         "bias_dtype": torch.float}
    dc = DTypeConfig.from_dict(d)
    assert dc.input_dtype is torchquant.quint8
    assert dc.weight_dtype_with_constraints.scale_min_lower_bound == 2 ** -12
    assert dc.to_dict()["input_dtype"] == DTypeWithConstraints(dtype=torchquant.quint8)


@pytest.mark.parametrize("key", ["input_dtype", "output_dtype", "weight_dtype"])
def test_dtype_config_from_dict_bad_dtype(key):
    with pytest.raises(ValueError, match=key):
        DTypeConfig.from_dict({key: "quint8"})
    with pytest.raises(ValueError):  # torch raises the same
        ao_bc.DTypeConfig.from_dict({key: "quint8"})


def test_dtype_config_from_dict_rejects_unknown_key():
    # [TQ] torch ignores a misspelt key silently; we name it.
    with pytest.raises(ValueError, match="bias_type"):
        DTypeConfig.from_dict({"input_dtype": torch.quint8, "bias_type": torch.float})


def _full_pattern_config(module):
    """Every public and private setter used once, on torch's class or ours."""
    return (module.BackendPatternConfig((nn.Linear, nn.ReLU))
            .set_observation_type(module.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT)
            .add_dtype_config(module.DTypeConfig(input_dtype=torch.quint8,
                                                 output_dtype=torch.quint8))
            .add_dtype_config(module.DTypeConfig(input_dtype=torch.quint8,
                                                 output_dtype=torch.float, weight_dtype=torch.qint8,
                                                 is_dynamic=True))
            .set_root_module(nn.Linear)
            .set_qat_module(_MyQAT)
            .set_reference_quantized_module(_MyReference)
            .set_fused_module(_MyFused)
            .set_fuser_method(_my_fuser)
            ._set_root_node_getter(_my_root_node_getter)
            ._set_extra_inputs_getter(_my_extra_inputs_getter)
            ._set_num_tensor_args_to_observation_type(
                {1: module.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT})
            ._set_input_type_to_index({"weight": 1, "bias": 2}))


def test_backend_pattern_config_setters_and_dict_match_torch():
    ours, theirs = _full_pattern_config(bc), _full_pattern_config(ao_bc)
    d = ours.to_dict()
    assert to_torchquant(d) == to_torchquant(theirs.to_dict())
    assert list(d) == list(theirs.to_dict())
    assert set(d) == {"pattern", "observation_type", "dtype_configs", "root_module", "qat_module",
                      "reference_quantized_module_for_root", "fused_module", "fuser_method",
                      "root_node_getter", "extra_inputs_getter",
                      "num_tensor_args_to_observation_type", "input_type_to_index"}
    rebuilt = BackendPatternConfig.from_dict(d)
    assert rebuilt.to_dict() == d
    assert rebuilt.reference_quantized_module is _MyReference
    # torch's dict (mapped) builds the same config
    assert BackendPatternConfig.from_dict(to_torchquant(theirs.to_dict())).to_dict() == d


def test_backend_pattern_config_fresh_dict():
    ours = BackendPatternConfig(torch.cat).to_dict()
    assert ours == {"observation_type": ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT,
                    "dtype_configs": [], "pattern": torch.cat}
    assert to_torchquant(ao_bc.BackendPatternConfig(torch.cat).to_dict()) == ours


def test_set_dtype_configs_replaces_and_add_appends():
    a, b = DTypeConfig(input_dtype=torch.quint8), DTypeConfig(input_dtype=torch.qint8)
    config = BackendPatternConfig("reshape").add_dtype_config(a).add_dtype_config(b)
    assert config.dtype_configs == [a, b]
    assert config.set_dtype_configs([b]).dtype_configs == [b]


def test_pattern_complex_format_round_trip_and_exclusivity():
    complex_pattern = (nn.ReLU, (operator.add, nn.Conv2d, MatchAllNode))
    ours = BackendPatternConfig()._set_pattern_complex_format(complex_pattern)
    theirs = ao_bc.BackendPatternConfig()._set_pattern_complex_format(
        (nn.ReLU, (operator.add, nn.Conv2d, AOMatchAllNode)))
    assert ours.to_dict() == to_torchquant(theirs.to_dict())
    assert ours.to_dict()["pattern_complex_format"] == complex_pattern
    assert "pattern" not in ours.to_dict()
    rebuilt = BackendPatternConfig.from_dict(ours.to_dict())
    assert rebuilt._pattern_complex_format == complex_pattern and rebuilt.pattern is None
    with pytest.raises(ValueError, match="Only one of 'pattern' or 'pattern_complex_format'"):
        ours.set_pattern(nn.ReLU)
    with pytest.raises(ValueError, match="Only one of 'pattern' or 'pattern_complex_format'"):
        BackendPatternConfig(nn.ReLU)._set_pattern_complex_format(complex_pattern)
    with pytest.raises(ValueError, match="Only one of"):
        BackendPatternConfig.from_dict({"pattern": nn.ReLU, "pattern_complex_format": (nn.ReLU,)})


def test_backend_pattern_config_from_dict_bad_input():
    # [TQ] torch builds a pattern-less config here and fails only when it is registered.
    with pytest.raises(ValueError, match="needs a 'pattern'"):
        BackendPatternConfig.from_dict({"dtype_configs": []})
    with pytest.raises(ValueError, match="reference_quantized_module"):
        # the seed's prose key; the real key is reference_quantized_module_for_root
        BackendPatternConfig.from_dict({"pattern": nn.Linear,
                                        "reference_quantized_module": _MyReference})
    with pytest.raises(ValueError, match="DTypeConfig"):
        BackendPatternConfig.from_dict({"pattern": nn.Linear, "dtype_configs": [torch.quint8]})


def test_backend_pattern_config_repr_lists_set_fields():
    text = repr(BackendPatternConfig(nn.Linear).set_root_module(nn.Linear))
    assert text.startswith("BackendPatternConfig(") and "root_module" in text
    assert "qat_module" not in text and "_input_type_to_index" not in text


def test_backend_config_registration_and_replacement():
    linear = BackendPatternConfig(nn.Linear)
    conv_relu = BackendPatternConfig((nn.Conv2d, nn.ReLU))
    conv_bn_relu = BackendPatternConfig((nn.Conv2d, nn.BatchNorm2d, nn.ReLU))
    config = BackendConfig().set_name("mine").set_backend_pattern_configs(
        [linear, conv_relu, conv_bn_relu])
    assert config.name == "mine" and config.configs == [linear, conv_relu, conv_bn_relu]
    assert list(config._pattern_complex_format_to_config) == [
        nn.Linear, (nn.ReLU, nn.Conv2d), (nn.ReLU, (nn.BatchNorm2d, nn.Conv2d))]
    # the same pattern given again replaces the earlier config in place
    replacement = BackendPatternConfig(nn.Linear).set_root_module(nn.Linear)
    config.set_backend_pattern_config(replacement)
    assert config.configs == [replacement, conv_relu, conv_bn_relu]
    # so does the equivalent complex-format pattern
    complex_conv_relu = BackendPatternConfig()._set_pattern_complex_format((nn.ReLU, nn.Conv2d))
    config.set_backend_pattern_config(complex_conv_relu)
    assert config.configs[1] is complex_conv_relu
    # configs is a copy
    config.configs.clear()
    assert len(config.configs) == 3


def test_backend_config_rejects_pattern_less_and_long_tuples():
    with pytest.raises(ValueError, match="must be specified"):
        BackendConfig().set_backend_pattern_config(BackendPatternConfig())
    with pytest.raises(ValueError, match="2 or 3 elements"):
        BackendConfig().set_backend_pattern_config(
            BackendPatternConfig((nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.Dropout)))


def test_backend_config_dicts_match_torch():
    def build(module):
        return (module.BackendConfig("my_backend")
                .set_backend_pattern_config(_full_pattern_config(module))
                .set_backend_pattern_config(module.BackendPatternConfig(torch.cat)
                    .set_observation_type(module.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT)))
    ours, theirs = build(bc), build(ao_bc)
    assert to_torchquant(ours.to_dict()) == to_torchquant(theirs.to_dict())
    assert set(ours.to_dict()) == {"name", "configs"}
    # from_dict takes pattern-config dicts or objects, and the name is optional
    from_dicts = BackendConfig.from_dict(ours.to_dict())
    assert from_dicts.to_dict() == ours.to_dict()
    from_objects = BackendConfig.from_dict({"configs": ours.configs})
    assert from_objects.name == "" and from_objects.configs == ours.configs
    assert BackendConfig.from_dict(to_torchquant(theirs.to_dict())).to_dict() == ours.to_dict()
    assert BackendConfig().to_dict() == ao_bc.BackendConfig().to_dict() == {"name": "", "configs": []}


def test_backend_config_from_dict_bad_input():
    with pytest.raises(ValueError, match="config"):
        BackendConfig.from_dict({"configs": [nn.Linear]})
    with pytest.raises(ValueError, match="backend_name"):
        BackendConfig.from_dict({"backend_name": "x", "configs": []})


def test_user_backend_config_example():
    """The example of torch's BackendConfig docstring, written against torchquant."""
    weighted_int8 = DTypeConfig(input_dtype=torchquant.quint8, output_dtype=torchquant.quint8,
                                weight_dtype=torchquant.qint8, bias_dtype=torch.float)

    def fuse_conv2d_relu(is_qat, conv, relu):
        return torchquant.nn.intrinsic.ConvReLU2d(conv, relu)

    config = (BackendConfig("my_backend")
              .set_backend_pattern_config(
                  BackendPatternConfig(nn.Linear).add_dtype_config(weighted_int8)
                  .set_root_module(nn.Linear).set_qat_module(torchquant.nn.qat.Linear)
                  .set_reference_quantized_module(torchquant.nn.quantized.reference.Linear))
              .set_backend_pattern_config(
                  BackendPatternConfig((nn.Conv2d, nn.ReLU)).add_dtype_config(weighted_int8)
                  .set_fused_module(torchquant.nn.intrinsic.ConvReLU2d)
                  .set_fuser_method(fuse_conv2d_relu)))
    assert [c.pattern for c in config.configs] == [nn.Linear, (nn.Conv2d, nn.ReLU)]
    fused = config.configs[1].fuser_method(False, nn.Conv2d(1, 1, 1), nn.ReLU())
    assert isinstance(fused, torchquant.nn.intrinsic.ConvReLU2d)
