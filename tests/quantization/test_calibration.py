"""``calibrate`` (issue #15): the same observer state as a hand-written loop, and a progress
bar (tqdm or the built-in one) only when asked or on a terminal."""
import sys

import pytest
import torch
from torch import nn

import torchquant.quantization as tqq
from torchquant.quantization import calibration


def _prepared():
    torch.manual_seed(0)
    model = nn.Sequential(tqq.QuantStub(), nn.Linear(4, 4), tqq.DeQuantStub()).eval()
    model.qconfig = tqq.default_qconfig
    return tqq.prepare(model)


@pytest.mark.parametrize("shape", ["tensors", "pairs", "dicts"])
def test_calibrate_matches_a_hand_written_loop(shape):
    batches = [torch.randn(3, 4) * (i + 1) for i in range(5)]
    data = {"tensors": batches, "pairs": [(x, 0) for x in batches],
            "dicts": [{"input": x} for x in batches]}[shape]
    ours, by_hand = _prepared(), _prepared()
    assert tqq.calibrate(ours, data, progress=False) is ours
    with torch.no_grad():
        for x in batches:
            by_hand(x)
    for (name, a), (_, b) in zip(ours.state_dict().items(), by_hand.state_dict().items()):
        assert torch.equal(a, b), name


def test_num_batches_and_custom_forward():
    seen = []
    tqq.calibrate(_prepared(), [torch.randn(1, 4) for _ in range(6)], progress=False,
                  num_batches=2, forward=lambda model, batch: seen.append(model(batch)))
    assert len(seen) == 2


def test_builtin_bar_without_tqdm(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tqdm.auto", None)  # import fails: no tqdm
    tqq.calibrate(_prepared(), [torch.randn(1, 4) for _ in range(3)], progress=True)
    err = capsys.readouterr().err
    assert "calibrating: 3/3 [" in err


def test_no_bar_when_not_a_terminal(capsys):
    tqq.calibrate(_prepared(), [torch.randn(1, 4) for _ in range(3)])  # stderr is captured
    assert capsys.readouterr().err == ""


def test_tqdm_bar_when_forced(capsys):
    pytest.importorskip("tqdm")
    bar = calibration.progress_bar([1, 2], "x", True)
    assert type(bar).__module__.startswith("tqdm")
    assert list(bar) == [1, 2]
