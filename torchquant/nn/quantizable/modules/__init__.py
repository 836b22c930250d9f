"""Quantizable (observable) module implementations."""
from .activation import MultiheadAttention
from .rnn import LSTM, LSTMCell

__all__ = ["LSTM", "LSTMCell", "MultiheadAttention"]
