"""The pattern table (torchquant.ops.patterns): every graph lowering emits exactly the patterns
the table gives its use, FX convert's module rows are torch.ao's lowering maps, and the shared
matchers read the pieces of an exported quantized graph as the lowerings expect."""
from __future__ import annotations

import pytest
import torch
from torch.ao.quantization.fx import _lower_to_native_backend as ao_lowering

import torchquant  # noqa: F401  (registers torch.ops.torchquant)
from torchquant.ops import patterns
from torchquant.ops.inductor import fusion
from torchquant.quantization.fx import convert as fx_convert
from torchquant.quantization.pt2e import lowering, reference_representation


def _names(use: str) -> set[str]:
    return {name for name, _ in patterns.patterns_of(use)}


@pytest.mark.parametrize("use, emitters", [
    ("pt2e", lowering.EMITTERS),
    ("inductor", fusion.EMITTERS),
    ("reference", reference_representation._EMITTERS),
])
def test_each_lowering_emits_exactly_the_patterns_of_its_use(use, emitters):
    assert set(emitters) == _names(use)


def test_every_root_op_resolves():
    import torch._inductor.inductor_prims  # noqa: F401  (defines inductor's max-pool prim)

    for pattern in patterns.PATTERNS:
        for use in patterns.USES:
            u = getattr(pattern, use)
            for root in (u.roots if u is not None else ()):
                assert patterns.resolve_op(root) is not None, (pattern.name, use, root)
    assert patterns.resolve_op("aten.no_such_op.default") is None


def _class_names(mapping: dict) -> set[tuple[str, ...]]:
    return {(k.__name__, *(c.__name__ for c in (v if isinstance(v, tuple) else (v,))))
            for k, v in mapping.items()}


@pytest.mark.parametrize("ours, theirs", [
    ("_LOWER_MODULES", "STATIC_LOWER_MODULE_MAP"),
    ("_LOWER_FUSED_MODULES", "STATIC_LOWER_FUSED_MODULE_MAP"),
    ("_LOWER_TWO_INPUT_FUSED_MODULES", "STATIC_LOWER_FUSED_MODULE_TWO_INPUTS_MAP"),
    ("_DYNAMIC_LOWER_MODULES", "DYNAMIC_LOWER_MODULE_MAP"),
    ("_DYNAMIC_LOWER_FUSED_MODULES", "DYNAMIC_LOWER_FUSED_MODULE_MAP"),
    ("_WEIGHT_ONLY_LOWER_MODULES", "WEIGHT_ONLY_LOWER_MODULE_MAP"),
    ("_LOWER_OUTPUT_QPARAMS_MODULES", "SPECIAL_PATTERN_LOWER_MODULE_MAP"),
])
def test_fx_rows_are_torch_ao_lowering_maps(ours, theirs):
    """FX convert's module maps, built from the table's ``fx`` rows, name the classes torch.ao's
    convert_fx lowers with (compared by class name, module for module)."""
    assert _class_names(getattr(fx_convert, ours)) == _class_names(getattr(ao_lowering, theirs))
    for module_path in {c.__module__ for v in getattr(fx_convert, ours).values()
                        for c in (v if isinstance(v, tuple) else (v,))}:
        assert module_path.startswith("torchquant.nn."), module_path


def test_fx_op_rows_resolve_and_have_emitters():
    """Every module / function an ``fx_ops`` row names exists, and FX convert has a quantized
    function for each of the "functional_output_qparams" row's functions."""
    for pattern in patterns.PATTERNS:
        if pattern.fx_ops is not None:
            modules, functions, _ = patterns.fx_ops(pattern.name)
            assert all(issubclass(m, torch.nn.Module) for m in modules)
            assert all(callable(f) for f in functions), pattern.name
    functions = patterns.fx_ops("functional_output_qparams")[1]
    assert set(fx_convert._FUNCTIONAL_EMITTERS) == {f.__name__ for f in functions}
    assert set(fx_convert._LOWER_FUNCTIONALS) == set(functions)


# ---- the matchers on a converted PT2E graph --------------------------------------------------------

class _ConvAddRelu(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 4, 3, padding=1)
        self.head = torch.nn.Conv2d(4, 2, 1)  # quantizes the add + relu output

    def forward(self, x, y):
        return self.head(torch.relu(self.conv(x) + y))


@pytest.fixture(scope="module")
def converted_conv_add_relu():
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchquant.quantization.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)

    torch.manual_seed(0)
    example = (torch.randn(1, 4, 6, 6), torch.randn(1, 4, 6, 6))
    exported = torch.export.export(_ConvAddRelu().eval(), example).module()
    quantizer = X86InductorQuantizer().set_global(get_default_x86_inductor_quantization_config())
    prepared = prepare_pt2e(exported, quantizer)
    prepared(*example)
    return convert_pt2e(prepared)


def test_matchers_read_a_converted_conv_add_relu(converted_conv_add_relu):
    gm = converted_conv_add_relu
    conv = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.conv2d.default)
    x, w = conv.args[:2]
    codes, scale, zero_point = patterns.activation_dequantize(x)
    assert codes.target is torch.ops.torchquant.quantize_per_tensor.default
    assert scale > 0 and 0 <= zero_point <= 255
    w_codes, w_scale, w_zp, axis = patterns.constant_dequantize(gm, w)
    assert w_codes.dtype == torch.int8 and axis == 0 and w_scale.shape == (4,)
    assert patterns.activation_dequantize(w) is None           # a constant is no activation
    assert patterns.constant_dequantize(gm, x) is None

    chain = patterns.PostOps(conv, addend_ok=lambda root, operand, other: True)
    assert chain.post_op == "add_relu" and chain.other is not None
    assert chain.quantize is not None and chain.last.target is torch.ops.aten.relu.default
    assert patterns.PostOps(conv).post_op == "none"              # no add asked for: stops there
    assert patterns.PostOps(conv, addend_ok=lambda *a: False).quantize is None


def test_undoes_dequantize_wants_the_same_qparams_and_full_range():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    q = graph.call_function(torch.ops.torchquant.quantize_per_tensor.default,
                            (x, 0.5, 3, "quint8"))
    assert patterns.undoes_dequantize(torch.uint8, 0.5, 3, q)
    assert not patterns.undoes_dequantize(torch.uint8, 0.25, 3, q)   # another scale
    assert not patterns.undoes_dequantize(torch.uint8, 0.5, 4, q)    # another zero point
    assert not patterns.undoes_dequantize(torch.int8, 0.5, 3, q)     # codes of another dtype
    assert not patterns.undoes_dequantize(None, 0.5, 3, q)
    tiny = graph.call_function(torch.ops.torchquant.quantize_per_tensor.default,
                               (x, 1e-35, 3, "quint8"))
    assert not patterns.undoes_dequantize(torch.uint8, 1e-35, 3, tiny)  # not the identity there


def test_unary_at_reads_inductors_spellings():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    aten = torch.ops.aten
    relu = graph.call_function(aten.relu.default, (x,))
    low = graph.call_function(aten.clamp_min.default, (x, 0.0))
    high = graph.call_function(aten.clamp_max.default, (low, 6.0))
    alone = graph.call_function(aten.clamp_min.default, (x, 0))
    assert patterns.unary_at(relu) == ("relu", [], relu)
    assert patterns.unary_at(low) == ("hardtanh", [0.0, 6.0], high)
    assert patterns.unary_at(alone) == ("relu", [], alone)
    assert patterns.unary_at(x) is None


def test_conv_arguments_reads_aten_and_functional_spellings():
    graph = torch.fx.Graph()
    x, w = graph.placeholder("x"), graph.placeholder("w")
    aten_call = graph.call_function(torch.ops.aten.conv2d.default, (x, w, None, [2], [1, 0]))
    functional = graph.call_function(torch.nn.functional.conv1d, (x, w),
                                     {"dilation": 2, "groups": 4})
    same = graph.call_function(torch.nn.functional.conv2d, (x, w), {"padding": "same"})
    symbolic = graph.call_function(torch.nn.functional.conv2d, (x, w, None, x))
    assert patterns.conv_arguments(aten_call, 2) == (x, w, None, (2, 2), (1, 0), (1, 1), 1)
    assert patterns.conv_arguments(functional, 1) == (x, w, None, (1,), (0,), (2,), 4)
    assert patterns.conv_arguments(same, 2) is None        # 'same' padding: left float
    assert patterns.conv_arguments(symbolic, 2) is None    # a stride computed in the graph
