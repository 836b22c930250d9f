"""Fused dynamic quantized module implementations."""
from .linear_relu import *  # noqa: F401,F403
from . import linear_relu

__all__ = list(linear_relu.__all__)
