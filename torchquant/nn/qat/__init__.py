"""``torchquant.nn.qat``: float modules whose weights are fake-quantized (as ``torch.ao.nn.qat``).

The activation fake-quant is not inside these modules; ``prepare_qat`` attaches it.
"""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
from . import dynamic  # noqa: F401,E402
