"""The ExecuTorch backend config (``"executorch"``): conv2d / linear / binary / shared-qparams
ops in symmetric qint8 (QNNPACK limits) or quint8, dynamic linear, weight-only embeddings."""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from ... import dtypes as _dt
from ...nn import qat as nnqat
from ...nn.quantized import reference as nnqr
from ._common_operator_config_utils import (
    _BINARY_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE,
    _CONV2D,
    _DIFFERENT,
    _SHARE,
    _config,
    _conv_family_configs,
    _weighted_module,
)
from .backend_config import BackendConfig, BackendPatternConfig, DTypeConfig, DTypeWithConstraints
from .qnnpack import (
    qnnpack_default_op_qint8_symmetric_dtype_config,
    qnnpack_weighted_op_qint8_symmetric_dtype_config,
)

__all__ = ["get_executorch_backend_config"]

executorch_weighted_op_int8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8, weight_dtype=_dt.qint8,
    bias_dtype=torch.float)
executorch_default_op_quint8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8)
executorch_default_dynamic_quint8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=torch.float, weight_dtype=_dt.qint8,
    bias_dtype=torch.float, is_dynamic=True)
executorch_act_qint8_scale_min_2_neg_12 = DTypeWithConstraints(
    dtype=_dt.qint8, scale_min_lower_bound=2 ** -12)
executorch_weight_qint8_neg_127_to_127_scale_min_2_neg_12 = DTypeWithConstraints(
    dtype=_dt.qint8, quant_min_lower_bound=-127, quant_max_upper_bound=127,
    scale_min_lower_bound=2 ** -12)
executorch_default_dynamic_qint8_dtype_config = DTypeConfig(
    input_dtype=executorch_act_qint8_scale_min_2_neg_12, output_dtype=torch.float,
    weight_dtype=executorch_weight_qint8_neg_127_to_127_scale_min_2_neg_12,
    bias_dtype=torch.float, is_dynamic=True)
executorch_default_dynamic_float16_dtype_config = DTypeConfig(
    input_dtype=torch.float16, output_dtype=torch.float, weight_dtype=torch.float16,
    bias_dtype=torch.float, is_dynamic=True)
executorch_weight_only_quint8_dtype_config = DTypeConfig(
    input_dtype=torch.float, output_dtype=torch.float, weight_dtype=_dt.quint8)

_NON_WEIGHTED_DTYPE_CONFIGS = [qnnpack_default_op_qint8_symmetric_dtype_config,
                               executorch_default_op_quint8_dtype_config]

_SHARE_QPARAMS_OPS = [
    nn.Flatten, F.adaptive_avg_pool2d, F.elu, F.hardtanh, F.max_pool2d, F.pad, F.relu, F.relu6,
    F.leaky_relu, F.leaky_relu_, nn.AdaptiveAvgPool2d, nn.ConstantPad2d, nn.ELU, nn.MaxPool2d,
    nn.ReLU6, nn.Hardtanh, nn.LeakyReLU, torch.clamp, torch.flatten, torch.mean, torch.permute,
    torch.permute_copy, torch.squeeze, "clamp", "mean", "permute", "reshape", "relu", "relu_",
    "squeeze", "squeeze_", "leaky_relu",
]


def _get_linear_configs() -> list[BackendPatternConfig]:
    dtype_configs = [
        qnnpack_weighted_op_qint8_symmetric_dtype_config,
        executorch_weighted_op_int8_dtype_config,
        executorch_default_dynamic_quint8_dtype_config,
        executorch_default_dynamic_qint8_dtype_config,
        executorch_default_dynamic_float16_dtype_config,
    ]
    return [
        _weighted_module(nn.Linear, dtype_configs, nn.Linear, nnqr.Linear, nnqat.Linear),
        _weighted_module(nnqat.Linear, dtype_configs, nn.Linear, nnqr.Linear),
        _config(F.linear, dtype_configs, _DIFFERENT)._set_input_type_to_index(
            {"weight": 1, "bias": 2}),
    ]


def _get_conv_configs() -> list[BackendPatternConfig]:
    """Conv2d only, without transposed conv."""
    return _conv_family_configs(_CONV2D, [qnnpack_weighted_op_qint8_symmetric_dtype_config,
                                          executorch_weighted_op_int8_dtype_config],
                                include_transpose=False)


def _get_binary_ops_configs() -> list[BackendPatternConfig]:
    """add / sub / mul (operator and torch forms), alone or followed by a relu."""
    dtype_configs = [qnnpack_default_op_qint8_symmetric_dtype_config,
                     executorch_weighted_op_int8_dtype_config]
    configs = []
    for op in (operator.add, torch.add, operator.sub, torch.sub, operator.mul, torch.mul):
        for pattern in ((op, nn.ReLU), (op, F.relu), (op, torch.relu), op):
            configs.append(_config(pattern, dtype_configs)._set_num_tensor_args_to_observation_type(
                _BINARY_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE))
    return configs


def _get_embedding_op_configs() -> list[BackendPatternConfig]:
    dtype_configs = [executorch_weight_only_quint8_dtype_config]
    configs = []
    for embedding, qat, reference in ((nn.Embedding, nnqat.Embedding, nnqr.Embedding),
                                      (nn.EmbeddingBag, nnqat.EmbeddingBag, nnqr.EmbeddingBag)):
        configs += [
            _config(embedding, dtype_configs, _DIFFERENT).set_qat_module(qat)
            .set_root_module(embedding).set_reference_quantized_module(reference),
            _weighted_module(qat, dtype_configs, embedding, reference),
            # torch adds F.embedding once per module kind; the second replaces the first
            _config(F.embedding, dtype_configs, _DIFFERENT)._set_input_type_to_index({"weight": 1}),
        ]
    return configs


def get_executorch_backend_config() -> BackendConfig:
    """The BackendConfig for models lowered through the ExecuTorch stack."""
    share = [_config(op, _NON_WEIGHTED_DTYPE_CONFIGS, _SHARE) for op in _SHARE_QPARAMS_OPS]
    batch_norm = [_config(nn.BatchNorm2d, _NON_WEIGHTED_DTYPE_CONFIGS, _DIFFERENT)]
    cat = [_config(op, _NON_WEIGHTED_DTYPE_CONFIGS, _SHARE)
           for op in (torch.cat, torch.concat, torch.concatenate)]
    return (BackendConfig("executorch")
            .set_backend_pattern_configs(_get_linear_configs())
            .set_backend_pattern_configs(_get_conv_configs())
            .set_backend_pattern_configs(_get_binary_ops_configs())
            .set_backend_pattern_configs(share)
            .set_backend_pattern_configs(batch_norm)
            .set_backend_pattern_configs(cat)
            .set_backend_pattern_configs(_get_embedding_op_configs()))
