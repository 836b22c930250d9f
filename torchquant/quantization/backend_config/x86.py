"""The x86 backend config (``"x86"``): fbgemm's patterns, but binary and fixed-qparams ops take
the weighted int8 DTypeConfig (with ``weight_dtype=qint8, bias_dtype=float``) as in torch."""
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

__all__ = ["get_x86_backend_config"]


def get_x86_backend_config() -> BackendConfig:
    """The BackendConfig for the x86 (fbgemm + oneDNN) kernels."""
    return _native_style_backend_config(
        "x86",
        conv=[weighted_op_quint8_dtype_config],
        linear=[weighted_op_quint8_dtype_config, default_dynamic_int8_dtype_config,
                default_dynamic_float16_dtype_config],
        binary=[weighted_op_quint8_dtype_config],
        default=[default_op_quint8_dtype_config],
        fixed_qparams=[weighted_op_quint8_dtype_config],
        share_qparams=[default_op_quint8_dtype_config],
        tensor_info=[default_op_quint8_dtype_config],
        rnn=[default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        embedding=[weight_only_quint8_dtype_config, weight_only_quint4x2_dtype_config],
        layer_norm=None)
