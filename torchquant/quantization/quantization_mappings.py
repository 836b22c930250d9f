"""Default module swaps of the eager workflow: float -> QAT -> quantized (static, dynamic,
reference), and the fixed-qparams output observers of sigmoid-like modules."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional

import torch
from torch import nn

from ..nn import intrinsic as nni
from ..nn import qat as nnqat
from ..nn import quantizable as nnqa
from ..nn import quantized as nnq
from ..nn.intrinsic import qat as nniqat
from ..nn.intrinsic import quantized as nniq
from ..nn.intrinsic.quantized import dynamic as nniqd
from ..nn.qat import dynamic as nnqatd
from ..nn.quantized import dynamic as nnqd
from ..nn.quantized import reference as nnqr
from . import fake_quantize as fq
from .stubs import DeQuantStub, QuantStub

__all__ = [
    "DEFAULT_REFERENCE_STATIC_QUANT_MODULE_MAPPINGS", "DEFAULT_STATIC_QUANT_MODULE_MAPPINGS",
    "DEFAULT_QAT_MODULE_MAPPINGS", "DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS",
    "DEFAULT_MODULE_TO_ACT_POST_PROCESS", "DEFAULT_FLOAT_TO_QUANTIZED_OPERATOR_MAPPINGS",
    "no_observer_set", "get_default_static_quant_module_mappings",
    "get_default_static_quant_reference_module_mappings", "get_embedding_static_quant_module_mappings",
    "get_default_static_sparse_quant_module_mappings", "get_static_quant_module_class",
    "get_dynamic_quant_module_class", "get_default_qat_module_mappings",
    "get_embedding_qat_module_mappings", "get_default_dynamic_quant_module_mappings",
    "get_default_dynamic_sparse_quant_module_mappings", "get_default_qconfig_propagation_list",
    "get_default_compare_output_module_list", "get_default_float_to_quantized_operator_mappings",
    "get_quantized_operator",
]

_INCLUDE_QCONFIG_PROPAGATE_LIST: set = {nn.Sequential}

_ndql = nn.modules.linear.NonDynamicallyQuantizableLinear

DEFAULT_REFERENCE_STATIC_QUANT_MODULE_MAPPINGS: dict = {
    QuantStub: nnq.Quantize, DeQuantStub: nnq.DeQuantize,
    nn.Linear: nnqr.Linear,
    nn.Conv1d: nnqr.Conv1d, nn.Conv2d: nnqr.Conv2d, nn.Conv3d: nnqr.Conv3d,
    nn.ConvTranspose1d: nnqr.ConvTranspose1d, nn.ConvTranspose2d: nnqr.ConvTranspose2d,
    nn.ConvTranspose3d: nnqr.ConvTranspose3d,
    nn.Embedding: nnqr.Embedding, nn.EmbeddingBag: nnqr.EmbeddingBag,
    nn.GRUCell: nnqr.GRUCell, nn.LSTMCell: nnqr.LSTMCell, nn.RNNCell: nnqr.RNNCell,
    nn.LSTM: nnqr.LSTM,
}
DEFAULT_STATIC_QUANT_MODULE_MAPPINGS: dict = {
    QuantStub: nnq.Quantize, DeQuantStub: nnq.DeQuantize,
    nn.BatchNorm2d: nnq.BatchNorm2d, nn.BatchNorm3d: nnq.BatchNorm3d,
    nn.Dropout: nnq.Dropout,
    nn.Conv1d: nnq.Conv1d, nn.Conv2d: nnq.Conv2d, nn.Conv3d: nnq.Conv3d,
    nn.ConvTranspose1d: nnq.ConvTranspose1d, nn.ConvTranspose2d: nnq.ConvTranspose2d,
    nn.ConvTranspose3d: nnq.ConvTranspose3d,
    nn.ELU: nnq.ELU, nn.Embedding: nnq.Embedding, nn.EmbeddingBag: nnq.EmbeddingBag,
    nn.GroupNorm: nnq.GroupNorm, nn.Hardswish: nnq.Hardswish,
    nn.InstanceNorm1d: nnq.InstanceNorm1d, nn.InstanceNorm2d: nnq.InstanceNorm2d,
    nn.InstanceNorm3d: nnq.InstanceNorm3d, nn.LayerNorm: nnq.LayerNorm,
    nn.LeakyReLU: nnq.LeakyReLU, _ndql: nnq.Linear, nn.Linear: nnq.Linear,
    nn.ReLU6: nnq.ReLU6, nn.PReLU: nnq.PReLU,
    nnq.FloatFunctional: nnq.QFunctional,
    nni.BNReLU2d: nniq.BNReLU2d, nni.BNReLU3d: nniq.BNReLU3d,
    nni.ConvReLU1d: nniq.ConvReLU1d, nni.ConvReLU2d: nniq.ConvReLU2d,
    nni.ConvReLU3d: nniq.ConvReLU3d, nni.ConvAdd2d: nniq.ConvAdd2d,
    nni.ConvAddReLU2d: nniq.ConvAddReLU2d, nni.LinearReLU: nniq.LinearReLU,
    nni.LinearLeakyReLU: nniq.LinearLeakyReLU, nni.LinearTanh: nniq.LinearTanh,
    nniqat.ConvBn1d: nnq.Conv1d, nniqat.ConvBn2d: nnq.Conv2d, nniqat.ConvBn3d: nnq.Conv3d,
    nniqat.ConvBnReLU1d: nniq.ConvReLU1d, nniqat.ConvBnReLU2d: nniq.ConvReLU2d,
    nniqat.ConvBnReLU3d: nniq.ConvReLU3d, nniqat.ConvReLU2d: nniq.ConvReLU2d,
    nniqat.ConvReLU3d: nniq.ConvReLU3d, nniqat.LinearReLU: nniq.LinearReLU,
    nniqat.LinearBn1d: nnq.Linear,
    nnqat.Linear: nnq.Linear, nnqat.Conv2d: nnq.Conv2d, nnqat.Conv3d: nnq.Conv3d,
}
DEFAULT_QAT_MODULE_MAPPINGS: dict = {
    nn.Conv2d: nnqat.Conv2d, nn.Conv3d: nnqat.Conv3d, nn.Linear: nnqat.Linear,
    _ndql: nnqat.Linear,
    nni.ConvBn1d: nniqat.ConvBn1d, nni.ConvBn2d: nniqat.ConvBn2d, nni.ConvBn3d: nniqat.ConvBn3d,
    nni.ConvBnReLU1d: nniqat.ConvBnReLU1d, nni.ConvBnReLU2d: nniqat.ConvBnReLU2d,
    nni.ConvBnReLU3d: nniqat.ConvBnReLU3d, nni.ConvReLU2d: nniqat.ConvReLU2d,
    nni.ConvReLU3d: nniqat.ConvReLU3d, nni.LinearReLU: nniqat.LinearReLU,
    nni.LinearBn1d: nniqat.LinearBn1d,
}
DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS: dict = {
    nn.GRUCell: nnqd.GRUCell, nn.Linear: nnqd.Linear, nnqatd.Linear: nnqd.Linear,
    _ndql: nnqd.Linear, nn.LSTM: nnqd.LSTM, nn.GRU: nnqd.GRU, nn.LSTMCell: nnqd.LSTMCell,
    nn.RNNCell: nnqd.RNNCell, nni.LinearReLU: nniqd.LinearReLU,
    nn.EmbeddingBag: nnq.EmbeddingBag, nn.Embedding: nnq.Embedding,
    # [TQ] torch 2.13 has the dynamic convs commented out here, so quantize_dynamic(model,
    # {nn.Conv2d}) leaves the convs float; here a conv the user names is quantized.  The
    # default qconfig_spec of quantize_dynamic holds no conv, so nothing changes unless asked.
    nn.Conv1d: nnqd.Conv1d, nn.Conv2d: nnqd.Conv2d, nn.Conv3d: nnqd.Conv3d,
    nn.ConvTranspose1d: nnqd.ConvTranspose1d, nn.ConvTranspose2d: nnqd.ConvTranspose2d,
    nn.ConvTranspose3d: nnqd.ConvTranspose3d,
}
DEFAULT_MODULE_TO_ACT_POST_PROCESS: dict = {
    nn.Hardsigmoid: fq.default_fixed_qparams_range_0to1_fake_quant,
    nn.Sigmoid: fq.default_fixed_qparams_range_0to1_fake_quant,
    nn.Softmax: fq.default_fixed_qparams_range_0to1_fake_quant,
    nn.Tanh: fq.default_fixed_qparams_range_neg1to1_fake_quant,
}
DEFAULT_FLOAT_TO_QUANTIZED_OPERATOR_MAPPINGS: dict = {
    torch.nn.functional.elu: nnq.functional.elu,
    torch.nn.functional.hardswish: nnq.functional.hardswish,
    torch.nn.functional.leaky_relu: nnq.functional.leaky_relu,
}
_EMBEDDING_QAT: dict = {nn.Embedding: nnqat.Embedding, nn.EmbeddingBag: nnqat.EmbeddingBag}
_EMBEDDING_STATIC: dict = {nn.Embedding: nnq.Embedding, nn.EmbeddingBag: nnq.EmbeddingBag,
                           nnqat.Embedding: nnq.Embedding, nnqat.EmbeddingBag: nnq.EmbeddingBag}


def _combined(table: dict, additional: Optional[dict] = None) -> dict:
    mapping = copy.deepcopy(table)
    if additional:
        mapping.update(additional)
    return mapping


def no_observer_set() -> set:
    """Modules that need no output observer (their qparams are not calibrated)."""
    return {nnqa.LSTM, nnqa.MultiheadAttention}


def get_default_static_quant_module_mappings() -> dict:
    """float / fused / QAT module type -> static quantized module type."""
    return _combined(DEFAULT_STATIC_QUANT_MODULE_MAPPINGS)


def get_default_static_quant_reference_module_mappings() -> dict:
    """float module type -> reference quantized module type (``convert(is_reference=True)``)."""
    return _combined(DEFAULT_REFERENCE_STATIC_QUANT_MODULE_MAPPINGS)


def get_embedding_static_quant_module_mappings() -> dict:
    mapping = _combined(DEFAULT_STATIC_QUANT_MODULE_MAPPINGS)
    mapping.update(_EMBEDDING_STATIC)
    return mapping


def get_default_static_sparse_quant_module_mappings() -> dict:
    """No sparse kernels in torchquant: an empty table (torch maps Linear to its sparse one)."""
    return {}


def get_static_quant_module_class(float_module_class: Callable,
                                  additional_static_quant_mapping: Optional[dict] = None,
                                  is_reference: bool = False) -> Any:
    """The static quantized class of a float class; AssertionError if there is none."""
    table = (DEFAULT_REFERENCE_STATIC_QUANT_MODULE_MAPPINGS if is_reference
             else DEFAULT_STATIC_QUANT_MODULE_MAPPINGS)
    mapping = _combined(table, additional_static_quant_mapping)
    static_quant_module_class = mapping.get(float_module_class)
    if static_quant_module_class is None:
        raise AssertionError(f"Floating point module class {float_module_class} does not have "
                             "a corresponding quantized module class")
    return copy.deepcopy(static_quant_module_class)


def get_dynamic_quant_module_class(float_module_class: Callable,
                                   additional_dynamic_quant_mapping: Optional[dict] = None) -> Any:
    """The dynamic quantized class of a float class; AssertionError if there is none."""
    mapping = _combined(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS, additional_dynamic_quant_mapping)
    dynamic_quant_module_class = mapping.get(float_module_class)
    if dynamic_quant_module_class is None:
        raise AssertionError(f"Floating point module class {float_module_class} does not have "
                             "a corresponding quantized module class")
    return copy.deepcopy(dynamic_quant_module_class)


def get_default_qat_module_mappings() -> dict:
    """float / fused module type -> QAT module type."""
    return _combined(DEFAULT_QAT_MODULE_MAPPINGS)


def get_embedding_qat_module_mappings() -> dict:
    mapping = _combined(DEFAULT_QAT_MODULE_MAPPINGS)
    mapping.update(_EMBEDDING_QAT)
    return mapping


def get_default_dynamic_quant_module_mappings() -> dict:
    """float module type -> dynamic quantized module type."""
    return _combined(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)


def get_default_dynamic_sparse_quant_module_mappings() -> dict:
    """No sparse kernels in torchquant: an empty table."""
    return {}


def get_default_qconfig_propagation_list() -> set:
    """Module types that receive a qconfig (and so may get observers) in ``prepare``."""
    return (set(DEFAULT_STATIC_QUANT_MODULE_MAPPINGS)
            | set(DEFAULT_QAT_MODULE_MAPPINGS)
            | set(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS)
            | _INCLUDE_QCONFIG_PROPAGATE_LIST)


def get_default_compare_output_module_list() -> set:
    """Module types whose outputs the numeric-suite comparison records."""
    values = (set(DEFAULT_STATIC_QUANT_MODULE_MAPPINGS.values())
              | set(DEFAULT_QAT_MODULE_MAPPINGS.values())
              | set(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS.values()))
    keys = (set(DEFAULT_STATIC_QUANT_MODULE_MAPPINGS)
            | set(DEFAULT_QAT_MODULE_MAPPINGS)
            | set(DEFAULT_DYNAMIC_QUANT_MODULE_MAPPINGS))
    return values | keys | _INCLUDE_QCONFIG_PROPAGATE_LIST


def get_default_float_to_quantized_operator_mappings() -> dict:
    return copy.deepcopy(DEFAULT_FLOAT_TO_QUANTIZED_OPERATOR_MAPPINGS)


def get_quantized_operator(float_op: Any) -> Callable:
    """The quantized functional counterpart of a float functional op."""
    quantized_op = DEFAULT_FLOAT_TO_QUANTIZED_OPERATOR_MAPPINGS.get(float_op)
    if quantized_op is None:
        raise AssertionError(f"Operator {float_op} does not have corresponding quantized op")
    return quantized_op


def _has_special_act_post_process(module: nn.Module) -> bool:
    return module.training and type(module) in DEFAULT_MODULE_TO_ACT_POST_PROCESS


def _get_special_act_post_process(module: nn.Module) -> Optional[Callable]:
    return DEFAULT_MODULE_TO_ACT_POST_PROCESS.get(type(module))
