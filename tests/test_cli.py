"""The command line: ``torchquant quantize`` / ``report`` end to end on a small exported model
(the quantized program is loaded again in a fresh process), and its bad-input handling (one
line on stderr, non-zero exit, nothing written)."""
from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from torch import nn

from torchquant.__main__ import main

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.filterwarnings("ignore:XNNPACKQuantizer is deprecated")


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 4)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.conv2(y)) + y
        return self.fc(torch.flatten(self.pool(y), 1))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    torch.manual_seed(0)
    example = torch.randn(2, 3, 8, 8)
    torch.export.save(torch.export.export(SmallNet().eval(), (example,)), folder / "float.pt2")
    torch.save([(torch.randn(2, 3, 8, 8),) for _ in range(3)], folder / "calib.pt")
    return folder


@pytest.fixture
def eager_latency(monkeypatch):
    """The latency figures timed on the eager model: for tests about something else, which
    would otherwise pay a compile per quantized model (the round-trip test times the compiled
    one)."""
    import torchquant._cli as cli
    monkeypatch.setattr(cli, "_compiled_or_eager", lambda model: (model, "eager"))


def _run(args, capsys):
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_help(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert all(word in text for word in ("quantize", "report", "demo"))
    for command, flags in (("quantize", ("--calib", "--quantizer", "--max-drop-db", "--out")),
                           ("report", ("--data", "FLOAT.pt2", "QUANT.pt2"))):
        with pytest.raises(SystemExit) as e:
            main([command, "--help"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        assert all(flag in text for flag in flags)


def test_console_script_is_declared():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["torchquant"] == "torchquant.__main__:main"


def test_quantize_round_trip_in_a_new_process(files, capsys):
    out, report, plot = files / "q.pt2", files / "report.md", files / "sqnr.png"
    rc, stdout, err = _run(["quantize", files / "float.pt2", "--calib", files / "calib.pt",
                            "--quantizer", "xnnpack", "--per-channel", "--out", out,
                            "--report", report, "--plot", plot, "--latency-runs", "2"], capsys)
    assert rc == 0, err
    assert "size:" in stdout and "latency" in stdout and "| node | module |" in stdout
    assert "conv1" in stdout and "Model output SQNR" in stdout
    assert "| node | module |" in report.read_text()
    assert plot.read_bytes()[:4] == b"\x89PNG" and plot.stat().st_size > 5000
    assert not [p for p in os.listdir(files) if p.startswith(".torchquant-")]

    x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(5))
    torch.save(x, files / "x.pt")
    loaded = torch.export.load(str(out))
    here = loaded.module()(x)
    ops = {str(n.target) for n in loaded.graph.nodes if n.op == "call_function"}
    assert "torchquant.dequantize_per_channel.default" in ops
    script = ("import sys, torch, torchquant\n"
              "ep = torch.export.load(sys.argv[1])\n"
              "torch.save(ep.module()(torch.load(sys.argv[2])), sys.argv[3])\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-c", script, str(out), str(files / "x.pt"),
                    str(files / "y.pt")], check=True, env=env, cwd=ROOT, timeout=300,
                   capture_output=True)
    assert torch.equal(torch.load(files / "y.pt"), here)

    # the report command reads both programs back and compares them
    csv_path = files / "report.csv"
    rc, stdout, err = _run(["report", files / "float.pt2", out, "--data", files / "calib.pt",
                            "--csv", csv_path], capsys)
    assert rc == 0, err
    assert "conv2d" in stdout and csv_path.read_text().startswith("handle,node,")


def test_quantize_with_fallback(files, capsys, eager_latency):
    out = files / "fallback.pt2"
    rc, stdout, err = _run(["quantize", files / "float.pt2", "--calib", files / "calib.pt",
                            "--quantizer", "x86", "--out", out, "--max-drop-db", "80",
                            "--max-float-layers", "1", "--latency-runs", "1"], capsys)
    assert rc == 0, err
    assert "Kept in float:" in stdout and "Fallback cost:" in stdout
    assert out.exists()


def _bad_inputs(folder: Path) -> dict:
    nan = torch.randn(2, 3, 8, 8)
    nan[0, 0, 0, 0] = float("nan")
    torch.save([(torch.randn(2, 3, 8, 8),), (nan,)], folder / "nan.pt")
    torch.save([], folder / "empty.pt")
    torch.save([(torch.randn(2, 3, 5, 5),)], folder / "shape.pt")
    torch.save({"x": 1}, folder / "dict.pt")
    (folder / "junk.pt2").write_bytes(b"not a program")
    return {
        "not_a_program": (folder / "junk.pt2", folder / "calib.pt", "not a program saved"),
        "missing_program": (folder / "nope.pt2", folder / "calib.pt", "does not exist"),
        "missing_data": (folder / "float.pt2", folder / "nope.pt", "does not exist"),
        "empty": (folder / "float.pt2", folder / "empty.pt", "is empty"),
        "shape": (folder / "float.pt2", folder / "shape.pt", "has shape (2, 3, 5, 5)"),
        "wrong_type": (folder / "float.pt2", folder / "dict.pt", "holds a dict"),
        "nan": (folder / "float.pt2", folder / "nan.pt", "batch 1 input 0 contains NaN"),
    }


@pytest.mark.parametrize("case", ["not_a_program", "missing_program", "missing_data", "empty",
                                  "shape", "wrong_type", "nan"])
def test_bad_inputs(files, capsys, case):
    model, data, message = _bad_inputs(files)[case]
    out = files / f"bad-{case}.pt2"
    rc, stdout, err = _run(["quantize", model, "--calib", data, "--out", out,
                            "--report", files / f"bad-{case}.md"], capsys)
    assert rc != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("torchquant quantize: error:"), err
    assert message in lines[0] and "Traceback" not in err
    assert not out.exists() and not (files / f"bad-{case}.md").exists()
    assert not [p for p in os.listdir(files) if p.startswith(".torchquant-")]
    if case == "nan":  # the layers the NaN reaches are named
        assert "conv1 (conv2d)" in lines[0]


def test_bad_program_in_a_process_prints_one_line(files):
    """torch logs a traceback when torch.export.load fails; the command silences it."""
    (files / "junk2.pt2").write_bytes(b"not a program")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "torchquant", "quantize",
                           str(files / "junk2.pt2"), "--calib", str(files / "calib.pt"),
                           "--out", str(files / "never.pt2")], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()
             and "Failed to load" not in line]  # torchao-style import noise is not ours
    assert len(lines) == 1 and "not a program saved with torch.export.save" in lines[0], \
        done.stderr
    assert not (files / "never.pt2").exists()


# ---- bad options and paths: one line, non-zero exit, nothing written (issue 28) -------------

def _one_error_line(rc, err, command):
    assert rc != 0
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"torchquant {command}: error:"), err
    assert "Traceback" not in err
    return lines[0]


def _no_temporaries(folder):
    return not [p for p in os.listdir(folder) if p.startswith(".torchquant-")]


@pytest.mark.parametrize("extra,message", [
    (["--report", "/proc/torchquant-report.md"], "--report '/proc/torchquant-report.md' cannot be written"),
    (["--report", "{folder}"], "is a directory"),
    (["--report", "{folder}/missing/r.md"], "does not exist"),
    (["--max-drop-db", "nan"], "--max-drop-db must be a finite number"),
    (["--threshold-db", "inf"], "--threshold-db must be a finite number"),
    (["--latency-runs", "0"], "--latency-runs must be at least 1"),
    (["--max-float-layers", "-1"], "--max-float-layers must be at least 0"),
])
def test_quantize_bad_option_or_path_writes_nothing(files, capsys, extra, message):
    out = files / "never-written.pt2"
    extra = [e.format(folder=files) for e in extra]
    rc, _, err = _run(["quantize", files / "float.pt2", "--calib", files / "calib.pt",
                       "--out", out, *extra], capsys)
    assert message in _one_error_line(rc, err, "quantize")
    assert not out.exists() and _no_temporaries(files)


def test_quantize_failing_write_leaves_no_output(files, capsys, monkeypatch, eager_latency):
    """A write that fails after another output was written: neither is left behind."""
    import torchquant._cli as cli

    def failing_writer(text):
        def write(tmp):
            raise OSError(28, "No space left on device")
        return write

    monkeypatch.setattr(cli, "_text_writer", failing_writer)
    out, report = files / "half.pt2", files / "half.md"
    rc, _, err = _run(["quantize", files / "float.pt2", "--calib", files / "calib.pt",
                       "--out", out, "--report", report, "--latency-runs", "1"], capsys)
    assert rc != 0 and "Traceback" not in err
    # (stderr also holds the calibration progress bar, drawn with carriage returns)
    errors = [part for part in err.replace("\r", "\n").splitlines() if "error:" in part]
    assert len(errors) == 1 and "cannot write --report" in errors[0], err
    assert not out.exists() and not report.exists() and _no_temporaries(files)


@pytest.mark.parametrize("extra,message", [
    (["--csv", "{folder}"], "--csv '{folder}' is a directory"),
    (["--max-batches", "0"], "--max-batches must be at least 1, got 0"),
    (["--max-batches", "-1"], "--max-batches must be at least 1, got -1"),
    (["--threshold-db", "nan"], "--threshold-db must be a finite number"),
])
def test_report_bad_option_or_path(files, capsys, extra, message):
    extra = [e.format(folder=files) for e in extra]
    rc, stdout, err = _run(["report", files / "float.pt2", files / "float.pt2", "--data",
                            files / "calib.pt", *extra], capsys)
    assert message.format(folder=files) in _one_error_line(rc, err, "report")
    assert not stdout and _no_temporaries(files) and _no_temporaries(files.parent)


def test_overwriting_keeps_the_file_mode(files, capsys, eager_latency):
    out = files / "private.pt2"
    out.write_bytes(b"old")
    out.chmod(0o600)
    rc, _, err = _run(["quantize", files / "float.pt2", "--calib", files / "calib.pt",
                       "--out", out, "--latency-runs", "1"], capsys)
    assert rc == 0, err
    assert (out.stat().st_mode & 0o777) == 0o600 and out.read_bytes() != b"old"


def test_not_a_program_is_one_line_naming_the_file_and_what_was_expected(files):
    """A file that is not a .pt2 archive: torch warns, then raises "check the warnings above";
    the command prints neither, only its own line."""
    torch.save(torch.randn(3), files / "tensor.pt2")
    torch.save({"a": 1}, files / "state.pt")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for name in ("tensor.pt2", "state.pt"):
        done = subprocess.run([sys.executable, "-m", "torchquant", "quantize",
                               str(files / name), "--calib", str(files / "calib.pt"),
                               "--out", str(files / "never.pt2")], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, done.stderr
        assert name in lines[0] and "expected a .pt2 archive written by torch.export.save" \
            in lines[0] and "warnings above" not in lines[0], lines[0]


# ---- package: a quantized program as an AOTInductor package (issue 30) ----------------------

def test_quantize_keeps_a_dynamic_batch_and_package_runs_without_torchquant(files, capsys,
                                                                        eager_latency):
    """``quantize`` of a program with a dynamic batch writes one with a dynamic batch, and
    ``package`` turns it into an AOTInductor package that a process without torchquant runs
    at another batch size (one test: each step compiles)."""
    torch.manual_seed(0)
    program = torch.export.export(SmallNet().eval(), (torch.randn(2, 3, 8, 8),),
                                  dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    torch.export.save(program, files / "float-dynamic.pt2")
    quantized_path, out = files / "q-dynamic.pt2", files / "model-package.pt2"
    rc, _, err = _run(["quantize", files / "float-dynamic.pt2", "--calib", files / "calib.pt",
                       "--quantizer", "x86", "--out", quantized_path, "--latency-runs", "1"],
                      capsys)
    assert rc == 0, err
    quantized = torch.export.load(str(quantized_path))
    x_node = next(n for n in quantized.graph.nodes if n.op == "placeholder"
                  and n.name in quantized.graph_signature.user_inputs)
    assert not isinstance(x_node.meta["val"].shape[0], int)

    rc, stdout, err = _run(["package", quantized_path, "--example", files / "calib.pt",
                            "--out", out], capsys)
    assert rc == 0, err
    assert "batch dynamic" in stdout and out.exists() and _no_temporaries(files)
    x = torch.randn(3, 3, 8, 8, generator=torch.Generator().manual_seed(9))
    torch.save(x, files / "x3.pt")
    script = ("import sys, torch\n"
              "from torch._inductor import aoti_load_package\n"
              "y = aoti_load_package(sys.argv[1])(torch.load(sys.argv[2]))\n"
              "assert 'torchquant' not in sys.modules\n"
              "torch.save(y, sys.argv[3])\n")
    subprocess.run([sys.executable, "-c", script, str(out), str(files / "x3.pt"),
                    str(files / "y3.pt")], check=True, timeout=300, capture_output=True)
    got = torch.load(files / "y3.pt")
    with torch.no_grad():
        expected = quantized.module()(x)
    # oneDNN's fused int8 convs may requantize a rounding tie one step from the Python
    # graph's float conv + quantize (tests/test_package.py compares them exactly with the
    # lowered model)
    assert got.shape == expected.shape == (3, 4)
    assert (got - expected).abs().max() <= 0.02 * expected.abs().max()


@pytest.mark.parametrize("case,message", [
    ("missing", "does not exist"),
    ("not_a_program", "not a program saved"),
    ("not_pt2", "must end in .pt2"),
    ("no_folder", "does not exist"),
    ("shape", "has shape (2, 3, 5, 5)"),
])
def test_package_bad_inputs_one_line_nothing_written(files, capsys, case, message):
    _bad_inputs(files)
    model, data, out = files / "float.pt2", files / "calib.pt", files / "never-package.pt2"
    if case == "missing":
        model = files / "nope.pt2"
    elif case == "not_a_program":
        model = files / "junk.pt2"
    elif case == "not_pt2":
        out = files / "never-package.zip"
    elif case == "no_folder":
        out = files / "missing" / "p.pt2"
    elif case == "shape":
        data = files / "shape.pt"
    rc, _, err = _run(["package", model, "--example", data, "--out", out], capsys)
    assert rc == 2
    assert message in _one_error_line(rc, err, "package")
    assert not out.exists() and _no_temporaries(files)
