"""The FBGEMM backend config (``"fbgemm"``): native's patterns without the LayerNorm entries."""
from __future__ import annotations

from .backend_config import BackendConfig
from .native import (_native_style_backend_config, _server_dtype_configs,
                     default_op_quint8_dtype_config)

__all__ = ["get_fbgemm_backend_config"]


def get_fbgemm_backend_config() -> BackendConfig:
    """The BackendConfig for the FBGEMM (server x86) kernels."""
    return _native_style_backend_config(
        "fbgemm", **_server_dtype_configs([default_op_quint8_dtype_config]), layer_norm=None)
