"""TorchScript (``torch.jit.script`` / ``trace``, hence ``save``) on models holding QTensors
never crashes the interpreter: each refuses with a RuntimeError that points to torch.export.

Run in a subprocess, so that a crash (what TorchScript did before, reading the storage-less
QTensor wrapper) fails the test instead of killing pytest.  A float QAT model (fake-quant
only, no QTensor) still traces, as in torch."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent('''
    import json, torch, torch.nn as nn
    import torchquant as tq, torchquant.quantization as tqq

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tqq.QuantStub(), tqq.DeQuantStub()
            self.conv, self.relu = nn.Conv2d(3, 4, 3), nn.ReLU()
            self.fc = nn.Linear(4 * 6 * 6, 5)
        def forward(self, x):
            x = self.relu(self.conv(self.quant(x)))
            return self.dequant(self.fc(torch.flatten(x, 1)))

    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    model = CNN().eval()
    model.qconfig = tqq.default_qconfig
    tqq.prepare(model, inplace=True)
    model(x)
    tqq.convert(model, inplace=True)
    q = tq.quantize_per_tensor(x, 0.05, 64, tq.quint8)
    results = {}

    def attempt(name, fn):
        try:
            fn()
            results[name] = "ok"
        except RuntimeError as exc:
            results[name] = str(exc)

    attempt("script", lambda: torch.jit.script(model))
    attempt("script_conv", lambda: torch.jit.script(model.conv))
    attempt("trace", lambda: torch.jit.trace(model, (x,)))
    attempt("trace_then_save", lambda: torch.jit.save(torch.jit.trace(model, (x,)), "m.pt"))
    attempt("trace_conv_qtensor_input", lambda: torch.jit.trace(model.conv, (q,)))
    attempt("trace_dequantize", lambda: torch.jit.trace(lambda t: t.dequantize(), (q,)))

    qat = nn.Sequential(tqq.QuantStub(), nn.Conv2d(3, 4, 3), nn.ReLU(), tqq.DeQuantStub())
    qat.qconfig = tqq.get_default_qat_qconfig("x86")
    tqq.prepare_qat(qat.train(), inplace=True)
    qat(x)
    qat.eval()
    traced = torch.jit.trace(qat, (x,))
    results["qat_trace_equal"] = bool(torch.equal(traced(x), qat(x)))
    print(json.dumps(results))
''')


def test_torchscript_on_quantized_model_refuses_clearly(tmp_path):
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]  # a crash gives a negative code
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert results.pop("qat_trace_equal") is True
    for name, outcome in results.items():
        assert "torch.jit" in outcome and "torch.export.export" in outcome, (name, outcome)
    assert not (tmp_path / "m.pt").exists()
