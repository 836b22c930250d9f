"""The x86 backend config (``"x86"``): fbgemm's patterns, but binary and fixed-qparams ops take
the weighted int8 DTypeConfig (with ``weight_dtype=qint8, bias_dtype=float``) as in torch."""
from __future__ import annotations

from .backend_config import BackendConfig
from .native import (_native_style_backend_config, _server_dtype_configs,
                     weighted_op_quint8_dtype_config)

__all__ = ["get_x86_backend_config"]


def get_x86_backend_config() -> BackendConfig:
    """The BackendConfig for the x86 (fbgemm + oneDNN) kernels."""
    return _native_style_backend_config(
        "x86", **_server_dtype_configs([weighted_op_quint8_dtype_config]), layer_norm=None)
