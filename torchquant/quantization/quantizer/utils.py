"""Configs and helpers shared by the ready quantizers (torchao 0.18's ``quantizer.utils``)."""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Callable, NamedTuple, Optional

import torch
from torch.fx import Node

from ...dtypes import per_channel_symmetric, per_tensor_affine, per_tensor_symmetric
from .quantizer import Q_ANNOTATION_KEY, QuantizationAnnotation, QuantizationSpec

__all__ = [
    "QuantizationConfig",
    "OperatorPatternType",
    "OperatorConfig",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "get_bias_qspec",
    "annotate_input_qspec_map",
    "annotate_output_qspec",
    "get_module_name_filter",
    "is_valid_annotation",
]


@dataclass(eq=True, frozen=True)
class QuantizationConfig:
    """The specs a ready quantizer applies to one pattern: activations in/out, weight, bias."""

    input_activation: Optional[QuantizationSpec]
    output_activation: Optional[QuantizationSpec]
    weight: Optional[QuantizationSpec]
    bias: Optional[QuantizationSpec]
    is_qat: bool = False


#: A sequence of modules / functions forming one quantizable pattern, e.g. ``[nn.Conv2d, F.relu]``.
OperatorPatternType = typing.Annotated[list[Callable], None]


class OperatorConfig(NamedTuple):
    config: QuantizationConfig
    operators: list[OperatorPatternType]


_PER_TENSOR_SCHEMES = (per_tensor_affine, per_tensor_symmetric)


def _activation_qspec(spec: Optional[QuantizationSpec], which: str) -> Optional[QuantizationSpec]:
    if spec is None:
        return None
    if spec.qscheme not in _PER_TENSOR_SCHEMES:
        # torchao asserts; a ValueError survives ``python -O`` and names the problem.
        raise ValueError(f"{which} activations must be quantized per tensor "
                         f"(per_tensor_affine / per_tensor_symmetric), got qscheme {spec.qscheme}")
    return spec


def get_input_act_qspec(quantization_config: Optional[QuantizationConfig]) -> Optional[QuantizationSpec]:
    """The config's input-activation spec (None-safe); it must be per tensor."""
    if quantization_config is None:
        return None
    return _activation_qspec(quantization_config.input_activation, "input")


def get_output_act_qspec(quantization_config: Optional[QuantizationConfig]) -> Optional[QuantizationSpec]:
    """The config's output-activation spec (None-safe); it must be per tensor."""
    if quantization_config is None:
        return None
    return _activation_qspec(quantization_config.output_activation, "output")


def get_weight_qspec(quantization_config: Optional[QuantizationConfig]) -> Optional[QuantizationSpec]:
    """The config's weight spec (None-safe); symmetric (per tensor or per channel) or no qscheme."""
    if quantization_config is None or quantization_config.weight is None:
        return None
    spec = quantization_config.weight
    if spec.qscheme is not None and spec.qscheme not in (per_tensor_symmetric, per_channel_symmetric):
        raise ValueError(f"Unsupported quantization_spec {spec} for weight: the qscheme must be "
                         "per_tensor_symmetric, per_channel_symmetric or None")
    return spec


def get_bias_qspec(quantization_config: Optional[QuantizationConfig]) -> Optional[QuantizationSpec]:
    """The config's bias spec (None-safe); only a float32 (placeholder) bias spec is supported."""
    if quantization_config is None or quantization_config.bias is None:
        return None
    spec = quantization_config.bias
    if spec.dtype != torch.float:
        raise ValueError(f"Only a float32 bias spec is supported (the bias is quantized by the "
                         f"backend from the input and weight scales), got dtype {spec.dtype}")
    return spec


def annotate_input_qspec_map(node: Node, input_node: Node, qspec) -> None:
    """Set the spec of the edge ``(input_node, node)``, creating the node's annotation if needed."""
    annotation = node.meta.get(Q_ANNOTATION_KEY, QuantizationAnnotation())
    if annotation.input_qspec_map is None:
        annotation.input_qspec_map = {}
    annotation.input_qspec_map[input_node] = qspec
    node.meta[Q_ANNOTATION_KEY] = annotation


def annotate_output_qspec(node: Node, qspec) -> None:
    """Set the spec of ``node``'s output, creating the node's annotation if needed."""
    annotation = node.meta.get(Q_ANNOTATION_KEY, QuantizationAnnotation())
    annotation.output_qspec = qspec
    node.meta[Q_ANNOTATION_KEY] = annotation


def _strip_self_prefix(path: str) -> str:
    """``nn_module_stack`` paths from strict (dynamo) export start with ``L['self'].``."""
    prefix = "L['self']."
    return path[len(prefix):] if path.startswith(prefix) else path


def get_module_name_filter(module_name: str) -> Callable[[Node], bool]:
    """``fn(node) -> bool``: True when ``node`` was traced inside the submodule whose fully
    qualified name is ``module_name`` (at any depth of its ``nn_module_stack``)."""

    def module_name_filter(n: Node) -> bool:
        stack = n.meta.get("nn_module_stack", {})
        return any(_strip_self_prefix(path) == module_name for path, _ in stack.values())

    return module_name_filter


def is_valid_annotation(annotation: Optional[QuantizationAnnotation]) -> bool:
    """True when the annotation quantizes something (an input edge or the output)."""
    if annotation is None:
        return False
    return len(annotation.input_qspec_map) > 0 or annotation.output_qspec is not None
