"""``torchquant.nn.quantized``: static quantized modules on QTensors (as ``torch.ao.nn.quantized``)."""
from . import functional
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all

__all__ = list(_modules_all) + ["functional"]
