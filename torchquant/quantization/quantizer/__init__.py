"""``torchquant.quantization.quantizer`` — PT2E quantizers: the :class:`Quantizer` contract, the
quantization specs and annotations a quantizer writes on an exported graph, and helpers.

Ready quantizers live in the submodules ``xnnpack_quantizer`` (``XNNPACKQuantizer``) and
``x86_inductor_quantizer`` (``X86InductorQuantizer``).  Semantics: torchao 0.18
(``torchao.quantization.pt2e.quantizer``), on torchquant's observers and fake quants.
"""
from .composable_quantizer import ComposableQuantizer
from .quantizer import (DerivedQuantizationSpec, EdgeOrNode, FixedQParamsQuantizationSpec,
                        ObserverOrFakeQuantize, ObserverOrFakeQuantizeConstructor,
                        Q_ANNOTATION_KEY, QuantizationAnnotation, QuantizationSpec,
                        QuantizationSpecBase, Quantizer, SharedQuantizationSpec)
from .utils import (OperatorConfig, OperatorPatternType, QuantizationConfig,
                    annotate_input_qspec_map, annotate_output_qspec, get_bias_qspec,
                    get_input_act_qspec, get_module_name_filter, get_output_act_qspec,
                    get_weight_qspec, is_valid_annotation)

__all__ = [
    "Quantizer",
    "ComposableQuantizer",
    "EdgeOrNode",
    "QuantizationSpec",
    "QuantizationSpecBase",
    "DerivedQuantizationSpec",
    "FixedQParamsQuantizationSpec",
    "SharedQuantizationSpec",
    "QuantizationAnnotation",
    "annotate_input_qspec_map",
    "annotate_output_qspec",
    "get_module_name_filter",
    "is_valid_annotation",
    "QuantizationConfig",
    "OperatorPatternType",
    "OperatorConfig",
    "get_input_act_qspec",
    "get_output_act_qspec",
    "get_weight_qspec",
    "get_bias_qspec",
    # also importable from here (torchao keeps them in torchao.quantization.pt2e)
    "ObserverOrFakeQuantize",
    "ObserverOrFakeQuantizeConstructor",
    "Q_ANNOTATION_KEY",
]
