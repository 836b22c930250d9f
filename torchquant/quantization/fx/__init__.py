"""``torchquant.quantization.fx``: the FX graph mode passes (torch's ``torch.ao.quantization.fx``).

:mod:`.tracer` (symbolic tracing with quantization leaves and scopes), :mod:`.match_utils`
(backend pattern matching), :mod:`.fuse`, :mod:`.prepare` (qconfig resolution, observer
insertion), :mod:`.convert` (reference model and lowering to torchquant ops) and
:mod:`.custom_config`.  The public entry points are in :mod:`torchquant.quantization.quantize_fx`.
"""
