"""The demo's timing table: which torchquant column is the headline, and that a slower compiled
model is said, not hidden.  The timings are faked (no wall-clock assertions); compiling is
covered by tests/quantization/pt2e/test_lowering.py and tests/ops/test_export.py."""
from __future__ import annotations

import torch

from torchquant import demo


def _fake_interleaved(medians: dict[str, float]):
    def fake(fns, rounds=7, repeat=5):
        assert set(fns) == set(medians)
        for fn in fns.values():  # each side is really callable
            fn()
        return dict(medians), {name: [value] * 3 for name, value in medians.items()}
    return fake


def _models():
    float_model = torch.nn.Linear(4, 2)
    return float_model, float_model, (lambda x: float_model(x)), float_model


def test_compiled_faster_is_the_headline(monkeypatch):
    monkeypatch.setattr(demo, "_interleaved_ms", _fake_interleaved(
        {"float": 2.0, "eager": 1.0, "compiled": 0.5, "torch.ao": 1.0}))
    f, eager, compiled, theirs = _models()
    timed = demo.timing_cells(f, eager, compiled, theirs, torch.randn(1, 4), 1, True)
    assert timed.cells == ["2.000", "1.000", "0.500", "0.50x (0.50-0.50)", "4.00x (4.00-4.00)",
                           "1.000", "0.50x (0.50-0.50)"]
    assert timed.note == ""
    assert len(timed.cells) == len(demo.TimingCells.header(True))


def test_compiled_slower_is_said_and_eager_is_the_headline(monkeypatch):
    monkeypatch.setattr(demo, "_interleaved_ms", _fake_interleaved(
        {"float": 2.0, "eager": 1.0, "compiled": 1.5, "torch.ao": 0.5}))
    f, eager, compiled, theirs = _models()
    timed = demo.timing_cells(f, eager, compiled, theirs, torch.randn(1, 4), 1, True)
    assert timed.cells[3] == "1.50x (1.50-1.50)"  # compiled / eager
    assert timed.cells[4] == "2.00x (2.00-2.00)"  # float / eager
    assert timed.cells[6] == "2.00x (2.00-2.00)"  # eager / torch.ao
    assert "SLOWER than eager" in timed.note and "1.50x" in timed.note


def test_without_compiled_or_peer(monkeypatch):
    monkeypatch.setattr(demo, "_interleaved_ms", _fake_interleaved({"float": 2.0, "eager": 1.0}))
    f, eager, _, _ = _models()
    timed = demo.timing_cells(f, eager, None, None, torch.randn(1, 4), 1, False)
    assert timed.cells == ["2.000", "1.000", "", "", "2.00x (2.00-2.00)"]
    assert timed.note == "" and len(timed.cells) == len(demo.TimingCells.header(False))


def test_a_model_that_fails_to_compile_is_left_out(monkeypatch, capsys):
    def broken(model, **kwargs):
        def run(x):
            raise RuntimeError("no C++ compiler")
        return run
    monkeypatch.setattr(demo, "_tq_compile", broken)
    out = demo._compile_models({"m": torch.nn.Linear(4, 2)}, {"one": torch.randn(1, 4)})
    assert out == {}
    assert "compile failed (RuntimeError: no C++ compiler); eager only" in capsys.readouterr().out


def test_compile_models_times_the_build(monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(demo, "_tq_compile",
                        lambda model, **kwargs: (seen.append(kwargs), model)[1])
    model = torch.nn.Linear(4, 2)
    out = demo._compile_models({"m": model}, {"one": torch.randn(1, 4)})
    assert out == {"m": model} and seen == [{"dynamic": False}]
    text = capsys.readouterr().out
    assert "m: torchquant.compile" in text and "compiled in" in text
