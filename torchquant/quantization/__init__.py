"""``torchquant.quantization`` — the ``torch.ao.quantization`` API on plain integer tensors."""
from __future__ import annotations

from typing import Union

from . import _torchao_paths

_torchao_paths.install()  # torchao's module paths (pt2e.quantize_pt2e ...) under this prefix

from .fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FusedMovingAvgObsFakeQuantize,
    default_affine_fixed_qparams_fake_quant,
    default_dynamic_fake_quant,
    default_embedding_fake_quant,
    default_embedding_fake_quant_4bit,
    default_fake_quant,
    default_fixed_qparams_range_0to1_fake_quant,
    default_fixed_qparams_range_neg1to1_fake_quant,
    default_fused_act_fake_quant,
    default_fused_per_channel_wt_fake_quant,
    default_fused_wt_fake_quant,
    default_histogram_fake_quant,
    default_per_channel_weight_fake_quant,
    default_symmetric_fixed_qparams_fake_quant,
    default_weight_fake_quant,
    disable_fake_quant,
    disable_observer,
    enable_fake_quant,
    enable_observer,
    fused_per_channel_wt_fake_quant_range_neg_127_to_127,
    fused_wt_fake_quant_range_neg_127_to_127,
)
from .observer import (
    AffineQuantizedObserverBase,
    FixedQParamsObserver,
    Granularity,
    HistogramObserver,
    MappingType,
    MinMaxObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    NoopObserver,
    ObserverBase,
    PerAxis,
    PerBlock,
    PerChannelMinMaxObserver,
    PerGroup,
    PerRow,
    PerTensor,
    PerToken,
    PlaceholderObserver,
    RecordingObserver,
    ReuseInputObserver,
    TorchAODType,
    UniformQuantizationObserverBase,
    ZeroPointDomain,
    default_affine_fixed_qparams_observer,
    default_debug_observer,
    default_dynamic_quant_observer,
    default_fixed_qparams_range_0to1_observer,
    default_fixed_qparams_range_neg1to1_observer,
    default_float_qparams_observer,
    default_float_qparams_observer_4bit,
    default_histogram_observer,
    default_observer,
    default_per_channel_weight_observer,
    default_placeholder_observer,
    default_reuse_input_observer,
    default_symmetric_fixed_qparams_observer,
    default_weight_observer,
    get_block_size,
    get_observer_state_dict,
    load_observer_state_dict,
    per_channel_weight_observer_range_neg_127_to_127,
    weight_observer_range_neg_127_to_127,
)
from .qconfig import (
    QConfig,
    QConfigAny,
    QConfigDynamic,
    default_activation_only_qconfig,
    default_debug_qconfig,
    default_dynamic_qat_qconfig,
    default_dynamic_qconfig,
    default_embedding_qat_qconfig,
    default_embedding_qat_qconfig_4bit,
    default_per_channel_qconfig,
    default_per_channel_symmetric_qnnpack_qat_qconfig,
    default_per_channel_symmetric_qnnpack_qconfig,
    default_qat_qconfig,
    default_qat_qconfig_v2,
    default_qconfig,
    default_quint8_weight_qconfig,
    default_reuse_input_qconfig,
    default_symmetric_qnnpack_qat_qconfig,
    default_symmetric_qnnpack_qconfig,
    default_weight_only_qconfig,
    float16_dynamic_qconfig,
    float16_static_qconfig,
    float_qparams_weight_only_qconfig,
    float_qparams_weight_only_qconfig_4bit,
    get_default_qat_qconfig,
    get_default_qat_qconfig_dict,
    get_default_qconfig,
    get_default_qconfig_dict,
    per_channel_dynamic_qconfig,
    per_token_dynamic_qconfig,
    qconfig_equals,
)
from .qconfig_mapping import (
    QConfigMapping,
    get_default_qat_qconfig_mapping,
    get_default_qconfig_mapping,
)
from .quant_type import QuantType

ObserverOrFakeQuantize = Union[ObserverBase, FakeQuantizeBase]
from .stubs import DeQuantStub, QuantStub, QuantWrapper
from .fuser_method_mappings import get_fuser_method
from .fuse_modules import fuse_modules, fuse_modules_qat  # noqa: F811 (the module stays importable)
from .quantization_mappings import (
    get_default_compare_output_module_list,
    get_default_dynamic_quant_module_mappings,
    get_default_float_to_quantized_operator_mappings,
    get_default_qat_module_mappings,
    get_default_qconfig_propagation_list,
    get_default_static_quant_module_mappings,
    get_default_static_quant_reference_module_mappings,
    get_dynamic_quant_module_class,
    get_embedding_qat_module_mappings,
    get_embedding_static_quant_module_mappings,
    get_quantized_operator,
    get_static_quant_module_class,
    no_observer_set,
)
from .quantize import (
    add_quant_dequant,
    convert,
    default_eval_fn,
    get_default_custom_config_dict,
    prepare,
    prepare_qat,
    propagate_qconfig_,
    quantize,
    quantize_dynamic,
    quantize_qat,
    swap_module,
)
from .summary import QuantizationSummary, summary
from .distributed import observe_across_ranks, sync_observers
from .calibration import calibrate
