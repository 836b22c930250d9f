"""torchquant.quantization.pt2e: train / eval on exported models (oracle: torchao 0.18's
``move_exported_model_to_eval`` / ``_train`` / ``allow_exported_model_train_eval``)."""
import copy

import pytest
import torch
from torch import nn

from torchquant.quantization import pt2e
from torchquant.quantization import observer as tq_observer

ao_pt2e = pytest.importorskip("torchao.quantization.pt2e")


class DropoutBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.conv(x)))


def _exported():
    torch.manual_seed(0)
    model = DropoutBN().train()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return torch.export.export(model, (torch.randn(2, 3, 8, 8),)).module()


def test_eval_and_train_match_torchao():
    x = torch.randn(2, 3, 8, 8)
    ours, theirs = _exported(), _exported()
    ours.load_state_dict(theirs.state_dict())
    pt2e.move_exported_model_to_eval(ours)
    ao_pt2e.move_exported_model_to_eval(theirs)
    assert torch.equal(ours(x), theirs(x))  # batch norm on running stats, no dropout
    assert torch.equal(ours(x), ours(x))
    pt2e.move_exported_model_to_train(ours)
    torch.manual_seed(1)
    y = ours(x)
    assert (y == 0).any()  # dropout is back


def test_allow_train_eval_switches_the_graph():
    model = pt2e.allow_exported_model_train_eval(_exported())
    x = torch.randn(2, 3, 8, 8)
    model.eval()
    first = model(x)
    assert torch.equal(first, model(x))
    model.train()
    torch.manual_seed(2)
    assert (model(x) == 0).any()


def test_model_is_exported_and_errors():
    assert pt2e.model_is_exported(_exported())
    assert not pt2e.model_is_exported(DropoutBN())
    assert not pt2e.model_is_exported(torch.fx.symbolic_trace(DropoutBN()))
    with pytest.raises(TypeError, match="exported model"):
        pt2e.move_exported_model_to_eval(DropoutBN())


def test_observer_classes_are_reexported():
    assert pt2e.MinMaxObserver is tq_observer.MinMaxObserver
    assert set(pt2e.__all__) <= set(dir(pt2e))
    missing = set(ao_pt2e.__all__) - set(pt2e.__all__)
    # the numeric debugger (issue #17), affine-quantization and pattern helpers are not here yet
    assert "MinMaxObserver" not in missing and "move_exported_model_to_eval" not in missing
