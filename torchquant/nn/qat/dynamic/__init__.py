"""``torchquant.nn.qat.dynamic``: QAT modules that convert to dynamically quantized ones."""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
