"""``XNNPACKQuantizer``: symmetric int8 quantization for the XNNPACK backend (torchao 0.18 keeps
it as a deprecated test helper; torchquant makes it public and does not warn).

Annotation order (earlier patterns claim nodes first): QAT-only conv+bn[+relu] and
conv_transpose+bn[+relu], then linear+relu, linear, conv+relu, conv, conv_transpose+relu,
adaptive_avg_pool2d, GRU inputs/outputs, add+relu, add, mul+relu, mul, cat; dynamic configs
annotate linear only.  Finally shape / pooling ops after a quantized node share its observer.
Config precedence: module name > module type > operator type > global.  [TQ] torchao stores
``set_operator_type`` configs but never applies them; here every operator node of that type
(e.g. ``torch.ops.aten.linear``) is annotated with its config, and fused patterns apply only
when all their operator nodes are of that type (a linear+relu pair falls back to the plain
linear pattern).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch
import torch.nn.functional as F
from torch.fx import GraphModule, Node

from ...dtypes import per_channel_symmetric, per_tensor_affine, per_tensor_symmetric
from ..fake_quantize import FakeQuantize, FusedMovingAvgObsFakeQuantize
from ..observer import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                        MovingAveragePerChannelMinMaxObserver, PerChannelMinMaxObserver,
                        PlaceholderObserver)
from .quantizer import QuantizationSpec, Quantizer
from .utils import OperatorConfig, OperatorPatternType, QuantizationConfig, get_module_name_filter
from .xnnpack_quantizer_utils import OP_TO_ANNOTATOR, _convert_scalars_to_attrs, propagate_annotation

__all__ = ["XNNPACKQuantizer", "get_symmetric_quantization_config"]

_EPS = 2**-12


@functools.lru_cache
def get_symmetric_quantization_config(
    is_per_channel: bool = False,
    is_qat: bool = False,
    is_dynamic: bool = False,
    act_qmin: int = -128,
    act_qmax: int = 127,
    weight_qmin: int = -127,
    weight_qmax: int = 127,
) -> QuantizationConfig:
    """int8 activations (affine per tensor) and int8 symmetric weights (per channel on axis 0
    when ``is_per_channel``); no bias spec.  Dynamic configs have no output spec."""
    act_args: dict[str, Any] = {"eps": _EPS}
    if is_qat and is_dynamic:
        act_ctr: Any = FakeQuantize
        act_args["observer"] = MovingAverageMinMaxObserver.with_args(averaging_constant=1)
    elif is_qat:
        act_ctr = FusedMovingAvgObsFakeQuantize
    elif is_dynamic:
        act_ctr = PlaceholderObserver
    else:
        act_ctr = HistogramObserver
    act_spec = QuantizationSpec(
        dtype=torch.int8, quant_min=act_qmin, quant_max=act_qmax, qscheme=per_tensor_affine,
        is_dynamic=is_dynamic, observer_or_fake_quant_ctr=act_ctr.with_args(**act_args))

    weight_args: dict[str, Any] = {"eps": _EPS}
    if is_qat:
        weight_ctr: Any = FusedMovingAvgObsFakeQuantize
        weight_args["observer"] = (MovingAveragePerChannelMinMaxObserver if is_per_channel
                                   else MovingAverageMinMaxObserver)
    else:
        weight_ctr = PerChannelMinMaxObserver if is_per_channel else MinMaxObserver
    weight_spec = QuantizationSpec(
        dtype=torch.int8, quant_min=weight_qmin, quant_max=weight_qmax,
        qscheme=per_channel_symmetric if is_per_channel else per_tensor_symmetric,
        ch_axis=0, is_dynamic=False, observer_or_fake_quant_ctr=weight_ctr.with_args(**weight_args))

    return QuantizationConfig(act_spec, None if is_dynamic else act_spec, weight_spec, None, is_qat)


def _supported_symmetric_quantized_operators() -> dict[str, list[OperatorPatternType]]:
    return {
        "conv2d": [[torch.nn.Conv2d, torch.nn.ReLU], [torch.nn.Conv2d, F.relu],
                   [F.conv2d, torch.nn.ReLU], [F.conv2d, F.relu]],
        "linear": [[torch.nn.Linear], [F.linear]],
        "add": [[torch.add]],
        "adaptive_avg_pool2d": [[torch.nn.AdaptiveAvgPool2d], [F.adaptive_avg_pool2d]],
    }


def _get_supported_config_and_operators() -> list[OperatorConfig]:
    configs = [
        get_symmetric_quantization_config(),
        get_symmetric_quantization_config(is_qat=True),
        get_symmetric_quantization_config(is_per_channel=True),
        get_symmetric_quantization_config(is_per_channel=True, is_qat=True),
    ]
    return [OperatorConfig(config, patterns)
            for config in configs
            for patterns in _supported_symmetric_quantized_operators().values()]


def _type_name(tp: Any) -> str:
    return f"{tp.__module__}.{tp.__qualname__}"


def _get_module_type_filter(tp: Callable) -> Callable[[Node], bool]:
    """``fn(node)``: True when a module of type ``tp`` is anywhere on the node's module stack
    (export records module types as classes or as their qualified names)."""
    wanted = _type_name(tp)

    def module_type_filter(n: Node) -> bool:
        stack = n.meta.get("nn_module_stack", {})
        return any((_type_name(t) if isinstance(t, type) else t) == wanted
                   for _, t in stack.values())

    return module_type_filter


def _is_call_of(n: Node, operator_type: Any) -> bool:
    """``n`` calls ``operator_type`` (an op packet such as ``torch.ops.aten.linear``, or one
    of its overloads)."""
    return n.op == "call_function" and (
        n.target == operator_type or getattr(n.target, "overloadpacket", None) == operator_type)


def _get_operator_type_filter(operator_type: Any) -> Callable[[Node], bool]:
    """``fn(node)``: True for a call of ``operator_type`` and for the non-call nodes (weights,
    biases) a pattern carries along."""
    return lambda n: n.op != "call_function" or _is_call_of(n, operator_type)


def _get_not_module_type_or_name_filter(tp_list: list[Callable], module_name_list: list[str]
                                        ) -> Callable[[Node], bool]:
    filters = ([_get_module_type_filter(tp) for tp in tp_list]
               + [get_module_name_filter(m) for m in module_name_list])

    def not_module_type_or_name_filter(n: Node) -> bool:
        return not any(f(n) for f in filters)

    return not_module_type_or_name_filter


class XNNPACKQuantizer(Quantizer):
    """Annotates an exported model for XNNPACK's int8 kernels (see the module docstring)."""

    supported_config_and_operators = _get_supported_config_and_operators()
    STATIC_QAT_ONLY_OPS = ["conv_bn_relu", "conv_bn", "conv_transpose_bn_relu", "conv_transpose_bn"]
    STATIC_OPS = ["linear_relu", "linear", "conv_relu", "conv", "conv_transpose_relu",
                  "adaptive_avg_pool2d", "gru_io_only", "add_relu", "add", "mul_relu", "mul", "cat"]
    DYNAMIC_OPS = ["linear"]

    def __init__(self) -> None:
        super().__init__()
        self.global_config: Optional[QuantizationConfig] = None
        self.operator_type_config: dict[Any, Optional[QuantizationConfig]] = {}
        self.module_type_config: dict[Callable, Optional[QuantizationConfig]] = {}
        self.module_name_config: dict[str, Optional[QuantizationConfig]] = {}

    @classmethod
    def get_supported_quantization_configs(cls) -> list[QuantizationConfig]:
        return list({config for config, _ in cls.supported_config_and_operators})

    @classmethod
    def get_supported_operator_for_quantization_config(
            cls, quantization_config: Optional[QuantizationConfig]) -> list[OperatorPatternType]:
        if quantization_config is None:
            return [p for _, patterns in cls.supported_config_and_operators for p in patterns]
        for config, patterns in cls.supported_config_and_operators:
            if config == quantization_config:
                return patterns
        return []

    @classmethod
    def get_supported_operators(cls) -> list[OperatorConfig]:
        return cls.supported_config_and_operators

    def set_global(self, quantization_config: QuantizationConfig) -> "XNNPACKQuantizer":
        self.global_config = quantization_config
        return self

    def set_operator_type(self, operator_type: Any,
                          quantization_config: QuantizationConfig) -> "XNNPACKQuantizer":
        """Use ``quantization_config`` for the nodes of ``operator_type``, an op packet such as
        ``torch.ops.aten.conv2d`` (or one of its overloads)."""
        self.operator_type_config[operator_type] = quantization_config
        return self

    def set_module_type(self, module_type: Callable,
                        quantization_config: QuantizationConfig) -> "XNNPACKQuantizer":
        """Use ``quantization_config`` for every pattern inside submodules of ``module_type``."""
        self.module_type_config[module_type] = quantization_config
        return self

    def set_module_name(self, module_name: str,
                        quantization_config: Optional[QuantizationConfig]) -> "XNNPACKQuantizer":
        """Use ``quantization_config`` for every pattern inside the submodule ``module_name``."""
        if quantization_config is None:
            raise ValueError("XNNPACKQuantizer.set_module_name: quantization_config=None is not "
                             "supported (leave the module out instead)")
        self.module_name_config[module_name] = quantization_config
        return self

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        """Scalar operands of add / mul become tensor attributes so they can be quantized."""
        return _convert_scalars_to_attrs(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        dynamic = (self.global_config is not None
                   and self.global_config.input_activation is not None
                   and self.global_config.input_activation.is_dynamic)
        self._annotate_by_precedence(model, self._dynamic_patterns if dynamic else self._static_patterns)
        propagate_annotation(model)
        return model

    def _static_patterns(self, model: GraphModule, config: Optional[QuantizationConfig],
                         filter_fn: Optional[Callable[[Node], bool]]) -> None:
        if config is None:
            return
        names = (self.STATIC_QAT_ONLY_OPS if config.is_qat else []) + self.STATIC_OPS
        for name in names:
            OP_TO_ANNOTATOR[name](model, config, filter_fn)

    def _dynamic_patterns(self, model: GraphModule, config: Optional[QuantizationConfig],
                          filter_fn: Optional[Callable[[Node], bool]]) -> None:
        if config is None:
            return
        for name in self.DYNAMIC_OPS:
            OP_TO_ANNOTATOR[name](model, config, filter_fn)

    def _annotate_by_precedence(self, model: GraphModule, annotate_patterns) -> None:
        for module_name, config in self.module_name_config.items():
            annotate_patterns(model, config, get_module_name_filter(module_name))
        for module_type, config in self.module_type_config.items():
            annotate_patterns(model, config, _get_module_type_filter(module_type))
        not_module = _get_not_module_type_or_name_filter(list(self.module_type_config),
                                                         list(self.module_name_config))
        for operator_type, config in self.operator_type_config.items():
            of_type = _get_operator_type_filter(operator_type)
            annotate_patterns(model, config, lambda n, f=of_type: not_module(n) and f(n))
        operator_types = list(self.operator_type_config)
        annotate_patterns(model, self.global_config, lambda n: not_module(n) and not any(
            _is_call_of(n, t) for t in operator_types))

    def validate(self, model: GraphModule) -> None:
        pass
