"""Half-renamed models: torch.ao / torch.quantization / torch.nn.quantized / torch.nn.intrinsic
objects inside a model handed to torchquant's eager workflow.

They do not work together (torch's QuantStub makes torch quantized tensors, torch's
FloatFunctional and observers expect them, torch's fused modules have no torchquant
counterpart and would silently stay float), so ``prepare`` / ``prepare_qat`` / ``convert``
raise a ``TypeError`` that names every such module and the torchquant name to use instead.
Objects are recognised by their class's module path; torch.ao is never imported.
"""
from __future__ import annotations

import importlib
from typing import Any, Optional

from torch import nn

from ..nn._torch_names import torchquant_namespace

__all__ = ["check_no_torch_quantization_objects"]


def _replacement(cls: type) -> str:
    """``torchquant.<namespace>.<Name>`` for a torch class, or the namespace alone when
    torchquant has no public name for it."""
    namespace = torchquant_namespace(getattr(cls, "__module__", "") or "")
    assert namespace is not None
    try:
        if hasattr(importlib.import_module(namespace), cls.__name__):
            return f"{namespace}.{cls.__name__}"
    except ImportError:  # pragma: no cover - every mapped namespace exists
        pass
    return f"the {namespace} counterpart (no {cls.__name__} there)"


def _torch_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _factory_class(factory: Any) -> Optional[type]:
    """The class a qconfig's ``activation`` / ``weight`` factory builds (``with_args``
    partials expose it as ``.p.func``; a bare class is itself)."""
    if isinstance(factory, type):
        return factory
    partial = getattr(factory, "p", None)
    func = getattr(partial, "func", None)
    return func if isinstance(func, type) else None


def _is_torch(cls: Any) -> bool:
    return torchquant_namespace(getattr(cls, "__module__", "") or "") is not None


def _qconfig_problem(qconfig: Any) -> Optional[str]:
    if _is_torch(type(qconfig)):
        return (f"its qconfig is torch's {type(qconfig).__name__} "
                f"({_torch_path(type(qconfig))}); use torchquant.quantization.QConfig / "
                "get_default_qconfig / get_default_qat_qconfig")
    for field in ("activation", "weight"):
        cls = _factory_class(getattr(qconfig, field, None))
        if cls is not None and _is_torch(cls):
            return (f"its qconfig.{field} builds torch's {_torch_path(cls)}; use "
                    f"{_replacement(cls)}")
    return None


def check_no_torch_quantization_objects(model: nn.Module, stage: str) -> None:
    """Raise ``TypeError`` listing the torch.ao quantization modules and qconfigs in ``model``
    (each with the torchquant name to use); ``stage`` names the calling function."""
    problems: list[str] = []
    parent_qconfig: dict[int, Any] = {}
    for name, module in model.named_modules():
        label = name or "the model"
        if _is_torch(type(module)):
            problems.append(f"{label!s}: {_torch_path(type(module))} is torch's; use "
                            f"{_replacement(type(module))}")
            continue
        qconfig = getattr(module, "qconfig", None)
        inherited = parent_qconfig.get(id(module), None)
        for child in module.children():
            parent_qconfig[id(child)] = qconfig
        if qconfig is None or qconfig is inherited:
            continue
        problem = _qconfig_problem(qconfig)
        if problem:
            problems.append(f"{label}: {problem}")
    if problems:
        shown = problems[:12]
        more = [f"... and {len(problems) - 12} more"] if len(problems) > 12 else []
        raise TypeError(
            f"{stage}: the model mixes torch.ao quantization objects with torchquant's; rename "
            "torch.ao.quantization / torch.quantization -> torchquant.quantization and "
            "torch.ao.nn.* / torch.nn.quantized / torch.nn.intrinsic / torch.nn.qat -> "
            "torchquant.nn.*:\n  " + "\n  ".join(shown + more))
