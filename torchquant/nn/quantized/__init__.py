"""``torchquant.nn.quantized``: static quantized modules on QTensors (as ``torch.ao.nn.quantized``)."""
