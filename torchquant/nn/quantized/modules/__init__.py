"""Static quantized module implementations, one concept per file."""
from .activation import *  # noqa: F401,F403
from .batchnorm import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .embedding_ops import *  # noqa: F401,F403
from .functional_modules import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .stubs import *  # noqa: F401,F403
from . import activation, batchnorm, conv, dropout, embedding_ops, functional_modules, linear, normalization, stubs

__all__ = [n for m in (activation, batchnorm, conv, dropout, embedding_ops, functional_modules,
                       linear, normalization, stubs) for n in m.__all__]
