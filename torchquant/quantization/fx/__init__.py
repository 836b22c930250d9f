"""``torchquant.quantization.fx``: the FX graph mode passes (torch's ``torch.ao.quantization.fx``).

So far only :mod:`.custom_config`; prepare / convert / fuse come with the FX workflow.
"""
