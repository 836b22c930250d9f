"""``torchquant.quantization._learnable_fake_quantize``: the module path torch keeps its
learnable fake-quantize under (``torch.ao.quantization._learnable_fake_quantize``), so code
importing it from there ports by renaming.  The class lives with the other fake-quantizes."""
from .fake_quantize import _LearnableFakeQuantize

__all__ = ["_LearnableFakeQuantize"]
