"""The TensorRT backend config (``"tensorrt"``): symmetric qint8 everywhere, plus ``addmm``.

As in torch this is experimental; it only describes patterns (torchquant has no TensorRT
lowering)."""
from __future__ import annotations

import torch

from ... import dtypes as _dt
from ._common_operator_config_utils import (
    _get_binary_op_configs,
    _get_conv_configs,
    _get_linear_configs,
    _get_share_qparams_op_configs,
    _get_tensor_info_op_configs,
)
from .backend_config import BackendConfig, BackendPatternConfig, DTypeConfig, ObservationType

__all__ = ["get_tensorrt_backend_config", "get_tensorrt_backend_config_dict"]


def get_tensorrt_backend_config() -> BackendConfig:
    """The BackendConfig for TensorRT (qint8 activations and weights)."""
    weighted_op_qint8 = DTypeConfig(input_dtype=_dt.qint8, output_dtype=_dt.qint8,
                                    weight_dtype=_dt.qint8, bias_dtype=torch.float)
    non_weighted_op_qint8 = DTypeConfig(input_dtype=_dt.qint8, output_dtype=_dt.qint8)
    addmm = (BackendPatternConfig(torch.addmm)
             .set_observation_type(ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT)
             .add_dtype_config(weighted_op_qint8)
             ._set_input_type_to_index({"bias": 0, "input": 1, "weight": 2}))
    cat = (BackendPatternConfig(torch.cat)
           .set_observation_type(ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT)
           .add_dtype_config(non_weighted_op_qint8))
    return (BackendConfig("tensorrt")
            .set_backend_pattern_configs(_get_conv_configs([weighted_op_qint8]))
            .set_backend_pattern_config(addmm)
            .set_backend_pattern_config(cat)
            .set_backend_pattern_configs(_get_linear_configs([weighted_op_qint8]))
            .set_backend_pattern_configs(_get_binary_op_configs([weighted_op_qint8]))
            .set_backend_pattern_configs(_get_share_qparams_op_configs([non_weighted_op_qint8]))
            .set_backend_pattern_configs(_get_tensor_info_op_configs([non_weighted_op_qint8])))


def get_tensorrt_backend_config_dict() -> dict:
    """:func:`get_tensorrt_backend_config` as a dict."""
    return get_tensorrt_backend_config().to_dict()
