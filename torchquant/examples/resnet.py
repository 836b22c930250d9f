"""A ResNet-18-shaped CNN written for eager quantization (residual adds via FloatFunctional).

No torchvision needed.  ``ops`` picks the package that provides QuantStub / DeQuantStub /
FloatFunctional, so the same architecture runs through torchquant or torch.ao (the oracle).
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Optional

import torch
from torch import nn

from ..nn.quantized import FloatFunctional
from ..quantization import DeQuantStub, QuantStub


def torchquant_ops() -> SimpleNamespace:
    return SimpleNamespace(QuantStub=QuantStub, DeQuantStub=DeQuantStub,
                           FloatFunctional=FloatFunctional)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, ops: SimpleNamespace):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample: Optional[nn.Sequential] = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))
        self.add_relu = ops.FloatFunctional()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.add_relu.add_relu(out, identity)

    def fuse_patterns(self, prefix: str) -> list[list[str]]:
        pats = [[f"{prefix}conv1", f"{prefix}bn1", f"{prefix}relu1"], [f"{prefix}conv2", f"{prefix}bn2"]]
        if self.downsample is not None:
            pats.append([f"{prefix}downsample.0", f"{prefix}downsample.1"])
        return pats


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000, width: int = 64,
                 ops: Optional[SimpleNamespace] = None):
        super().__init__()
        ops = ops or torchquant_ops()
        self.quant = ops.QuantStub()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        widths = [width, width * 2, width * 4, width * 8]
        blocks, cin = [], width
        for i, w in enumerate(widths):
            stride = 1 if i == 0 else 2
            blocks.append(nn.Sequential(BasicBlock(cin, w, stride, ops), BasicBlock(w, w, 1, ops)))
            cin = w
        self.layer1, self.layer2, self.layer3, self.layer4 = blocks
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(cin, num_classes)
        self.dequant = ops.DeQuantStub()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(self.quant(x)))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.dequant(self.fc(x))

    def fuse_patterns(self) -> list[list[str]]:
        pats = [["conv1", "bn1", "relu"]]
        for name in ("layer1", "layer2", "layer3", "layer4"):
            for j, block in enumerate(getattr(self, name)):
                pats += block.fuse_patterns(f"{name}.{j}.")
        return pats


def randomize_bn(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give BatchNorms non-trivial statistics so folding is exercised (untrained weights)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=g) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.weight.data.copy_(torch.rand(n, generator=g) * 0.5 + 0.75)
            m.bias.data.copy_(torch.randn(n, generator=g) * 0.1)
    return model
