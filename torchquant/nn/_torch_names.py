"""torch's quantization namespaces and their torchquant counterparts, recognised by name only.

torchquant never imports torch.ao; objects from it are recognised by the module path of their
class (or function), so that a half-renamed model gets a message instead of a silent no-op.
"""
from __future__ import annotations

from typing import Any, Optional

__all__ = ["TORCH_TO_TORCHQUANT", "torchquant_namespace", "torch_quantization_function"]

# Longest prefix first; a torch class path under the left maps to the right namespace.
TORCH_TO_TORCHQUANT: tuple[tuple[str, str], ...] = tuple(
    (torch_ns, tq_ns)
    for prefix in ("torch.ao.nn", "torch.nn")
    for torch_ns, tq_ns in (
        (f"{prefix}.intrinsic.quantized.dynamic", "torchquant.nn.intrinsic.quantized.dynamic"),
        (f"{prefix}.intrinsic.quantized", "torchquant.nn.intrinsic.quantized"),
        (f"{prefix}.intrinsic.qat", "torchquant.nn.intrinsic.qat"),
        (f"{prefix}.intrinsic", "torchquant.nn.intrinsic"),
        (f"{prefix}.quantized.dynamic", "torchquant.nn.quantized.dynamic"),
        (f"{prefix}.quantized.reference", "torchquant.nn.quantized.reference"),
        (f"{prefix}.quantized", "torchquant.nn.quantized"),
        (f"{prefix}.qat.dynamic", "torchquant.nn.qat.dynamic"),
        (f"{prefix}.qat", "torchquant.nn.qat"),
        (f"{prefix}.quantizable", "torchquant.nn.quantizable"),
    )
) + (
    ("torch.ao.quantization", "torchquant.quantization"),
    ("torch.quantization", "torchquant.quantization"),
)


def torchquant_namespace(module_path: str) -> Optional[str]:
    """The torchquant namespace for a torch quantization module path, else None."""
    for torch_ns, tq_ns in TORCH_TO_TORCHQUANT:
        if module_path == torch_ns or module_path.startswith(torch_ns + "."):
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
