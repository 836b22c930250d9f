"""The oneDNN backend config (``"onednn"``): native's families (dynamic linear int8 only, qint8
weight-only embeddings) plus oneDNN's conv + add (+ relu) and linear + leaky_relu / tanh fusions.

The conv + add patterns are written in the reversed nested tuple format: ``(add, conv_side,
other)`` with ``conv_side`` either ``nn.Conv2d`` or ``(nn.BatchNorm2d, nn.Conv2d)`` and the conv
on the left (first add operand) or right, optionally under an ``nn.ReLU``.  Their fuser methods,
root-node getters and extra-input getters receive the matched pattern in that nested shape.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ... import dtypes as _dt
from ...nn import intrinsic as nni
from ...nn.quantized import reference as nnqr
from ...nn.utils import fusion as _fusion_utils
from ..fuser_method_mappings import _sequential_wrapper2
from ..utils import MatchAllNode
from ._common_operator_config_utils import (
    _DIFFERENT,
    _get_binary_op_configs,
    _get_bn_configs,
    _get_cat_config,
    _get_conv_configs,
    _get_default_op_configs,
    _get_embedding_op_configs,
    _get_fixed_qparams_op_configs,
    _get_linear_configs,
    _get_ln_configs,
    _get_rnn_op_configs,
    _get_share_qparams_op_configs,
)
from .backend_config import BackendConfig, BackendPatternConfig, DTypeConfig

__all__ = ["get_onednn_backend_config"]

onednn_weighted_op_int8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8, weight_dtype=_dt.qint8,
    bias_dtype=torch.float)
onednn_op_quint8_dtype_config = DTypeConfig(input_dtype=_dt.quint8, output_dtype=_dt.quint8)
onednn_dynamic_int8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=torch.float, weight_dtype=_dt.qint8,
    bias_dtype=torch.float, is_dynamic=True)
onednn_weight_only_qint8_dtype_config = DTypeConfig(
    input_dtype=torch.float, output_dtype=torch.float, weight_dtype=_dt.qint8)
onednn_input_output_only_quint8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8, weight_dtype=torch.float,
    bias_dtype=torch.float)


def _fold_bn_for_eval(is_qat: bool, conv: nn.Module, bn: nn.Module, *others: Any) -> nn.Module:
    """oneDNN's BN-containing fusions exist for inference only: fold the BN into the conv."""
    if is_qat:
        raise NotImplementedError(f"Cannot fuse train modules: {(conv, bn, *others)}")
    return _fusion_utils.fuse_conv_bn_eval(conv, bn)


def _fuse_linear_bn_leaky_relu(is_qat: bool, linear: nn.Module, bn: nn.Module,
                               leaky_relu: nn.Module) -> nn.Module:
    """Linear + BatchNorm1d + LeakyReLU -> ``LinearLeakyReLU`` of the BN-folded linear (eval)."""
    if not linear.training == bn.training == leaky_relu.training:
        raise AssertionError("Linear, BN and LeakyReLU all must be in the same mode (train or eval).")
    if is_qat:
        raise NotImplementedError(f"Cannot fuse train modules: {(linear, bn, leaky_relu)}")
    if type(linear) is not nn.Linear:
        raise NotImplementedError(f"Cannot fuse eval modules: {(linear, bn, leaky_relu)}")
    return nni.LinearLeakyReLU(_fusion_utils.fuse_linear_bn_eval(linear, bn), leaky_relu)


# conv + add, conv on the left: pattern (add, conv, other)
def _fuse_conv_add_left(is_qat, add, conv, _other):
    return nni.ConvAdd2d(conv, add)


def _conv_add_root_node_getter_left(pattern):
    return pattern[1]


def _conv_add_extra_inputs_getter_left(pattern):
    return [pattern[2]]


# conv + bn + add, conv on the left: pattern (add, (bn, conv), other)
def _fuse_conv_bn_add_left(is_qat, add, bn_conv, _other):
    bn, conv = bn_conv
    return nni.ConvAdd2d(_fold_bn_for_eval(is_qat, conv, bn, add), add)


def _conv_bn_add_root_node_getter_left(pattern):
    return pattern[1][1]


def _conv_bn_add_extra_inputs_getter_left(pattern):
    return [pattern[2]]


# conv + add, conv on the right: pattern (add, other, conv)
def _fuse_conv_add_right(is_qat, add, _other, conv):
    return nni.ConvAdd2d(conv, add)


def _conv_add_root_node_getter_right(pattern):
    return pattern[2]


def _conv_add_extra_inputs_getter_right(pattern):
    return [pattern[1]]


# conv + bn + add, conv on the right: pattern (add, other, (bn, conv))
def _fuse_conv_bn_add_right(is_qat, add, _other, bn_conv):
    bn, conv = bn_conv
    return nni.ConvAdd2d(_fold_bn_for_eval(is_qat, conv, bn, add), add)


def _conv_bn_add_root_node_getter_right(pattern):
    return pattern[2][1]


def _conv_bn_add_extra_inputs_getter_right(pattern):
    return [pattern[1]]


# The same under a ReLU: pattern (relu, add_pattern)
def _fuse_conv_add_relu_left(is_qat, relu, add_pattern):
    add, conv, _other = add_pattern
    return nni.ConvAddReLU2d(conv, add, relu)


def _conv_add_relu_root_node_getter_left(pattern):
    return pattern[1][1]


def _conv_add_relu_extra_inputs_getter_left(pattern):
    return [pattern[1][2]]


def _fuse_conv_bn_add_relu_left(is_qat, relu, add_pattern):
    add, (bn, conv), _other = add_pattern
    return nni.ConvAddReLU2d(_fold_bn_for_eval(is_qat, conv, bn, add, relu), add, relu)


def _conv_bn_add_relu_root_node_getter_left(pattern):
    return pattern[1][1][1]


def _conv_bn_add_relu_extra_inputs_getter_left(pattern):
    return [pattern[1][2]]


def _fuse_conv_add_relu_right(is_qat, relu, add_pattern):
    add, _other, conv = add_pattern
    return nni.ConvAddReLU2d(conv, add, relu)


def _conv_add_relu_root_node_getter_right(pattern):
    return pattern[1][2]


def _conv_add_relu_extra_inputs_getter_right(pattern):
    return [pattern[1][1]]


def _fuse_conv_bn_add_relu_right(is_qat, relu, add_pattern):
    add, _other, (bn, conv) = add_pattern
    return nni.ConvAddReLU2d(_fold_bn_for_eval(is_qat, conv, bn, add, relu), add, relu)


def _conv_bn_add_relu_root_node_getter_right(pattern):
    return pattern[1][2][1]


def _conv_bn_add_relu_extra_inputs_getter_right(pattern):
    return [pattern[1][1]]


# (side, with_relu, with_bn) -> (fuser, root node getter, extra inputs getter)
_CONV_ADD_HELPERS = {
    ("left", False, True): (_fuse_conv_bn_add_left, _conv_bn_add_root_node_getter_left,
                            _conv_bn_add_extra_inputs_getter_left),
    ("left", False, False): (_fuse_conv_add_left, _conv_add_root_node_getter_left,
                             _conv_add_extra_inputs_getter_left),
    ("right", False, True): (_fuse_conv_bn_add_right, _conv_bn_add_root_node_getter_right,
                             _conv_bn_add_extra_inputs_getter_right),
    ("right", False, False): (_fuse_conv_add_right, _conv_add_root_node_getter_right,
                              _conv_add_extra_inputs_getter_right),
    ("left", True, True): (_fuse_conv_bn_add_relu_left, _conv_bn_add_relu_root_node_getter_left,
                           _conv_bn_add_relu_extra_inputs_getter_left),
    ("left", True, False): (_fuse_conv_add_relu_left, _conv_add_relu_root_node_getter_left,
                            _conv_add_relu_extra_inputs_getter_left),
    ("right", True, True): (_fuse_conv_bn_add_relu_right, _conv_bn_add_relu_root_node_getter_right,
                            _conv_bn_add_relu_extra_inputs_getter_right),
    ("right", True, False): (_fuse_conv_add_relu_right, _conv_add_relu_root_node_getter_right,
                             _conv_add_relu_extra_inputs_getter_right),
}


def _conv_add_configs(dtype_configs: list[DTypeConfig], with_relu: bool
                      ) -> list[BackendPatternConfig]:
    """conv (+ bn) + add (+ relu), conv left then right, each with and without BN and with
    ``torch.add`` then ``operator.add``, then the fused module's own config."""
    fused = nni.ConvAddReLU2d if with_relu else nni.ConvAdd2d
    configs = []
    for side in ("left", "right"):
        for with_bn in (True, False):
            for add_op in (torch.add, operator.add):
                conv_side = (nn.BatchNorm2d, nn.Conv2d) if with_bn else nn.Conv2d
                add_pattern = ((add_op, conv_side, MatchAllNode) if side == "left"
                               else (add_op, MatchAllNode, conv_side))
                pattern = (nn.ReLU, add_pattern) if with_relu else add_pattern
                fuser, root_node_getter, extra_inputs_getter = \
                    _CONV_ADD_HELPERS[(side, with_relu, with_bn)]
                configs.append(
                    BackendPatternConfig()._set_pattern_complex_format(pattern)
                    .set_observation_type(_DIFFERENT).set_dtype_configs(dtype_configs)
                    .set_fuser_method(fuser)._set_root_node_getter(root_node_getter)
                    ._set_extra_inputs_getter(extra_inputs_getter).set_fused_module(fused))
    configs.append(BackendPatternConfig(fused).set_observation_type(_DIFFERENT)
                   .set_dtype_configs(dtype_configs).set_root_module(nn.Conv2d)
                   .set_reference_quantized_module(nnqr.Conv2d))
    return configs


def _linear_eltwise_configs(dtype_configs: list[DTypeConfig], post_module: type, post_op: Any,
                            fused: type) -> list[BackendPatternConfig]:
    """Linear followed by an activation: module fusions, the fused module, functional forms."""
    fuser = _sequential_wrapper2(fused)
    return [
        BackendPatternConfig((nn.Linear, post_module)).set_dtype_configs(dtype_configs)
        .set_fuser_method(fuser).set_fused_module(fused),
        BackendPatternConfig((nn.Linear, post_op)).set_dtype_configs(dtype_configs)
        .set_fuser_method(fuser).set_fused_module(fused),
        BackendPatternConfig(fused).set_observation_type(_DIFFERENT)
        .set_dtype_configs(dtype_configs).set_root_module(nn.Linear)
        .set_reference_quantized_module(nnqr.Linear),
        BackendPatternConfig((F.linear, post_module)).set_observation_type(_DIFFERENT)
        .set_dtype_configs(dtype_configs),
        BackendPatternConfig((F.linear, post_op)).set_observation_type(_DIFFERENT)
        .set_dtype_configs(dtype_configs),
    ]


def get_onednn_backend_config() -> BackendConfig:
    """The BackendConfig for the oneDNN (x86 / ARM, with post-op fusions) kernels."""
    conv_dtype_configs = [onednn_weighted_op_int8_dtype_config]
    linear_dtype_configs = [onednn_weighted_op_int8_dtype_config,
                            onednn_dynamic_int8_dtype_config]
    default_dtype_configs = [onednn_op_quint8_dtype_config]
    conv_configs = (_get_conv_configs(conv_dtype_configs)
                    + _conv_add_configs(conv_dtype_configs, with_relu=False)
                    + _conv_add_configs(conv_dtype_configs, with_relu=True))
    linear_configs = (
        _get_linear_configs(linear_dtype_configs)
        + _linear_eltwise_configs(linear_dtype_configs, nn.LeakyReLU, F.leaky_relu,
                                  nni.LinearLeakyReLU)
        + [BackendPatternConfig((nn.Linear, nn.BatchNorm1d, nn.LeakyReLU))
           .set_dtype_configs(linear_dtype_configs)
           .set_fuser_method(_fuse_linear_bn_leaky_relu).set_fused_module(nni.LinearLeakyReLU)]
        + _linear_eltwise_configs(linear_dtype_configs, nn.Tanh, torch.tanh, nni.LinearTanh))
    return (BackendConfig("onednn")
            .set_backend_pattern_configs(conv_configs)
            .set_backend_pattern_configs(linear_configs)
            .set_backend_pattern_configs(_get_binary_op_configs(default_dtype_configs))
            .set_backend_pattern_config(_get_cat_config(default_dtype_configs))
            .set_backend_pattern_configs(_get_default_op_configs(default_dtype_configs))
            .set_backend_pattern_configs(_get_fixed_qparams_op_configs(default_dtype_configs))
            .set_backend_pattern_configs(_get_share_qparams_op_configs(default_dtype_configs))
            .set_backend_pattern_configs(_get_bn_configs(default_dtype_configs))
            .set_backend_pattern_configs(_get_ln_configs([onednn_input_output_only_quint8_dtype_config]))
            .set_backend_pattern_configs(_get_rnn_op_configs([onednn_dynamic_int8_dtype_config]))
            .set_backend_pattern_configs(
                _get_embedding_op_configs([onednn_weight_only_qint8_dtype_config])))
