"""Small float models for the quantizer tests, each with example inputs."""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


class ConvBnRelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, bias=False)
        self.bn2 = nn.BatchNorm2d(8)

    def forward(self, x):
        return self.bn2(self.conv2(self.relu(self.bn(self.conv(x)))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(32, 32)
        self.gelu = nn.GELU()
        self.fc3 = nn.Linear(32, 8, bias=False)
        self.tanh = nn.Tanh()
        self.fc4 = nn.Linear(8, 4)

    def forward(self, x):
        return self.fc4(self.tanh(self.fc3(self.gelu(self.fc2(self.relu(self.fc1(x)))))))


class AddMulCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 1)
        self.conv2 = nn.Conv2d(3, 4, 1)
        self.conv3 = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        a, b = self.conv1(x), self.conv2(x)
        s = F.relu(a + b)
        m = a * b
        mr = torch.relu(s * m)
        c = torch.cat([s, mr], dim=1)
        y = self.conv3(c)
        return y + 1.0, y * 0.5, torch.cat([y, y], 1)


class ResidualBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.conv3 = nn.Conv2d(8, 8, 3, padding=1)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = self.relu1(self.bn1(self.conv1(x)))
        y = self.pool(y)
        z = self.relu(self.bn2(self.conv2(y)) + y)
        z = self.conv3(z) + z
        return self.fc(torch.flatten(self.avg(z), 1))


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)
        self.k = nn.Linear(16, 16)
        self.v = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        h = self.norm(x)
        q, k, v = self.q(h), self.k(h), self.v(h)
        att = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * 0.25, dim=-1)
        o = torch.matmul(att, v)
        o = self.out(o) + x
        return F.relu(o) * o


class Pooling(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 3)
        self.conv_b = nn.Conv2d(3, 6, 3)
        self.hswish = nn.Hardswish()
        self.conv_c = nn.Conv2d(3, 6, 3)
        self.relu6 = nn.ReLU6()
        self.conv_d = nn.Conv2d(3, 6, 3)
        self.silu = nn.SiLU()
        self.conv_e = nn.Conv2d(3, 6, 3)
        self.htanh = nn.Hardtanh()
        self.maxpool = nn.MaxPool2d(2)
        self.avgpool = nn.AvgPool2d(2)
        self.adapt = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(24, 5)

    def forward(self, x):
        a = self.maxpool(self.conv(x))
        b = self.avgpool(self.hswish(self.conv_b(x)))
        c = self.maxpool(self.relu6(self.conv_c(x)))
        d = self.avgpool(self.silu(self.conv_d(x)))
        e = self.htanh(self.conv_e(x))
        cat = torch.cat([a, b, c, d], dim=1)
        flat = torch.flatten(self.adapt(cat), 1)
        return self.fc(flat), e.mean()


class Conv1dTranspose(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(3, 4, 3)
        self.relu = nn.ReLU()
        self.bn1d = nn.BatchNorm1d(4)
        self.convt = nn.ConvTranspose2d(3, 4, 3)
        self.bnt = nn.BatchNorm2d(4)
        self.convt2 = nn.ConvTranspose2d(4, 4, 3)
        self.conv1d_b = nn.Conv1d(4, 4, 1)
        self.relu2 = nn.ReLU()  # one ReLU module used twice makes a two-output partition

    def forward(self, x1, x2):
        y1 = self.relu(self.conv1d(x1))
        y1 = self.bn1d(self.conv1d_b(y1))
        y2 = self.relu2(self.bnt(self.convt(x2)))
        y2 = torch.relu(self.convt2(y2))
        return y1, y2


class LinearBinary(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 8)
        self.fc2 = nn.Linear(8, 8)
        self.leaky = nn.LeakyReLU()
        self.fc3 = nn.Linear(8, 8)
        self.relu = nn.ReLU()

    def forward(self, x):
        y = self.fc1(x) + x
        z = self.relu(self.fc2(y) + y)
        return self.leaky(self.fc3(z)), z.flatten(0)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(4, 4)

    def forward(self, x):
        y = self.relu(self.conv(x))
        return self.fc(y.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


class Nested(nn.Module):
    """Submodules for module-name / module-type configs: ``sub`` and ``other`` are Blocks."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 4, 1)
        self.sub = Block()
        self.other = Block()
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = self.other(self.sub(self.stem(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))


class GRUHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(4, 4, batch_first=True)
        self.fc = nn.Linear(4, 4)

    def forward(self, x, h):
        y, h_out = self.gru(x, h)
        return self.fc(y), h_out


MODELS = {
    "conv_bn_relu": (ConvBnRelu, lambda: (torch.randn(2, 3, 8, 8),)),
    "mlp": (MLP, lambda: (torch.randn(4, 16),)),
    "add_mul_cat": (AddMulCat, lambda: (torch.randn(2, 3, 6, 6),)),
    "residual": (ResidualBlock, lambda: (torch.randn(2, 3, 8, 8),)),
    "attention": (Attention, lambda: (torch.randn(2, 5, 16),)),
    "pooling": (Pooling, lambda: (torch.randn(2, 3, 10, 10),)),
    "conv1d_transpose": (Conv1dTranspose, lambda: (torch.randn(2, 3, 9), torch.randn(2, 3, 6, 6))),
    "linear_binary": (LinearBinary, lambda: (torch.randn(3, 8),)),
    "nested": (Nested, lambda: (torch.randn(2, 3, 6, 6),)),
}


EXTRA_MODELS = {
    "gru": (GRUHead, lambda: (torch.randn(2, 3, 4), torch.randn(1, 2, 4))),
}


def export_twice(name: str, train: bool = False):
    """Two independent exports (one per quantizer) of one seeded model."""
    cls, make_inputs = {**MODELS, **EXTRA_MODELS}[name]
    torch.manual_seed(0)
    model = cls().train(train)
    inputs = make_inputs()
    return (torch.export.export(model, inputs).module(),
            torch.export.export(model, inputs).module())
