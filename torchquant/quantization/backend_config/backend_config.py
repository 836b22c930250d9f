"""What a backend can run quantized, pattern by pattern (torch's ``BackendConfig`` API).

A :class:`BackendConfig` is a set of :class:`BackendPatternConfig` s keyed by pattern.  Each one
says which dtypes the pattern supports (:class:`DTypeConfig`, optionally with
:class:`DTypeWithConstraints`), how observers are placed around it (:class:`ObservationType`) and,
for fusion / QAT / convert, which modules stand for it.  FX ``prepare_fx`` / ``convert_fx`` read
it; everything here is plain data with dict round trips whose keys are torch's.

[TQ] Quantized dtypes are stored as torchquant QDTypes (torch's own quantized dtype objects
are accepted, normalised by :func:`torchquant.dtypes.from_torch_quantized_dtype`);
``from_dict`` rejects unknown keys (torch ignores them silently) and a pattern config without
any pattern.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Callable, Optional, Union

import torch

from ... import dtypes as _dt
from ..utils import Pattern

__all__ = [
    "BackendConfig",
    "BackendPatternConfig",
    "DTypeConfig",
    "DTypeWithConstraints",
    "ObservationType",
]

# DTypeConfig dict keys
_INPUT_DTYPE = "input_dtype"
_OUTPUT_DTYPE = "output_dtype"
_WEIGHT_DTYPE = "weight_dtype"
_BIAS_DTYPE = "bias_dtype"
_IS_DYNAMIC = "is_dynamic"
_DTYPE_CONFIG_KEYS = (_INPUT_DTYPE, _OUTPUT_DTYPE, _WEIGHT_DTYPE, _BIAS_DTYPE, _IS_DYNAMIC)

# BackendConfig dict keys
_NAME = "name"
_CONFIGS = "configs"

# BackendPatternConfig dict keys
_PATTERN = "pattern"
_PATTERN_COMPLEX_FORMAT = "pattern_complex_format"
_OBSERVATION_TYPE = "observation_type"
_DTYPE_CONFIGS = "dtype_configs"
_ROOT_MODULE = "root_module"
_QAT_MODULE = "qat_module"
_REFERENCE_QUANTIZED_MODULE = "reference_quantized_module_for_root"
_FUSED_MODULE = "fused_module"
_FUSER_METHOD = "fuser_method"
_ROOT_NODE_GETTER = "root_node_getter"
_EXTRA_INPUTS_GETTER = "extra_inputs_getter"
_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE = "num_tensor_args_to_observation_type"
_INPUT_TYPE_TO_INDEX = "input_type_to_index"
_PATTERN_CONFIG_KEYS = (
    _PATTERN, _PATTERN_COMPLEX_FORMAT, _OBSERVATION_TYPE, _DTYPE_CONFIGS, _ROOT_MODULE,
    _QAT_MODULE, _REFERENCE_QUANTIZED_MODULE, _FUSED_MODULE, _FUSER_METHOD, _ROOT_NODE_GETTER,
    _EXTRA_INPUTS_GETTER, _NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE, _INPUT_TYPE_TO_INDEX,
)


def _reject_unknown_keys(what: str, d: dict[str, Any], known: tuple[str, ...]) -> None:
    """ValueError naming every key of ``d`` that ``what.from_dict`` does not understand."""
    if not isinstance(d, dict):
        raise ValueError(f"{what}.from_dict expects a dict, got {type(d).__name__}")
    unknown = [k for k in d if k not in known]
    if unknown:
        raise ValueError(f"{what}.from_dict: unknown key(s) {unknown}; expected some of {list(known)}")


def _normalize_dtype(dtype: Any) -> Any:
    """torch's quantized dtype objects become torchquant QDTypes; plain torch
    dtypes (``torch.float``, ``torch.float16``, ``torch.uint8`` ...) and None stay as given."""
    qdtype = _dt.from_torch_quantized_dtype(dtype)
    return dtype if qdtype is None else qdtype


def _is_dtype(x: Any) -> bool:
    return isinstance(x, (torch.dtype, _dt.QDType))


class ObservationType(Enum):
    """How observers (later quantize / dequantize pairs) are placed around a pattern."""

    OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT = 0
    """The output gets its own observer (conv, linear, add, ...)."""

    OUTPUT_SHARE_OBSERVER_WITH_INPUT = 1
    """The output reuses the input's observer instance (cat, max_pool, reshape, ...)."""

    INPUT_OUTPUT_NOT_OBSERVED = 2
    """Neither side is observed (``x.shape``, ``x.size()``)."""


@dataclass
class DTypeWithConstraints:
    """A dtype plus the limits a qconfig's observer must respect for the pattern to be quantized.

    ``quant_min_lower_bound`` / ``quant_max_upper_bound`` bound the observer's quant range;
    ``scale_min_lower_bound`` is checked against the observer's ``eps`` (the upper bound is
    recorded but, as in torch, not enforced); ``scale_exact_match`` / ``zero_point_exact_match``
    require a fixed-qparams observer with exactly those qparams (sigmoid, tanh, ...).
    """

    dtype: Optional[Any] = None
    quant_min_lower_bound: Union[int, float, None] = None
    quant_max_upper_bound: Union[int, float, None] = None
    scale_min_lower_bound: Union[int, float, None] = None
    scale_max_upper_bound: Union[int, float, None] = None
    scale_exact_match: Optional[float] = None
    zero_point_exact_match: Optional[int] = None

    def __post_init__(self) -> None:
        self.dtype = _normalize_dtype(self.dtype)


def _with_constraints(dtype: Any) -> DTypeWithConstraints:
    if isinstance(dtype, DTypeWithConstraints):
        return dtype
    return DTypeWithConstraints(dtype=dtype)


@dataclass(init=False)
class DTypeConfig:
    """The dtypes a pattern supports, as they appear in the reference model's quantize ops.

    ``input_dtype`` / ``output_dtype`` are the activation dtypes of the quantize ops around the
    pattern (for dynamic quantization the input dtype is still ``quint8`` though the interface
    is float), ``weight_dtype`` / ``bias_dtype`` those of its parameters.  A qconfig whose
    observers agree with one DTypeConfig of a pattern (and meet its constraints) quantizes it.
    """

    input_dtype_with_constraints: DTypeWithConstraints
    output_dtype_with_constraints: DTypeWithConstraints
    weight_dtype_with_constraints: DTypeWithConstraints
    bias_dtype: Optional[torch.dtype]
    is_dynamic: Optional[bool]

    def __init__(self, input_dtype: Any = None, output_dtype: Any = None,
                 weight_dtype: Any = None, bias_dtype: Optional[torch.dtype] = None,
                 is_dynamic: Optional[bool] = None) -> None:
        self.input_dtype_with_constraints = _with_constraints(input_dtype)
        self.output_dtype_with_constraints = _with_constraints(output_dtype)
        self.weight_dtype_with_constraints = _with_constraints(weight_dtype)
        self.bias_dtype = _normalize_dtype(bias_dtype)
        self.is_dynamic = is_dynamic

    @property
    def input_dtype(self) -> Any:
        return self.input_dtype_with_constraints.dtype

    @property
    def output_dtype(self) -> Any:
        return self.output_dtype_with_constraints.dtype

    @property
    def weight_dtype(self) -> Any:
        return self.weight_dtype_with_constraints.dtype

    @classmethod
    def from_dict(cls, dtype_config_dict: dict[str, Any]) -> DTypeConfig:
        """Build from ``{"input_dtype", "output_dtype", "weight_dtype", "bias_dtype",
        "is_dynamic"}`` (all optional; the first three a dtype or DTypeWithConstraints)."""
        _reject_unknown_keys("DTypeConfig", dtype_config_dict, _DTYPE_CONFIG_KEYS)
        activations_and_weight = []
        for key in (_INPUT_DTYPE, _OUTPUT_DTYPE, _WEIGHT_DTYPE):
            value = dtype_config_dict.get(key)
            if value is not None and not (_is_dtype(value)
                                          or isinstance(value, DTypeWithConstraints)):
                raise ValueError(f"Expected {key} to be a torch.dtype, a torchquant QDType or "
                                 f"DTypeWithConstraints, got {value!r}")
            activations_and_weight.append(value)
        return cls(*activations_and_weight, dtype_config_dict.get(_BIAS_DTYPE),
                   dtype_config_dict.get(_IS_DYNAMIC))

    def to_dict(self) -> dict[str, Any]:
        """The :meth:`from_dict` keys that are set; dtypes as their DTypeWithConstraints."""
        d: dict[str, Any] = {}
        if self.input_dtype is not None:
            d[_INPUT_DTYPE] = self.input_dtype_with_constraints
        if self.output_dtype is not None:
            d[_OUTPUT_DTYPE] = self.output_dtype_with_constraints
        if self.weight_dtype is not None:
            d[_WEIGHT_DTYPE] = self.weight_dtype_with_constraints
        if self.bias_dtype is not None:
            d[_BIAS_DTYPE] = self.bias_dtype
        if self.is_dynamic is not None:
            d[_IS_DYNAMIC] = self.is_dynamic
        return d


class BackendPatternConfig:
    """How one pattern is quantized: dtypes, observer placement, fusion / QAT / reference modules.

    A pattern is a module class, a function (``F.linear``, ``torch.add``, ``operator.add``), a
    method name (``"reshape"``), or a 2- or 3-tuple of those in execution order
    (``(nn.Conv2d, nn.BatchNorm2d, nn.ReLU)``).  Every setter returns ``self``.
    """

    def __init__(self, pattern: Optional[Pattern] = None) -> None:
        self.pattern: Optional[Pattern] = pattern
        self.observation_type = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT
        self.dtype_configs: list[DTypeConfig] = []
        self.root_module: Optional[type[torch.nn.Module]] = None
        self.qat_module: Optional[type[torch.nn.Module]] = None
        self.reference_quantized_module: Optional[type[torch.nn.Module]] = None
        self.fused_module: Optional[type[torch.nn.Module]] = None
        self.fuser_method: Optional[Callable] = None
        # Advanced / internal fields (FX pattern matching); kept for the dict round trip.
        self._root_node_getter: Optional[Callable] = None
        self._extra_inputs_getter: Optional[Callable] = None
        self._num_tensor_args_to_observation_type: dict[int, ObservationType] = {}
        self._input_type_to_index: dict[str, int] = {}
        self._pattern_complex_format: Optional[Pattern] = None

    def __repr__(self) -> str:
        set_fields = {k: v for k, v in self.__dict__.items()
                      if (len(v) > 0 if isinstance(v, (list, dict)) else v is not None)}
        return f"BackendPatternConfig({set_fields})"

    def set_pattern(self, pattern: Pattern) -> BackendPatternConfig:
        """The pattern, in forward order; exclusive with the reversed nested complex format."""
        if self._pattern_complex_format is not None:
            raise ValueError("Only one of 'pattern' or 'pattern_complex_format' can be set")
        self.pattern = pattern
        return self

    def set_observation_type(self, observation_type: ObservationType) -> BackendPatternConfig:
        """How observers are inserted around this pattern (default: the output gets its own)."""
        self.observation_type = observation_type
        return self

    def add_dtype_config(self, dtype_config: DTypeConfig) -> BackendPatternConfig:
        """Append one supported DTypeConfig."""
        self.dtype_configs.append(dtype_config)
        return self

    def set_dtype_configs(self, dtype_configs: list[DTypeConfig]) -> BackendPatternConfig:
        """Replace the supported DTypeConfigs (the list is kept, not copied, as in torch)."""
        self.dtype_configs = dtype_configs
        return self

    def set_root_module(self, root_module: type[torch.nn.Module]) -> BackendPatternConfig:
        """The float module at the root of the pattern (``nn.Linear`` for ``LinearReLU``); at
        convert it is swapped for :meth:`set_reference_quantized_module`'s module."""
        self.root_module = root_module
        return self

    def set_qat_module(self, qat_module: type[torch.nn.Module]) -> BackendPatternConfig:
        """The QAT module this pattern's module is swapped to in ``prepare_qat_fx``."""
        self.qat_module = qat_module
        return self

    def set_reference_quantized_module(self, reference_quantized_module: type[torch.nn.Module]
                                       ) -> BackendPatternConfig:
        """The reference quantized module replacing the root module at convert."""
        self.reference_quantized_module = reference_quantized_module
        return self

    def set_fused_module(self, fused_module: type[torch.nn.Module]) -> BackendPatternConfig:
        """The fused module type this pattern fuses into."""
        self.fused_module = fused_module
        return self

    def set_fuser_method(self, fuser_method: Callable) -> BackendPatternConfig:
        """``fuser_method(is_qat, *modules_of_the_pattern) -> fused module``, modules in the
        pattern's forward order."""
        self.fuser_method = fuser_method
        return self

    def _set_root_node_getter(self, root_node_getter: Callable) -> BackendPatternConfig:
        self._root_node_getter = root_node_getter
        return self

    def _set_extra_inputs_getter(self, extra_inputs_getter: Callable) -> BackendPatternConfig:
        self._extra_inputs_getter = extra_inputs_getter
        return self

    def _set_num_tensor_args_to_observation_type(
            self, num_tensor_args_to_observation_type: dict[int, ObservationType]
    ) -> BackendPatternConfig:
        self._num_tensor_args_to_observation_type = num_tensor_args_to_observation_type
        return self

    def _set_input_type_to_index(self, input_type_to_index: dict[str, int]
                                 ) -> BackendPatternConfig:
        self._input_type_to_index = input_type_to_index
        return self

    def _set_pattern_complex_format(self, pattern: Pattern) -> BackendPatternConfig:
        """The pattern in the (deprecated) reversed nested tuple format the FX matcher uses:
        ``(nn.ReLU, (nn.BatchNorm2d, nn.Conv2d))``; exclusive with :meth:`set_pattern`."""
        if self.pattern is not None:
            raise ValueError("Only one of 'pattern' or 'pattern_complex_format' can be set")
        self._pattern_complex_format = pattern
        return self

    @classmethod
    def from_dict(cls, backend_pattern_config_dict: dict[str, Any]) -> BackendPatternConfig:
        """Build from a dict with the :meth:`to_dict` keys; ``"pattern"`` or
        ``"pattern_complex_format"`` is required, ``"dtype_configs"`` holds DTypeConfigs or
        their dicts."""
        d = backend_pattern_config_dict
        _reject_unknown_keys("BackendPatternConfig", d, _PATTERN_CONFIG_KEYS)
        if d.get(_PATTERN) is None and d.get(_PATTERN_COMPLEX_FORMAT) is None:
            raise ValueError("BackendPatternConfig.from_dict needs a 'pattern' (or the deprecated "
                             f"'pattern_complex_format'); got keys {list(d)}")
        conf = cls()
        if _PATTERN in d:
            conf.set_pattern(d[_PATTERN])
        if _OBSERVATION_TYPE in d:
            conf.set_observation_type(d[_OBSERVATION_TYPE])
        for dtype_config in d.get(_DTYPE_CONFIGS, []):
            if isinstance(dtype_config, dict):
                dtype_config = DTypeConfig.from_dict(dtype_config)
            elif not isinstance(dtype_config, DTypeConfig):
                raise ValueError(f"Expected a list of DTypeConfigs (or their dicts) in "
                                 f"backend_pattern_config_dict['{_DTYPE_CONFIGS}'], got "
                                 f"{type(dtype_config)}")
            conf.add_dtype_config(dtype_config)
        conf.set_root_module(d.get(_ROOT_MODULE))
        conf.set_qat_module(d.get(_QAT_MODULE))
        conf.set_reference_quantized_module(d.get(_REFERENCE_QUANTIZED_MODULE))
        conf.set_fused_module(d.get(_FUSED_MODULE))
        conf.set_fuser_method(d.get(_FUSER_METHOD))
        conf._set_root_node_getter(d.get(_ROOT_NODE_GETTER))
        conf._set_extra_inputs_getter(d.get(_EXTRA_INPUTS_GETTER))
        conf._set_num_tensor_args_to_observation_type(
            d.get(_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE, {}))
        conf._set_input_type_to_index(d.get(_INPUT_TYPE_TO_INDEX, {}))
        if _PATTERN_COMPLEX_FORMAT in d:
            conf._set_pattern_complex_format(d[_PATTERN_COMPLEX_FORMAT])
        return conf

    def to_dict(self) -> dict[str, Any]:
        """``observation_type`` and ``dtype_configs`` (as dicts) always, every other field only
        when set."""
        d: dict[str, Any] = {
            _OBSERVATION_TYPE: self.observation_type,
            _DTYPE_CONFIGS: [c.to_dict() for c in self.dtype_configs],
        }
        optional = (
            (_PATTERN, self.pattern),
            (_ROOT_MODULE, self.root_module),
            (_QAT_MODULE, self.qat_module),
            (_REFERENCE_QUANTIZED_MODULE, self.reference_quantized_module),
            (_FUSED_MODULE, self.fused_module),
            (_FUSER_METHOD, self.fuser_method),
            (_ROOT_NODE_GETTER, self._root_node_getter),
            (_EXTRA_INPUTS_GETTER, self._extra_inputs_getter),
            (_NUM_TENSOR_ARGS_TO_OBSERVATION_TYPE, self._num_tensor_args_to_observation_type or None),
            (_INPUT_TYPE_TO_INDEX, self._input_type_to_index or None),
            (_PATTERN_COMPLEX_FORMAT, self._pattern_complex_format),
        )
        d.update((key, value) for key, value in optional if value is not None)
        return d


def _pattern_in_reversed_nested_tuple_format(config: BackendPatternConfig) -> Pattern:
    """The key the FX matcher uses: ``(a, b)`` -> ``(b, a)``, ``(a, b, c)`` -> ``(c, (b, a))``;
    a non-tuple pattern or one given in the complex format as is."""
    if config._pattern_complex_format is not None:
        return config._pattern_complex_format
    pattern = config.pattern
    if pattern is None:
        raise ValueError("Either 'pattern' or 'pattern_complex_format' must be specified")
    if not isinstance(pattern, tuple):
        return pattern
    if len(pattern) == 2:
        return (pattern[1], pattern[0])
    if len(pattern) == 3:
        return (pattern[2], (pattern[1], pattern[0]))
    raise ValueError(f"Expected a tuple with 2 or 3 elements, got: {pattern}")


class BackendConfig:
    """The patterns a backend can quantize and how (a set of :class:`BackendPatternConfig`).

    Registering a config whose pattern is already present replaces the earlier one in place.
    """

    def __init__(self, name: str = "") -> None:
        self.name = name
        # Keyed by the reversed nested tuple format the FX matcher uses; users read `configs`.
        self._pattern_complex_format_to_config: dict[Pattern, BackendPatternConfig] = {}

    def __repr__(self) -> str:
        set_fields = {k: v for k, v in self.__dict__.items() if len(v) > 0}
        return f"BackendConfig({set_fields})"

    def set_name(self, name: str) -> BackendConfig:
        """The name of the target backend."""
        self.name = name
        return self

    def set_backend_pattern_config(self, config: BackendPatternConfig) -> BackendConfig:
        """Register ``config``, replacing any config for the same pattern."""
        self._pattern_complex_format_to_config[_pattern_in_reversed_nested_tuple_format(config)] = config
        return self

    def set_backend_pattern_configs(self, configs: list[BackendPatternConfig]) -> BackendConfig:
        """Register each of ``configs`` in order (later ones replace earlier same-pattern ones)."""
        for config in configs:
            self.set_backend_pattern_config(config)
        return self

    @property
    def configs(self) -> list[BackendPatternConfig]:
        """A copy of the list of registered pattern configs, in registration order."""
        return list(self._pattern_complex_format_to_config.values())

    @classmethod
    def from_dict(cls, backend_config_dict: dict[str, Any]) -> BackendConfig:
        """Build from ``{"name": str (optional), "configs": [BackendPatternConfig or its dict]}``."""
        _reject_unknown_keys("BackendConfig", backend_config_dict, (_NAME, _CONFIGS))
        conf = cls(backend_config_dict.get(_NAME, ""))
        for entry in backend_config_dict.get(_CONFIGS, []):
            if isinstance(entry, dict):
                entry = BackendPatternConfig.from_dict(entry)
            elif not isinstance(entry, BackendPatternConfig):
                raise ValueError(f"Expected backend_config_dict['{_CONFIGS}'] to hold "
                                 f"BackendPatternConfigs or their dicts, got {type(entry)}")
            conf.set_backend_pattern_config(entry)
        return conf

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., "configs": [each pattern config's to_dict()]}``."""
        return {_NAME: self.name, _CONFIGS: [c.to_dict() for c in self.configs]}
