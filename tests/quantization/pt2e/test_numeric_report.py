"""numeric_report (PT2E, eager and FX converted models), its markdown / CSV / PNG outputs, and
the auto-fallback of quantization.auto_fallback on the ResNet-18-shaped CNN."""
from __future__ import annotations

import copy
import csv
import io
import math

import pytest
import torch
from torch import nn

from _models import ResidualBlock
from torchquant.examples.resnet import ResNet18, randomize_bn
from torchquant.quantization import convert, fuse_modules, get_default_qconfig, prepare
from torchquant.quantization import pt2e
from torchquant.quantization.auto_fallback import quantize_pt2e_with_fallback
from torchquant.quantization.pt2e._numeric_report import model_size_bytes
from torchquant.quantization.qconfig_mapping import get_default_qconfig_mapping
from torchquant.quantization.quantize_fx import convert_fx, prepare_fx
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer import xnnpack_quantizer as tq_xnn

DQ_OPS = (torch.ops.torchquant.dequantize_per_tensor.default,
          torch.ops.torchquant.dequantize_per_channel.default)


def _sqnr_db(ref, actual):
    ref, actual = ref.double(), actual.double()
    return float(10 * torch.log10((ref ** 2).sum() / ((ref - actual) ** 2).sum()))


@pytest.fixture(scope="module")
def residual():
    torch.manual_seed(0)
    model = ResidualBlock().eval()
    batches = [(torch.randn(2, 3, 8, 8),) for _ in range(3)]
    ep = torch.export.export(model, batches[0])
    pt2e.generate_numeric_debug_handle(ep)
    prepared = prepare_pt2e(ep.module(), tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config()))
    for b in batches:
        prepared(*b)
    return ep.module(), convert_pt2e(prepared), batches


def test_pt2e_report_rows(residual):
    float_gm, quant_gm, batches = residual
    report = pt2e.numeric_report(float_gm, quant_gm, batches, threshold_db=35.0)
    handles = {pt2e._numeric_debugger.get_debug_handle(n) for n in quant_gm.graph.nodes} - {None}
    assert {r.handle for r in report.rows} <= handles
    ops = {r.op for r in report.rows}
    assert {"aten.conv2d", "aten.linear", "aten.relu", "aten.max_pool2d"} <= ops
    sqnrs = [r.sqnr_db for r in report.rows]
    assert sqnrs == sorted(sqnrs)  # worst first
    assert all(r.flagged == (r.sqnr_db < 35.0) for r in report.rows)
    assert [r.index for r in report.in_order] == sorted(r.index for r in report.rows)
    by_node = {r.node: r for r in report.rows}
    assert by_node["conv2d"].module_path == "conv1" and by_node["linear"].module_path == "fc"
    # the output SQNR and the last layer's numbers are the model outputs' own
    ref = torch.cat([float_gm(*b) for b in batches])
    out = torch.cat([quant_gm(*b) for b in batches])
    assert report.output_sqnr_db == pytest.approx(_sqnr_db(ref, out), abs=1e-6)
    fc = by_node["linear"]
    assert fc.sqnr_db == pytest.approx(_sqnr_db(ref, out), abs=1e-6)
    assert fc.mse == pytest.approx(float(((ref - out) ** 2).mean()), rel=1e-5)
    assert fc.max_abs_error == pytest.approx(float((ref - out).abs().max()), rel=1e-6)


def test_report_text_csv_and_plot(residual, tmp_path):
    float_gm, quant_gm, batches = residual
    report = pt2e.numeric_report(float_gm, quant_gm, batches[:1])
    md = report.to_markdown()
    assert "| node | module | op | SQNR (dB) |" in md and "conv2d" in md
    assert md.count("\n|") == len(report.rows) + 2
    rows = list(csv.DictReader(io.StringIO(report.to_csv())))
    assert [r["node"] for r in rows] == [r.node for r in report.rows]
    assert float(rows[0]["sqnr_db"]) == pytest.approx(report.rows[0].sqnr_db, abs=1e-3)
    png = tmp_path / "sqnr.png"
    assert report.plot(png) == str(png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert [p.name for p in tmp_path.iterdir()] == ["sqnr.png"]  # no temporary left behind


def test_report_needs_handles(residual):
    float_gm, quant_gm, batches = residual
    plain = torch.export.export(ResidualBlock().eval(), batches[0]).module()
    with pytest.raises(ValueError, match="generate_numeric_debug_handle"):
        pt2e.numeric_report(plain, quant_gm, batches)
    with pytest.raises(ValueError, match="empty"):
        pt2e.numeric_report(float_gm, quant_gm, [])


def _resnet():
    torch.manual_seed(0)
    return randomize_bn(ResNet18(num_classes=10, width=8)).eval()


def test_eager_report_matches_fused_modules():
    float_model = _resnet()
    batches = [(torch.randn(1, 3, 16, 16),)]
    m = copy.deepcopy(float_model)
    m = fuse_modules(m, m.fuse_patterns())
    m.qconfig = get_default_qconfig("x86")
    prepared = prepare(m)
    for b in batches:
        prepared(*b)
    quantized = convert(prepared)
    report = pt2e.numeric_report(float_model, quantized, batches)
    by_node = {r.node: r for r in report.rows}
    # conv1 absorbed bn1 + relu: compared with the float relu's output, so SQNR is sane
    assert by_node["conv1"].op == "ConvReLU2d (+bn1, relu)"
    assert by_node["layer1.0.conv2"].op == "Conv2d (+bn2)"
    assert sum(r.op.startswith(("Conv", "ConvReLU")) for r in report.rows) == 20
    assert all(r.sqnr_db > 20 for r in report.rows)
    ref = torch.cat([float_model(*b) for b in batches])
    out = torch.cat([quantized(*b) for b in batches])
    assert report.output_sqnr_db == pytest.approx(_sqnr_db(ref, out), abs=1e-6)
    assert by_node["fc"].sqnr_db == pytest.approx(_sqnr_db(ref, out), abs=1e-6)


class ConvBnReluFc(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.fc = nn.Linear(8 * 6 * 6, 4)

    def forward(self, x):
        return self.fc(torch.flatten(self.relu(self.bn(self.conv(x))), 1))


def test_fx_report():
    torch.manual_seed(0)
    float_model = ConvBnReluFc().eval()
    batches = [(torch.randn(2, 3, 8, 8),) for _ in range(2)]
    prepared = prepare_fx(copy.deepcopy(float_model), get_default_qconfig_mapping("x86"),
                          batches[0])
    for b in batches:
        prepared(*b)
    quantized = convert_fx(prepared)
    report = pt2e.numeric_report(float_model, quantized, batches)
    assert [r.node for r in report.in_order] == ["conv", "fc"]
    assert report.in_order[0].op == "ConvReLU2d (+bn, relu)"
    assert all(25 < r.sqnr_db < 80 for r in report.rows)


def _conv_weights(gm):
    """(int8 convs, float convs) of a converted PT2E graph."""
    convs = [n for n in gm.graph.nodes if n.target is torch.ops.aten.conv2d.default]
    int8 = [n for n in convs if n.args[1].op == "call_function" and n.args[1].target in DQ_OPS]
    return len(int8), len(convs) - len(int8)


def test_resnet_report_and_fallback():
    model = _resnet()
    torch.manual_seed(1)
    batches = [(torch.randn(1, 3, 32, 32),) for _ in range(2)]
    ep = torch.export.export(model, batches[0])
    quantizer = tq_xnn.XNNPACKQuantizer().set_global(
        tq_xnn.get_symmetric_quantization_config(is_per_channel=True))
    plain = quantize_pt2e_with_fallback(ep, quantizer, batches)
    report = plain.report
    assert plain.kept_float == [] and _conv_weights(plain.model) == (20, 0)
    weighted = [r for r in report.rows if r.op in ("aten.conv2d", "aten.linear")]
    assert len(weighted) == 21
    # the worst layers are named by their module path
    assert all(r.module_path.startswith(("conv1", "layer", "fc")) for r in weighted)
    # keep float whatever is below the third-worst conv / linear: at most a few layers
    threshold = sorted(r.sqnr_db for r in weighted)[2] + 1e-3
    result = quantize_pt2e_with_fallback(ep, quantizer, batches,
                                              fallback_sqnr_db=threshold, max_float_layers=4)
    assert 1 <= len(result.kept_float) <= 4
    assert result.kept_float[0] == next(r.module_path for r in report.rows
                                        if r.op in ("aten.conv2d", "aten.linear"))
    int8, float_convs = _conv_weights(result.model)
    assert int8 >= 0.8 * 20 and int8 + float_convs == 20
    assert result.report.output_sqnr_db > report.output_sqnr_db
    assert result.size_bytes > result.size_bytes_all_quantized
    assert model_size_bytes(result.model) == result.size_bytes
    kept_rows = [r for r in result.report.rows if r.kept_float]
    assert {r.module_path for r in kept_rows} == set(result.kept_float)
    assert "Kept in float" in result.report.to_markdown()
    assert math.isfinite(result.report.output_sqnr_db)
