"""The FBGEMM backend config (``"fbgemm"``): native's patterns without the LayerNorm entries."""
from __future__ import annotations

from .backend_config import BackendConfig
from .native import (
    _native_style_backend_config,
    default_dynamic_float16_dtype_config,
    default_dynamic_int8_dtype_config,
    default_op_quint8_dtype_config,
    weight_only_quint4x2_dtype_config,
    weight_only_quint8_dtype_config,
    weighted_op_quint8_dtype_config,
)

__all__ = ["get_fbgemm_backend_config"]


def get_fbgemm_backend_config() -> BackendConfig:
    """The BackendConfig for the FBGEMM (server x86) kernels."""
    return _native_style_backend_config(
        "fbgemm",
        conv=[weighted_op_quint8_dtype_config],
        linear=[weighted_op_quint8_dtype_config, default_dynamic_int8_dtype_config,
                default_dynamic_float16_dtype_config],
        binary=[default_op_quint8_dtype_config],
        default=[default_op_quint8_dtype_config],
        fixed_qparams=[default_op_quint8_dtype_config],
        share_qparams=[default_op_quint8_dtype_config],
        tensor_info=[default_op_quint8_dtype_config],
        rnn=[default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        embedding=[weight_only_quint8_dtype_config, weight_only_quint4x2_dtype_config],
        layer_norm=None)
