"""Dynamic quantized module implementations."""
from .conv import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from . import conv, linear, rnn

__all__ = [n for m in (conv, linear, rnn) for n in m.__all__]
