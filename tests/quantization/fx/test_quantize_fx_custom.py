"""PrepareCustomConfig's custom modules (float -> observed -> quantized class swaps) and
quantized graph inputs / outputs (input / output_quantized_indexes) against torch.ao's FX
(torch 2.13): same observer placement, same module types, bit-exact outputs (x86 default
qconfig: reduce_range activations)."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx
from torch.ao.quantization.fx import custom_config as ao_cc

import torchquant
from torchquant.tensor import QTensor
from torchquant.quantization import quantize_fx
from torchquant.quantization.fx import custom_config as tq_cc
from torchquant.quantization.qconfig import get_default_qconfig_mapping


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _placement(gm):
    return [(str(n.target), n.args[0].name, sorted(u.name for u in n.users))
            for n in gm.graph.nodes
            if n.op == "call_module" and str(n.target).startswith("activation_post_process")]


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.fc1(x), self.fc2(y) + x


def test_input_and_output_quantized_indexes_match_torch():
    torch.manual_seed(0)
    model = TwoInputs().eval()
    example = (torch.randn(2, 4), torch.randn(2, 4))
    ours = quantize_fx.prepare_fx(
        model, get_default_qconfig_mapping("x86"), example,
        prepare_custom_config=tq_cc.PrepareCustomConfig().set_input_quantized_indexes([0])
        .set_output_quantized_indexes([0]))
    theirs = ao_fx.prepare_fx(
        copy.deepcopy(model), ao.get_default_qconfig_mapping("x86"), example,
        prepare_custom_config=ao_cc.PrepareCustomConfig().set_input_quantized_indexes([0])
        .set_output_quantized_indexes([0]))
    # x (quantized by the caller) is never observed
    assert _placement(ours) == _placement(theirs)
    assert all(name != "x" for _, name, _ in _placement(ours))
    for _ in range(3):
        batch = (torch.randn(2, 4), torch.randn(2, 4))
        ours(*batch)
        theirs(*batch)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    x, y = torch.randn(2, 4), torch.randn(2, 4)
    out_ours = q_ours(torchquant.quantize_per_tensor(x, 0.02, 64, torchquant.quint8), y)
    out_theirs = q_theirs(torch.quantize_per_tensor(x, 0.02, 64, torch.quint8), y)
    assert isinstance(out_ours[0], QTensor) and not isinstance(out_ours[1], QTensor)
    assert out_ours[0].q_scale() == out_theirs[0].q_scale()
    torch.testing.assert_close(out_ours[0].dequantize(), out_theirs[0].dequantize(),
                               rtol=0, atol=0)
    torch.testing.assert_close(out_ours[1], out_theirs[1], rtol=0, atol=0)
    # the reference model takes and returns the same quantized values
    ref = quantize_fx.convert_to_reference_fx(ours)
    out_ref = ref(torchquant.quantize_per_tensor(x, 0.02, 64, torchquant.quint8), y)
    assert isinstance(out_ref[0], QTensor)
    torch.testing.assert_close(out_ref[0].dequantize(), out_ours[0].dequantize(), rtol=0,
                               atol=0)


class Custom(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class ObservedCustom(nn.Module):
    def __init__(self, lin):
        super().__init__()
        self.lin = lin

    def forward(self, x):
        return self.lin(x)

    @classmethod
    def from_float(cls, float_module):
        observed = cls(float_module.lin)
        observed.qconfig = float_module.qconfig
        return observed


def _quantized_custom(quantize):
    class QuantizedCustom(nn.Module):
        """Takes and returns a quantized tensor (its own fixed output qparams)."""

        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x):
            return quantize(self.lin(x.dequantize()), 0.05, 64)

        @classmethod
        def from_observed(cls, observed):
            return cls(observed.lin)

    return QuantizedCustom


class WithCustom(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.custom = Custom()
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.custom(self.fc1(x)))


def test_custom_module_swaps_match_torch():
    torch.manual_seed(0)
    model = WithCustom().eval()
    example = (torch.randn(2, 4),)
    ours_q = _quantized_custom(lambda v, s, z: torchquant.quantize_per_tensor(
        v, s, z, torchquant.quint8))
    theirs_q = _quantized_custom(lambda v, s, z: torch.quantize_per_tensor(v, s, z, torch.quint8))
    ours = quantize_fx.prepare_fx(
        model, get_default_qconfig_mapping("x86"), example,
        prepare_custom_config=tq_cc.PrepareCustomConfig().set_float_to_observed_mapping(
            Custom, ObservedCustom))
    theirs = ao_fx.prepare_fx(
        copy.deepcopy(model), ao.get_default_qconfig_mapping("x86"), example,
        prepare_custom_config=ao_cc.PrepareCustomConfig().set_float_to_observed_mapping(
            Custom, ObservedCustom))
    assert type(ours.custom) is ObservedCustom                  # a leaf, swapped at prepare
    assert _placement(ours) == _placement(theirs)
    for _ in range(3):
        x = torch.randn(2, 4)
        ours(x)
        theirs(x)
    q_ours = quantize_fx.convert_fx(
        ours, convert_custom_config=tq_cc.ConvertCustomConfig()
        .set_observed_to_quantized_mapping(ObservedCustom, ours_q))
    q_theirs = ao_fx.convert_fx(
        theirs, convert_custom_config=ao_cc.ConvertCustomConfig()
        .set_observed_to_quantized_mapping(ObservedCustom, theirs_q))
    assert type(q_ours.custom) is ours_q
    assert [type(m).__name__ for m in q_ours.children()] == \
        [type(m).__name__ for m in q_theirs.children()]
    x = torch.randn(2, 4)
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)


def test_custom_module_without_quantized_mapping_is_a_clear_error():
    model = WithCustom().eval()
    prepared = quantize_fx.prepare_fx(
        model, get_default_qconfig_mapping("x86"), (torch.randn(2, 4),),
        prepare_custom_config=tq_cc.PrepareCustomConfig().set_float_to_observed_mapping(
            Custom, ObservedCustom))
    prepared(torch.randn(2, 4))
    with pytest.raises(ValueError, match="set_observed_to_quantized_mapping"):
        quantize_fx.convert_fx(prepared)


class Sub(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.lin2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin2(torch.relu(self.lin(x)))


class WithStandalone(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.sub = Sub()
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x):
        return self.fc2(self.sub(self.fc1(x)))


def _module_types(gm):
    return {n: type(m).__name__ for n, m in gm.named_modules() if "_packed_params" not in n}


@pytest.mark.parametrize("quantized_io", [False, True])
@pytest.mark.parametrize("by", ["name", "class"])
def test_standalone_modules_match_torch(by, quantized_io):
    """The standalone module is prepared / converted as a GraphModule of its own; the parent
    observes only the inputs it takes quantized and never its output (torch's rules: with a
    float standalone output, fc2 stays a reference Linear in both)."""
    torch.manual_seed(0)
    model = WithStandalone().eval()
    example = (torch.randn(2, 4),)

    def configs(cc):
        child = None
        if quantized_io:
            child = cc.PrepareCustomConfig().set_input_quantized_indexes([0]) \
                .set_output_quantized_indexes([0])
        if by == "name":
            return cc.PrepareCustomConfig().set_standalone_module_name("sub", None, example,
                                                                       child, None)
        return cc.PrepareCustomConfig().set_standalone_module_class(Sub, None, example, child,
                                                                    None)

    ours = quantize_fx.prepare_fx(model, get_default_qconfig_mapping("x86"), example,
                                  prepare_custom_config=configs(tq_cc))
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), ao.get_default_qconfig_mapping("x86"),
                              example, prepare_custom_config=configs(ao_cc))
    assert isinstance(ours.sub, torch.fx.GraphModule)
    assert _placement(ours) == _placement(theirs)
    assert _placement(ours.sub) == _placement(theirs.sub)
    for _ in range(3):
        x = torch.randn(2, 4)
        ours(x)
        theirs(x)
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    assert _module_types(q_ours) == _module_types(q_theirs)
    x = torch.randn(2, 4)
    # One output step (~0.007) of tolerance: on this AVX2 machine torch's whole converted model
    # differed by one step in one element from torch's own converted layers called one by one
    # on the same quantized input (and those agree with ours bit for bit); the cause inside
    # torch's kernels (see the int8 GEMM notes in tests/conftest.py) was not pinned down.
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0.01)
    # (torch 2.13's own reference model of a standalone module fails to run; ours runs)
    ref = quantize_fx.convert_to_reference_fx(ours)
    assert ref(x).shape == (2, 4)
