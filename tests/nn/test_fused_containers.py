"""The fused float containers (``torchquant.nn.intrinsic``) accept and reject the same
arguments as torch 2.13's ``torch.ao.nn.intrinsic``: torch's argument names, the exact child
types (before parametrizations: a subclass such as a QAT conv is rejected, a parametrized conv
accepted), the same errors and messages, the unchecked ConvAdd2d / ConvAddReLU2d with their
single child, and the base ``_FusedModule`` as a plain Sequential."""
from collections import OrderedDict

import pytest
import torch
import torch.ao.nn.intrinsic as ao_nni
import torch.ao.nn.qat as ao_nnqat
import torch.ao.quantization as aoq
import torch.nn.utils.parametrize as parametrize
from torch import nn

import torchquant.nn.intrinsic as nni


class _SubConv(nn.Conv2d):
    pass


class _Identity(nn.Module):
    def forward(self, x):
        return x


def _parametrized_conv():
    conv = nn.Conv2d(1, 1, 1)
    parametrize.register_parametrization(conv, "weight", _Identity())
    return conv


def _qat_conv():
    conv = nn.Conv2d(1, 1, 1)
    conv.qconfig = aoq.get_default_qat_qconfig()
    return ao_nnqat.Conv2d.from_float(conv)


CASES = {
    "one-arg": lambda m: m.ConvReLU2d(nn.Conv2d(1, 1, 1)),
    "relu6": lambda m: m.ConvReLU2d(nn.Conv2d(1, 1, 1), nn.ReLU6()),
    "three-wrong": lambda m: m.ConvBnReLU2d(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1), nn.Sigmoid()),
    "tanh": lambda m: m.LinearTanh(nn.Linear(1, 1), nn.ReLU()),
    "leaky": lambda m: m.LinearLeakyReLU(nn.Linear(1, 1), nn.LeakyReLU()),
    "too-many": lambda m: m.ConvReLU2d(nn.Conv2d(1, 1, 1), nn.ReLU(), nn.ReLU()),
    "subclass": lambda m: m.ConvReLU2d(_SubConv(1, 1, 1), nn.ReLU()),
    "qat-conv": lambda m: m.ConvReLU2d(_qat_conv(), nn.ReLU()),
    "parametrized": lambda m: m.ConvReLU2d(_parametrized_conv(), nn.ReLU()),
    "bn-3d-in-2d": lambda m: m.ConvBn2d(nn.Conv2d(1, 1, 1), nn.BatchNorm3d(1)),
    "conv1d-relu": lambda m: m.ConvReLU1d(nn.Conv1d(1, 1, 1), nn.ReLU(inplace=True)),
    "linear-bn": lambda m: m.LinearBn1d(nn.Linear(1, 1), nn.BatchNorm1d(1)),
    "bnrelu-kw": lambda m: m.BNReLU2d(batch_norm=nn.BatchNorm2d(1), relu=nn.ReLU()),
    "convrelu-kw": lambda m: m.ConvReLU3d(conv=nn.Conv3d(1, 1, 1), relu=nn.ReLU()),
    "convadd-any": lambda m: m.ConvAdd2d(nn.Linear(1, 1), torch.add),
    "convadd-missing": lambda m: m.ConvAdd2d(nn.Conv2d(1, 1, 1)),
    "convaddrelu-any": lambda m: m.ConvAddReLU2d(nn.Conv2d(1, 1, 1), torch.add, nn.Sigmoid()),
    "base-one": lambda m: m._FusedModule(nn.Conv2d(1, 1, 1)),
    "base-ordered": lambda m: m._FusedModule(OrderedDict(a=nn.Conv2d(1, 1, 1))),
    "slice": lambda m: m.ConvReLU2d(nn.Conv2d(1, 1, 1), nn.ReLU())[0:1],
}


def _outcome(build, module):
    try:
        built = build(module)
    except (TypeError, AssertionError) as exc:
        return type(exc).__name__, str(exc)
    return type(built).__name__, list(built._modules), [type(c).__name__ for c in built]


@pytest.mark.parametrize("case", list(CASES))
def test_constructor_accepts_and_rejects_as_torch(case):
    assert _outcome(CASES[case], nni) == _outcome(CASES[case], ao_nni)


def test_single_child_containers_run():
    torch.manual_seed(0)
    conv = nn.Conv2d(2, 2, 1)
    ours = nni.ConvAddReLU2d(conv, torch.add, nn.ReLU())
    theirs = ao_nni.ConvAddReLU2d(conv, torch.add, nn.ReLU())
    x1, x2 = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    assert torch.equal(ours(x1, x2), theirs(x1, x2))
    assert list(ours.state_dict()) == list(theirs.state_dict())
