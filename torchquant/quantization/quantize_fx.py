"""FX graph mode quantization (``torch.ao.quantization.quantize_fx``): ``fuse_fx``,
``prepare_fx``, ``prepare_qat_fx``, ``convert_fx``, ``convert_to_reference_fx``.

The user's model is deep-copied, symbolically traced, fused per the BackendConfig, observed per
the matched patterns and the resolved qconfigs, then converted to a reference model (quantize /
dequantize nodes, ``nn.quantized.reference`` modules) and lowered to torchquant's quantized
modules and QTensor ops.  Static int8 patterns (per-tensor activations), dynamic int8 / float16
qconfigs (Linear, F.linear, LSTM / GRU and the RNN cells lower to ``nn.quantized.dynamic``
modules) and weight-only embeddings are supported, as are PrepareCustomConfig's standalone
modules, custom module swaps and quantized graph inputs / outputs.
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Optional, Union

import torch
from torch.fx import GraphModule

from . import distributed as _distributed
from .summary import record as _record_coverage
from .backend_config import BackendConfig, get_native_backend_config
from .backend_config.utils import get_module_to_qat_module
from .fx.convert import (convert_to_reference, keep_quantized_outputs, lower_to_torchquant,
                         ORIGINAL_WEIGHTS_LOOKUP, drop_unread_attributes,
                         read_qparams_from_buffers, run_weight_observers,
                         mark_quantized_inputs, remove_qconfigs, rewire_standalone_module,
                         swap_custom_modules, unlowered_reference_modules)
from .fx.custom_config import ConvertCustomConfig, FuseCustomConfig, PrepareCustomConfig
from .fx.fuse import _set_module, fuse_graph_module
from .fx.prepare import (annotate_tensor_nodes, generate_node_name_to_qconfig, insert_observers,
                         plan_custom_modules, plan_patterns, plan_standalone_module,
                         update_qconfig_for_fusion)
from .fx.tracer import trace_for_quantization
from .qconfig import QConfigMapping, qconfig_equals
from .quant_type import QuantType

_PREPARED_KEY = "_torchquant_observed_graph_module_attrs"

__all__ = ["fuse_fx", "prepare_fx", "prepare_qat_fx", "convert_fx", "convert_to_reference_fx"]


def _backend_config(backend_config: Union[BackendConfig, dict, None]) -> BackendConfig:
    if backend_config is None:
        return get_native_backend_config()
    if isinstance(backend_config, dict):
        warnings.warn("Passing a backend_config_dict to FX quantization is deprecated; pass a "
                      "BackendConfig", FutureWarning, stacklevel=3)
        return BackendConfig.from_dict(backend_config)
    if not isinstance(backend_config, BackendConfig):
        raise TypeError(f"backend_config must be a BackendConfig, got {type(backend_config)}")
    return backend_config


def _qconfig_mapping(qconfig_mapping: Union[QConfigMapping, dict, None], what: str
                     ) -> QConfigMapping:
    if qconfig_mapping is None:
        raise ValueError(f"{what} needs a qconfig_mapping (e.g. "
                         "torchquant.quantization.get_default_qconfig_mapping('x86'))")
    if isinstance(qconfig_mapping, dict):
        warnings.warn("Passing a QConfig dictionary to FX quantization is deprecated; pass a "
                      "QConfigMapping (QConfigMapping.from_dict)", FutureWarning, stacklevel=3)
        return QConfigMapping.from_dict(qconfig_mapping)
    if not isinstance(qconfig_mapping, QConfigMapping):
        raise TypeError(f"qconfig_mapping must be a QConfigMapping, got {type(qconfig_mapping)}")
    return copy.deepcopy(qconfig_mapping)


def _coerce_config(config: Any, cls: type, what: str) -> Any:
    if config is None:
        return cls()
    if isinstance(config, dict):
        warnings.warn(f"Passing a {what} dictionary is deprecated; pass a {cls.__name__}",
                      FutureWarning, stacklevel=3)
        return cls.from_dict(config)
    if not isinstance(config, cls):
        raise TypeError(f"{what} must be a {cls.__name__}, got {type(config)}")
    return config


def _copy_preserved(source: torch.nn.Module, target: GraphModule, names: list[str]) -> None:
    for name in names:
        if hasattr(source, name):
            setattr(target, name, getattr(source, name))


def _trace_and_fuse(model: torch.nn.Module, backend_config: BackendConfig, is_qat: bool,
                    non_traceable_names: list[str], non_traceable_classes: list[type]
                    ) -> tuple[GraphModule, dict]:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"FX quantization expects an nn.Module, got {type(model)}")
    model_copy = copy.deepcopy(model)
    gm, scopes = trace_for_quantization(model_copy, non_traceable_names, non_traceable_classes)
    gm = fuse_graph_module(gm, backend_config, is_qat)
    return gm, scopes


def fuse_fx(model: torch.nn.Module,
            fuse_custom_config: Union[FuseCustomConfig, dict[str, Any], None] = None,
            backend_config: Union[BackendConfig, dict[str, Any], None] = None) -> GraphModule:
    """Trace ``model`` (a copy) and fuse every pattern with a fuser method in the backend
    config (conv+bn(+relu), conv+relu, linear+relu, linear+bn ...).  Model in eval mode: BN is
    folded into the conv / linear."""
    torch._C._log_api_usage_once("torchquant.quantization.quantize_fx.fuse_fx")
    fuse_custom_config = _coerce_config(fuse_custom_config, FuseCustomConfig, "fuse_custom_config")
    gm, scopes = _trace_and_fuse(model, _backend_config(backend_config), model.training, [], [])
    gm._node_name_to_scope = scopes
    _copy_preserved(model, gm, fuse_custom_config.preserved_attributes)
    return gm


def _prepare(model: torch.nn.Module, qconfig_mapping: Any, is_qat: bool,
             example_inputs: Any, prepare_custom_config: Any, backend_config: Any,
             what: str) -> GraphModule:
    if example_inputs is None:
        raise ValueError(f"{what} needs example_inputs (a tuple of the model's positional "
                         "inputs), e.g. example_inputs=(torch.randn(1, 3, 224, 224),)")
    if not isinstance(example_inputs, tuple):
        raise TypeError(f"{what}: example_inputs must be a tuple, got {type(example_inputs)}")
    mapping = _qconfig_mapping(qconfig_mapping, what)
    custom = _coerce_config(prepare_custom_config, PrepareCustomConfig, "prepare_custom_config")
    backend = _backend_config(backend_config)
    if is_qat and not model.training:
        raise ValueError("prepare_qat_fx expects a model in training mode (call model.train())")
    if not is_qat and model.training:
        raise ValueError("prepare_fx is post-training quantization and expects a model in eval "
                         "mode (call model.eval()); use prepare_qat_fx for QAT")
    float_to_observed = dict(custom.float_to_observed_mapping.get(QuantType.STATIC, {}))
    gm, scopes = _trace_and_fuse(model, backend, is_qat,
                                 list(custom.non_traceable_module_names)
                                 + list(custom.standalone_module_names),
                                 list(custom.non_traceable_module_classes)
                                 + list(float_to_observed)
                                 + list(custom.standalone_module_classes))
    mapping = update_qconfig_for_fusion(gm, mapping)
    modules = dict(gm.named_modules(remove_duplicate=False))
    node_name_to_qconfig = generate_node_name_to_qconfig(gm, modules, mapping, scopes)
    if is_qat:
        _swap_qat_modules(gm, modules, backend)
        modules = dict(gm.named_modules(remove_duplicate=False))
    tensor_nodes = annotate_tensor_nodes(gm, example_inputs)
    plans, float_reasons = plan_patterns(gm, modules, node_name_to_qconfig, backend, tensor_nodes)
    custom_nodes = plan_custom_modules(gm, modules, node_name_to_qconfig, float_to_observed, plans)
    standalone = _standalone_entries(gm, modules, custom)
    standalone_indexes = {}
    for name, (node, entry) in standalone.items():
        child_custom = _coerce_config(entry.prepare_custom_config, PrepareCustomConfig,
                                      "prepare_custom_config")
        standalone_indexes[name] = (list(child_custom.input_quantized_indexes),
                                    list(child_custom.output_quantized_indexes))
        float_reasons.pop(name, None)
        plan_standalone_module(node, node_name_to_qconfig.get(name),
                               standalone_indexes[name][0], plans)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    # values that are never observed: inputs the caller quantizes, standalone module outputs
    never_observed = frozenset([placeholders[i].name for i in custom.input_quantized_indexes
                                if i < len(placeholders)] + list(standalone))
    insert_observers(gm, modules, plans, tensor_nodes, never_observed)
    for name, (node, entry) in standalone.items():
        child = _prepare(modules[str(node.target)],
                         entry.qconfig_mapping if entry.qconfig_mapping is not None
                         else qconfig_mapping, is_qat, entry.example_inputs,
                         entry.prepare_custom_config,
                         entry.backend_config if entry.backend_config is not None else backend,
                         f"{what} (standalone module '{node.target}')")
        _set_module(gm, str(node.target), child)
    gm.graph.lint()
    gm.recompile()
    state = {
        "_qconfig_mapping": mapping,
        "_is_qat": is_qat,
        "_node_name_to_scope": scopes,
        "_node_name_to_qconfig": node_name_to_qconfig,
        "_prepare_custom_config": custom,
        "_equalization_node_name_to_qconfig": {},
        "_quantized_root_configs": {name: plan.config for name, plan in plans.items()
                                    if plan.root.name == name and name not in standalone},
        "_float_node_reasons": float_reasons,
        "_custom_module_nodes": custom_nodes,
        "_input_quantized_indexes": list(custom.input_quantized_indexes),
        "_output_quantized_indexes": list(custom.output_quantized_indexes),
        "_standalone_module_indexes": standalone_indexes,
        "_backend_config": backend,
    }
    gm.meta[_PREPARED_KEY] = state
    for name, value in state.items():
        setattr(gm, name, value)
    _copy_preserved(model, gm, custom.preserved_attributes)
    return gm


def _standalone_entries(gm: GraphModule, modules: dict[str, torch.nn.Module],
                        custom: PrepareCustomConfig) -> dict[str, tuple[Any, Any]]:
    """node name -> (node, StandaloneModuleConfigEntry) of the standalone module calls (by
    module name first, then by class)."""
    found = {}
    for node in gm.graph.nodes:
        if node.op != "call_module":
            continue
        entry = custom.standalone_module_names.get(str(node.target))
        if entry is None:
            entry = custom.standalone_module_classes.get(type(modules.get(str(node.target))))
        if entry is not None:
            found[node.name] = (node, entry)
    return found


def _swap_qat_modules(gm: GraphModule, modules: dict[str, torch.nn.Module],
                      backend: BackendConfig) -> None:
    to_qat = {k: v for k, v in get_module_to_qat_module(backend).items() if isinstance(k, type)}
    for name, module in list(modules.items()):
        qat_cls = to_qat.get(type(module))
        if qat_cls is not None and getattr(module, "qconfig", None) is not None:
            _set_module(gm, name, qat_cls.from_float(module))


def prepare_fx(model: torch.nn.Module, qconfig_mapping: Union[QConfigMapping, dict[str, Any]],
               example_inputs: tuple[Any, ...],
               prepare_custom_config: Union[PrepareCustomConfig, dict[str, Any], None] = None,
               _equalization_config: Union[QConfigMapping, dict[str, Any], None] = None,
               backend_config: Union[BackendConfig, dict[str, Any], None] = None,
               sync_across_ranks: Any = False) -> GraphModule:
    """Post-training preparation: trace a copy of ``model``, fuse, and insert observers
    (``activation_post_process_<n>``) per the matched patterns and qconfigs.
    ``sync_across_ranks`` (True or a process group): observers reduce every batch across the
    ranks (:func:`~torchquant.quantization.observe_across_ranks`)."""
    if _equalization_config:
        raise NotImplementedError("prepare_fx: _equalization_config is not supported")
    return _distributed._apply_prepare_option(_prepare(
        model, qconfig_mapping, False, example_inputs, prepare_custom_config, backend_config,
        "prepare_fx"), sync_across_ranks)


def prepare_qat_fx(model: torch.nn.Module, qconfig_mapping: Union[QConfigMapping, dict[str, Any]],
                   example_inputs: tuple[Any, ...],
                   prepare_custom_config: Union[PrepareCustomConfig, dict[str, Any], None] = None,
                   backend_config: Union[BackendConfig, dict[str, Any], None] = None,
                   sync_across_ranks: Any = False) -> GraphModule:
    """QAT preparation: like :func:`prepare_fx` on a training-mode model; modules are swapped
    to the backend config's QAT modules and the qconfig's fake quants are inserted."""
    return _distributed._apply_prepare_option(_prepare(
        model, qconfig_mapping, True, example_inputs, prepare_custom_config, backend_config,
        "prepare_qat_fx"), sync_across_ranks)


def _check_convert_mapping(gm: GraphModule, qconfig_mapping: Any) -> None:
    """A convert-time mapping may only keep or disable (None) the prepare-time qconfigs."""
    if qconfig_mapping is None:
        return
    mapping = _qconfig_mapping(qconfig_mapping, "convert_fx")
    prepared = gm.meta[_PREPARED_KEY]["_qconfig_mapping"]
    sections = ("object_type_qconfigs", "module_name_regex_qconfigs", "module_name_qconfigs",
                "module_name_object_type_order_qconfigs")
    pairs = [("global", prepared.global_qconfig, mapping.global_qconfig)]
    for section in sections:
        old_section, new_section = getattr(prepared, section), getattr(mapping, section)
        for key, new in new_section.items():
            pairs.append((f"{section}[{key!r}]", old_section.get(key), new))
    for where, old, new in pairs:
        if new is not None and not qconfig_equals(old, new):
            raise ValueError(f"convert_fx: the qconfig for {where} differs from the one used in "
                             "prepare; at convert a qconfig may only be kept or set to None")
    if any(new is None and old is not None for _, old, new in pairs):
        raise NotImplementedError("convert_fx: disabling qconfigs at convert time is not "
                                  "supported yet")


def _convert(graph_module: GraphModule, convert_custom_config: Any, qconfig_mapping: Any,
             backend_config: Any, is_reference: bool, what: str) -> GraphModule:
    if not isinstance(graph_module, GraphModule) or _PREPARED_KEY not in graph_module.meta:
        raise ValueError(f"{what} expects the GraphModule returned by prepare_fx / "
                         f"prepare_qat_fx, got a {type(graph_module).__name__} that was never "
                         "prepared")
    custom = _coerce_config(convert_custom_config, ConvertCustomConfig, "convert_custom_config")
    _check_convert_mapping(graph_module, qconfig_mapping)
    backend = _backend_config(backend_config)
    gm = copy.deepcopy(graph_module)
    state = graph_module.meta[_PREPARED_KEY]
    standalone = state.get("_standalone_module_indexes", {})
    for name in standalone:       # each standalone module converts as a unit of its own
        node = next(n for n in gm.graph.nodes if n.name == name)
        child = gm.get_submodule(str(node.target))
        child_backend = child.meta[_PREPARED_KEY].get("_backend_config", backend)
        _set_module(gm, str(node.target),
                    _convert(child, None, None, child_backend, is_reference,
                             f"{what} (standalone module '{node.target}')"))
    run_weight_observers(gm, backend)
    gm = convert_to_reference(gm, backend, state["_quantized_root_configs"],
                              remove_qconfig=is_reference,
                              node_name_to_scope=state.get("_node_name_to_scope"),
                              node_name_to_qconfig=state.get("_node_name_to_qconfig"))
    mark_quantized_inputs(gm, state.get("_input_quantized_indexes", []))
    swap_custom_modules(gm, state.get("_custom_module_nodes", []),
                        custom.observed_to_quantized_mapping.get(QuantType.STATIC, {}))
    for name, (input_indexes, output_indexes) in standalone.items():
        rewire_standalone_module(gm, name, input_indexes, 0 in output_indexes)
    if not is_reference:
        gm = lower_to_torchquant(gm, backend)
        remove_qconfigs(gm)
    keep_quantized_outputs(gm, state.get("_output_quantized_indexes", []))
    if not is_reference:
        read_qparams_from_buffers(gm)
        drop_unread_attributes(gm)
    _warn_float_nodes(graph_module, what)
    gm.meta.pop(_PREPARED_KEY, None)
    _copy_preserved(graph_module, gm, custom.preserved_attributes)
    return gm


def _warn_float_nodes(gm: GraphModule, what: str) -> None:
    reasons = gm.meta[_PREPARED_KEY]["_float_node_reasons"]
    if reasons:
        listing = ", ".join(f"'{name}' ({why})" for name, why in reasons.items())
        warnings.warn(f"{what}: these nodes stay in float: {listing}", UserWarning, stacklevel=3)


def convert_fx(graph_module: GraphModule,
               convert_custom_config: Union[ConvertCustomConfig, dict[str, Any], None] = None,
               _remove_qconfig: bool = True,
               qconfig_mapping: Union[QConfigMapping, dict[str, Any], None] = None,
               backend_config: Union[BackendConfig, dict[str, Any], None] = None,
               keep_original_weights: bool = False) -> GraphModule:
    """Convert a prepared (and calibrated / trained) model to a quantized one: the reference
    model lowered to torchquant quantized modules and QTensor ops.

    ``keep_original_weights=True`` (as torch.ao) keeps the float weight and bias of every
    functional ``F.linear`` / ``F.conv*`` that was quantized, as
    ``model.original_weights_lookup[<name of its quantized weight holder>] = [weight, bias]``
    (bias None when absent)."""
    converted = _convert(graph_module, convert_custom_config, qconfig_mapping, backend_config,
                         False, "convert_fx")
    if not keep_original_weights:
        converted.__dict__.pop(ORIGINAL_WEIGHTS_LOOKUP, None)
    # the coverage line eager convert logs too, with why a module stayed a reference module
    _record_coverage(converted, "convert", unlowered_reference_modules(converted) or None)
    return converted


def convert_to_reference_fx(graph_module: GraphModule,
                            convert_custom_config: Union[ConvertCustomConfig, dict[str, Any],
                                                         None] = None,
                            _remove_qconfig: bool = True,
                            qconfig_mapping: Union[QConfigMapping, dict[str, Any], None] = None,
                            backend_config: Union[BackendConfig, dict[str, Any], None] = None
                            ) -> GraphModule:
    """Convert to the reference model: quantize / dequantize nodes around float ops and
    ``nn.quantized.reference`` modules."""
    converted = _convert(graph_module, convert_custom_config, qconfig_mapping, backend_config,
                         True, "convert_to_reference_fx")
    _record_coverage(converted, "convert")
    return converted
