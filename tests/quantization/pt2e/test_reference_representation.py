"""convert_pt2e(use_reference_representation=True) against torchao 0.18's reference
representation: the int8 q/dq patterns become plain integer arithmetic, bit-exact with
torchao's rewritten graph (both run the same float32 / int32 op sequence)."""
from __future__ import annotations

import copy
import operator
import warnings

import pytest
import torch
import torch.nn as nn

from _models import MODELS
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn
from torchquant.quantization.quantizer import x86_inductor_quantizer as tq_x86

ao_pt2e = pytest.importorskip("torchao.quantization.pt2e.quantize_pt2e")
ao_xnn = pytest.importorskip("torchao.testing.pt2e._xnnpack_quantizer")

pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")


class BiasedMLP(nn.Module):
    """Linear (fused pattern), linear + relu (q/dq only), add and add + relu patterns."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 32)
        self.fc4 = nn.Linear(32, 4)

    def forward(self, x):
        a = torch.relu(self.fc1(x))
        b = self.fc2(a)
        c = torch.relu(self.fc3(b) + b)
        return self.fc4(c + a)


class NoBiasLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(16, 8, bias=False)

    def forward(self, x):
        return self.fc(x)


_ALL_MODELS = {**MODELS, "biased_mlp": (BiasedMLP, lambda: (torch.randn(4, 16),)),
               "no_bias": (NoBiasLinear, lambda: (torch.randn(4, 16),))}


def _converted(name, per_channel, ao_quantizer=None, tq_quantizer=None, reference=True):
    cls, make_inputs = _ALL_MODELS[name]
    torch.manual_seed(0)
    model = cls().eval()
    inputs = make_inputs()
    gen = torch.Generator().manual_seed(1)
    batches = [inputs] + [tuple(torch.randn(x.shape, generator=gen) * 2 for x in inputs)
                          for _ in range(3)]
    ours = prepare_pt2e(torch.export.export(copy.deepcopy(model), inputs).module(),
                        tq_quantizer or tq_xnn.XNNPACKQuantizer().set_global(
                            tq_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)))
    for b in batches:
        ours(*b)
    ours = convert_pt2e(ours, use_reference_representation=reference)
    theirs = None
    if ao_quantizer is not False:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            theirs = ao_pt2e.prepare_pt2e(
                torch.export.export(copy.deepcopy(model), inputs).module(),
                ao_quantizer or ao_xnn.XNNPACKQuantizer().set_global(
                    ao_xnn.get_symmetric_quantization_config(is_per_channel=per_channel)))
            for b in batches:
                theirs(*b)
            theirs = ao_pt2e.convert_pt2e(theirs, use_reference_representation=reference)
    return model, batches, theirs, ours


def _outputs(gm, batch):
    out = gm(*batch)
    return list(out) if isinstance(out, (tuple, list)) else [out]


def _targets(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _int_linears(gm):
    """linear / convolution nodes computing on int32 (the fused reference patterns)."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and n.target in (torch.ops.aten.linear.default, torch.ops.aten.convolution.default)
               and n.args[2] is None and n.args[0].op == "call_function"
               and n.args[0].kwargs.get("dtype") == torch.int32)


def _ao_int_linears(gm):
    return sum(1 for n in gm.graph.nodes if n.op == "call_function"
               and "out_dtype" in str(n.target) and "linear" in str(n.args[0]))


@pytest.mark.parametrize("name,per_channel", [
    ("biased_mlp", False), ("biased_mlp", True), ("add_mul_cat", False), ("residual", True)])
def test_reference_representation_bit_exact_with_torchao(name, per_channel):
    _, batches, theirs, ours = _converted(name, per_channel)
    targets = _targets(ours)
    # no torchquant quantize / dequantize op is left (all codes here are int8)
    assert not [t for t in targets if t.startswith("torchquant.")], targets
    # the same linears became integer linears as in torchao's graph
    assert _int_linears(ours) == _ao_int_linears(theirs)
    for batch in batches:
        for a, b in zip(_outputs(theirs, batch), _outputs(ours, batch)):
            assert torch.equal(a, b)


def test_reference_patterns_present():
    """biased_mlp per tensor: fc2, fc3, fc4 (linear -> q) become int32 linears; fc1 (linear +
    relu, quantized after the relu) keeps a float linear between reference dq / q, as in
    torchao."""
    _, batches, _, ours = _converted("biased_mlp", False, ao_quantizer=False)
    assert _int_linears(ours) == 3
    float_linears = [n for n in ours.graph.nodes if n.target == torch.ops.aten.linear.default
                     and n.args[2] is not None]
    assert len(float_linears) == 1
    assert "aten.round.default" in " ".join(_targets(ours))
    # against the q/dq form: same qparams, the integer requantize truncates -> a step or so off
    _, _, _, qdq = _converted("biased_mlp", False, ao_quantizer=False, reference=False)
    for batch in batches:
        a, b = _outputs(qdq, batch)[0], _outputs(ours, batch)[0]
        assert (a - b).abs().max() < 0.1 * a.abs().max()


def test_linear_without_bias_runs():
    """torchao 0.18's rewritten graph divides ``None`` by the bias scale here and fails at run
    time; torchquant drops the bias term."""
    model, batches, _, ours = _converted("no_bias", False, ao_quantizer=False)
    assert _int_linears(ours) == 1
    _, _, _, qdq = _converted("no_bias", False, ao_quantizer=False, reference=False)
    for batch in batches:
        a, b = _outputs(qdq, batch)[0], _outputs(ours, batch)[0]
        assert (a - b).abs().max() < 0.05 * a.abs().max()


def test_uint8_qdq_left_as_torchquant_ops():
    """torchao's reference patterns are int8 only; uint8 (X86 quantizer) q/dq stay ops."""
    _, batches, _, ours = _converted(
        "biased_mlp", False, ao_quantizer=False,
        tq_quantizer=tq_x86.X86InductorQuantizer().set_global(
            tq_x86.get_default_x86_inductor_quantization_config()))
    _, _, _, qdq = _converted(
        "biased_mlp", False, ao_quantizer=False, reference=False,
        tq_quantizer=tq_x86.X86InductorQuantizer().set_global(
            tq_x86.get_default_x86_inductor_quantization_config()))
    assert any(t.startswith("torchquant.quantize_per_tensor") for t in _targets(ours))
    for batch in batches:
        # weights (int8, per channel) dequantize by reference arithmetic: same float32 values
        assert torch.equal(_outputs(qdq, batch)[0], _outputs(ours, batch)[0])


def test_convolution_pattern():
    """torchao's conv pattern is written for ``aten.convolution`` (torch.export now emits
    ``aten.conv2d``, which neither library fuses): a graph with ``aten.convolution`` between
    int8 per-tensor q/dq becomes an int32 convolution, within one output step of the q/dq form
    (the integer requantize truncates where quantize rounds)."""
    from torchquant.quantization.pt2e.reference_representation import (
        reference_representation_rewrite)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2, padding=1)).eval()
    inputs = (torch.randn(2, 3, 9, 9),)
    gm = prepare_pt2e(torch.export.export(model, inputs).module(),
                      tq_xnn.XNNPACKQuantizer().set_global(
                          tq_xnn.get_symmetric_quantization_config()))
    gm(*inputs)
    gm = convert_pt2e(gm)
    for n in gm.graph.nodes:
        if n.target == torch.ops.aten.conv2d.default:
            defaults = (None, [1, 1], [0, 0], [1, 1], 1)
            x, w, b, stride, padding, dilation, groups = (
                tuple(n.args) + defaults[len(n.args) - 2:])
            n.target = torch.ops.aten.convolution.default
            n.args = (x, w, b, stride, padding, dilation, False, [0, 0], groups)
    gm.recompile()
    expected = gm(*inputs)
    output_dq = gm.graph.output_node().args[0][0]  # the dequantize of the conv's output
    assert "dequantize_per_tensor" in str(output_dq.target)
    scale = float(output_dq.args[1])
    reference_representation_rewrite(gm)
    assert _int_linears(gm) == 1
    assert not [t for t in _targets(gm) if t.startswith("torchquant.")]
    out = gm(*inputs)
    assert (out - expected).abs().max() <= scale * 1.001


def test_max_pool_pattern():
    """torchao's max-pool pattern (``max_pool2d_with_indices`` -> getitem 0, which torch.export
    no longer emits) between int8 per-tensor dq / q: an integer max pool; with the output
    sharing the input's qparams it is exact."""
    from torchquant.quantization import observer as tq_obs
    from torchquant.quantization.pt2e.reference_representation import (
        reference_representation_rewrite)
    from torchquant.quantization.quantizer import (QuantizationAnnotation, QuantizationSpec,
                                                   Quantizer, SharedQuantizationSpec)

    act = QuantizationSpec(dtype=torch.int8, quant_min=-128, quant_max=127,
                           qscheme=torch.per_tensor_affine,
                           observer_or_fake_quant_ctr=tq_obs.MinMaxObserver)

    class PoolQuantizer(Quantizer):
        def annotate(self, gm):
            for n in gm.graph.nodes:
                if n.target == torch.ops.aten.max_pool2d.default:
                    n.meta["quantization_annotation"] = QuantizationAnnotation(
                        input_qspec_map={n.args[0]: act},
                        output_qspec=SharedQuantizationSpec((n.args[0], n)), _annotated=True)
            return gm

        def validate(self, gm):
            pass

    torch.manual_seed(0)
    inputs = (torch.randn(2, 3, 8, 8),)
    gm = prepare_pt2e(torch.export.export(nn.MaxPool2d(2).eval(), inputs).module(),
                      PoolQuantizer())
    gm(*inputs)
    gm = convert_pt2e(gm)
    for n in list(gm.graph.nodes):
        if n.target == torch.ops.aten.max_pool2d.default:
            with gm.graph.inserting_before(n):
                pooled = gm.graph.call_function(torch.ops.aten.max_pool2d_with_indices.default,
                                                n.args)
                first = gm.graph.call_function(operator.getitem, (pooled, 0))
            n.replace_all_uses_with(first)
            gm.graph.erase_node(n)
    gm.recompile()
    expected = gm(*inputs)
    reference_representation_rewrite(gm)
    assert not [t for t in _targets(gm) if t.startswith("torchquant.")]
    pools = [n for n in gm.graph.nodes if n.target == torch.ops.aten.max_pool2d_with_indices.default]
    assert len(pools) == 1 and pools[0].args[0].target == torch.ops.aten.sub.Tensor
    assert torch.equal(gm(*inputs), expected)
