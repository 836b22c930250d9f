"""Short op sequences through FX prepare / convert, torchquant beside torch.ao: the converted
models' outputs are bit-exact and their state dict keys equal.  The sequences come from a
randomized sweep that found torchquant running ops on quantized tensors where torch.ao runs them
in float (``torch.relu``, ``.flatten()``) or the reverse (``ChannelShuffle``): each such
difference is a requantization, one step off at places."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torch.ao.quantization as ao
import torch.ao.quantization.quantize_fx as ao_fx

from torchquant.quantization import quantize_fx
from torchquant.quantization.qconfig import get_default_qconfig_mapping

_C = 4


def _apply(op: str, x: torch.Tensor, module: nn.Module | None) -> torch.Tensor:
    if module is not None:
        return module(x)
    return {
        "F.relu": F.relu, "torch.relu": torch.relu, ".relu": lambda t: t.relu(),
        "sigmoid": torch.sigmoid, "tanh": torch.tanh, "hardswish": F.hardswish,
        "hardsigmoid": F.hardsigmoid, "hardtanh": F.hardtanh, "relu6": F.relu6,
        "clamp": lambda t: torch.clamp(t, -0.5, 0.5), "add_relu_self": lambda t: t + torch.relu(t),
        "mul_self": lambda t: t * t, "cat": lambda t: torch.cat([t[:, :2], t[:, 2:]], 1),
        "add_scalar": lambda t: t + 0.5, "mul_scalar": lambda t: t * 1.5,
        "leaky": lambda t: F.leaky_relu(t, 0.1), "elu": F.elu,
        "interpolate": lambda t: F.interpolate(t, scale_factor=1.0),
        "contiguous": lambda t: t.contiguous(), "channel_shuffle": lambda t: torch.channel_shuffle(t, 2),
        "mean_keep": lambda t: t - t.mean((2, 3), keepdim=True),
        ".flatten": lambda t: t.flatten(1), "torch.flatten": lambda t: torch.flatten(t, 1),
        "reshape": lambda t: t.reshape(t.shape[0], -1),
        "adaptive": lambda t: F.adaptive_avg_pool2d(t, 1).flatten(1),
        "softmax": lambda t: torch.softmax(t, -1),
        "unsqueeze_squeeze": lambda t: t.unsqueeze(1).squeeze(1),
    }[op](x)


class _FunctionalLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(_C, _C) * 0.3)

    def forward(self, x):
        return F.linear(x, self.weight)


_MODULES = {"conv": lambda: nn.Conv2d(_C, _C, 3, padding=1), "bn": lambda: nn.BatchNorm2d(_C),
            "ReLU": nn.ReLU, "maxpool": lambda: nn.MaxPool2d(3, 1, 1),
            "avgpool": lambda: nn.AvgPool2d(3, 1, 1), "ChannelShuffle": lambda: nn.ChannelShuffle(2),
            "layernorm": lambda: nn.LayerNorm(_C * 16), "linear": lambda: nn.Linear(_C * 16, _C * 16),
            "functional_linear": _FunctionalLinear}


class _Sequence(nn.Module):
    def __init__(self, ops: list[str]):
        super().__init__()
        self.ops = ops
        self.pre = nn.Conv2d(3, _C, 3, padding=1)
        self.layers = nn.ModuleDict({str(i): _MODULES[op]() for i, op in enumerate(ops)
                                     if op in _MODULES})
        self.head = nn.Linear(_C if {"adaptive", "functional_linear"} & set(ops) else _C * 16, 5)

    def forward(self, x):
        x = self.pre(x)
        for i, op in enumerate(self.ops):
            x = _apply(op, x, self.layers[str(i)] if str(i) in self.layers else None)
        return self.head(x)


@pytest.mark.parametrize("ops", [
    ["conv", "torch.relu", ".flatten"],
    ["sigmoid", ".flatten", "torch.relu"],
    ["bn", "ChannelShuffle", "add_scalar", "ReLU", "torch.flatten"],
    ["channel_shuffle", "relu6", "reshape", "layernorm"],
    ["cat", "cat", "avgpool", "reshape", "unsqueeze_squeeze"],
    ["maxpool", "clamp", ".flatten", "torch.relu"],
    ["hardsigmoid", ".relu", "interpolate", "torch.flatten", "softmax"],
    ["leaky", "conv", "leaky", "torch.flatten", "linear", "layernorm"],
    ["add_relu_self", "hardsigmoid", "interpolate", "torch.relu", ".flatten"],
    ["mean_keep", "mul_scalar", "mean_keep", "tanh", "adaptive"],
    ["elu", "hardswish", "mul_self", "contiguous", "torch.flatten", "softmax"],
    # a reuse-input qconfig (torch.ao's for reshape): the output's observer node calls the
    # input's observer (the state dict's buffers were numbered one apart)
    ["elu", "mul_self", "reshape", "torch.relu"],
])
def test_outputs_and_state_dict_keys_are_torch_aos(ops):
    torch.manual_seed(0)
    model = _Sequence(ops).eval()
    x = (torch.randn(2, 3, 4, 4),)
    calibration = [torch.randn(2, 3, 4, 4) * 2 for _ in range(2)]
    outputs, keys = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fx, mapping in ((quantize_fx, get_default_qconfig_mapping("x86")),
                            (ao_fx, ao.get_default_qconfig_mapping("x86"))):
            prepared = fx.prepare_fx(copy.deepcopy(model), mapping, x)
            for batch in calibration:
                prepared(batch)
            converted = fx.convert_fx(prepared)
            outputs.append(converted(*x))
            keys.append(sorted(converted.state_dict()))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
    assert keys[0] == keys[1]


@pytest.mark.parametrize("ops", [
    ["cat", "reshape"],                                # reuse-input observer shared in QAT
    ["avgpool", "adaptive", "functional_linear"],  # weight observed again at convert
    ["conv", "bn", "ReLU", ".flatten", "linear"],
])
def test_qat_then_convert_is_torch_aos(ops):
    """QAT: three SGD steps through FX prepare_qat_fx, then convert, beside torch.ao: the
    fake quants' moving averages see what torch.ao's see (a reuse-input op's output through the
    input's fake quant; functional weights observed once more at convert), so the converted
    outputs are torch.ao's bit for bit."""
    from torchquant.quantization.qconfig_mapping import get_default_qat_qconfig_mapping
    torch.manual_seed(0)
    model = _Sequence(ops).train()
    x = (torch.randn(2, 3, 4, 4),)
    data = [torch.randn(4, 3, 4, 4) for _ in range(3)]
    outputs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fx, mapping in ((quantize_fx, get_default_qat_qconfig_mapping("x86")),
                            (ao_fx, ao.get_default_qat_qconfig_mapping("x86"))):
            prepared = fx.prepare_qat_fx(copy.deepcopy(model), mapping, x)
            optimizer = torch.optim.SGD(prepared.parameters(), lr=0.01)
            for batch in data:
                optimizer.zero_grad()
                prepared(batch).sum().backward()
                optimizer.step()
            outputs.append(fx.convert_fx(prepared.eval())(*x))
    torch.testing.assert_close(outputs[0], outputs[1], rtol=0, atol=0)
