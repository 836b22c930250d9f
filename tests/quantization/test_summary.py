"""The coverage summary (issue #15): float-by-design modules vs. modules the user probably
wanted quantized, and a one-line result visible without configuring logging."""
import logging
import os
import subprocess
import sys

import torch
from torch import nn

import torchquant.quantization as tqq


class Scale(nn.Module):
    """A leaf with a parameter and no quantized counterpart."""

    def __init__(self):
        super().__init__()
        self.s = nn.Parameter(torch.ones(8))

    def forward(self, x):
        return x * self.s


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = tqq.QuantStub()
        self.fc = nn.Linear(8, 8)
        self.drop = nn.Dropout(0.1)
        self.dequant = tqq.DeQuantStub()
        self.norm = nn.LayerNorm(8)
        self.scale = Scale()

    def forward(self, x):
        return self.scale(self.norm(self.dequant(self.drop(self.fc(self.quant(x))))))


def _converted(qconfig_scale):
    model = Net().eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    model.norm.qconfig = None  # left float by the qconfig: by design
    if not qconfig_scale:
        model.scale.qconfig = None
    prepared = tqq.prepare(model)
    prepared(torch.randn(4, 8))
    return tqq.convert(prepared)


def test_by_design_float_modules_log_info(caplog):
    with caplog.at_level(logging.INFO, logger="torchquant"):
        converted = _converted(qconfig_scale=False)
    report = tqq.summary(converted)
    floats = {m.name: (m.reason, m.by_design) for m in report.float_modules}
    assert floats == {"norm": ("no qconfig", True), "scale": ("no qconfig", True)}
    assert report.unexpectedly_float == ()
    [record] = [r for r in caplog.records if "quantized" in r.getMessage()]
    assert record.levelno == logging.INFO


def test_module_with_qconfig_but_no_quantized_form_warns(caplog):
    with caplog.at_level(logging.INFO, logger="torchquant"):
        converted = _converted(qconfig_scale=True)
    report = tqq.summary(converted)
    assert [m.name for m in report.unexpectedly_float] == ["scale"]
    assert "wanted quantized?" in str(report)
    [record] = [r for r in caplog.records if "quantized" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert "1 of them had a qconfig but no quantized form (scale)" in record.getMessage()


def test_dynamic_layernorm_and_embedding_are_float_by_design():
    model = nn.Sequential(nn.Embedding(10, 8), nn.LayerNorm(8), nn.Linear(8, 8))
    report = tqq.summary(tqq.quantize_dynamic(model))
    assert report.count("quantized") == 1
    assert {m.name for m in report.float_modules} == {"0", "1"}
    assert report.unexpectedly_float == ()


def test_line_visible_without_logging_configured():
    code = ("import torch, torchquant.quantization as tqq\n"
            "m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))\n"
            "tqq.quantize_dynamic(m)\n")
    env = {**os.environ, "TORCHQUANT_QUIET": "0"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300, check=True)
    assert "quantized 1 of 2 modules; 1 left in float: 1 (no qconfig)" in result.stderr


def test_convert_fx_logs_the_coverage_line_as_eager_convert(caplog):
    from torchquant.quantization.quantize_fx import convert_fx, prepare_fx
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)).eval()
    x = torch.randn(4, 8)
    prepared = prepare_fx(model, tqq.get_default_qconfig_mapping("x86"), (x,))
    prepared(x)
    with caplog.at_level(logging.INFO, logger="torchquant"):
        convert_fx(prepared)
    assert "quantized 2 of 2 modules" in caplog.text
