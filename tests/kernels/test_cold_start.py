"""Cold start (issue #15): with an empty inductor cache, convert and the first calls of a small
CNN compile nothing on the calling thread; compiled kernels are built in the background and,
once ready, give the same integers.  Asserted on compile events, never on times."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

SCRIPT = textwrap.dedent("""
    import json, threading
    import torch
    import torch._inductor
    from torch import nn
    import torchquant.quantization as tqq
    import torchquant.nn.quantized as nnq
    from torchquant.kernels import cpu_compiled

    events = []
    real_inductor_compile, real_torch_compile = torch._inductor.compile, torch.compile

    def spy_inductor(*args, **kwargs):
        events.append(("inductor", threading.current_thread() is threading.main_thread()))
        return real_inductor_compile(*args, **kwargs)

    def spy_torch_compile(*args, **kwargs):
        events.append(("torch.compile", threading.current_thread() is threading.main_thread()))
        return real_torch_compile(*args, **kwargs)

    torch._inductor.compile, torch.compile = spy_inductor, spy_torch_compile

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.quant, self.dequant = tqq.QuantStub(), tqq.DeQuantStub()
            self.conv1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
            self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
            self.add = nnq.FloatFunctional()
            self.pool, self.fc = nn.AdaptiveAvgPool2d(1), nn.Linear(8, 10)

        def forward(self, x):
            y = self.relu1(self.conv1(self.quant(x)))
            y = self.add.add(y, self.conv2(y))
            return self.dequant(self.fc(torch.flatten(self.pool(y), 1)))

    torch.manual_seed(0)
    model = CNN().eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    tqq.fuse_modules(model, [["conv1", "relu1"]], inplace=True)
    prepared = tqq.prepare(model)
    tqq.calibrate(prepared, [torch.randn(1, 3, 128, 128) for _ in range(2)], progress=False)
    converted = tqq.convert(prepared)
    x = torch.randn(1, 3, 128, 128)  # 49k elements: big enough for the compiled quantize
    outputs = [converted(x) for _ in range(3)]
    on_main = [kind for kind, main in events if main]
    ready = cpu_compiled.wait_for_kernels(timeout=400)
    after = converted(x)
    print(json.dumps({
        "compiles_on_main_thread": on_main,
        "background_compiles": sum(1 for _, main in events if not main),
        "ready": ready, "kernels": len(cpu_compiled._kernels),
        "same": all(torch.equal(o, outputs[0]) for o in outputs + [after]),
    }))
""")


def test_cold_convert_and_first_calls_compile_nothing_on_the_calling_thread():
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache,
               "TORCHQUANT_COMPILE_IN_BACKGROUND": "1", "TORCHQUANT_QUIET": "1"}
        result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                                env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["compiles_on_main_thread"] == []
    assert report["ready"]
    # the hot quantize of the 49k-element input was built off the calling thread, and the
    # compiled path gives the same integers as the eager formula before it
    assert report["background_compiles"] >= 1 and report["kernels"] >= 1
    assert report["same"]
