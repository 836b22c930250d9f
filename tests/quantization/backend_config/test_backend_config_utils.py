"""The FX-facing views of a BackendConfig (backend_config.utils) and the fuser methods the ready
configs name, against torch 2.13: same keys, and fused modules that compute what torch's do."""
from __future__ import annotations

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torch.ao.quantization.backend_config as ao_bc
import torch.ao.quantization.backend_config.utils as ao_utils

import torchquant
from torchquant.quantization import backend_config as bc
from torchquant.quantization.backend_config import utils

from ao_to_torchquant import to_torchquant

_VIEWS = ["get_pattern_to_dtype_configs", "get_pattern_to_input_type_to_index",
          "get_root_module_to_quantized_reference_module", "get_module_to_qat_module"]


def test_utils_names_are_torchs():
    assert sorted(utils.__all__) == sorted(ao_utils.__all__)


@pytest.mark.parametrize("backend", ["native", "onednn", "qnnpack"])
@pytest.mark.parametrize("view", _VIEWS)
def test_views_match_torch(backend, view):
    ours = getattr(bc, f"get_{backend}_backend_config")()
    theirs = getattr(ao_bc, f"get_{backend}_backend_config")()
    assert to_torchquant(getattr(utils, view)(ours)) == \
        to_torchquant(getattr(ao_utils, view)(theirs))


@pytest.mark.parametrize("backend", ["native", "onednn"])
def test_class_and_getter_views_match_torch(backend):
    ours = getattr(bc, f"get_{backend}_backend_config")()
    theirs = getattr(ao_bc, f"get_{backend}_backend_config")()
    for view in ("get_qat_module_classes", "get_fused_module_classes"):
        assert set(getattr(utils, view)(ours)) == \
            set(to_torchquant(list(getattr(ao_utils, view)(theirs)))), view
    for view in ("get_fuser_method_mapping", "get_fusion_pattern_to_root_node_getter",
                 "get_fusion_pattern_to_extra_inputs_getter"):
        assert list(getattr(utils, view)(ours)) == \
            to_torchquant(list(getattr(ao_utils, view)(theirs))), view


def _eval(*modules):
    for m in modules:
        m.eval()
    return modules


def _bn(n):
    bn = nn.BatchNorm2d(n)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    return bn


def test_fuser_mapping_takes_modules_in_matcher_order():
    """(conv, bn, relu) fusers are called as f(is_qat, relu, (bn, conv)) through the mapping."""
    torch.manual_seed(0)
    conv, bn, relu = _eval(nn.Conv2d(3, 4, 3), _bn(4), nn.ReLU())
    x = torch.randn(2, 3, 8, 8)
    expected = relu(bn(conv(x)))
    mapping = utils.get_fuser_method_mapping(bc.get_native_backend_config())
    fused = mapping[(nn.ReLU, (nn.BatchNorm2d, nn.Conv2d))](False, relu, (bn, conv))
    assert isinstance(fused, torchquant.nn.intrinsic.ConvReLU2d)
    torch.testing.assert_close(fused(x), expected, rtol=1e-5, atol=1e-5)  # BN folding rounds
    # FX hands a functional relu to the fuser as an nn.ReLU module (as torch's fuse handler)
    linear_relu = mapping[(F.relu, nn.Linear)](False, nn.ReLU(), nn.Linear(3, 3))
    assert isinstance(linear_relu, torchquant.nn.intrinsic.LinearReLU)


_CONV_ADD_CASES = [
    # (complex pattern, arguments after is_qat: built from conv, bn, relu, add; with bn?, relu?)
    ((torch.add, (nn.BatchNorm2d, nn.Conv2d), "other"), True, False),
    ((operator.add, nn.Conv2d, "other"), False, False),
    ((torch.add, "other", (nn.BatchNorm2d, nn.Conv2d)), True, False),
    ((operator.add, "other", nn.Conv2d), False, False),
    ((nn.ReLU, (torch.add, (nn.BatchNorm2d, nn.Conv2d), "other")), True, True),
    ((nn.ReLU, (operator.add, "other", nn.Conv2d)), False, True),
]


def _resolve(pattern, match_all):
    if pattern == "other":
        return match_all
    if isinstance(pattern, tuple):
        return tuple(_resolve(p, match_all) for p in pattern)
    return pattern


def _modules_for(pattern, conv, bn, relu):
    """The fuser's arguments for ``pattern``: modules for module types, the op for functions,
    None for the other operand."""
    if pattern == "other":
        return None
    if isinstance(pattern, tuple):
        return tuple(_modules_for(p, conv, bn, relu) for p in pattern)
    return {nn.Conv2d: conv, nn.BatchNorm2d: bn, nn.ReLU: relu}.get(pattern, pattern)


@pytest.mark.parametrize("pattern, with_bn, with_relu", _CONV_ADD_CASES)
def test_onednn_conv_add_fusers_match_torch(pattern, with_bn, with_relu):
    from torchquant.quantization.utils import MatchAllNode
    from torch.ao.quantization.utils import MatchAllNode as AOMatchAllNode
    torch.manual_seed(0)
    conv, bn, relu = _eval(nn.Conv2d(3, 4, 3, padding=1), _bn(4), nn.ReLU())
    ours = utils.get_fuser_method_mapping(bc.get_onednn_backend_config())
    theirs = ao_utils.get_fuser_method_mapping(ao_bc.get_onednn_backend_config())
    args = _modules_for(pattern, conv, bn, relu)
    root = utils.get_fusion_pattern_to_root_node_getter(bc.get_onednn_backend_config())
    extra = utils.get_fusion_pattern_to_extra_inputs_getter(bc.get_onednn_backend_config())
    ao_root = ao_utils.get_fusion_pattern_to_root_node_getter(ao_bc.get_onednn_backend_config())
    ao_extra = ao_utils.get_fusion_pattern_to_extra_inputs_getter(ao_bc.get_onednn_backend_config())
    key, ao_key = _resolve(pattern, MatchAllNode), _resolve(pattern, AOMatchAllNode)
    # the getters pick the same members out of a matched pattern
    marker = _resolve(pattern, "EXTRA")
    assert root[key](marker) == ao_root[ao_key](marker) == nn.Conv2d
    assert extra[key](marker) == ao_extra[ao_key](marker) == ["EXTRA"]
    fused = ours[key](False, *args)
    reference = theirs[ao_key](False, *args)
    assert type(fused) is (torchquant.nn.intrinsic.ConvAddReLU2d if with_relu
                           else torchquant.nn.intrinsic.ConvAdd2d)
    x1, x2 = torch.randn(2, 3, 6, 6), torch.randn(2, 4, 6, 6)
    expected = reference(x1, x2)
    torch.testing.assert_close(fused(x1, x2), expected, rtol=0, atol=0)
    if with_bn:
        with pytest.raises(NotImplementedError, match="Cannot fuse train modules"):
            ours[key](True, *args)


def test_onednn_linear_bn_leaky_relu_fuser_matches_torch():
    torch.manual_seed(0)
    linear, bn, leaky = nn.Linear(5, 4), nn.BatchNorm1d(4), nn.LeakyReLU(0.1)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
    _eval(linear, bn, leaky)
    key = (nn.LeakyReLU, (nn.BatchNorm1d, nn.Linear))
    fused = utils.get_fuser_method_mapping(bc.get_onednn_backend_config())[key](
        False, leaky, (bn, linear))
    reference = ao_utils.get_fuser_method_mapping(ao_bc.get_onednn_backend_config())[key](
        False, leaky, (bn, linear))
    assert isinstance(fused, torchquant.nn.intrinsic.LinearLeakyReLU)
    x = torch.randn(3, 5)
    torch.testing.assert_close(fused(x), reference(x), rtol=0, atol=0)
    with pytest.raises(NotImplementedError):
        fused_qat = utils.get_fuser_method_mapping(bc.get_onednn_backend_config())[key]
        fused_qat(True, leaky, (bn, linear))
    linear.train()
    with pytest.raises(AssertionError, match="same mode"):
        utils.get_fuser_method_mapping(bc.get_onednn_backend_config())[key](
            False, leaky, (bn, linear))


def test_pretty_str_and_human_readable():
    entry = bc.get_native_backend_config().configs[0].to_dict()
    assert utils.entry_to_pretty_str(entry).splitlines()[1] == \
        ao_utils.entry_to_pretty_str(ao_bc.get_native_backend_config().configs[0].to_dict()
                                     ).splitlines()[1]
    assert utils.pattern_to_human_readable((F.max_pool2d, "reshape")) == \
        ("torch.nn.functional.max_pool2d", "reshape")
