"""``torchquant.nn.intrinsic.qat``: fused QAT modules (as ``torch.ao.nn.intrinsic.qat``)."""
from .modules import *  # noqa: F401,F403
from .modules import __all__  # noqa: F401
