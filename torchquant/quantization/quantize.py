"""The eager-mode workflow: propagate qconfigs, attach observers (``prepare``), swap modules
for quantized ones (``convert``), and the one-call ``quantize`` / ``quantize_dynamic`` /
``quantize_qat``.

Same semantics as torch.ao's eager mode, plus no silent no-ops: ``prepare`` / ``convert`` /
``quantize_dynamic`` record a coverage summary on the model (see :mod:`.summary`), log one
line through the ``torchquant`` logger, and ``convert`` warns when nothing was quantized.
"""
from __future__ import annotations

import copy
import inspect
import itertools
import warnings
from typing import Any, Callable, Iterable, Optional

import torch
from torch import nn

from .. import dtypes as _dt
from ..nn import _workflow
from ..nn import quantizable as nnqa
from ..nn import quantized as nnq
from ..nn.intrinsic.modules.fused import _FusedModule
from ..nn.quantized.modules.functional_modules import FloatFunctional, QFunctional
from . import distributed as _distributed
from . import summary as _summary
from ._foreign import check_no_torch_quantization_objects
from .fake_quantize import FakeQuantizeBase
from .observer import ObserverBase, set_observer_owner
from .qconfig import _assert_valid_qconfig
from .qconfig import (QConfig, _activation_is_memoryless, default_dynamic_qconfig,
                      float16_dynamic_qconfig, float_qparams_weight_only_qconfig,
                      float_qparams_weight_only_qconfig_4bit)
from .quantization_mappings import (_get_special_act_post_process,
                                    _has_special_act_post_process,
                                    get_default_dynamic_quant_module_mappings,
                                    get_default_qat_module_mappings,
                                    get_default_qconfig_propagation_list,
                                    get_default_static_quant_module_mappings,
                                    get_default_static_quant_reference_module_mappings,
                                    no_observer_set)
from .stubs import DeQuantStub, QuantWrapper
from .utils import get_qparam_dict, progress_bar

__all__ = ["get_default_custom_config_dict", "propagate_qconfig_", "add_quant_dequant",
           "prepare", "quantize", "quantize_dynamic", "prepare_qat", "quantize_qat", "convert",
           "swap_module", "default_eval_fn"]


def get_default_custom_config_dict() -> dict:
    """The custom-module classes torchquant registers by default (the quantizable LSTM/MHA)."""
    return {
        "float_to_observed_custom_module_class": {
            nn.LSTM: nnqa.LSTM, nn.MultiheadAttention: nnqa.MultiheadAttention},
        "observed_to_quantized_custom_module_class": {
            nnqa.LSTM: nnq.LSTM, nnqa.MultiheadAttention: nnq.MultiheadAttention},
    }


# --------------------------------------------------------------------------------------------
# qconfig propagation
# --------------------------------------------------------------------------------------------

def _module_device(module: nn.Module) -> Optional[torch.device]:
    devices = {p.device for p in itertools.chain(module.parameters(), module.buffers())}
    if len(devices) > 1:
        raise ValueError(f"prepare only works with modules on a single device, found {devices}")
    return next(iter(devices)) if devices else None


def _propagate(module: nn.Module, qconfig_dict: dict, parent_qconfig: Any, prefix: str,
               custom: dict) -> None:
    qconfig = qconfig_dict.get(type(module), parent_qconfig)
    qconfig = qconfig_dict.get(prefix, qconfig)
    qconfig = getattr(module, "qconfig", qconfig)
    if qconfig is not None and not isinstance(qconfig, QConfig) and not hasattr(qconfig,
                                                                              "activation"):
        raise TypeError(f"{prefix or type(module).__name__}: qconfig must be a QConfig, got "
                        f"{type(qconfig).__name__}")
    _assert_valid_qconfig(qconfig, module)  # as torch: no per-channel weight on ConvTranspose
    module.qconfig = qconfig
    skip_names = set(custom.get("non_traceable_module_name", []))
    skip_types = tuple(custom.get("non_traceable_module_class", []))
    for name, child in module.named_children():
        child_prefix = f"{prefix}.{name}" if prefix else name
        if name in skip_names or (skip_types and isinstance(child, skip_types)):
            continue
        _propagate(child, qconfig_dict, qconfig, child_prefix, custom)


def propagate_qconfig_(module: nn.Module, qconfig_dict: Optional[dict] = None,
                       prepare_custom_config_dict: Optional[dict] = None) -> None:
    """Set ``.qconfig`` on every submodule, in place.

    ``qconfig_dict`` maps module types or qualified names to qconfigs; a name beats a type,
    a qconfig already set on a module beats both, and children inherit their parent's.
    """
    _propagate(module, qconfig_dict or {}, None, "", prepare_custom_config_dict or {})


# --------------------------------------------------------------------------------------------
# observers
# --------------------------------------------------------------------------------------------

def _observer_forward_hook(self: nn.Module, input: Any, output: Any) -> Any:
    """Forward hook: the output observer sees (and, as a fake-quant, may change) the output."""
    try:
        return self.activation_post_process(output)
    except ValueError as exc:
        name = getattr(self, "_torchquant_name", None) or type(self).__name__
        raise ValueError(f"while observing the output of {name!r}: {exc}") from exc


def _observer_forward_pre_hook(self: nn.Module, input: Any) -> Any:
    """Pre-hook for memoryless observers (dynamic QAT): observe the input instead."""
    return self.activation_post_process(input[0])


def _activation_is_memoryless(qconfig: Any) -> bool:
    act = qconfig.activation()
    act = getattr(act, "activation_post_process", act)
    return getattr(act, "averaging_constant", None) == 1


def _needs_observation(m: nn.Module) -> bool:
    return getattr(m, "qconfig", None) is not None


def _insert_observer(m: nn.Module, name: str, device: Optional[torch.device],
                     special: Optional[Callable] = None) -> None:
    if not _needs_observation(m) or isinstance(m, DeQuantStub):
        return
    observer = m.qconfig.activation() if special is None else special()
    if device is not None:
        observer.to(device)
    set_observer_owner(observer, name)
    m.add_module("activation_post_process", observer)
    m._torchquant_name = name
    # prepend, as torch: the observer runs before hooks the user registered earlier, so those
    # see the observed (for a fake-quant: the fake-quantized) output, in torch's order
    if _activation_is_memoryless(m.qconfig):
        m.register_forward_pre_hook(_observer_forward_pre_hook, prepend=True)
    else:
        m.register_forward_hook(_observer_forward_hook, prepend=True)


def _is_leaf(m: nn.Module) -> bool:
    return len(m._modules) == 0


def _add_observers(module: nn.Module, propagation: set, non_leaf: Optional[set],
                   device: Optional[torch.device], custom_map: dict, prefix: str = "") -> None:
    for name, child in list(module.named_children()):
        qual = f"{prefix}.{name}" if prefix else name
        if type(child) in (FloatFunctional, QFunctional):
            if _needs_observation(child):
                child.activation_post_process = child.qconfig.activation()
                set_observer_owner(child.activation_post_process, qual)
                if device is not None:
                    child.activation_post_process.to(device)
        elif isinstance(child, _FusedModule):
            _insert_observer(child, qual, device)
        elif non_leaf and type(child) in non_leaf:
            _insert_observer(child, qual, device)
        elif _has_special_act_post_process(child) and _needs_observation(child):
            _insert_observer(child, qual, device, _get_special_act_post_process(child))
        elif _needs_observation(child) and type(child) in custom_map:
            observed_class = custom_map[type(child)]
            observed = observed_class.from_float(child)
            setattr(module, name, observed)
            if observed_class not in no_observer_set():
                _insert_observer(observed, qual, device)
        else:
            _add_observers(child, propagation, non_leaf, device, custom_map, qual)
    if (_is_leaf(module) and not isinstance(module, nn.Sequential)
            and type(module) in propagation):
        _insert_observer(module, prefix or type(module).__name__, device)


def add_quant_dequant(module: nn.Module) -> nn.Module:
    """Wrap every leaf module that has a qconfig in a :class:`QuantWrapper` (in place)."""
    if _is_leaf(module) and getattr(module, "qconfig", None) is not None:
        return QuantWrapper(module)
    for name, child in module.named_children():
        module._modules[name] = add_quant_dequant(child)
    return module


def prepare(model: nn.Module, inplace: bool = False, allow_list: Optional[set] = None,
            observer_non_leaf_module_list: Optional[set] = None,
            prepare_custom_config_dict: Optional[dict] = None,
            sync_across_ranks: Any = False) -> nn.Module:
    """Attach output observers (from each module's qconfig) for calibration.

    ``sync_across_ranks`` (True or a process group): observers reduce every batch across the
    ranks (:func:`~torchquant.quantization.observe_across_ranks`).

    Warns, as torch does, when no submodule has a qconfig.  The model passed in is left
    untouched unless ``inplace=True``.
    """
    torch._C._log_api_usage_once("torchquant.quantization.prepare")
    custom = prepare_custom_config_dict
    if custom is None:
        custom = get_default_custom_config_dict()
    custom_map = custom.get("float_to_observed_custom_module_class", {})
    if not inplace:
        model = copy.deepcopy(model)
    propagation = allow_list if allow_list is not None else get_default_qconfig_propagation_list()
    check_no_torch_quantization_objects(model, "prepare")
    propagate_qconfig_(model, qconfig_dict=None, prepare_custom_config_dict=custom)
    if not any(_needs_observation(m) for m in model.modules()):
        warnings.warn("None of the submodule got qconfig applied. Make sure you passed correct "
                      "configuration through `qconfig_dict` or by assigning the `.qconfig` "
                      "attribute directly on submodules", stacklevel=2)
    _add_observers(model, propagation, observer_non_leaf_module_list, _module_device(model),
                   custom_map)
    model._torchquant_prepared = True
    _distributed._apply_prepare_option(model, sync_across_ranks)
    _summary.record(model, "prepare")
    return model


def _get_observer_dict(mod: nn.Module, target_dict: dict, prefix: str = "") -> None:
    """Collect every ``activation_post_process`` under ``mod`` into ``target_dict``, keyed by
    its qualified name (``"conv.activation_post_process"``), for accuracy debugging (torch's
    private helper of the same name)."""
    dot = prefix + "." if prefix else ""
    if hasattr(mod, "activation_post_process"):
        target_dict[dot + "activation_post_process"] = mod.activation_post_process
    for name, child in mod.named_children():
        _get_observer_dict(child, target_dict, dot + name)


def _remove_activation_post_process(module: nn.Module) -> None:
    if isinstance(getattr(module, "activation_post_process", None),
                  (ObserverBase, FakeQuantizeBase)):
        delattr(module, "activation_post_process")
    for hooks, hook in ((module._forward_pre_hooks, _observer_forward_pre_hook),
                        (module._forward_hooks, _observer_forward_hook)):
        for key in [k for k, fn in hooks.items() if fn is hook]:
            del hooks[key]
    if hasattr(module, "_torchquant_name"):
        del module._torchquant_name


def _remove_qconfig(module: nn.Module) -> None:
    for child in module.children():
        _remove_qconfig(child)
    if hasattr(module, "qconfig"):
        del module.qconfig
    _remove_activation_post_process(module)


# --------------------------------------------------------------------------------------------
# one-call workflows
# --------------------------------------------------------------------------------------------

def quantize(model: nn.Module, run_fn: Callable, run_args: Any, mapping: Optional[dict] = None,
             inplace: bool = False) -> nn.Module:
    """Static post-training quantization: prepare, ``run_fn(model, *run_args)``, convert."""
    torch._C._log_api_usage_once("torchquant.quantization.quantize")
    if mapping is None:
        mapping = get_default_static_quant_module_mappings()
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    prepare(model, inplace=True)
    run_fn(model, *(run_args if isinstance(run_args, (list, tuple)) else (run_args,)))
    convert(model, mapping, inplace=True)
    return model


def _dynamic_default(dtype: Any, spec_set: bool) -> Any:
    key = dtype
    if dtype is torch.float16 or dtype == torch.half:
        key = "float16"
    else:
        try:
            key = _dt.to_qdtype(dtype)
        except (TypeError, ValueError):
            key = None
    if key is _dt.qint8:
        return default_dynamic_qconfig
    if key == "float16":
        return float16_dynamic_qconfig
    if key is _dt.quint8:
        return float_qparams_weight_only_qconfig
    if key is _dt.quint4x2:
        return float_qparams_weight_only_qconfig_4bit
    if spec_set:
        raise RuntimeError(f"Unknown dtype specified for quantize_dynamic: {dtype}")
    raise ValueError(f"Don't know how to quantize with default settings for {dtype}. "
                     "Provide full qconfig please")


def quantize_dynamic(model: nn.Module, qconfig_spec: Any = None, dtype: Any = _dt.qint8,
                     mapping: Optional[dict] = None, inplace: bool = False) -> nn.Module:
    """Dynamic quantization: int8 (or float16) weights, activations quantized per call.

    ``qconfig_spec`` is None (Linear and the RNNs with ``dtype``'s default qconfig; the
    embeddings for quint8 / quint4x2), a set of module types, or a dict of types / qualified
    names to qconfigs.
    """
    torch._C._log_api_usage_once("torchquant.quantization.quantize_dynamic")
    if qconfig_spec is None:
        qconfig = _dynamic_default(dtype, spec_set=False)
        if qconfig in (float_qparams_weight_only_qconfig, float_qparams_weight_only_qconfig_4bit):
            types = [nn.EmbeddingBag] if qconfig is float_qparams_weight_only_qconfig_4bit \
                else [nn.EmbeddingBag, nn.Embedding]
        else:
            types = [nn.Linear, nn.LSTM, nn.GRU, nn.LSTMCell, nn.RNNCell, nn.GRUCell]
        qconfig_spec = dict.fromkeys(types, qconfig)
    elif isinstance(qconfig_spec, (set, frozenset)):
        qconfig_spec = dict.fromkeys(qconfig_spec, _dynamic_default(dtype, spec_set=True))
    elif not isinstance(qconfig_spec, dict):
        raise TypeError(f"qconfig_spec must be None, a set or a dict, got "
                        f"{type(qconfig_spec).__name__}")
    if mapping is None:
        mapping = get_default_dynamic_quant_module_mappings()
    if not inplace:
        model = copy.deepcopy(model)
    model.eval()
    propagate_qconfig_(model, qconfig_spec)
    convert(model, mapping, inplace=True)
    return model


def prepare_qat(model: nn.Module, mapping: Optional[dict] = None,
                inplace: bool = False, sync_across_ranks: Any = False) -> nn.Module:
    """Swap modules for their QAT versions (fake-quantized weights) and attach fake-quant
    output observers.  The model must be in training mode.  ``sync_across_ranks``: as in
    :func:`prepare`."""
    torch._C._log_api_usage_once("torchquant.quantization.prepare_qat")
    assert model.training, "prepare_qat only works on models in training mode"
    if mapping is None:
        mapping = get_default_qat_module_mappings()
    if not inplace:
        model = copy.deepcopy(model)
    check_no_torch_quantization_objects(model, "prepare_qat")
    propagate_qconfig_(model, qconfig_dict=None)
    convert(model, mapping=mapping, inplace=True, remove_qconfig=False, _record=False)
    prepare(model, observer_non_leaf_module_list=set(mapping.values()), inplace=True,
            sync_across_ranks=sync_across_ranks)
    return model


def quantize_qat(model: nn.Module, run_fn: Callable, run_args: Any,
                 inplace: bool = False) -> nn.Module:
    """Quantization-aware training: prepare_qat, ``run_fn(model, *run_args)`` (the training
    loop), convert."""
    torch._C._log_api_usage_once("torchquant.quantization.quantize_qat")
    if not inplace:
        model = copy.deepcopy(model)
    model.train()
    prepare_qat(model, inplace=True)
    run_fn(model, *(run_args if isinstance(run_args, (list, tuple)) else (run_args,)))
    convert(model, inplace=True)
    return model


# --------------------------------------------------------------------------------------------
# convert
# --------------------------------------------------------------------------------------------

def convert(module: nn.Module, mapping: Optional[dict] = None, inplace: bool = False,
            remove_qconfig: bool = True, is_reference: bool = False,
            convert_custom_config_dict: Optional[dict] = None,
            use_precomputed_fake_quant: bool = False, *, _record: bool = True) -> nn.Module:
    """Swap every module that has a qconfig and a counterpart in ``mapping`` for it.

    Raises when ``mapping`` is the static one and the model was never prepared (modules with
    a qconfig but no observer); warns when nothing was swapped.
    """
    torch._C._log_api_usage_once("torchquant.quantization.convert")
    check_no_torch_quantization_objects(module, "convert")
    if not inplace:
        module = copy.deepcopy(module)
    if mapping is None:
        if not (is_reference or _observed_inside(module)
                or getattr(module, "_torchquant_prepared", False)):
            raise RuntimeError("convert: the model has no observers; it was never prepared. "
                               "Call prepare() (or prepare_qat()) and calibrate it first")
        mapping = (get_default_static_quant_reference_module_mappings() if is_reference
                   else get_default_static_quant_module_mappings())
    custom = convert_custom_config_dict
    if custom is None:
        custom = get_default_custom_config_dict()
    custom_map = custom.get("observed_to_quantized_custom_module_class", {})
    reasons: dict[str, str] = {}
    _convert(module, mapping, is_reference, custom_map, use_precomputed_fake_quant, "", reasons)
    if remove_qconfig:
        _remove_qconfig(module)
    if _record:
        _summary.record(module, "convert", reasons)
    return module


def _convert(module: nn.Module, mapping: dict, is_reference: bool, custom_map: dict,
             use_precomputed: bool, prefix: str, reasons: dict) -> None:
    swapped = {}
    for name, child in module.named_children():
        qual = f"{prefix}.{name}" if prefix else name
        if not isinstance(child, _FusedModule) and type(child) not in custom_map:
            _convert(child, mapping, is_reference, custom_map, use_precomputed, qual, reasons)
        new = swap_module(child, mapping, custom_map, use_precomputed, _name=qual)
        if new is child:
            reason = _float_reason(child, mapping, custom_map)
            if reason:
                reasons[qual] = reason
        swapped[name] = new
    for name, new in swapped.items():
        module._modules[name] = new


def _float_reason(m: nn.Module, mapping: dict, custom_map: dict) -> Optional[str]:
    if type(m) in mapping or type(m) in custom_map:
        return "no qconfig"
    if _is_leaf(m) or isinstance(m, _FusedModule):
        if getattr(m, "qconfig", None) is None:
            return "no qconfig"
        return f"no quantized counterpart for {type(m).__name__}"
    return None


def swap_module(mod: nn.Module, mapping: dict, custom_module_class_mapping: dict,
                use_precomputed_fake_quant: bool = False, *, _name: str = "") -> nn.Module:
    """``mapping[type(mod)].from_float(mod)`` when ``mod`` has a qconfig (else ``mod``),
    keeping its user hooks (not the observer hook) and its device."""
    if getattr(mod, "qconfig", None) is None:
        return mod
    if type(mod) in custom_module_class_mapping:
        new_mod = custom_module_class_mapping[type(mod)].from_observed(mod)
    elif type(mod) in mapping:
        target = mapping[type(mod)]
        if getattr(target, "_IS_REFERENCE", False):
            weight_observer = mod.qconfig.weight()
            weight_observer(mod.weight)
            new_mod = target.from_float(mod, get_qparam_dict(weight_observer))
        else:
            _check_prepared(mod, target, _name)
            params = inspect.signature(target.from_float).parameters
            if "use_precomputed_fake_quant" in params:
                new_mod = target.from_float(mod, use_precomputed_fake_quant=use_precomputed_fake_quant)
            else:
                new_mod = target.from_float(mod)
    else:
        return mod
    for pre_hook in mod._forward_pre_hooks.values():
        if pre_hook is not _observer_forward_pre_hook:
            new_mod.register_forward_pre_hook(pre_hook)
    for hook in mod._forward_hooks.values():
        if hook is not _observer_forward_hook:
            new_mod.register_forward_hook(hook)
    devices = {p.device for p in itertools.chain(mod.parameters(), mod.buffers())}
    if len(devices) == 1:
        new_mod.to(next(iter(devices)))
    return new_mod


# Quantized classes whose from_float reads an output observer (static modules).
def _check_prepared(mod: nn.Module, target: type, name: str) -> None:
    module_path = getattr(target, "__module__", "")
    static = (".nn.quantized.modules" in module_path
              or ".nn.intrinsic.quantized.modules" in module_path)
    needs_observer = static and target.__name__ not in ("DeQuantize", "Dropout", "ReLU6",
                                                        "Embedding", "EmbeddingBag")
    if needs_observer and not hasattr(mod, "activation_post_process") \
            and not _observed_inside(mod):
        raise RuntimeError(f"convert: module {name or type(mod).__name__!r} "
                           f"({type(mod).__name__}) has a qconfig but no observer; call "
                           "prepare() (or prepare_qat()) and calibrate before convert()")


def _observed_inside(mod: nn.Module) -> bool:
    return any(hasattr(m, "activation_post_process") for m in mod.modules())


# --------------------------------------------------------------------------------------------
# calibration helper
# --------------------------------------------------------------------------------------------

def default_eval_fn(model: nn.Module, calib_data: Iterable, progress: Optional[bool] = None
                    ) -> None:
    """Run ``model`` on every ``(data, target)`` of ``calib_data`` (targets ignored), with a
    progress bar when stderr is a terminal (``progress=False`` silences it)."""
    with torch.no_grad():
        for data, _target in progress_bar(calib_data, "calibrating", progress):
            model(data)


# The package's one upward edge, made at import: nn's LSTM / MultiheadAttention / dynamic
# Linear / Embedding / dynamic QAT Linear call back into the workflow through the hook
# torchquant.nn._workflow (tests/test_import_graph.py's UPWARD_HOOKS names it and checks it
# is filled here, and only here).
_workflow.register(prepare=prepare, prepare_qat=prepare_qat, convert=convert,
                   default_dynamic_qconfig=default_dynamic_qconfig,
                   float_qparams_weight_only_qconfig=float_qparams_weight_only_qconfig,
                   activation_is_memoryless=_activation_is_memoryless)
