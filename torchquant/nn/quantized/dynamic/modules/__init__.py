"""Dynamic quantized module implementations."""
from .linear import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from . import linear, rnn

__all__ = [n for m in (linear, rnn) for n in m.__all__]
