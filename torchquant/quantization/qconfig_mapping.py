"""``QConfigMapping``: which qconfig applies to which part of a model.

Five levels, lowest to highest precedence: global < object type (module class, function or
method name) < module-name regex (first match in insertion order) < module name (a parent's
entry covers its children) < (module name, object type, call index).  A ``None`` qconfig at a
level that matches switches quantization off there.  :func:`_get_qconfig` resolves them.

The definitions live in :mod:`.qconfig` (the deprecated ``get_default_qconfig_dict`` there
returns a default mapping, built from the qconfigs defined there); this is their torch path.
"""
from __future__ import annotations

from .qconfig import (  # noqa: F401
    QConfigMapping,
    get_default_qconfig_mapping,
    get_default_qat_qconfig_mapping,
    ObjectType,
    _FIXED_QPARAMS_OP_TO_OBSERVER,
    _GLOBAL_DICT_KEY,
    _OBJECT_TYPE_DICT_KEY,
    _MODULE_NAME_REGEX_DICT_KEY,
    _MODULE_NAME_DICT_KEY,
    _MODULE_NAME_OBJECT_TYPE_ORDER_DICT_KEY,
    _QCONFIG_STYLE_ORDER,
    _get_default_qconfig_mapping,
    _get_module_name_qconfig,
    _get_qconfig,
)

__all__ = ["QConfigMapping", "get_default_qconfig_mapping", "get_default_qat_qconfig_mapping"]
