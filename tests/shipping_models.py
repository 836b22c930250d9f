"""Small copies of the four models the ways out of torchquant are checked on (AOTInductor
packages, ONNX): a ResNet-18-shaped CNN, a MobileNetV2-shaped CNN, a MiniLM-like encoder
quantized dynamically and an LSTM; with the eager / FX / PT2E conversions that apply to each.

Tiny widths: every package is an inductor compile, whose time grows with the graph.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

import torchquant.quantization as tq
from torchquant.examples.resnet import ResNet18, randomize_bn

IMAGE = (3, 32, 32)
TOKENS, HIDDEN = 8, 32
# torch.export unrolls the LSTM over its steps, and every step is code the package compiles:
# three carry the state through two updates per layer at about half five steps' compile time
LSTM_STEPS, LSTM_FEATURES = 3, 16


def resnet() -> nn.Module:
    """ResNet-18's layout (BasicBlocks, residual add+ReLU, max / adaptive average pools,
    Linear head) at width 8, with QuantStub / DeQuantStub for eager quantization."""
    torch.manual_seed(0)
    return randomize_bn(ResNet18(num_classes=10, width=8)).eval()


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden), nn.ReLU6()]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2Shaped(nn.Module):
    """torchvision's MobileNetV2 layout (inverted residuals: 1x1 expand, depthwise 3x3, 1x1
    project; ReLU6; residual adds; global pool; Linear head) with fewer, narrower blocks.
    Its residual adds are plain ``+``, so it quantizes through FX and PT2E, not eager mode."""

    SETTINGS = [(1, 8, 1, 1), (4, 16, 2, 2), (4, 24, 2, 2)]

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        cin = 8
        layers: list[nn.Module] = [nn.Conv2d(3, cin, 3, 2, 1, bias=False), nn.BatchNorm2d(cin),
                                   nn.ReLU6()]
        for expand, cout, repeat, stride in self.SETTINGS:
            for i in range(repeat):
                layers.append(_InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers += [nn.Conv2d(cin, 64, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU6()]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(64, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


def mobilenet() -> nn.Module:
    torch.manual_seed(0)
    return randomize_bn(MobileNetV2Shaped()).eval()


class MiniLMShaped(nn.Module):
    """One BERT encoder layer (MiniLM's: Q / K / V / output Linears, softmax attention, GELU
    feed-forward, post-LayerNorms) on hidden states ``[batch, tokens, hidden]``."""

    def __init__(self, hidden: int = HIDDEN, heads: int = 2, ff: int = 64) -> None:
        super().__init__()
        self.query, self.key, self.value, self.out = (nn.Linear(hidden, hidden)
                                                      for _ in range(4))
        self.norm1, self.norm2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.ff1, self.ff2 = nn.Linear(hidden, ff), nn.Linear(ff, hidden)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.heads

        def split(y: torch.Tensor) -> torch.Tensor:
            return y.view(b, t, h, d // h).transpose(1, 2)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        attention = torch.softmax(q @ k.transpose(-1, -2) / (d // h) ** 0.5, dim=-1) @ v
        x = self.norm1(x + self.out(attention.transpose(1, 2).reshape(b, t, d)))
        return self.norm2(x + self.ff2(nn.functional.gelu(self.ff1(x))))


def minilm() -> nn.Module:
    torch.manual_seed(0)
    return MiniLMShaped().eval()


class LSTMModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(LSTM_FEATURES, LSTM_FEATURES, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lstm(x)[0]


def lstm() -> nn.Module:
    torch.manual_seed(0)
    return LSTMModel().eval()


class ActivationsNet(nn.Module):
    """MobileNetV3-style parts: hardswish, a squeeze-excite gate (hardsigmoid, mul), a
    concatenation of branches with other qparams, average pooling, sigmoid / tanh / ELU /
    leaky ReLU and a scalar add."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.act = nn.Hardswish()
        self.squeeze, self.excite = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.gate = nn.Hardsigmoid()
        self.left, self.right = nn.Conv2d(16, 8, 3, padding=1), nn.Conv2d(16, 12, 1)
        self.sigmoid, self.tanh, self.elu = nn.Sigmoid(), nn.Tanh(), nn.ELU()
        self.leaky = nn.LeakyReLU(0.1)
        self.pool = nn.AvgPool2d(3, stride=1, padding=1, count_include_pad=False)
        self.head = nn.Conv2d(20, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.stem(x))
        s = self.gate(self.excite(torch.relu(self.squeeze(x.mean((2, 3), keepdim=True)))))
        x = x * s
        y = torch.cat([self.sigmoid(self.left(x)), self.tanh(self.right(x))], 1)
        y = self.leaky(self.elu(self.head(self.pool(y))))
        return y + 0.25


def activations() -> nn.Module:
    torch.manual_seed(0)
    return ActivationsNet().eval()


def example(name: str, batch: int, seed: int = 1) -> tuple[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = {"resnet": IMAGE, "mobilenet": IMAGE, "activations": IMAGE, "minilm": (TOKENS, HIDDEN),
             "lstm": (LSTM_STEPS, LSTM_FEATURES)}[name]
    return (torch.randn(batch, *shape, generator=g),)


def _calibration(name: str) -> list[tuple[torch.Tensor]]:
    return [example(name, 4, seed) for seed in (10, 11)]


def eager_static(model: nn.Module, name: str) -> nn.Module:
    """Eager-mode static quantization (fuse, x86 qconfig, calibrate, convert)."""
    model = tq.fuse_modules(copy.deepcopy(model), model.fuse_patterns())
    model.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for batch in _calibration(name):
            model(*batch)
    return tq.convert(model)


def eager_dynamic(model: nn.Module, layers: set) -> nn.Module:
    return tq.quantize_dynamic(copy.deepcopy(model), {layer: tq.default_dynamic_qconfig
                                                      for layer in layers})


def fx_static(model: nn.Module, name: str) -> torch.fx.GraphModule:
    from torchquant.quantization.quantize_fx import convert_fx, prepare_fx
    prepared = prepare_fx(copy.deepcopy(model), tq.get_default_qconfig_mapping("x86"),
                          example(name, 2))
    with torch.no_grad():
        for batch in _calibration(name):
            prepared(*batch)
    return convert_fx(prepared)


def pt2e(model: nn.Module, name: str, dynamic: bool = False) -> torch.fx.GraphModule:
    """PT2E with the X86InductorQuantizer (static, or dynamic activations), exported with a
    dynamic batch."""
    from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
    from torchquant.quantization.quantizer.x86_inductor_quantizer import (
        X86InductorQuantizer, get_default_x86_inductor_quantization_config)
    ex = example(name, 2)
    exported = torch.export.export(copy.deepcopy(model), ex,
                                   dynamic_shapes=({0: torch.export.Dim.DYNAMIC},)).module()
    quantizer = X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    prepared = prepare_pt2e(exported, quantizer)
    with torch.no_grad():
        for batch in _calibration(name):
            prepared(*batch)
    return convert_pt2e(prepared)
