"""Cold start (issue #15): with an empty inductor cache, convert and the first call of a small
CNN compile nothing; the kernel built when a shape repeats gives the same integers.  Asserted
on compile events, never on times."""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

SCRIPT = textwrap.dedent("""
    import json
    import torch
    import torch._inductor
    from torch import nn
    import torchquant.quantization as tqq
    import torchquant.nn.quantized as nnq
    from torchquant.kernels import cpu_compiled

    events = []
    real_inductor_compile, real_torch_compile = torch._inductor.compile, torch.compile

    def spy_inductor(*args, **kwargs):
        events.append(("inductor", None))
        return real_inductor_compile(*args, **kwargs)

    def spy_torch_compile(*args, **kwargs):
        events.append(("torch.compile", None))
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
    before_first_call = list(events)
    x = torch.randn(1, 3, 128, 128)  # 49k elements: big enough for the compiled quantize
    first = converted(x)
    at_first_call = events[len(before_first_call):]
    later = [converted(x) for _ in range(2)]
    print(json.dumps({
        "compiles_before_first_call": [kind for kind, _ in before_first_call],
        "compiles_at_first_call": [kind for kind, _ in at_first_call],
        "compiles_later": len(events) - len(before_first_call) - len(at_first_call),
        "kernels": len(cpu_compiled._kernels),
        "same": all(torch.equal(o, first) for o in later),
    }))
""")


def test_cold_convert_and_first_call_compile_nothing():
    with tempfile.TemporaryDirectory() as cache:
        # builds amortised over no eager time: the count rule alone (a kernel on the second call).
        # Without the native kernels: with them the quantize and the add never compile at all
        # (tests/kernels/test_native_elementwise.py), the compiled kernels are the path of
        # machines where the native library is not built
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache, "TORCHQUANT_QUIET": "1",
               "TORCHQUANT_COMPILED_BUILD_ESTIMATE_S": "0", "TORCHQUANT_NATIVE": "0"}
        result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                                env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["compiles_before_first_call"] == []
    assert report["compiles_at_first_call"] == []
    # the repeated shape's quantize was compiled, and gives the same integers as the eager
    # formula of the first call
    assert report["compiles_later"] >= 1 and report["kernels"] >= 1
    assert report["same"]
