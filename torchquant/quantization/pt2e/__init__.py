"""``torchquant.quantization.pt2e`` — the PT2E (export) flow's public helpers, as torchao's
``torchao.quantization.pt2e``: train / eval on exported models (:mod:`.export_utils`) and the
observer and fake-quant classes the quantizers' specs name.  The internals live beside them:
observer insertion (:mod:`.prepare`), observer -> quantize / dequantize rewriting
(:mod:`.convert`), the conv+bn QAT rewrite (:mod:`.qat`) and graph helpers (:mod:`.utils`).
The entry points are in :mod:`torchquant.quantization.quantize_pt2e`.
"""
from __future__ import annotations

from ..fake_quantize import (FakeQuantize, FakeQuantizeBase, FixedQParamsFakeQuantize,
                             FusedMovingAvgObsFakeQuantize, default_dynamic_fake_quant,
                             default_fake_quant, disable_fake_quant, disable_observer,
                             enable_fake_quant, enable_observer)
from ..observer import (FixedQParamsObserver, HistogramObserver, MinMaxObserver,
                        MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver,
                        NoopObserver, ObserverBase, PerChannelMinMaxObserver,
                        PlaceholderObserver, RecordingObserver, ReuseInputObserver,
                        UniformQuantizationObserverBase)
from ._numeric_debugger import (CUSTOM_KEY, FROM_NODE_KEY, NUMERIC_DEBUG_HANDLE_KEY,
                                NodeAccuracySummary, NodeSourceDebugInfo, OutputLogger,
                                QuantizationComparisonResult, compare_results,
                                extract_results_from_loggers, generate_numeric_debug_handle,
                                prepare_for_propagation_comparison)
from ._numeric_report import LayerAccuracy, NumericReport, numeric_report
from .export_utils import (allow_exported_model_train_eval, model_is_exported,
                           move_exported_model_to_eval, move_exported_model_to_train)

__all__ = [
    "FakeQuantize", "FakeQuantizeBase", "FixedQParamsFakeQuantize", "FixedQParamsObserver",
    "FusedMovingAvgObsFakeQuantize", "HistogramObserver", "MinMaxObserver",
    "MovingAverageMinMaxObserver", "MovingAveragePerChannelMinMaxObserver", "NoopObserver",
    "ObserverBase", "PerChannelMinMaxObserver", "PlaceholderObserver", "RecordingObserver",
    "ReuseInputObserver", "UniformQuantizationObserverBase", "enable_fake_quant",
    "enable_observer", "disable_fake_quant", "disable_observer", "default_fake_quant",
    "default_dynamic_fake_quant", "move_exported_model_to_eval", "move_exported_model_to_train",
    "allow_exported_model_train_eval", "model_is_exported",
    "CUSTOM_KEY", "NUMERIC_DEBUG_HANDLE_KEY", "FROM_NODE_KEY", "generate_numeric_debug_handle",
    "prepare_for_propagation_comparison", "OutputLogger", "extract_results_from_loggers",
    "compare_results", "QuantizationComparisonResult", "NodeAccuracySummary",
    "NodeSourceDebugInfo",
    "numeric_report", "NumericReport", "LayerAccuracy",
]
