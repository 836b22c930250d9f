"""The QNNPACK backend config (``"qnnpack"``): every family also accepts symmetric qint8 with
QNNPACK/XNNPACK's limits (scale >= 2**-12, weights in [-127, 127])."""
from __future__ import annotations

import torch

from ... import dtypes as _dt
from .backend_config import BackendConfig, DTypeConfig, DTypeWithConstraints
from .native import (
    _native_style_backend_config,
    default_dynamic_float16_dtype_config,
    default_dynamic_int8_dtype_config,
    default_op_quint8_dtype_config,
    weight_only_quint4x2_dtype_config,
    weight_only_quint8_dtype_config,
    weighted_op_quint8_dtype_config,
)

__all__ = ["get_qnnpack_backend_config"]

qnnpack_act_qint8_scale_min_2_neg_12 = DTypeWithConstraints(
    dtype=_dt.qint8, scale_min_lower_bound=2 ** -12)
qnnpack_weight_qint8_neg_127_to_127_scale_min_2_neg_12 = DTypeWithConstraints(
    dtype=_dt.qint8, quant_min_lower_bound=-127, quant_max_upper_bound=127,
    scale_min_lower_bound=2 ** -12)
qnnpack_weighted_op_qint8_symmetric_dtype_config = DTypeConfig(
    input_dtype=qnnpack_act_qint8_scale_min_2_neg_12,
    output_dtype=qnnpack_act_qint8_scale_min_2_neg_12,
    weight_dtype=qnnpack_weight_qint8_neg_127_to_127_scale_min_2_neg_12,
    bias_dtype=torch.float)
qnnpack_default_op_qint8_symmetric_dtype_config = DTypeConfig(
    input_dtype=qnnpack_act_qint8_scale_min_2_neg_12,
    output_dtype=qnnpack_act_qint8_scale_min_2_neg_12)


def get_qnnpack_backend_config() -> BackendConfig:
    """The BackendConfig for the QNNPACK (mobile ARM) kernels."""
    symmetric_or_quint8 = [qnnpack_default_op_qint8_symmetric_dtype_config,
                           default_op_quint8_dtype_config]
    return _native_style_backend_config(
        "qnnpack",
        conv=[qnnpack_weighted_op_qint8_symmetric_dtype_config, weighted_op_quint8_dtype_config],
        linear=[qnnpack_weighted_op_qint8_symmetric_dtype_config, weighted_op_quint8_dtype_config,
                default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        binary=symmetric_or_quint8,
        default=symmetric_or_quint8,
        fixed_qparams=symmetric_or_quint8,
        share_qparams=symmetric_or_quint8,
        tensor_info=None,
        rnn=[default_dynamic_int8_dtype_config, default_dynamic_float16_dtype_config],
        embedding=[weight_only_quint8_dtype_config, weight_only_quint4x2_dtype_config],
        layer_norm=None)
