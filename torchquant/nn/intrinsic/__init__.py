"""``torchquant.nn.intrinsic``: fused float containers (as ``torch.ao.nn.intrinsic``)."""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
