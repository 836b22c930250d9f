"""torch's quantization namespaces and their torchquant counterparts, recognised by name only.

torchquant never imports torch.ao; objects from it are recognised by the module path of their
class (or function), so that a half-renamed model gets a message instead of a silent no-op.
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["TORCH_TO_TORCHQUANT", "torchquant_namespace", "torch_quantization_function"]

# torch namespaces as package paths (tuples of names; longest first) and the torchquant
# namespace each maps to.  torch.nn.quantized / .intrinsic / .qat are torch's legacy aliases of
# the torch.ao.nn ones; torch.quantization is the legacy alias of torch.ao.quantization.
_NN_SUBPACKAGES: tuple[tuple[str, ...], ...] = (
    ("intrinsic", "quantized", "dynamic"), ("intrinsic", "quantized"), ("intrinsic", "qat"),
    ("intrinsic",), ("quantized", "dynamic"), ("quantized", "reference"), ("quantized",),
    ("qat", "dynamic"), ("qat",), ("quantizable",))
TORCH_TO_TORCHQUANT: tuple[tuple[tuple[str, ...], str], ...] = tuple(
    (root + sub, ".".join(("torchquant", "nn") + sub))
    for root in (("torch", "ao", "nn"), ("torch", "nn"))
    for sub in _NN_SUBPACKAGES
) + (
    (("torch", "ao", "quantization"), "torchquant.quantization"),
    (("torch", "quantization"), "torchquant.quantization"),
)


def torchquant_namespace(module_path: str) -> Optional[str]:
    """The torchquant namespace for a torch quantization module path, else None."""
    parts = tuple(module_path.split("."))
    for torch_parts, tq_ns in TORCH_TO_TORCHQUANT:
        if parts[:len(torch_parts)] == torch_parts:
            return tq_ns
    return None


# torch's model.apply() switches and the torchquant method each one stands for.
_SWITCHES = {"disable_observer", "enable_observer", "disable_fake_quant", "enable_fake_quant",
             "freeze_bn_stats", "update_bn_stats"}


def torch_quantization_function(fn: Any) -> Optional[str]:
    """The name of ``fn`` when it is one of torch's QAT switches (``disable_observer``,
    ``freeze_bn_stats``, ...): torch's versions check ``type(mod)`` against torch's own classes
    and so do nothing to torchquant modules, which catch them in ``apply`` instead."""
    name = getattr(fn, "__name__", None)
    module_path = getattr(fn, "__module__", None) or ""
    if name in _SWITCHES and torchquant_namespace(module_path) is not None:
        return name
    return None
