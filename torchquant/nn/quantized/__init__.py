"""``torchquant.nn.quantized``: static quantized modules on QTensors (as ``torch.ao.nn.quantized``)."""
from . import functional
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all
from .modules import MaxPool2d  # noqa: F401  (as torch: importable, not in __all__)

__all__ = list(_modules_all) + ["functional"]
