"""The ready backend configs against torch 2.13's: same names, same number of pattern configs,
same order, and every config's ``to_dict`` equal once torch.ao classes are mapped to ours."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch.ao.quantization.backend_config as ao_bc
from torch.ao.quantization.backend_config.x86 import get_x86_backend_config as ao_get_x86

import torchquant
from torchquant.quantization import backend_config as bc
from torchquant.quantization.backend_config.x86 import get_x86_backend_config

from ao_to_torchquant import to_torchquant

# (our getter, torch's getter, name, number of pattern configs in torch 2.13)
READY = [
    (bc.get_native_backend_config, ao_bc.get_native_backend_config, "native", 194),
    (bc.get_fbgemm_backend_config, ao_bc.get_fbgemm_backend_config, "fbgemm", 192),
    (bc.get_qnnpack_backend_config, ao_bc.get_qnnpack_backend_config, "qnnpack", 190),
    (get_x86_backend_config, ao_get_x86, "x86", 192),
    (bc.get_onednn_backend_config, ao_bc.get_onednn_backend_config, "onednn", 221),
    (bc.get_executorch_backend_config, ao_bc.get_executorch_backend_config, "executorch", 84),
    (bc.get_tensorrt_backend_config, ao_bc.get_tensorrt_backend_config, "tensorrt", 149),
]


def test_exported_names_are_torchs():
    assert sorted(bc.__all__) == sorted(ao_bc.__all__)
    for name in ao_bc.__all__:
        assert hasattr(bc, name), name


@pytest.mark.parametrize("ours, theirs, name, count", READY, ids=[r[2] for r in READY])
def test_ready_config_matches_torch(ours, theirs, name, count):
    mine, ref = ours(), theirs()
    assert mine.name == ref.name == name
    assert len(mine.configs) == len(ref.configs) == count
    # The keys the FX matcher uses, in the same order.
    assert list(to_torchquant(list(mine._pattern_complex_format_to_config))) == \
        to_torchquant(list(ref._pattern_complex_format_to_config))
    for i, (m, r) in enumerate(zip(mine.configs, ref.configs)):
        assert to_torchquant(m.to_dict()) == to_torchquant(r.to_dict()), \
            f"{name} config #{i} ({r.pattern or r._pattern_complex_format})"


@pytest.mark.parametrize("ours, theirs", [
    (bc.get_native_backend_config_dict, ao_bc.get_native_backend_config_dict),
    (bc.get_tensorrt_backend_config_dict, ao_bc.get_tensorrt_backend_config_dict),
])
def test_dict_getters_match_torch(ours, theirs):
    assert to_torchquant(ours()) == to_torchquant(theirs())


@pytest.mark.parametrize("ours", [r[0] for r in READY], ids=[r[2] for r in READY])
def test_ready_config_dict_round_trip(ours):
    config = ours()
    rebuilt = bc.BackendConfig.from_dict(config.to_dict())
    assert to_torchquant(rebuilt.to_dict()) == to_torchquant(config.to_dict())
    # every pattern config is a fresh object, equal field by field
    assert all(a is not b for a, b in zip(rebuilt.configs, config.configs))


_TORCH_QUANTIZED_DTYPES = (torch.quint8, torch.qint8, torch.qint32, torch.quint4x2)


def test_ready_configs_use_torchquant_dtypes():
    """Quantized dtypes are torchquant's QDTypes, never torch's quantized dtypes."""
    for ours, *_ in READY:
        for config in ours().configs:
            for dc in config.dtype_configs:
                for d in (dc.input_dtype, dc.output_dtype, dc.weight_dtype, dc.bias_dtype):
                    assert all(d is not q for q in _TORCH_QUANTIZED_DTYPES), (config.pattern, dc)


def _config_for(backend_config, pattern):
    (found,) = [c for c in backend_config.configs if c.pattern == pattern]
    return found


def test_native_content_spot_checks():
    """A few entries spelled out (SPEC §9.5/§9.6), independent of torch's dicts."""
    native = bc.get_native_backend_config()
    linear = _config_for(native, nn.Linear)
    assert [(d.input_dtype, d.output_dtype, d.weight_dtype, d.bias_dtype, d.is_dynamic)
            for d in linear.dtype_configs] == [
        (torchquant.quint8, torchquant.quint8, torchquant.qint8, torch.float, None),
        (torchquant.quint8, torch.float, torchquant.qint8, torch.float, True),
        (torch.float16, torch.float, torch.float16, torch.float, True)]
    assert linear.reference_quantized_module is torchquant.nn.quantized.reference.Linear
    assert linear.qat_module is torchquant.nn.qat.Linear
    cat = _config_for(native, torch.cat)
    assert cat.observation_type is bc.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    assert _config_for(native, "shape").observation_type is \
        bc.ObservationType.INPUT_OUTPUT_NOT_OBSERVED
    (sigmoid,) = _config_for(native, torch.sigmoid).dtype_configs
    assert sigmoid.output_dtype_with_constraints == bc.DTypeWithConstraints(
        torchquant.quint8, 0, 255, None, None, 1.0 / 256.0, 0)
    (tanh,) = _config_for(native, nn.Tanh).dtype_configs
    assert (tanh.input_dtype_with_constraints.scale_exact_match,
            tanh.input_dtype_with_constraints.zero_point_exact_match) == (2.0 / 256.0, 128)
    # the generic config is not touched by the fixed-qparams copies
    (relu,) = _config_for(native, F.relu).dtype_configs
    assert relu.input_dtype_with_constraints.scale_exact_match is None
    add = _config_for(native, torch.add)
    assert add._num_tensor_args_to_observation_type[1] is \
        bc.ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    assert _config_for(native, F.conv2d)._input_type_to_index == {"weight": 1, "bias": 2}


def test_qnnpack_symmetric_constraints():
    conv = _config_for(bc.get_qnnpack_backend_config(), nn.Conv2d)
    symmetric = conv.dtype_configs[0]
    assert symmetric.input_dtype_with_constraints == bc.DTypeWithConstraints(
        dtype=torchquant.qint8, scale_min_lower_bound=2 ** -12)
    assert symmetric.weight_dtype_with_constraints == bc.DTypeWithConstraints(
        dtype=torchquant.qint8, quant_min_lower_bound=-127, quant_max_upper_bound=127,
        scale_min_lower_bound=2 ** -12)


def test_fixed_qparams_rejects_scale_bounds():
    from torchquant.quantization.backend_config._common_operator_config_utils import (
        _get_fixed_qparams_op_configs)
    bounded = bc.DTypeConfig(input_dtype=bc.DTypeWithConstraints(
        dtype=torchquant.quint8, scale_min_lower_bound=1e-3))
    with pytest.raises(ValueError, match="scale_min_lower_bound is invalid"):
        _get_fixed_qparams_op_configs([bounded])


def test_comparison_is_not_vacuous():
    """The mapped comparison above does see a changed dtype, fuser or fused module."""
    ref = ao_bc.get_onednn_backend_config().configs
    # a copy: the ready configs share their DTypeConfig objects (module constants, as torch's
    # do), and the changes below must not reach other tests' oneDNN configs
    mine = copy.deepcopy(bc.get_onednn_backend_config().configs)
    conv_relu = 3  # (nn.Conv1d, nn.ReLU): a _sequential_wrapper2 fuser
    assert to_torchquant(mine[conv_relu].to_dict()) == to_torchquant(ref[conv_relu].to_dict())
    conv2d_relu = bc.get_native_backend_config().configs[3 + 19]  # 19 configs per conv dim
    assert conv2d_relu.pattern == (nn.Conv2d, nn.ReLU)
    mine[conv_relu].set_fuser_method(conv2d_relu.fuser_method)  # a wrapper of ConvReLU2d
    assert to_torchquant(mine[conv_relu].to_dict()) != to_torchquant(ref[conv_relu].to_dict())
    mine[0].dtype_configs[0].weight_dtype_with_constraints.dtype = torchquant.quint8
    assert to_torchquant(mine[0].to_dict()) != to_torchquant(ref[0].to_dict())
    mine[70].set_fused_module(torchquant.nn.intrinsic.ConvAdd2d)
    assert to_torchquant(mine[70].to_dict()) != to_torchquant(ref[70].to_dict())
