"""The default FX backend config (``"native"``: fbgemm / qnnpack / x86 kernels, here torchquant's).

The DTypeConfig constants are torch's names; the x86 / fbgemm / qnnpack / onednn configs reuse
most of them.
"""
from __future__ import annotations

import torch

from ... import dtypes as _dt
from ._common_operator_config_utils import (
    _get_binary_op_configs,
    _get_bn_configs,
    _get_cat_config,
    _get_conv_configs,
    _get_default_op_configs,
    _get_embedding_op_configs,
    _get_fixed_qparams_op_configs,
    _get_linear_configs,
    _get_ln_configs,
    _get_rnn_op_configs,
    _get_share_qparams_op_configs,
    _get_tensor_info_op_configs,
)
from .backend_config import BackendConfig, DTypeConfig

__all__ = [
    "get_test_only_legacy_native_backend_config",
    "default_op_quint8_dtype_config",
    "default_op_fp16_dtype_config",
    "default_dynamic_int8_dtype_config",
    "default_dynamic_float16_dtype_config",
    "input_output_only_quint8_dtype_config",
    "weight_only_quint8_dtype_config",
    "weight_only_quint4x2_dtype_config",
    "get_native_backend_config",
    "get_native_backend_config_dict",
    "get_test_only_legacy_native_backend_config_dict",
]

# Static int8 conv / linear: quint8 activations, qint8 weight, float bias.
weighted_op_quint8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8, weight_dtype=_dt.qint8,
    bias_dtype=torch.float)
# Static int8 ops without weights.
default_op_quint8_dtype_config = DTypeConfig(input_dtype=_dt.quint8, output_dtype=_dt.quint8)
default_op_fp16_dtype_config = DTypeConfig(
    input_dtype=torch.float16, output_dtype=torch.float16, weight_dtype=torch.float16,
    bias_dtype=torch.float16)
# Dynamic int8: activations quantized on the fly (input quint8), float output.
default_dynamic_int8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=torch.float, weight_dtype=_dt.qint8,
    bias_dtype=torch.float, is_dynamic=True)
default_dynamic_float16_dtype_config = DTypeConfig(
    input_dtype=torch.float16, output_dtype=torch.float, weight_dtype=torch.float16,
    bias_dtype=torch.float, is_dynamic=True)
# LayerNorm: quantized activations, float weight and bias.
input_output_only_quint8_dtype_config = DTypeConfig(
    input_dtype=_dt.quint8, output_dtype=_dt.quint8, weight_dtype=torch.float,
    bias_dtype=torch.float)
# Embeddings: weight-only.
weight_only_quint8_dtype_config = DTypeConfig(
    input_dtype=torch.float, output_dtype=torch.float, weight_dtype=_dt.quint8)
weight_only_quint4x2_dtype_config = DTypeConfig(
    input_dtype=torch.float, output_dtype=torch.float, weight_dtype=_dt.quint4x2)


def _native_style_backend_config(
        name: str, *, conv, linear, binary, default, fixed_qparams, share_qparams, tensor_info,
        rnn, embedding, layer_norm) -> BackendConfig:
    """The pattern families of the native config, in torch's registration order; a family given
    ``None`` is left out (fbgemm / x86 have no LayerNorm entries, qnnpack no tensor-info ones)."""
    config = (BackendConfig(name)
              .set_backend_pattern_configs(_get_conv_configs(conv))
              .set_backend_pattern_configs(_get_linear_configs(linear))
              .set_backend_pattern_configs(_get_binary_op_configs(binary))
              .set_backend_pattern_config(_get_cat_config(default))
              .set_backend_pattern_configs(_get_default_op_configs(default))
              .set_backend_pattern_configs(_get_fixed_qparams_op_configs(fixed_qparams))
              .set_backend_pattern_configs(_get_share_qparams_op_configs(share_qparams)))
    if tensor_info is not None:
        config.set_backend_pattern_configs(_get_tensor_info_op_configs(tensor_info))
    config.set_backend_pattern_configs(_get_bn_configs(default))
    if layer_norm is not None:
        config.set_backend_pattern_configs(_get_ln_configs(layer_norm))
    return (config.set_backend_pattern_configs(_get_rnn_op_configs(rnn))
            .set_backend_pattern_configs(_get_embedding_op_configs(embedding)))


def _server_dtype_configs(binary_and_fixed: list) -> dict:
    """The DTypeConfigs of the server backends (native, fbgemm, x86) by op family: they differ
    only in what binary and fixed-qparams ops take (and in native's LayerNorm entry)."""
    return dict(
        conv=[weighted_op_quint8_dtype_config],
        linear=[weighted_op_quint8_dtype_config, default_dynamic_int8_dtype_config,
                default_dynamic_float16_dtype_config],
        binary=list(binary_and_fixed),
        default=[default_op_quint8_dtype_config],
        fixed_qparams=list(binary_and_fixed),
        share_qparams=[default_op_quint8_dtype_config],
        tensor_info=[default_op_quint8_dtype_config],
        rnn=[default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        embedding=[weight_only_quint8_dtype_config, weight_only_quint4x2_dtype_config])


def get_native_backend_config() -> BackendConfig:
    """The BackendConfig FX graph mode uses by default (``"native"``)."""
    return _native_style_backend_config(
        "native", **_server_dtype_configs([default_op_quint8_dtype_config]),
        layer_norm=[input_output_only_quint8_dtype_config])


def get_native_backend_config_dict() -> dict:
    """:func:`get_native_backend_config` as a dict."""
    return get_native_backend_config().to_dict()


def get_test_only_legacy_native_backend_config() -> BackendConfig:
    """The native config plus fp16 static variants of linear, binary, fixed- and
    shared-qparams ops (torch keeps it for its tests)."""
    return _native_style_backend_config(
        "_native_and_fp16",
        conv=[weighted_op_quint8_dtype_config],
        linear=[weighted_op_quint8_dtype_config, default_dynamic_int8_dtype_config,
                default_dynamic_float16_dtype_config, default_op_fp16_dtype_config],
        binary=[default_op_quint8_dtype_config, default_op_fp16_dtype_config],
        default=[default_op_quint8_dtype_config],
        fixed_qparams=[default_op_quint8_dtype_config, default_op_fp16_dtype_config],
        share_qparams=[default_op_quint8_dtype_config, default_op_fp16_dtype_config],
        tensor_info=[default_op_quint8_dtype_config],
        rnn=[default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        embedding=[weight_only_quint8_dtype_config, weight_only_quint4x2_dtype_config],
        layer_norm=[input_output_only_quint8_dtype_config])


def get_test_only_legacy_native_backend_config_dict() -> dict:
    return get_test_only_legacy_native_backend_config().to_dict()
