from .conv import Conv1d, Conv2d, Conv3d
from .embedding_ops import Embedding, EmbeddingBag
from .linear import Linear

__all__ = ["Linear", "Conv1d", "Conv2d", "Conv3d", "Embedding", "EmbeddingBag"]
