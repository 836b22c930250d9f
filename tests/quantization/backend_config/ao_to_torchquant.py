"""Map torch.ao objects found in torch's backend-config dicts to their torchquant counterparts,
so torch 2.13's dicts can be compared with ours by plain ``==``.

torch.ao.nn.intrinsic.X -> torchquant.nn.intrinsic.X (likewise intrinsic.qat, qat and
quantized.reference), torch's quantized dtypes -> torchquant QDTypes, torch's ObservationType /
DTypeWithConstraints -> ours, torch's fuser methods -> torchquant's of the same name, torch's
oneDNN helper functions -> ours of the same name.  Fuser closures made by
``_sequential_wrapper2(cls)`` (a fresh function per call on both sides) become the marker
``("sequential_wrapper2", cls)`` on both sides.
"""
from __future__ import annotations

import dataclasses
import enum
import importlib
import types

import torch
import torch.ao.quantization  # noqa: F401
import torch.ao.quantization.backend_config.utils  # noqa: F401  (torch 2.13 needs it loaded)

import torchquant
from torchquant.quantization import backend_config as tq_backend_config
from torchquant.quantization.backend_config import onednn as tq_onednn
from torchquant.quantization import fuser_method_mappings as tq_fusers
from torchquant.quantization.utils import MatchAllNode

_CLASS_MODULE_PREFIXES = [  # longest first
    ("torch.ao.nn.intrinsic.qat", "torchquant.nn.intrinsic.qat"),
    ("torch.ao.nn.intrinsic", "torchquant.nn.intrinsic"),
    ("torch.ao.nn.qat", "torchquant.nn.qat"),
    ("torch.ao.nn.quantized.reference", "torchquant.nn.quantized.reference"),
]
_TORCH_QDTYPES = {torch.quint8: torchquant.quint8, torch.qint8: torchquant.qint8,
                  torch.qint32: torchquant.qint32, torch.quint4x2: torchquant.quint4x2}


def _map_class(cls: type) -> type:
    if cls is torch.ao.quantization.utils.MatchAllNode:
        return MatchAllNode
    for torch_prefix, ours in _CLASS_MODULE_PREFIXES:
        if cls.__module__.startswith(torch_prefix + "."):
            return getattr(importlib.import_module(ours), cls.__name__)
    if cls.__module__.startswith("torch.ao"):
        raise AssertionError(f"no torchquant counterpart known for {cls}")
    return cls


def _map_function(f):
    if "_sequential_wrapper2.<locals>" in f.__qualname__:
        (cell,) = f.__closure__
        return ("sequential_wrapper2", _map_class(cell.cell_contents))
    module = getattr(f, "__module__", "") or ""
    if module == "torch.ao.quantization.fuser_method_mappings":
        return getattr(tq_fusers, f.__name__)
    if module == "torch.ao.quantization.backend_config.onednn":
        return getattr(tq_onednn, f.__name__)
    if module.startswith("torch.ao"):
        raise AssertionError(f"no torchquant counterpart known for {f}")
    return f


def to_torchquant(x):
    """``x`` (a torch.ao config dict, or one of ours) in comparable torchquant terms."""
    if isinstance(x, dict):
        return {to_torchquant(k): to_torchquant(v) for k, v in x.items()}
    if isinstance(x, list):
        return [to_torchquant(v) for v in x]
    if isinstance(x, tuple):
        return tuple(to_torchquant(v) for v in x)
    if isinstance(x, torch.ao.quantization.backend_config.DTypeWithConstraints):
        fields = {f.name: to_torchquant(getattr(x, f.name)) for f in dataclasses.fields(x)}
        return tq_backend_config.DTypeWithConstraints(**fields)
    if isinstance(x, torch.ao.quantization.backend_config.DTypeConfig):
        return tq_backend_config.DTypeConfig.from_dict(to_torchquant(x.to_dict()))
    if isinstance(x, torch.ao.quantization.backend_config.ObservationType):
        return tq_backend_config.ObservationType[x.name]
    if isinstance(x, enum.Enum):
        return x
    if isinstance(x, torch.dtype):
        return _TORCH_QDTYPES.get(x, x)
    if isinstance(x, type):
        return _map_class(x)
    if isinstance(x, types.FunctionType):
        return _map_function(x)
    return x
