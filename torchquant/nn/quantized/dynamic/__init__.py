"""``torchquant.nn.quantized.dynamic``: float in / float out modules with int8 (or float16)
weights and activations quantized per call (as ``torch.ao.nn.quantized.dynamic``)."""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
