"""convert_fx lowers the native / x86 backend config's "default" ops as torch.ao's FX does
(torch 2.13's special-pattern lowering): normalization, activation, dropout, softmax, PReLU,
standalone BatchNorm (+ReLU) and ConvTranspose modules become torchquant quantized modules; the
functional hardswish / elu / leaky_relu / layer_norm / instance_norm / dropout become
torchquant's QTensor functions; GroupNorm, silu and gelu stay float between dequantize and
quantize (as in torch).  Activation observers use reduce_range (x86 default qconfig), so the
outputs are compared bit-exactly.
"""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx

import torchquant.nn.quantized.functional as qF
from torchquant.nn.quantized import _normalization
from torchquant.quantization import quantize_fx
from torchquant.quantization.qconfig import (get_default_qat_qconfig_mapping,
                                             get_default_qconfig_mapping)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class DefaultOps(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.gn = nn.GroupNorm(2, 4)
        self.inorm = nn.InstanceNorm2d(4)
        self.hs = nn.Hardswish()
        self.elu = nn.ELU()
        self.lrelu = nn.LeakyReLU(0.1)
        self.ln = nn.LayerNorm([4, 6, 6])
        self.drop = nn.Dropout()
        self.prelu = nn.PReLU()
        self.sm = nn.Softmax(dim=1)
        self.bn = nn.BatchNorm2d(4)
        self.bn_relu = nn.BatchNorm2d(4)
        self.relu = nn.ReLU()
        self.bn3 = nn.BatchNorm3d(4)
        self.deconv = nn.ConvTranspose2d(4, 4, 2, stride=2)
        self.sig = nn.Sigmoid()
        self.tanh = nn.Tanh()
        self.conv2 = nn.Conv2d(4, 4, 1)

    def forward(self, x):
        x = self.conv(x)
        x = self.inorm(self.gn(x))
        x = self.lrelu(self.elu(self.hs(x)))
        x = self.sm(self.prelu(self.drop(self.ln(x))))
        x = self.bn(torch.add(x, x))
        x = self.relu(self.bn_relu(x))
        x = self.bn3(x.unsqueeze(2)).squeeze(2)
        y = self.sig(x) + self.tanh(x)
        z = F.hardswish(x) + F.elu(x) + F.leaky_relu(x) + F.layer_norm(x, [6])
        z = z + F.instance_norm(x) + F.dropout(x, training=False) + F.silu(x) + F.gelu(x)
        z = z + F.group_norm(x, 2)
        return self.conv2(self.deconv(y + z))


def _prepared_pair():
    torch.manual_seed(0)
    model = DefaultOps().eval()
    for bn in (model.bn, model.bn_relu, model.bn3):
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 1.5)
    example = (torch.randn(2, 3, 6, 6),)
    ours = quantize_fx.prepare_fx(model, get_default_qconfig_mapping("x86"), example)
    theirs = ao_fx.prepare_fx(copy.deepcopy(model), ao.get_default_qconfig_mapping("x86"),
                              example)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        ours(x)
        theirs(x)
    return model, ours, theirs


def _module_types(gm):
    return {name: type(m).__name__ for name, m in gm.named_children()}


def test_default_ops_lower_to_the_same_module_types_bit_exactly():
    model, ours, theirs = _prepared_pair()
    q_ours, q_theirs = quantize_fx.convert_fx(ours), ao_fx.convert_fx(theirs)
    assert _module_types(q_ours) == _module_types(q_theirs)
    lowered = ["conv", "inorm", "hs", "elu", "lrelu", "ln", "drop", "prelu", "sm", "bn",
               "bn_relu", "bn3", "deconv", "conv2"]
    for name in lowered:
        assert type(getattr(q_ours, name)).__module__.startswith("torchquant.nn"), name
    assert type(q_ours.bn_relu).__name__ == "BNReLU2d"
    assert type(q_ours.gn) is nn.GroupNorm                       # torch keeps it float
    functions = {n.target for n in q_ours.graph.nodes if n.op == "call_function"}
    assert {qF.hardswish, qF.elu, qF.leaky_relu, _normalization.layer_norm,
            _normalization.instance_norm} <= functions
    assert not functions & {F.hardswish, F.elu, F.leaky_relu, F.layer_norm, F.instance_norm,
                            F.dropout}
    assert {F.silu, F.gelu, F.group_norm} <= functions           # float, as in torch
    torch.manual_seed(1)
    for _ in range(3):
        x = torch.randn(2, 3, 6, 6)
        torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)
    # (no float-accuracy bar here: a chain of 20 requantized ops, softmax among them, is a
    # coverage model; torch's converted model is as far from float as ours)


def test_default_ops_model_exports():
    _, ours, _ = _prepared_pair()
    q = quantize_fx.convert_fx(ours)
    x = torch.randn(2, 3, 6, 6)
    exported = torch.export.export(q, (x,))
    torch.testing.assert_close(exported.module()(x), q(x), rtol=0, atol=0)


def test_default_ops_through_qat_match_torch():
    """prepare_qat_fx -> train-mode forward -> convert_fx on the same model (dropout p=0 so
    both sides see the same values): fake-quantized outputs, module types and converted
    outputs equal torch's."""
    torch.manual_seed(0)
    model = DefaultOps().train()
    model.drop.p = 0.0
    example = (torch.randn(2, 3, 6, 6),)
    ours = quantize_fx.prepare_qat_fx(model, get_default_qat_qconfig_mapping("x86"), example)
    theirs = ao_fx.prepare_qat_fx(copy.deepcopy(model), ao.get_default_qat_qconfig_mapping("x86"),
                                  example)
    for _ in range(2):
        x = torch.randn(2, 3, 6, 6)
        torch.testing.assert_close(ours(x), theirs(x), rtol=0, atol=0)
    q_ours, q_theirs = quantize_fx.convert_fx(ours.eval()), ao_fx.convert_fx(theirs.eval())
    assert _module_types(q_ours) == _module_types(q_theirs)
    x = torch.randn(2, 3, 6, 6)
    torch.testing.assert_close(q_ours(x), q_theirs(x), rtol=0, atol=0)
