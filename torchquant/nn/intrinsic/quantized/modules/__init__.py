from .bn_relu import *  # noqa: F401,F403
from .conv_add import *  # noqa: F401,F403
from .conv_relu import *  # noqa: F401,F403
from .linear_relu import *  # noqa: F401,F403
from . import bn_relu, conv_add, conv_relu, linear_relu

__all__ = [n for m in (bn_relu, conv_add, conv_relu, linear_relu) for n in m.__all__]
