"""``torchquant.nn``: quantized, QAT, fused and quantizable modules (as ``torch.ao.nn``)."""
# nn.quantized first: its static MultiheadAttention subclasses nn.quantizable's, which in turn
# uses nn.quantized's FloatFunctional, so entering through nn.quantizable would meet a half-made
# package.  (The cycle itself is listed in tests/test_import_graph.py's follow-ups.)
from . import quantized  # noqa: F401
