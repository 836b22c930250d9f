"""User options of the FX passes: what ``fuse_fx``, ``prepare_fx`` and ``convert_fx`` leave
alone, swap or keep (torch's ``torch.ao.quantization.fx.custom_config``).

Every setter returns ``self``; ``to_dict`` / ``from_dict`` use torch's dict keys, and ``to_dict``
leaves out empty fields.  [TQ] ``from_dict`` rejects unknown keys (torch ignores them) and
also accepts a flat ``{float_class: observed_class}`` for the custom-module mapping (static).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ..backend_config import BackendConfig
from ..backend_config.backend_config import _reject_unknown_keys
from ..qconfig_mapping import QConfigMapping
from ..quant_type import QuantType, _get_quant_type_to_str, _quant_type_from_str

__all__ = [
    "ConvertCustomConfig",
    "FuseCustomConfig",
    "PrepareCustomConfig",
    "StandaloneModuleConfigEntry",
]

STANDALONE_MODULE_NAME_DICT_KEY = "standalone_module_name"
STANDALONE_MODULE_CLASS_DICT_KEY = "standalone_module_class"
FLOAT_TO_OBSERVED_DICT_KEY = "float_to_observed_custom_module_class"
OBSERVED_TO_QUANTIZED_DICT_KEY = "observed_to_quantized_custom_module_class"
NON_TRACEABLE_MODULE_NAME_DICT_KEY = "non_traceable_module_name"
NON_TRACEABLE_MODULE_CLASS_DICT_KEY = "non_traceable_module_class"
INPUT_QUANTIZED_INDEXES_DICT_KEY = "input_quantized_idxs"
OUTPUT_QUANTIZED_INDEXES_DICT_KEY = "output_quantized_idxs"
PRESERVED_ATTRIBUTES_DICT_KEY = "preserved_attributes"

_PREPARE_KEYS = (STANDALONE_MODULE_NAME_DICT_KEY, STANDALONE_MODULE_CLASS_DICT_KEY,
                 FLOAT_TO_OBSERVED_DICT_KEY, NON_TRACEABLE_MODULE_NAME_DICT_KEY,
                 NON_TRACEABLE_MODULE_CLASS_DICT_KEY, INPUT_QUANTIZED_INDEXES_DICT_KEY,
                 OUTPUT_QUANTIZED_INDEXES_DICT_KEY, PRESERVED_ATTRIBUTES_DICT_KEY)
_CONVERT_KEYS = (OBSERVED_TO_QUANTIZED_DICT_KEY, PRESERVED_ATTRIBUTES_DICT_KEY)
_FUSE_KEYS = (PRESERVED_ATTRIBUTES_DICT_KEY,)


@dataclass
class StandaloneModuleConfigEntry:
    """How a standalone module (prepared and converted as a unit of its own) is quantized;
    ``None`` for a config means "the parent's"."""
    qconfig_mapping: Optional[QConfigMapping]
    example_inputs: tuple[Any, ...]
    prepare_custom_config: Optional[PrepareCustomConfig]
    backend_config: Optional[BackendConfig]


def _nonempty_fields(obj: Any) -> dict[str, Any]:
    return {k: v for k, v in obj.__dict__.items() if len(v) > 0}


def _coerce(obj: Any, cls: type, what: str) -> Any:
    """``obj`` as a ``cls`` (built with ``cls.from_dict`` from a dict); None stays None."""
    if obj is None or isinstance(obj, cls):
        return obj
    if isinstance(obj, dict):
        return cls.from_dict(obj)
    raise ValueError(f"Expected {cls.__name__} (or its dict) in prepare_custom_config_dict"
                     f"[\"{what}\"], got {type(obj)}")


def _class_mapping_items(mapping: Any, what: str):
    """``(QuantType, from_class, to_class)`` for a ``{quant_type_name: {cls: cls}}`` dict; a
    class key at the top level is a static entry of the flat form."""
    if not isinstance(mapping, dict):
        raise ValueError(f"Expected a dict for \"{what}\", got {type(mapping)}")
    for key, value in mapping.items():
        if isinstance(key, type):
            yield QuantType.STATIC, key, value
            continue
        quant_type = _quant_type_from_str(key)
        if not isinstance(value, dict):
            raise ValueError(f"Expected a dict of classes under \"{what}\"[{key!r}], got "
                             f"{type(value)}")
        for from_class, to_class in value.items():
            yield quant_type, from_class, to_class


def _class_mapping_to_dict(mapping: dict[QuantType, dict[type, type]]) -> dict[str, dict]:
    return {_get_quant_type_to_str(quant_type): classes for quant_type, classes in mapping.items()}


class PrepareCustomConfig:
    """Options of ``prepare_fx`` / ``prepare_qat_fx``.

    Standalone modules (by name or class) are prepared as separate graphs; custom modules are
    swapped for their observed class (``from_float``); non-traceable modules are left as leaves
    of the trace; ``input_quantized_indexes`` / ``output_quantized_indexes`` mark graph inputs
    that arrive quantized and outputs left quantized; preserved attributes are copied onto the
    GraphModule.
    """

    def __init__(self) -> None:
        self.standalone_module_names: dict[str, StandaloneModuleConfigEntry] = {}
        self.standalone_module_classes: dict[type, StandaloneModuleConfigEntry] = {}
        self.float_to_observed_mapping: dict[QuantType, dict[type, type]] = {}
        self.non_traceable_module_names: list[str] = []
        self.non_traceable_module_classes: list[type] = []
        self.input_quantized_indexes: list[int] = []
        self.output_quantized_indexes: list[int] = []
        self.preserved_attributes: list[str] = []

    def __repr__(self) -> str:
        return f"PrepareCustomConfig({_nonempty_fields(self)})"

    def set_standalone_module_name(self, module_name: str,
                                   qconfig_mapping: Optional[QConfigMapping],
                                   example_inputs: tuple[Any, ...],
                                   prepare_custom_config: Optional[PrepareCustomConfig],
                                   backend_config: Optional[BackendConfig]) -> PrepareCustomConfig:
        """Prepare the submodule called ``module_name`` as a standalone module."""
        self.standalone_module_names[module_name] = StandaloneModuleConfigEntry(
            qconfig_mapping, example_inputs, prepare_custom_config, backend_config)
        return self

    def set_standalone_module_class(self, module_class: type,
                                    qconfig_mapping: Optional[QConfigMapping],
                                    example_inputs: tuple[Any, ...],
                                    prepare_custom_config: Optional[PrepareCustomConfig],
                                    backend_config: Optional[BackendConfig]) -> PrepareCustomConfig:
        """Prepare every submodule of type ``module_class`` as a standalone module."""
        self.standalone_module_classes[module_class] = StandaloneModuleConfigEntry(
            qconfig_mapping, example_inputs, prepare_custom_config, backend_config)
        return self

    def set_float_to_observed_mapping(self, float_class: type, observed_class: type,
                                      quant_type: QuantType = QuantType.STATIC
                                      ) -> PrepareCustomConfig:
        """Swap modules of ``float_class`` for ``observed_class.from_float(module)`` at prepare
        (static quantization only, as in torch)."""
        if quant_type != QuantType.STATIC:
            raise ValueError("set_float_to_observed_mapping is currently only supported for "
                             f"static quantization, got {quant_type}")
        self.float_to_observed_mapping.setdefault(quant_type, {})[float_class] = observed_class
        return self

    def set_non_traceable_module_names(self, module_names: list[str]) -> PrepareCustomConfig:
        """Submodules (by qualified name) the tracer keeps as leaves instead of tracing."""
        self.non_traceable_module_names = module_names
        return self

    def set_non_traceable_module_classes(self, module_classes: list[type]) -> PrepareCustomConfig:
        """Submodule types the tracer keeps as leaves instead of tracing."""
        self.non_traceable_module_classes = module_classes
        return self

    def set_input_quantized_indexes(self, indexes: list[int]) -> PrepareCustomConfig:
        """Graph inputs (by position) that arrive already quantized."""
        self.input_quantized_indexes = indexes
        return self

    def set_output_quantized_indexes(self, indexes: list[int]) -> PrepareCustomConfig:
        """Graph outputs (by position) left quantized by convert."""
        self.output_quantized_indexes = indexes
        return self

    def set_preserved_attributes(self, attributes: list[str]) -> PrepareCustomConfig:
        """Attributes of the model copied onto the prepared GraphModule."""
        self.preserved_attributes = attributes
        return self

    @classmethod
    def from_dict(cls, prepare_custom_config_dict: dict[str, Any]) -> PrepareCustomConfig:
        """Build from a dict with the :meth:`to_dict` keys (all optional).  In a standalone
        tuple ``(name_or_class, qconfig_mapping, example_inputs, prepare_custom_config,
        backend_config)`` the three configs may be given as dicts or None."""
        d = prepare_custom_config_dict
        _reject_unknown_keys("PrepareCustomConfig", d, _PREPARE_KEYS)
        conf = cls()
        for key, setter in ((STANDALONE_MODULE_NAME_DICT_KEY, conf.set_standalone_module_name),
                            (STANDALONE_MODULE_CLASS_DICT_KEY, conf.set_standalone_module_class)):
            for entry in d.get(key, []):
                if not isinstance(entry, (tuple, list)) or len(entry) != 5:
                    raise ValueError(
                        f"Expected (module_name_or_class, qconfig_mapping, example_inputs, "
                        f"prepare_custom_config, backend_config) in \"{key}\", got {entry!r}")
                module, qconfig_mapping, example_inputs, prepare_custom_config, backend_config = entry
                setter(module, _coerce(qconfig_mapping, QConfigMapping, key), example_inputs,
                       _coerce(prepare_custom_config, PrepareCustomConfig, key),
                       _coerce(backend_config, BackendConfig, key))
        for quant_type, float_class, observed_class in _class_mapping_items(
                d.get(FLOAT_TO_OBSERVED_DICT_KEY, {}), FLOAT_TO_OBSERVED_DICT_KEY):
            conf.set_float_to_observed_mapping(float_class, observed_class, quant_type)
        conf.set_non_traceable_module_names(d.get(NON_TRACEABLE_MODULE_NAME_DICT_KEY, []))
        conf.set_non_traceable_module_classes(d.get(NON_TRACEABLE_MODULE_CLASS_DICT_KEY, []))
        conf.set_input_quantized_indexes(d.get(INPUT_QUANTIZED_INDEXES_DICT_KEY, []))
        conf.set_output_quantized_indexes(d.get(OUTPUT_QUANTIZED_INDEXES_DICT_KEY, []))
        conf.set_preserved_attributes(d.get(PRESERVED_ATTRIBUTES_DICT_KEY, []))
        return conf

    def to_dict(self) -> dict[str, Any]:
        """The non-empty fields under torch's keys; standalone entries as 5-tuples with the
        qconfig mapping and prepare config as dicts and the backend config as is (as torch)."""
        def entry_tuple(key: Any, e: StandaloneModuleConfigEntry) -> tuple:
            return (key,
                    e.qconfig_mapping.to_dict() if e.qconfig_mapping is not None else None,
                    e.example_inputs,
                    e.prepare_custom_config.to_dict() if e.prepare_custom_config is not None
                    else None,
                    e.backend_config)

        d: dict[str, Any] = {}
        if self.standalone_module_names:
            d[STANDALONE_MODULE_NAME_DICT_KEY] = [
                entry_tuple(name, e) for name, e in self.standalone_module_names.items()]
        if self.standalone_module_classes:
            d[STANDALONE_MODULE_CLASS_DICT_KEY] = [
                entry_tuple(cls, e) for cls, e in self.standalone_module_classes.items()]
        if self.float_to_observed_mapping:
            d[FLOAT_TO_OBSERVED_DICT_KEY] = _class_mapping_to_dict(self.float_to_observed_mapping)
        for key, value in ((NON_TRACEABLE_MODULE_NAME_DICT_KEY, self.non_traceable_module_names),
                           (NON_TRACEABLE_MODULE_CLASS_DICT_KEY, self.non_traceable_module_classes),
                           (INPUT_QUANTIZED_INDEXES_DICT_KEY, self.input_quantized_indexes),
                           (OUTPUT_QUANTIZED_INDEXES_DICT_KEY, self.output_quantized_indexes),
                           (PRESERVED_ATTRIBUTES_DICT_KEY, self.preserved_attributes)):
            if len(value) > 0:
                d[key] = value
        return d


class ConvertCustomConfig:
    """Options of ``convert_fx``: observed custom module -> quantized class (``from_observed``),
    and attributes copied onto the converted GraphModule."""

    def __init__(self) -> None:
        self.observed_to_quantized_mapping: dict[QuantType, dict[type, type]] = {}
        self.preserved_attributes: list[str] = []

    def __repr__(self) -> str:
        return f"ConvertCustomConfig({_nonempty_fields(self)})"

    def set_observed_to_quantized_mapping(self, observed_class: type, quantized_class: type,
                                          quant_type: QuantType = QuantType.STATIC
                                          ) -> ConvertCustomConfig:
        """Swap observed custom modules of ``observed_class`` for
        ``quantized_class.from_observed(module)`` at convert."""
        self.observed_to_quantized_mapping.setdefault(quant_type, {})[observed_class] = \
            quantized_class
        return self

    def set_preserved_attributes(self, attributes: list[str]) -> ConvertCustomConfig:
        """Attributes copied onto the converted GraphModule."""
        self.preserved_attributes = attributes
        return self

    @classmethod
    def from_dict(cls, convert_custom_config_dict: dict[str, Any]) -> ConvertCustomConfig:
        """Build from ``{"observed_to_quantized_custom_module_class": {quant_type_name:
        {observed: quantized}}, "preserved_attributes": [...]}`` (both optional)."""
        d = convert_custom_config_dict
        _reject_unknown_keys("ConvertCustomConfig", d, _CONVERT_KEYS)
        conf = cls()
        for quant_type, observed_class, quantized_class in _class_mapping_items(
                d.get(OBSERVED_TO_QUANTIZED_DICT_KEY, {}), OBSERVED_TO_QUANTIZED_DICT_KEY):
            conf.set_observed_to_quantized_mapping(observed_class, quantized_class, quant_type)
        conf.set_preserved_attributes(d.get(PRESERVED_ATTRIBUTES_DICT_KEY, []))
        return conf

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        if self.observed_to_quantized_mapping:
            d[OBSERVED_TO_QUANTIZED_DICT_KEY] = _class_mapping_to_dict(
                self.observed_to_quantized_mapping)
        if len(self.preserved_attributes) > 0:
            d[PRESERVED_ATTRIBUTES_DICT_KEY] = self.preserved_attributes
        return d


class FuseCustomConfig:
    """Options of ``fuse_fx``: attributes copied onto the fused GraphModule."""

    def __init__(self) -> None:
        self.preserved_attributes: list[str] = []

    def __repr__(self) -> str:
        return f"FuseCustomConfig({_nonempty_fields(self)})"

    def set_preserved_attributes(self, attributes: list[str]) -> FuseCustomConfig:
        """Attributes of the model copied onto the fused GraphModule."""
        self.preserved_attributes = attributes
        return self

    @classmethod
    def from_dict(cls, fuse_custom_config_dict: dict[str, Any]) -> FuseCustomConfig:
        """Build from ``{"preserved_attributes": [...]}`` (optional)."""
        _reject_unknown_keys("FuseCustomConfig", fuse_custom_config_dict, _FUSE_KEYS)
        return cls().set_preserved_attributes(
            fuse_custom_config_dict.get(PRESERVED_ATTRIBUTES_DICT_KEY, []))

    def to_dict(self) -> dict[str, Any]:
        if len(self.preserved_attributes) > 0:
            return {PRESERVED_ATTRIBUTES_DICT_KEY: self.preserved_attributes}
        return {}
