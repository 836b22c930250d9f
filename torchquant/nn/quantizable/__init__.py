"""``torchquant.nn.quantizable``: float modules rebuilt from observable parts (LSTM, MHA) for
the eager custom-module flow, as ``torch.ao.nn.quantizable``."""
from .modules import *  # noqa: F401,F403
from .modules import __all__ as _modules_all

__all__ = list(_modules_all)
