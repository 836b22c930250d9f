"""``QConfig``: which observer / fake-quantize to build for a layer's activation and weight.

A qconfig holds *constructors* (classes or ``with_args`` factories), never instances: prepare
builds fresh observers for every layer from them.  The predefined qconfigs and the per-backend
defaults below are torch's, setting for setting.
"""
from __future__ import annotations

import copy
import re
import warnings
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Optional, Union

import torch
from torch import nn

from .. import dtypes as _dt
from .fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    default_dynamic_fake_quant,
    default_embedding_fake_quant,
    default_embedding_fake_quant_4bit,
    default_fake_quant,
    default_fused_act_fake_quant,
    default_fused_per_channel_wt_fake_quant,
    default_fused_wt_fake_quant,
    default_per_channel_weight_fake_quant,
    default_weight_fake_quant,
    fused_per_channel_wt_fake_quant_range_neg_127_to_127,
    fused_wt_fake_quant_range_neg_127_to_127,
)
from .observer import (
    HistogramObserver,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    NoopObserver,
    PerChannelMinMaxObserver,
    PlaceholderObserver,
    ReuseInputObserver,
    _PartialWrapper,
    default_debug_observer,
    default_dynamic_quant_observer,
    default_fixed_qparams_range_0to1_observer,
    default_fixed_qparams_range_neg1to1_observer,
    default_float_qparams_observer,
    default_float_qparams_observer_4bit,
    default_observer,
    default_per_channel_weight_observer,
    default_placeholder_observer,
    default_reuse_input_observer,
    default_weight_observer,
    per_channel_weight_observer_range_neg_127_to_127,
    weight_observer_range_neg_127_to_127,
)
from .utils import _parent_name

__all__ = [
    "QConfig", "QConfigDynamic", "QConfigAny", "qconfig_equals",
    "default_qconfig", "default_debug_qconfig", "default_per_channel_qconfig",
    "default_dynamic_qconfig", "float16_dynamic_qconfig", "float16_static_qconfig",
    "per_channel_dynamic_qconfig", "float_qparams_weight_only_qconfig",
    "float_qparams_weight_only_qconfig_4bit", "default_quint8_weight_qconfig",
    "default_qat_qconfig", "default_dynamic_qat_qconfig", "default_weight_only_qconfig",
    "default_activation_only_qconfig", "default_qat_qconfig_v2", "default_reuse_input_qconfig",
    "default_symmetric_qnnpack_qconfig", "default_per_channel_symmetric_qnnpack_qconfig",
    "default_symmetric_qnnpack_qat_qconfig", "default_per_channel_symmetric_qnnpack_qat_qconfig",
    "default_embedding_qat_qconfig", "default_embedding_qat_qconfig_4bit",
    "get_default_qconfig", "get_default_qat_qconfig", "get_default_qconfig_dict",
    "get_default_qat_qconfig_dict",
]

_SUPPORTED_BACKENDS = ["fbgemm", "x86", "qnnpack", "onednn"]
_INSTANCE_ERROR = ("{name} received observer instance, please pass observer class instead. "
                   "Use MyObserver.with_args(x=1) to override arguments to constructor if needed")


class QConfig(namedtuple("QConfig", ["activation", "weight"])):
    """Observer constructors for a layer's output activation and its weight.

    Example::

        QConfig(activation=MinMaxObserver.with_args(dtype=torchquant.qint8),
                weight=default_weight_observer)
    """

    __slots__ = ()

    def __new__(cls, activation: Any, weight: Any) -> "QConfig":
        if isinstance(activation, nn.Module) or isinstance(weight, nn.Module):
            raise ValueError(_INSTANCE_ERROR.format(name="QConfig"))
        return super().__new__(cls, activation, weight)


class QConfigDynamic(namedtuple("QConfigDynamic", ["activation", "weight"])):
    """Deprecated: dynamic quantization now uses :class:`QConfig` too."""

    __slots__ = ()

    def __new__(cls, activation: Any = torch.nn.Identity,
                weight: Any = torch.nn.Identity) -> "QConfigDynamic":
        warnings.warn("`QConfigDynamic` is going to be deprecated in PyTorch 1.12, please use "
                      "`QConfig` instead", FutureWarning, stacklevel=2)
        if isinstance(weight, nn.Module):
            raise ValueError(_INSTANCE_ERROR.format(name="QConfigDynamic"))
        return super().__new__(cls, activation, weight)


QConfigAny = Optional[QConfig]


default_qconfig = QConfig(activation=default_observer, weight=default_weight_observer)
"""MinMax activations (quint8, 0..127) and per-tensor symmetric qint8 weights."""

default_debug_qconfig = QConfig(weight=default_weight_observer,
                                activation=default_debug_observer)
"""Records every activation (RecordingObserver)."""

default_per_channel_qconfig = QConfig(activation=default_observer,
                                      weight=default_per_channel_weight_observer)

default_dynamic_qconfig = QConfig(activation=default_dynamic_quant_observer,
                                  weight=default_weight_observer)

float16_dynamic_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=torch.float16, is_dynamic=True),
    weight=PlaceholderObserver.with_args(dtype=torch.float16))
"""Dynamic quantization with float16 weights."""

float16_static_qconfig = QConfig(activation=PlaceholderObserver.with_args(dtype=torch.float16),
                                 weight=PlaceholderObserver.with_args(dtype=torch.float16))
"""float16 activations and weights."""

per_channel_dynamic_qconfig = QConfig(activation=default_dynamic_quant_observer,
                                      weight=default_per_channel_weight_observer)

float_qparams_weight_only_qconfig = QConfig(activation=default_placeholder_observer,
                                            weight=default_float_qparams_observer)
"""Weight-only quantization with float zero points (embeddings)."""

float_qparams_weight_only_qconfig_4bit = QConfig(activation=default_placeholder_observer,
                                                 weight=default_float_qparams_observer_4bit)

default_qat_qconfig = QConfig(activation=default_fake_quant, weight=default_weight_fake_quant)

default_dynamic_qat_qconfig = QConfig(activation=default_dynamic_fake_quant,
                                      weight=default_weight_fake_quant)

default_weight_only_qconfig = QConfig(activation=torch.nn.Identity,
                                      weight=default_weight_fake_quant)

default_activation_only_qconfig = QConfig(activation=default_fake_quant,
                                          weight=torch.nn.Identity)

default_qat_qconfig_v2 = QConfig(activation=default_fused_act_fake_quant,
                                 weight=default_fused_wt_fake_quant)
"""QAT with the fused observer + fake-quantize modules (faster)."""

default_reuse_input_qconfig = QConfig(activation=default_reuse_input_observer,
                                      weight=NoopObserver)
"""Ops whose output reuses the input's observer (``reshape`` ...)."""

# Symmetric qint8 activations and [-127, 127] weights: what XNNPACK (via qnnpack) requires.
# eps = 2**-12 keeps requantization scales above XNNPACK's 2**-32 floor.
default_symmetric_qnnpack_qconfig = QConfig(
    activation=HistogramObserver.with_args(dtype=_dt.qint8, reduce_range=False, eps=2 ** -12),
    weight=weight_observer_range_neg_127_to_127)

default_per_channel_symmetric_qnnpack_qconfig = QConfig(
    activation=HistogramObserver.with_args(dtype=_dt.qint8, reduce_range=False, eps=2 ** -12),
    weight=per_channel_weight_observer_range_neg_127_to_127)

default_embedding_qat_qconfig = QConfig(activation=NoopObserver.with_args(dtype=torch.float32),
                                        weight=default_embedding_fake_quant)

default_embedding_qat_qconfig_4bit = QConfig(
    activation=NoopObserver.with_args(dtype=torch.float32),
    weight=default_embedding_fake_quant_4bit)

default_quint8_weight_qconfig = QConfig(activation=HistogramObserver, weight=MinMaxObserver)
"""quint8 affine weights (PReLU)."""

default_symmetric_qnnpack_qat_qconfig = QConfig(
    activation=FusedMovingAvgObsFakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=_dt.qint8,
        reduce_range=False, eps=2 ** -12),
    weight=fused_wt_fake_quant_range_neg_127_to_127)

default_per_channel_symmetric_qnnpack_qat_qconfig = QConfig(
    activation=FusedMovingAvgObsFakeQuantize.with_args(
        observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=_dt.qint8,
        reduce_range=False, eps=2 ** -12),
    weight=fused_per_channel_wt_fake_quant_range_neg_127_to_127)


def _check_backend(backend: str) -> None:
    if backend not in _SUPPORTED_BACKENDS:
        raise AssertionError(f"backend: {backend} not supported. backend must be one of "
                             f"{_SUPPORTED_BACKENDS}")


def get_default_qconfig(backend: str = "x86", version: int = 0) -> QConfig:
    """The default post-training qconfig for ``backend`` (x86, fbgemm, qnnpack or onednn).

    x86 / fbgemm use ``reduce_range=True`` activations (0..127: their int8 kernels accumulate
    pairs in int16), qnnpack per-tensor weights, onednn the full activation range.
    """
    _check_backend(backend)
    if version != 0:
        raise AssertionError(f"Version number: {version} in get_default_qconfig is not "
                             "supported. Version number must be 0")
    if backend in ("x86", "fbgemm"):
        return QConfig(activation=HistogramObserver.with_args(reduce_range=True),
                       weight=default_per_channel_weight_observer)
    if backend == "qnnpack":
        return QConfig(activation=HistogramObserver.with_args(reduce_range=False),
                       weight=default_weight_observer)
    if not torch.cpu._is_vnni_supported():
        warnings.warn("Default qconfig of oneDNN backend with reduce_range of false may have "
                      "accuracy issues on CPU without Vector Neural Network Instruction support.",
                      stacklevel=2)
    return QConfig(activation=HistogramObserver.with_args(reduce_range=False),
                   weight=default_per_channel_weight_observer)


def get_default_qat_qconfig(backend: str = "x86", version: int = 1) -> QConfig:
    """The default QAT qconfig for ``backend``: version 0 uses ``FakeQuantize``, version 1
    the fused observer + fake-quantize modules."""
    _check_backend(backend)
    if version not in (0, 1):
        raise AssertionError(f"Version number: {version} in get_default_qat_qconfig is not "
                             "supported. Version number must be 0 or 1")
    fake_quant = FakeQuantize if version == 0 else FusedMovingAvgObsFakeQuantize
    if backend == "onednn":
        activation = fake_quant.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                          quant_max=255)
    else:
        activation = fake_quant.with_args(observer=MovingAverageMinMaxObserver, quant_min=0,
                                          quant_max=255,
                                          reduce_range=backend in ("x86", "fbgemm"))
    if backend == "qnnpack":
        weight = default_weight_fake_quant if version == 0 else default_fused_wt_fake_quant
    else:
        weight = (default_per_channel_weight_fake_quant if version == 0
                  else default_fused_per_channel_wt_fake_quant)
    return QConfig(activation=activation, weight=weight)


_default_fp32_placeholder_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=torch.float32),
    weight=PlaceholderObserver.with_args(dtype=torch.float32))

_default_quint8_placeholder_qconfig = QConfig(
    activation=PlaceholderObserver.with_args(dtype=_dt.quint8),
    weight=None)  # used by ops without weights


def get_default_qconfig_dict(backend: str = "x86", version: int = 0) -> dict[str, Any]:
    """Deprecated: ``get_default_qconfig_mapping(backend, version).to_dict()``."""
    warnings.warn("`torchquant.quantization.get_default_qconfig_dict` is deprecated and will be "
                  "removed in a future version. Please use "
                  "`torchquant.quantization.get_default_qconfig_mapping` instead.",
                  FutureWarning, stacklevel=2)
    return get_default_qconfig_mapping(backend, version).to_dict()


def get_default_qat_qconfig_dict(backend: str = "x86", version: int = 1) -> dict[str, Any]:
    """Deprecated: ``get_default_qat_qconfig_mapping(backend, version).to_dict()``."""
    warnings.warn("`torchquant.quantization.get_default_qat_qconfig_dict` is deprecated and will "
                  "be removed in a future version. Please use "
                  "`torchquant.quantization.get_default_qat_qconfig_mapping` instead.",
                  FutureWarning, stacklevel=2)
    return get_default_qat_qconfig_mapping(backend, version).to_dict()


def _assert_valid_qconfig(qconfig: QConfigAny, mod: nn.Module) -> None:
    """Reject per-channel weight observers on transposed convolutions (no kernel for them)."""
    if qconfig is None or qconfig.weight is None:
        return
    if isinstance(mod, (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)):
        example_observer = qconfig.weight()
        if isinstance(example_observer, (PerChannelMinMaxObserver,
                                         MovingAveragePerChannelMinMaxObserver)):
            raise AssertionError("Per channel weight observer is not supported yet for "
                                 "ConvTranspose{n}d.")


def _add_module_to_qconfig_obs_ctr(qconfig: QConfigAny, module: Optional[nn.Module]) -> Any:
    """The qconfig with constructors that build observers on ``module``'s device.

    Constructors that accept ``factory_kwargs`` get it as a callable argument evaluated at
    construction time; others are left as they are.
    """
    if module is None or qconfig is None or qconfig._fields != ("activation", "weight"):
        return qconfig

    def factory_kwargs_for_module_device() -> Optional[dict[str, Any]]:
        devices = {p.device for p in module.parameters()} | {b.device for b in module.buffers()}
        return {"device": next(iter(devices))} if devices else None

    def on_module_device(constructor: Any) -> Any:
        try:
            constructor.with_args(factory_kwargs=None)()
        except (AttributeError, TypeError):  # no with_args, or no factory_kwargs parameter
            return constructor
        return constructor.with_callable_args(factory_kwargs=factory_kwargs_for_module_device)

    return QConfig(on_module_device(qconfig.activation), on_module_device(qconfig.weight))


def _partial_wrapper_equals(first: _PartialWrapper, second: _PartialWrapper) -> bool:
    """Same function, positional args and keywords; bound ``observer`` factories compared
    recursively (partials have no ``__eq__`` of their own)."""
    first_keywords = copy.copy(first.p.keywords)
    second_keywords = copy.copy(second.p.keywords)
    observers_equal = True
    if "observer" in first_keywords and "observer" in second_keywords:
        observers_equal = _obs_or_fq_ctr_equals(first_keywords.pop("observer"),
                                                second_keywords.pop("observer"))
    return (observers_equal and first_keywords == second_keywords
            and first.p.func == second.p.func and first.p.args == second.p.args)


def _obs_or_fq_ctr_equals(first: Any, second: Any) -> bool:
    if isinstance(first, _PartialWrapper) and isinstance(second, _PartialWrapper):
        return _partial_wrapper_equals(first, second)
    return first == second


def qconfig_equals(q1: QConfigAny, q2: QConfigAny) -> bool:
    """Whether two qconfigs build the same observers (factories compared by their bound
    function and arguments)."""
    if q1 is None or q2 is None:
        return q1 == q2
    try:
        return (_obs_or_fq_ctr_equals(q1.activation, q2.activation)
                and _obs_or_fq_ctr_equals(q1.weight, q2.weight))
    except AttributeError:
        return q1 == q2


def _activation_is_memoryless(qconfig: QConfig) -> bool:
    """The activation observer keeps no history (moving average with constant 1)."""
    activation = qconfig.activation()
    if isinstance(activation, FakeQuantizeBase) and hasattr(activation, "activation_post_process"):
        activation = activation.activation_post_process
    return getattr(activation, "averaging_constant", None) == 1


def _is_reuse_input_qconfig(qconfig: QConfigAny) -> bool:
    return (qconfig is not None and isinstance(qconfig.activation(), ReuseInputObserver)
            and isinstance(qconfig.weight(), NoopObserver))



# --------------------------------------------------------------------------------------------
# QConfigMapping and the per-backend default mappings (public under their torch path,
# :mod:`.qconfig_mapping`; defined here because the deprecated qconfig-dict functions above
# return them and the default mappings are built from the predefined qconfigs)
# --------------------------------------------------------------------------------------------
# ``QConfigMapping``: which qconfig applies to which part of a model.  Five levels, lowest to
# highest precedence: global < object type (module class, function or method name) <
# module-name regex (first match in insertion order) < module name (a parent's entry covers
# its children) < (module name, object type, call index).  A ``None`` qconfig at a level that
# matches switches quantization off there.  :func:`_get_qconfig` resolves them.

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


# --------------------------------------------------------------------------------------------
# Per-token dynamic activations (torchquant addition; torchao's int8 dynamic activations)
# --------------------------------------------------------------------------------------------

from .granularity import MappingType as _MappingType  # noqa: E402
from .granularity import PerToken as _PerToken  # noqa: E402


class PerTokenDynamicObserver(PlaceholderObserver):
    """Marks an activation for dynamic int8 symmetric quantization with one scale per token
    (row): ``scale = max(|row|) / 127`` (at least ``eps``), values in -127..127.

    An identity placeholder like torch's dynamic observers: it only carries the choice to
    ``from_float`` (``is_per_token``, ``granularity = PerToken()``, ``mapping_type``).  Its
    ``qscheme`` is ``per_tensor_symmetric`` -- the mapping each token gets; torch has no
    per-token qscheme.
    """

    is_per_token = True
    granularity = _PerToken()
    mapping_type = _MappingType.SYMMETRIC

    def __init__(self, dtype: Any = _dt.qint8, quant_min: int = -127, quant_max: int = 127,
                 eps: float = 1e-5, is_dynamic: bool = True) -> None:
        super().__init__(dtype=dtype, quant_min=quant_min, quant_max=quant_max,
                         qscheme=_dt.per_tensor_symmetric, eps=eps, is_dynamic=is_dynamic)

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, granularity=PerToken(), is_dynamic={self.is_dynamic}"


per_token_dynamic_qconfig = QConfig(
    activation=PerTokenDynamicObserver,
    weight=PerChannelMinMaxObserver.with_args(dtype=_dt.qint8,
                                              qscheme=_dt.per_channel_symmetric))
"""Dynamic quantization with int8 symmetric per-token activations and int8 symmetric
per-channel weights: one int8 GEMM, far closer to float than per-tensor activations."""

__all__.append("per_token_dynamic_qconfig")
