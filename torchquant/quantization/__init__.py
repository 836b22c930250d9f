"""``torchquant.quantization`` — the ``torch.ao.quantization`` API on plain integer tensors."""
