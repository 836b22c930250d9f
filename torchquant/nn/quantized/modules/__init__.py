"""Static quantized module implementations, one concept per file."""
from .activation import *  # noqa: F401,F403
from .activation_mha import *  # noqa: F401,F403
from .batchnorm import *  # noqa: F401,F403
from .conv import *  # noqa: F401,F403
from .dropout import *  # noqa: F401,F403
from .embedding_ops import *  # noqa: F401,F403
from .functional_modules import *  # noqa: F401,F403
from .linear import *  # noqa: F401,F403
from .normalization import *  # noqa: F401,F403
from .rnn import *  # noqa: F401,F403
from .stubs import *  # noqa: F401,F403
# torch's quantized MaxPool2d is the float module itself (max pooling commutes with a monotone
# affine map, so it runs on the QTensor's integers); importable here as in torch, not in __all__
from torch.nn.modules.pooling import MaxPool2d  # noqa: F401
from . import (activation, activation_mha, batchnorm, conv, dropout, embedding_ops,
               functional_modules, linear, normalization, rnn, stubs)

__all__ = [n for m in (activation, activation_mha, batchnorm, conv, dropout, embedding_ops,
                       functional_modules, linear, normalization, rnn, stubs) for n in m.__all__]
