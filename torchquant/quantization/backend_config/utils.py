"""Views of a BackendConfig the FX passes use (pattern -> dtype configs, fuser methods, ...).

Patterns are keyed in the reversed nested tuple format of the FX matcher (``(relu, (bn,
conv))``); fuser methods given for forward-order patterns are wrapped to take their modules in
that format.
"""
from __future__ import annotations

from typing import Any, Callable

import torch.nn.functional as F

from ..utils import Pattern
from .backend_config import (
    BackendConfig,
    BackendPatternConfig,
    DTypeConfig,
    _pattern_in_reversed_nested_tuple_format,
)

__all__ = [
    "get_pattern_to_dtype_configs",
    "get_qat_module_classes",
    "get_fused_module_classes",
    "get_pattern_to_input_type_to_index",
    "get_root_module_to_quantized_reference_module",
    "get_fuser_method_mapping",
    "get_module_to_qat_module",
    "get_fusion_pattern_to_root_node_getter",
    "get_fusion_pattern_to_extra_inputs_getter",
    "remove_boolean_dispatch_from_name",
    "pattern_to_human_readable",
    "entry_to_pretty_str",
]


def _by_complex_pattern(backend_config: BackendConfig, field: Callable[[BackendPatternConfig], Any]
                        ) -> dict[Pattern, Any]:
    """``{complex-format pattern: field(config)}`` over the configs where the field is set."""
    result = {}
    for pattern, config in backend_config._pattern_complex_format_to_config.items():
        value = field(config)
        if value is not None:
            result[pattern] = value
    return result


def get_pattern_to_dtype_configs(backend_config: BackendConfig) -> dict[Pattern, list[DTypeConfig]]:
    return _by_complex_pattern(backend_config, lambda c: c.dtype_configs)


def get_qat_module_classes(backend_config: BackendConfig) -> tuple[type, ...]:
    return tuple({c.qat_module for c in backend_config.configs if c.qat_module is not None})


def get_fused_module_classes(backend_config: BackendConfig) -> tuple[type, ...]:
    return tuple({c.fused_module for c in backend_config.configs if c.fused_module is not None})


def get_pattern_to_input_type_to_index(backend_config: BackendConfig
                                       ) -> dict[Pattern, dict[str, int]]:
    return _by_complex_pattern(backend_config, lambda c: c._input_type_to_index)


def get_root_module_to_quantized_reference_module(backend_config: BackendConfig
                                                  ) -> dict[type, type]:
    return {c.root_module: c.reference_quantized_module for c in backend_config.configs
            if c.root_module is not None and c.reference_quantized_module is not None}


def _reverse2(fuser: Callable) -> Callable:
    def reversed_fuser(is_qat, second, first):
        return fuser(is_qat, first, second)
    return reversed_fuser


def _reverse3(fuser: Callable) -> Callable:
    def reversed_fuser(is_qat, third, second_and_first):
        second, first = second_and_first
        return fuser(is_qat, first, second, third)
    return reversed_fuser


def _get_pattern_in_reversed_nested_tuple_format(config: BackendPatternConfig) -> Pattern:
    return _pattern_in_reversed_nested_tuple_format(config)


def _get_fuser_method_in_reversed_nested_tuple_format(config: BackendPatternConfig) -> Callable:
    """The config's fuser taking the modules as the FX matcher hands them: ``f(is_qat, a, b)``
    becomes ``f'(is_qat, b, a)`` and ``f(is_qat, a, b, c)`` becomes ``f'(is_qat, c, (b, a))``;
    a fuser of a complex-format pattern is already in that form."""
    if config.fuser_method is None:
        raise AssertionError("config.fuser_method must be provided")
    if config._pattern_complex_format is not None:
        return config.fuser_method
    if not isinstance(config.pattern, tuple):
        raise ValueError(f"Expected pattern to be a tuple, got: {config.pattern}")
    if len(config.pattern) == 2:
        return _reverse2(config.fuser_method)
    if len(config.pattern) == 3:
        return _reverse3(config.fuser_method)
    raise ValueError(f"Expected a tuple with 2 or 3 elements, got: {config.pattern}")


def get_fuser_method_mapping(backend_config: BackendConfig) -> dict[Pattern, Callable]:
    return {pattern: _get_fuser_method_in_reversed_nested_tuple_format(config)
            for pattern, config in backend_config._pattern_complex_format_to_config.items()
            if config.fuser_method is not None}


def get_module_to_qat_module(backend_config: BackendConfig) -> dict[Pattern, type]:
    return _by_complex_pattern(backend_config, lambda c: c.qat_module)


def get_fusion_pattern_to_root_node_getter(backend_config: BackendConfig
                                           ) -> dict[Pattern, Callable]:
    """Patterns whose root node is not the last one matched (e.g. conv in conv + add), with the
    function that picks it out of the matched node pattern."""
    return _by_complex_pattern(backend_config, lambda c: c._root_node_getter)


def get_fusion_pattern_to_extra_inputs_getter(backend_config: BackendConfig
                                              ) -> dict[Pattern, Callable]:
    """Patterns whose fused module takes extra inputs (the other operand of conv + add), with
    the function returning them from the matched node pattern."""
    return _by_complex_pattern(backend_config, lambda c: c._extra_inputs_getter)


_BOOLEAN_DISPATCH_NAMES = {
    F.fractional_max_pool2d: "torch.nn.functional.fractional_max_pool2d",
    F.fractional_max_pool3d: "torch.nn.functional.fractional_max_pool3d",
    F.max_pool1d: "torch.nn.functional.max_pool1d",
    F.max_pool2d: "torch.nn.functional.max_pool2d",
    F.max_pool3d: "torch.nn.functional.max_pool3d",
    F.adaptive_max_pool1d: "torch.nn.functional.adaptive_max_pool1d",
    F.adaptive_max_pool2d: "torch.nn.functional.adaptive_max_pool2d",
    F.adaptive_max_pool3d: "torch.nn.functional.adaptive_max_pool3d",
}


def remove_boolean_dispatch_from_name(p: Any) -> Any:
    """Functions built by torch's ``boolean_dispatch`` (``F.max_pool2d`` ...) print as
    ``boolean_dispatch.<locals>.fn``; give their public name instead."""
    for function, name in _BOOLEAN_DISPATCH_NAMES.items():
        if p is function:
            return name
    if "boolean_dispatch" in str(p):
        raise AssertionError(f"{p} does not have a human readable representation in "
                             "quantization documentation")
    return p


def pattern_to_human_readable(p: Any) -> Any:
    if isinstance(p, tuple):
        return tuple(pattern_to_human_readable(inner) for inner in p)
    if isinstance(p, str):
        return p
    return remove_boolean_dispatch_from_name(p)


def entry_to_pretty_str(entry: dict[str, Any]) -> str:
    """A BackendPatternConfig dict, one field per line, pattern first."""
    lines = ["{"]
    if "pattern" in entry:
        lines.append(f"  'pattern': {pattern_to_human_readable(entry['pattern'])},")
    if "dtype_configs" in entry:
        lines.append("  'dtype_configs': [")
        for dtype_config in entry["dtype_configs"]:
            lines.append("    {")
            lines.extend(f"      '{k}': {v}," for k, v in dtype_config.items())
            lines.append("    },")
        lines.append("  ],")
    if "num_tensor_args_to_observation_type" in entry:
        lines.append("  'num_tensor_args_to_observation_type': {")
        lines.extend(f"    {k}: {v}," for k, v in
                     entry["num_tensor_args_to_observation_type"].items())
        lines.append("  },")
    for field_name, value in entry.items():
        if field_name not in ("pattern", "dtype_configs", "num_tensor_args_to_observation_type"):
            lines.append(f"  '{field_name}': {value},")
    lines.append("}")
    return "\n".join(lines)
