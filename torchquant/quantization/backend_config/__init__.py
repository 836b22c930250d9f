"""``torchquant.quantization.backend_config``: which patterns a backend quantizes, and how.

Same names as ``torch.ao.quantization.backend_config``; the x86 config lives in
:mod:`.x86` (``get_x86_backend_config``), as in torch.
"""
from .backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    DTypeWithConstraints,
    ObservationType,
)
from .executorch import get_executorch_backend_config
from .fbgemm import get_fbgemm_backend_config
from .native import get_native_backend_config, get_native_backend_config_dict
from .onednn import get_onednn_backend_config
from .qnnpack import get_qnnpack_backend_config
from .tensorrt import get_tensorrt_backend_config, get_tensorrt_backend_config_dict
from . import utils  # noqa: F401  (loaded with the package, unlike torch 2.13 where a bare import breaks the getters)

__all__ = [
    "get_fbgemm_backend_config",
    "get_native_backend_config",
    "get_native_backend_config_dict",
    "get_qnnpack_backend_config",
    "get_tensorrt_backend_config",
    "get_tensorrt_backend_config_dict",
    "get_executorch_backend_config",
    "BackendConfig",
    "BackendPatternConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "ObservationType",
    "get_onednn_backend_config",
]
