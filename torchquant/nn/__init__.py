"""``torchquant.nn``: quantized, QAT, fused and quantizable modules (as ``torch.ao.nn``)."""
from . import quantized  # noqa: F401
