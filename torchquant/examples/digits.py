"""A small CNN on scikit-learn's bundled digits (8x8 images, 1797 samples): the demo's model.

Training takes seconds with a fixed seed; the trained float weights are cached under the user
cache folder (``$XDG_CACHE_HOME/torchquant`` or ``~/.cache/torchquant``) so later runs skip it.
The quantization recipes here are the plain eager-mode ones a torch.ao user writes, with
torchquant names; the test suite runs the same recipes through torch.ao as the oracle.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from .. import quantization as _torchquant_quantization
from ..nn.intrinsic.qat import freeze_bn_stats as _freeze_bn_stats
from ..quantization import DeQuantStub, QuantStub

CACHE_VERSION = 1
SEED = 0


class DigitsCNN(nn.Module):
    """conv-bn-relu x2, max-pool, two linears; quant/dequant stubs at the edges.

    ``stubs`` builds the stubs from the given package (torchquant's or torch.ao's) so the same
    architecture runs through either workflow.
    """

    def __init__(self, stubs: Optional[tuple[Callable[[], nn.Module], Callable[[], nn.Module]]] = None):
        super().__init__()
        if stubs is None:
            stubs = (QuantStub, DeQuantStub)
        self.quant = stubs[0]()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(32)
        self.relu2 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.relu3 = nn.ReLU()
        self.fc2 = nn.Linear(64, 10)
        self.dequant = stubs[1]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.quant(x)
        x = self.relu1(self.bn1(self.conv1(x)))
        x = self.pool(self.relu2(self.bn2(self.conv2(x))))
        x = torch.flatten(x, 1)
        x = self.fc2(self.relu3(self.fc1(x)))
        return self.dequant(x)


FUSE_PATTERNS = [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"], ["fc1", "relu3"]]


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): a fixed 75/25 split, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SEED))
    split = int(0.75 * len(y))
    tr, te = perm[:split], perm[split:]
    return x[tr], y[tr], x[te], y[te]


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int, lr: float,
          seed: int = SEED) -> nn.Module:
    """Adam on mini-batches of 64 in a fixed order; returns the model in train mode."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=gen).split(64):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            opt.step()
    return model


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in percent (model in eval mode, no grad)."""
    model.eval()
    with torch.no_grad():
        return 100.0 * (model(x).argmax(1) == y).float().mean().item()


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "torchquant"


def trained_float_model(data=None, use_cache: bool = True) -> DigitsCNN:
    """The float model, trained once (20 epochs) and cached; deterministic for a given torch."""
    x_tr, y_tr, _, _ = data if data is not None else load_data()
    path = cache_dir() / f"digits_cnn_v{CACHE_VERSION}_torch{torch.__version__.split('+')[0]}.pt"
    model = DigitsCNN()
    if use_cache and path.exists():
        try:
            model.load_state_dict(torch.load(path, weights_only=True))
            return model.eval()
        except Exception:  # a stale or damaged cache file: retrain
            pass
    torch.manual_seed(SEED)
    model = DigitsCNN()
    train(model, x_tr, y_tr, epochs=20, lr=3e-3)
    if use_cache:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            torch.save(model.state_dict(), tmp)
            tmp.replace(path)
        except OSError:
            pass  # read-only home: just don't cache
    return model.eval()


def _lib(lib):
    return _torchquant_quantization if lib is None else lib


def static_ptq(float_model: nn.Module, calibration: torch.Tensor, backend: str = "x86",
               lib=None) -> nn.Module:
    """Eager static PTQ: fuse conv-bn-relu / linear-relu, backend qconfig (per-channel weights,
    histogram activations), calibrate, convert.  ``lib``: the quantization package to use
    (default torchquant.quantization; the tests pass torch.ao.quantization as the oracle)."""
    tq = _lib(lib)
    model = copy.deepcopy(float_model).eval()
    model = tq.fuse_modules(model, FUSE_PATTERNS)
    model.qconfig = tq.get_default_qconfig(backend)
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for batch in calibration.split(256):
            model(batch)
    return tq.convert(model)


def qat(float_model: nn.Module, x: torch.Tensor, y: torch.Tensor, epochs: int = 3,
        backend: str = "x86", lib=None, freeze_bn_stats: Optional[Callable] = None) -> nn.Module:
    """Eager QAT: fuse for QAT, backend QAT qconfig, fine-tune a few epochs at a low rate
    (BN statistics frozen for the last epoch), convert."""
    tq = _lib(lib)
    if freeze_bn_stats is None:
        freeze_bn_stats = _freeze_bn_stats
    model = copy.deepcopy(float_model).train()
    model = tq.fuse_modules_qat(model, FUSE_PATTERNS)
    model.qconfig = tq.get_default_qat_qconfig(backend)
    tq.prepare_qat(model, inplace=True)
    if epochs > 1:
        train(model, x, y, epochs=epochs - 1, lr=1e-4, seed=SEED + 1)
    model.apply(freeze_bn_stats)
    train(model, x, y, epochs=1, lr=1e-4, seed=SEED + 2)
    return tq.convert(model.eval())


def dynamic(float_model: nn.Module, lib=None) -> nn.Module:
    """Dynamic quantization of the Linear layers (convs stay float)."""
    tq = _lib(lib)
    return tq.quantize_dynamic(copy.deepcopy(float_model).eval(), {nn.Linear})
