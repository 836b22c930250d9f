"""``QConfigMapping``: which qconfig applies to which part of a model.

Five levels, lowest to highest precedence: global < object type (module class, function or
method name) < module-name regex (first match in insertion order) < module name (a parent's
entry covers its children) < (module name, object type, call index).  A ``None`` qconfig at a
level that matches switches quantization off there.  :func:`_get_qconfig` resolves them.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from typing import Any, Callable, Optional, Union

import torch

from .fake_quantize import FixedQParamsFakeQuantize, default_weight_fake_quant
from .observer import (
    default_fixed_qparams_range_0to1_observer,
    default_fixed_qparams_range_neg1to1_observer,
    default_placeholder_observer,
    default_weight_observer,
)
from .qconfig import (
    QConfig,
    QConfigAny,
    default_quint8_weight_qconfig,
    default_reuse_input_qconfig,
    get_default_qat_qconfig,
    get_default_qconfig,
)
from .utils import _parent_name

__all__ = ["QConfigMapping", "get_default_qconfig_mapping", "get_default_qat_qconfig_mapping"]

ObjectType = Union[Callable, str]

# Keys of the dict form (``to_dict`` / ``from_dict``, and the legacy ``qconfig_dict``).
_GLOBAL_DICT_KEY = ""
_OBJECT_TYPE_DICT_KEY = "object_type"
_MODULE_NAME_REGEX_DICT_KEY = "module_name_regex"
_MODULE_NAME_DICT_KEY = "module_name"
_MODULE_NAME_OBJECT_TYPE_ORDER_DICT_KEY = "module_name_object_type_order"

# Ops whose quantized output range is fixed, with the observer that pins it.
_FIXED_QPARAMS_OP_TO_OBSERVER: dict[ObjectType, Any] = {
    torch.nn.Hardsigmoid: default_fixed_qparams_range_0to1_observer,
    torch.nn.functional.hardsigmoid: default_fixed_qparams_range_0to1_observer,
    "hardsigmoid": default_fixed_qparams_range_0to1_observer,
    "hardsigmoid_": default_fixed_qparams_range_0to1_observer,
    torch.nn.Sigmoid: default_fixed_qparams_range_0to1_observer,
    torch.sigmoid: default_fixed_qparams_range_0to1_observer,
    "sigmoid": default_fixed_qparams_range_0to1_observer,
    "sigmoid_": default_fixed_qparams_range_0to1_observer,
    torch.nn.Softmax: default_fixed_qparams_range_0to1_observer,
    torch.nn.Tanh: default_fixed_qparams_range_neg1to1_observer,
    torch.tanh: default_fixed_qparams_range_neg1to1_observer,
    "tanh": default_fixed_qparams_range_neg1to1_observer,
    "tanh_": default_fixed_qparams_range_neg1to1_observer,
}

_QCONFIG_STYLE_ORDER = ["global_qconfig", "object_type_qconfigs", "module_name_regex_qconfigs",
                        "module_name_qconfigs", "module_name_object_type_order_qconfigs"]


class QConfigMapping:
    """Maps model parts to qconfigs; every setter returns ``self`` so calls chain::

        QConfigMapping()
            .set_global(global_qconfig)
            .set_object_type(torch.nn.Linear, qconfig1)
            .set_module_name_regex("foo.*bar.*conv[0-9]+", qconfig1)
            .set_module_name("module1", qconfig2)
            .set_module_name_object_type_order("foo.bar", torch.nn.functional.linear, 0, qconfig3)

    Setting an existing key replaces its qconfig but keeps its position (which matters for
    regexes: the first matching one wins).
    """

    def __init__(self) -> None:
        self.global_qconfig: QConfigAny = None
        self.object_type_qconfigs: OrderedDict[ObjectType, QConfigAny] = OrderedDict()
        self.module_name_regex_qconfigs: OrderedDict[str, QConfigAny] = OrderedDict()
        self.module_name_qconfigs: OrderedDict[str, QConfigAny] = OrderedDict()
        self.module_name_object_type_order_qconfigs: OrderedDict[
            tuple[str, ObjectType, int], QConfigAny] = OrderedDict()

    def set_global(self, global_qconfig: QConfigAny) -> QConfigMapping:
        """The qconfig for everything no other entry matches."""
        self.global_qconfig = global_qconfig
        return self

    def set_object_type(self, object_type: ObjectType, qconfig: QConfigAny) -> QConfigMapping:
        """A module class, a function (``torch.nn.functional.linear``) or a method name
        (``"reshape"``)."""
        self.object_type_qconfigs[object_type] = qconfig
        return self

    def set_module_name_regex(self, module_name_regex: str,
                              qconfig: QConfigAny) -> QConfigMapping:
        """Modules whose qualified name ``re.match``-es the pattern; register specific patterns
        before general ones."""
        self.module_name_regex_qconfigs[module_name_regex] = qconfig
        return self

    def set_module_name(self, module_name: str, qconfig: QConfigAny) -> QConfigMapping:
        """The module with this qualified name and, unless they have their own entry, its
        submodules."""
        self.module_name_qconfigs[module_name] = qconfig
        return self

    def set_module_name_object_type_order(self, module_name: str, object_type: ObjectType,
                                          index: int, qconfig: QConfigAny) -> QConfigMapping:
        """The ``index``-th call (from 0) of ``object_type`` inside module ``module_name``
        (FX graph mode only)."""
        self.module_name_object_type_order_qconfigs[(module_name, object_type, index)] = qconfig
        return self

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for style in _QCONFIG_STYLE_ORDER:
            lines.append(f" {style}")
            entries = getattr(self, style)
            if isinstance(entries, OrderedDict) and entries:
                lines.extend(f"  {key}: {qconfig}" for key, qconfig in entries.items())
            else:
                lines.append(f"  {entries}")
        return "\n".join(lines) + "\n)"

    def to_dict(self) -> dict[str, Any]:
        """The legacy dict form: ``""`` -> global qconfig, the other keys -> lists of tuples
        (``module_name_object_type_order`` entries are ``(name, type, index, qconfig)``)."""
        return {
            _GLOBAL_DICT_KEY: self.global_qconfig,
            _OBJECT_TYPE_DICT_KEY: list(self.object_type_qconfigs.items()),
            _MODULE_NAME_REGEX_DICT_KEY: list(self.module_name_regex_qconfigs.items()),
            _MODULE_NAME_DICT_KEY: list(self.module_name_qconfigs.items()),
            _MODULE_NAME_OBJECT_TYPE_ORDER_DICT_KEY: [
                (*key, qconfig) for key, qconfig in
                self.module_name_object_type_order_qconfigs.items()],
        }

    @classmethod
    def from_dict(cls, qconfig_dict: dict[str, Any]) -> QConfigMapping:
        """Inverse of :meth:`to_dict`; every key is optional."""
        mapping = cls()
        if _GLOBAL_DICT_KEY in qconfig_dict:
            mapping.set_global(qconfig_dict[_GLOBAL_DICT_KEY])
        for object_type, qconfig in qconfig_dict.get(_OBJECT_TYPE_DICT_KEY, []):
            mapping.set_object_type(object_type, qconfig)
        for regex, qconfig in qconfig_dict.get(_MODULE_NAME_REGEX_DICT_KEY, []):
            mapping.set_module_name_regex(regex, qconfig)
        for module_name, qconfig in qconfig_dict.get(_MODULE_NAME_DICT_KEY, []):
            mapping.set_module_name(module_name, qconfig)
        for module_name, object_type, index, qconfig in qconfig_dict.get(
                _MODULE_NAME_OBJECT_TYPE_ORDER_DICT_KEY, []):
            mapping.set_module_name_object_type_order(module_name, object_type, index, qconfig)
        return mapping


def _get_module_name_qconfig(qconfig_mapping: QConfigMapping, module_name: str,
                             fallback: QConfigAny) -> QConfigAny:
    """The entry for ``module_name`` or its nearest named ancestor, else ``fallback``."""
    while module_name:
        if module_name in qconfig_mapping.module_name_qconfigs:
            return qconfig_mapping.module_name_qconfigs[module_name]
        module_name, _ = _parent_name(module_name)
    return fallback


def _get_qconfig(qconfig_mapping: QConfigMapping, object_type: Optional[ObjectType],
                 module_name: str, call_index: Optional[int] = None,
                 call_scope: Optional[str] = None) -> QConfigAny:
    """The qconfig that applies, by the precedence in the module docstring.

    ``object_type`` is the module class, function or method name; ``module_name`` the
    qualified name matched by regex and name entries.  ``call_index`` (how many calls of
    ``object_type`` came before this one inside module ``call_scope``, default
    ``module_name``) enables the ``module_name_object_type_order`` level.
    """
    qconfig = qconfig_mapping.object_type_qconfigs.get(object_type, qconfig_mapping.global_qconfig)
    for regex, regex_qconfig in qconfig_mapping.module_name_regex_qconfigs.items():
        if re.match(regex, module_name):
            qconfig = regex_qconfig
            break
    qconfig = _get_module_name_qconfig(qconfig_mapping, module_name, qconfig)
    if call_index is not None:
        key = (module_name if call_scope is None else call_scope, object_type, call_index)
        qconfig = qconfig_mapping.module_name_object_type_order_qconfigs.get(key, qconfig)
    return qconfig


def _get_default_qconfig_mapping(is_qat: bool, backend: str, version: int) -> QConfigMapping:
    """The default mapping: the backend's qconfig globally plus the per-op exceptions."""
    qconfig = (get_default_qat_qconfig(backend, version) if is_qat
               else get_default_qconfig(backend, version))
    default_weight = default_weight_fake_quant if is_qat else default_weight_observer
    # fbgemm / x86 have no per-channel transposed convolution: use per-tensor weights there.
    if backend in ("fbgemm", "x86"):
        qconfig_transpose = QConfig(activation=qconfig.activation, weight=default_weight)
    else:
        qconfig_transpose = qconfig
    # LayerNorm keeps float weights (else an extra quantize-dequantize pair appears).
    qconfig_layernorm = QConfig(activation=qconfig.activation, weight=default_placeholder_observer)

    mapping = (QConfigMapping()
               .set_global(qconfig)
               .set_object_type("reshape", default_reuse_input_qconfig)
               .set_object_type(torch.nn.ConvTranspose1d, qconfig_transpose)
               .set_object_type(torch.nn.ConvTranspose2d, qconfig_transpose)
               .set_object_type(torch.nn.ConvTranspose3d, qconfig_transpose)
               .set_object_type(torch.nn.functional.conv_transpose1d, qconfig_transpose)
               .set_object_type(torch.nn.functional.conv_transpose2d, qconfig_transpose)
               .set_object_type(torch.nn.functional.conv_transpose3d, qconfig_transpose)
               .set_object_type(torch.nn.functional.layer_norm, qconfig_layernorm)
               .set_object_type(torch.nn.LayerNorm, qconfig_layernorm)
               .set_object_type(torch.nn.PReLU, default_quint8_weight_qconfig))
    # One qconfig object per fixed-qparams observer, shared by all the ops that use it.
    fixed_qconfigs: dict[int, QConfig] = {}
    for op, observer in _FIXED_QPARAMS_OP_TO_OBSERVER.items():
        if id(observer) not in fixed_qconfigs:
            activation = FixedQParamsFakeQuantize.with_args(observer=observer) if is_qat else observer
            fixed_qconfigs[id(observer)] = QConfig(activation=activation, weight=default_weight)
        mapping.set_object_type(op, fixed_qconfigs[id(observer)])
    return mapping


def get_default_qconfig_mapping(backend: str = "x86", version: int = 0) -> QConfigMapping:
    """The default post-training mapping for ``backend`` (x86, fbgemm, qnnpack or onednn)."""
    return _get_default_qconfig_mapping(False, backend, version)


def get_default_qat_qconfig_mapping(backend: str = "x86", version: int = 1) -> QConfigMapping:
    """The default quantization-aware-training mapping for ``backend``."""
    return _get_default_qconfig_mapping(True, backend, version)
