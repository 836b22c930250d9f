"""Pattern-config builders shared by the ready backend configs (native, fbgemm, x86, ...).

Each builder takes the DTypeConfigs a backend supports for one family of ops and returns the
family's BackendPatternConfigs, in the order torch 2.13 registers them (registration order is
what ``BackendConfig.configs`` returns, and a later config for the same pattern replaces an
earlier one in place -- the conv family relies on that).
"""
from __future__ import annotations

import copy
import operator
from dataclasses import dataclass
from typing import Callable, Union

import torch
import torch.nn.functional as F
from torch import nn

from ... import dtypes as _dt
from ...nn import intrinsic as nni
from ...nn import qat as nnqat
from ...nn.intrinsic import qat as nniqat
from ...nn.quantized import reference as nnqr
from ..fuser_method_mappings import (
    _sequential_wrapper2,
    fuse_conv_bn,
    fuse_conv_bn_relu,
    fuse_convtranspose_bn,
    fuse_linear_bn,
)
from .backend_config import BackendPatternConfig, DTypeConfig, DTypeWithConstraints, ObservationType

__all__: list[str] = []

_DIFFERENT = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
_SHARE = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
_NOT_OBSERVED = ObservationType.INPUT_OUTPUT_NOT_OBSERVED

# Where the weight / bias sit among a functional op's arguments.
_WEIGHT_BIAS_AT_1_2 = {"weight": 1, "bias": 2}


@dataclass(frozen=True)
class _ConvFamily:
    """The modules and functions of one conv dimensionality."""
    root: type
    transpose: type
    bn: type
    reference: type
    transpose_reference: type
    fused_conv_relu: type
    fused_conv_bn: type
    fused_conv_bn_relu: type
    qat: type
    relu_qat: type
    bn_qat: type
    bn_relu_qat: type
    func: Callable
    func_transpose: Callable


_CONV1D = _ConvFamily(nn.Conv1d, nn.ConvTranspose1d, nn.BatchNorm1d, nnqr.Conv1d,
                      nnqr.ConvTranspose1d, nni.ConvReLU1d, nni.ConvBn1d, nni.ConvBnReLU1d,
                      nnqat.Conv1d, nniqat.ConvReLU1d, nniqat.ConvBn1d, nniqat.ConvBnReLU1d,
                      F.conv1d, F.conv_transpose1d)
_CONV2D = _ConvFamily(nn.Conv2d, nn.ConvTranspose2d, nn.BatchNorm2d, nnqr.Conv2d,
                      nnqr.ConvTranspose2d, nni.ConvReLU2d, nni.ConvBn2d, nni.ConvBnReLU2d,
                      nnqat.Conv2d, nniqat.ConvReLU2d, nniqat.ConvBn2d, nniqat.ConvBnReLU2d,
                      F.conv2d, F.conv_transpose2d)
_CONV3D = _ConvFamily(nn.Conv3d, nn.ConvTranspose3d, nn.BatchNorm3d, nnqr.Conv3d,
                      nnqr.ConvTranspose3d, nni.ConvReLU3d, nni.ConvBn3d, nni.ConvBnReLU3d,
                      nnqat.Conv3d, nniqat.ConvReLU3d, nniqat.ConvBn3d, nniqat.ConvBnReLU3d,
                      F.conv3d, F.conv_transpose3d)

# Fixed-qparams ops: the output range is known, so the activation qparams must be exactly
# these (quint8 over [0, 1] or [-1, 1]).
_FIXED_QPARAMS_0TO1 = DTypeWithConstraints(
    dtype=_dt.quint8, quant_min_lower_bound=0, quant_max_upper_bound=255,
    scale_exact_match=1.0 / 256.0, zero_point_exact_match=0)
_FIXED_QPARAMS_NEG1TO1 = DTypeWithConstraints(
    dtype=_dt.quint8, quant_min_lower_bound=0, quant_max_upper_bound=255,
    scale_exact_match=2.0 / 256.0, zero_point_exact_match=128)
_FIXED_QPARAMS_OP_TO_CONSTRAINTS: dict[Union[Callable, str], DTypeWithConstraints] = {
    nn.Hardsigmoid: _FIXED_QPARAMS_0TO1,
    F.hardsigmoid: _FIXED_QPARAMS_0TO1,
    "hardsigmoid": _FIXED_QPARAMS_0TO1,
    "hardsigmoid_": _FIXED_QPARAMS_0TO1,
    nn.Sigmoid: _FIXED_QPARAMS_0TO1,
    torch.sigmoid: _FIXED_QPARAMS_0TO1,
    "sigmoid": _FIXED_QPARAMS_0TO1,
    "sigmoid_": _FIXED_QPARAMS_0TO1,
    nn.Softmax: _FIXED_QPARAMS_0TO1,
    nn.Tanh: _FIXED_QPARAMS_NEG1TO1,
    torch.tanh: _FIXED_QPARAMS_NEG1TO1,
    "tanh": _FIXED_QPARAMS_NEG1TO1,
    "tanh_": _FIXED_QPARAMS_NEG1TO1,
}

# Binary ops: with one tensor argument (x + 1.0) the output shares the input's observer.
_BINARY_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE = {0: _DIFFERENT, 1: _SHARE, 2: _DIFFERENT}

_SHARE_QPARAMS_OPS: list[Union[Callable, str]] = [
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
    nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.Hardtanh, nn.Identity,
    nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
    nn.PixelShuffle, nn.PixelUnshuffle, nn.ReLU, nn.ReLU6,
    torch.adaptive_avg_pool1d, F.adaptive_avg_pool2d, F.adaptive_avg_pool3d,
    F.hardtanh, F.hardtanh_, F.interpolate,
    F.max_pool1d, F.max_pool2d, F.max_pool3d,
    F.pixel_shuffle, F.pixel_unshuffle, F.relu, F.relu6,
    torch.avg_pool1d, torch._C._nn.avg_pool2d, torch._C._nn.avg_pool3d,
    torch.clamp, torch.flatten, torch.mean, torch.narrow, torch.repeat_interleave,
    torch.transpose, torch.squeeze, torch.stack, torch.unsqueeze, operator.floordiv,
    "contiguous", "clamp", "detach", "detach_", "mean", "permute", "repeat",
    "repeat_interleave", "reshape", "resize_", "relu", "relu_", "squeeze", "squeeze_",
    "transpose", "unsqueeze", "unsqueeze_", "view",
]

_DEFAULT_OPS: list[Callable] = [
    nn.ELU, nn.LeakyReLU, nn.Hardswish, nn.InstanceNorm1d, nn.InstanceNorm2d,
    nn.InstanceNorm3d, nn.Dropout, nn.PReLU, F.elu, F.hardswish, F.leaky_relu, F.dropout,
]


def _config(pattern, dtype_configs: list[DTypeConfig], observation_type=None
            ) -> BackendPatternConfig:
    """A pattern config with its dtype configs (and observation type when given)."""
    config = BackendPatternConfig(pattern)
    if observation_type is not None:
        config.set_observation_type(observation_type)
    return config.set_dtype_configs(dtype_configs)


def _weighted_module(pattern, dtype_configs, root, reference, qat=None
                     ) -> BackendPatternConfig:
    """A module (plain, fused or QAT) whose root is swapped for ``reference`` at convert."""
    config = (_config(pattern, dtype_configs, _DIFFERENT)
              .set_root_module(root).set_reference_quantized_module(reference))
    return config.set_qat_module(qat) if qat is not None else config


def _fusion(pattern, dtype_configs, fuser_method, fused_module) -> BackendPatternConfig:
    return _config(pattern, dtype_configs).set_fuser_method(fuser_method).set_fused_module(fused_module)


def _get_binary_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """add / mul (operator and torch forms), each alone or followed by a relu, and matmul."""
    configs = []
    for op in (operator.add, torch.add, operator.mul, torch.mul):
        for pattern in ((op, nn.ReLU), (op, F.relu), (op, torch.relu), op):
            configs.append(_config(pattern, dtype_configs)._set_num_tensor_args_to_observation_type(
                _BINARY_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE))
    configs.append(_config(torch.matmul, dtype_configs))
    return configs


def _get_linear_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Linear: module, QAT module, functional; + ReLU (fusion, fused, QAT fused, functional);
    + BatchNorm1d (fusion, fused, QAT fused)."""
    relu_fuser = _sequential_wrapper2(nni.LinearReLU)
    return [
        _weighted_module(nn.Linear, dtype_configs, nn.Linear, nnqr.Linear, nnqat.Linear),
        _weighted_module(nnqat.Linear, dtype_configs, nn.Linear, nnqr.Linear),
        _config(F.linear, dtype_configs, _DIFFERENT)._set_input_type_to_index(
            dict(_WEIGHT_BIAS_AT_1_2)),
        _fusion((nn.Linear, nn.ReLU), dtype_configs, relu_fuser, nni.LinearReLU),
        _fusion((nn.Linear, F.relu), dtype_configs, relu_fuser, nni.LinearReLU),
        _weighted_module(nni.LinearReLU, dtype_configs, nn.Linear, nnqr.Linear, nniqat.LinearReLU),
        _weighted_module(nniqat.LinearReLU, dtype_configs, nn.Linear, nnqr.Linear),
        _config((F.linear, nn.ReLU), dtype_configs, _DIFFERENT),
        _config((F.linear, F.relu), dtype_configs, _DIFFERENT),
        _fusion((nn.Linear, nn.BatchNorm1d), dtype_configs, fuse_linear_bn, nni.LinearBn1d),
        _weighted_module(nni.LinearBn1d, dtype_configs, nn.Linear, nnqr.Linear, nniqat.LinearBn1d),
        _weighted_module(nniqat.LinearBn1d, dtype_configs, nn.Linear, nnqr.Linear),
    ]


def _conv_family_configs(c: _ConvFamily, dtype_configs: list[DTypeConfig],
                         include_transpose: bool = True) -> list[BackendPatternConfig]:
    """One conv dimensionality: module, QAT module, functional; + ReLU; + BN (+ ReLU); and
    unless ``include_transpose`` is False, ConvTranspose (+ BN) and functional conv_transpose."""
    relu_fuser = _sequential_wrapper2(c.fused_conv_relu)
    configs = [
        _weighted_module(c.root, dtype_configs, c.root, c.reference, c.qat),
        _weighted_module(c.qat, dtype_configs, c.root, c.reference),
        _config(c.func, dtype_configs, _DIFFERENT)._set_input_type_to_index(
            dict(_WEIGHT_BIAS_AT_1_2)),
        _fusion((c.root, nn.ReLU), dtype_configs, relu_fuser, c.fused_conv_relu),
        _fusion((c.root, F.relu), dtype_configs, relu_fuser, c.fused_conv_relu),
        _weighted_module(c.fused_conv_relu, dtype_configs, c.root, c.reference, c.relu_qat),
        _weighted_module(c.relu_qat, dtype_configs, c.root, c.reference),
        _config((c.func, nn.ReLU), dtype_configs, _DIFFERENT),
        _config((c.func, F.relu), dtype_configs, _DIFFERENT),
        # torch registers the fused ConvReLU / its QAT module a second time; the second
        # registration is the one that stays (in the first one's position).
        _config(c.fused_conv_relu, dtype_configs).set_qat_module(c.relu_qat),
        _config(c.relu_qat, dtype_configs).set_root_module(c.root)
        .set_reference_quantized_module(c.reference),
        _fusion((c.root, c.bn), dtype_configs, fuse_conv_bn, c.fused_conv_bn),
        _fusion((c.root, c.bn, nn.ReLU), dtype_configs, fuse_conv_bn_relu, c.fused_conv_bn_relu),
        _config((c.root, c.bn, F.relu), dtype_configs).set_root_module(c.root)
        .set_fuser_method(fuse_conv_bn_relu).set_fused_module(c.fused_conv_bn_relu),
        _config(c.fused_conv_bn, dtype_configs).set_qat_module(c.bn_qat),
        _config(c.fused_conv_bn_relu, dtype_configs).set_qat_module(c.bn_relu_qat),
        _weighted_module(c.bn_qat, dtype_configs, c.root, c.reference),
        _weighted_module(c.bn_relu_qat, dtype_configs, c.root, c.reference),
    ]
    if include_transpose:
        configs += [
            _config(c.transpose, dtype_configs).set_root_module(c.transpose)
            .set_reference_quantized_module(c.transpose_reference),
            _config((c.transpose, c.bn), dtype_configs).set_fuser_method(fuse_convtranspose_bn)
            .set_root_module(c.transpose).set_reference_quantized_module(c.transpose_reference),
            _config(c.func_transpose, dtype_configs)._set_input_type_to_index(
                dict(_WEIGHT_BIAS_AT_1_2)),
        ]
    return configs


def _get_conv_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Every conv family (1d, 2d, 3d) with its transposed conv."""
    return [config for c in (_CONV1D, _CONV2D, _CONV3D)
            for config in _conv_family_configs(c, dtype_configs)]


def _get_cat_config(dtype_configs: list[DTypeConfig]) -> BackendPatternConfig:
    return _config(torch.cat, dtype_configs, _SHARE)


def _get_ln_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    return [
        _config(nn.LayerNorm, dtype_configs, _DIFFERENT),
        _config(F.layer_norm, dtype_configs, _DIFFERENT)._set_input_type_to_index(
            {"weight": 2, "bias": 3}),
    ]


def _get_default_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Ops whose output gets its own observer (ELU, LeakyReLU, Hardswish, norms, ...)."""
    configs = [_config(op, dtype_configs, _DIFFERENT) for op in _DEFAULT_OPS]
    configs.append(_config(F.group_norm, dtype_configs, _DIFFERENT)._set_input_type_to_index(
        {"weight": 2, "bias": 3}))
    configs.append(_config(F.instance_norm, dtype_configs, _DIFFERENT)._set_input_type_to_index(
        {"weight": 3, "bias": 4}))
    return configs


def _add_fixed_qparams_to_dtype_configs(dtype_configs: list[DTypeConfig],
                                        constraints: DTypeWithConstraints) -> list[DTypeConfig]:
    """Copies of ``dtype_configs`` whose input / output activations of ``constraints.dtype``
    carry its range and exact scale / zero point; other dtypes are left as they are.  A scale
    bound on such an activation contradicts fixed qparams (ValueError)."""
    result = []
    for dtype_config in dtype_configs:
        copied = copy.deepcopy(dtype_config)
        for activation in (copied.input_dtype_with_constraints,
                           copied.output_dtype_with_constraints):
            if activation.dtype != constraints.dtype:
                continue
            for bound in ("scale_min_lower_bound", "scale_max_upper_bound"):
                if getattr(activation, bound) is not None:
                    raise ValueError(f"{bound} is invalid for fixed qparams ops: {dtype_config}")
            activation.quant_min_lower_bound = constraints.quant_min_lower_bound
            activation.quant_max_upper_bound = constraints.quant_max_upper_bound
            activation.scale_exact_match = constraints.scale_exact_match
            activation.zero_point_exact_match = constraints.zero_point_exact_match
        result.append(copied)
    return result


def _get_fixed_qparams_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    return [_config(op, _add_fixed_qparams_to_dtype_configs(dtype_configs, constraints), _DIFFERENT)
            for op, constraints in _FIXED_QPARAMS_OP_TO_CONSTRAINTS.items()]


def _get_share_qparams_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """Ops that work on quantized values unchanged, so the output shares the input's observer
    (pools, reshapes, relu, clamp, ...)."""
    return [_config(op, dtype_configs, _SHARE) for op in _SHARE_QPARAMS_OPS]


def _get_bn_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """BatchNorm2d/3d alone and fused with a ReLU (module or functional)."""
    bn_to_fused = {nn.BatchNorm2d: nni.BNReLU2d, nn.BatchNorm3d: nni.BNReLU3d}
    configs = []
    for bn, fused in bn_to_fused.items():
        fuser = _sequential_wrapper2(fused)
        configs += [
            _fusion((bn, nn.ReLU), dtype_configs, fuser, fused),
            _fusion((bn, F.relu), dtype_configs, fuser, fused),
            _config(bn, dtype_configs, _DIFFERENT),
        ]
    configs += [_config(fused, dtype_configs, _DIFFERENT) for fused in bn_to_fused.values()]
    return configs


def _get_rnn_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    return [_weighted_module(rnn, dtype_configs, rnn, reference)
            for rnn, reference in ((nn.GRUCell, nnqr.GRUCell), (nn.LSTMCell, nnqr.LSTMCell),
                                   (nn.RNNCell, nnqr.RNNCell), (nn.LSTM, nnqr.LSTM),
                                   (nn.GRU, nnqr.GRU))]


def _get_embedding_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    configs = []
    for embedding, qat, reference in ((nn.Embedding, nnqat.Embedding, nnqr.Embedding),
                                      (nn.EmbeddingBag, nnqat.EmbeddingBag, nnqr.EmbeddingBag)):
        configs += [
            _config(embedding, dtype_configs, _DIFFERENT).set_qat_module(qat)
            .set_root_module(embedding).set_reference_quantized_module(reference),
            _weighted_module(qat, dtype_configs, embedding, reference),
        ]
    return configs


def _get_tensor_info_op_configs(dtype_configs: list[DTypeConfig]) -> list[BackendPatternConfig]:
    """``x.shape`` / ``x.size()``: they return metadata, so nothing is observed."""
    return [_config(op, dtype_configs, _NOT_OBSERVED) for op in ("shape", "size")]
