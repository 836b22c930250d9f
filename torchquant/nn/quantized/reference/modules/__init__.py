from .conv import Conv1d, Conv2d, Conv3d, ConvTranspose1d, ConvTranspose2d, ConvTranspose3d
from .linear import Linear
from .rnn import GRU, LSTM, GRUCell, LSTMCell, RNNCell
from .sparse import Embedding, EmbeddingBag

__all__ = ["Linear", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
           "ConvTranspose3d", "RNNCell", "LSTMCell", "GRUCell", "LSTM", "GRU", "Embedding",
           "EmbeddingBag"]
