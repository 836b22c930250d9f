"""``torchquant.nn.quantized.reference``: float modules that quantize-dequantize their weights
(what ``convert(..., is_reference=True)`` produces)."""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
