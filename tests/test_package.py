"""torchquant.export_package / torchquant.load: AOTInductor packages of converted models that
run in a process without torchquant and give the Python model's outputs.

Each package is one inductor compile (seconds each): every model is converted and packaged once,
and a fresh interpreter loads the package, runs it at the example's batch size and another one
(the batch is dynamic), checks it never imported torchquant and saves the outputs for the test
to compare.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import nn

import shipping_models as sm
import torchquant
from torchquant._package import PackageError
from torchquant.ops import linear as ops_linear

EXAMPLE_BATCH, OTHER_BATCH = 2, 5

# Every flow (eager static / dynamic, FX, PT2E dynamic) and every model once or more; not
# every pair: each case is a whole AOTInductor compile, and make test has 10 minutes.  PT2E
# static (x86 quantizer) is packaged and run without torchquant by tests/test_cli.py
# (quantize, then package); its AOTInductor graphs are compared with torch.compile's in
# tests/test_compile_aot.py and with the lowered model in tests/quantization/pt2e/test_lowering.py.
CASES: dict[str, tuple[str, Callable[[], nn.Module]]] = {
    "resnet-eager": ("resnet", lambda: sm.eager_static(sm.resnet(), "resnet")),
    "mobilenet-fx": ("mobilenet", lambda: sm.fx_static(sm.mobilenet(), "mobilenet")),
    "activations-fx": ("activations", lambda: sm.fx_static(sm.activations(), "activations")),
    "minilm-eager": ("minilm", lambda: sm.eager_dynamic(sm.minilm(), {nn.Linear})),
    "minilm-pt2e": ("minilm", lambda: sm.pt2e(sm.minilm(), "minilm", dynamic=True)),
    "lstm-eager": ("lstm", lambda: sm.eager_dynamic(sm.lstm(), {nn.LSTM})),
}

_FRESH_PROCESS = textwrap.dedent("""
    import sys, torch
    from torch._inductor import aoti_load_package
    package, *runs = sys.argv[1:]
    model = aoti_load_package(package)
    for inputs, output in zip(runs[::2], runs[1::2]):
        with torch.no_grad():
            torch.save(model(*torch.load(inputs)), output)
    assert "torchquant" not in sys.modules, "the package imported torchquant"
    print("fresh process: ok")
""")


# Where the package's integers are the Python model's but its float parts are inductor's:
# softmax / LayerNorm / GELU / sigmoid / tanh and oneDNN's float-output epilogues round an ulp
# or so apart from ATen's kernels (the int8 parts are bit-exact: test_decompositions_*).
FLOAT_ULPS = {"rtol": 1e-5, "atol": 1e-6}
BIT_EXACT = {"resnet-eager", "mobilenet-fx", "activations-fx"}
# Where oneDNN's u8 x s8 int8 saturates (AVX2, AVX-512 without VNNI, or forced so) an eager /
# FX static model's convs and Linears become the eager kernels' exact split
# (ops/inductor/saturation_safe.py): still bit-exact (checked with ONEDNN_MAX_CPU_ISA=AVX2).


@pytest.mark.parametrize("case", sorted(CASES))
def test_package_in_a_fresh_process_gives_python_outputs(case, tmp_path):
    """Converted, packaged and run at the example's batch size and another (dynamic batch) in
    a process that never imports torchquant (and, the eager ResNet, by AOTInductor's C++
    runner: no Python at all).  One test per model (one compile each), so that pytest-xdist's
    workers share the compiles out instead of repeating them."""
    name, convert = CASES[case]
    model = convert()
    onednn_exact = ops_linear.onednn_u8s8_exact()
    path = torchquant.export_package(model, sm.example(name, EXAMPLE_BATCH),
                                     tmp_path / f"{case}.pt2")
    runs, argv = [], [str(path)]
    for batch in (EXAMPLE_BATCH, OTHER_BATCH):
        inputs = sm.example(name, batch, seed=100 + batch)
        torch.save(inputs, tmp_path / f"in{batch}.pt")
        argv += [str(tmp_path / f"in{batch}.pt"), str(tmp_path / f"out{batch}.pt")]
        runs.append(inputs)
    done = subprocess.run([sys.executable, "-c", _FRESH_PROCESS, *argv], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0 and "fresh process: ok" in done.stdout, done.stderr[-3000:]

    lowered = torchquant.compile(model, use_torch_compile=False) if case.endswith("pt2e") else None
    in_process = torchquant.load(path)
    for inputs in runs:
        got = torch.load(tmp_path / f"out{inputs[0].size(0)}.pt")
        with torch.no_grad():
            expected = model(*inputs)
            assert torch.equal(in_process(*inputs), got)  # torchquant.load: the same package
        assert got.shape == expected.shape and got.dtype == expected.dtype
        if case in BIT_EXACT:
            assert torch.equal(got, expected)
        elif lowered is not None:
            # PT2E: the package's convs are oneDNN int8 calls that requantize their int32
            # accumulator, which lands one step from the Python graph's float conv + quantize
            # where that sits on a rounding tie (and the step propagates); they are the very
            # calls torchquant's lowered (fused) model makes, which it matches up to the last
            # float epilogue's ulps
            with torch.no_grad():
                torch.testing.assert_close(got, lowered(*inputs), **FLOAT_ULPS)
            assert (got - expected).abs().max() <= 0.02 * expected.abs().max()
        else:
            torch.testing.assert_close(got, expected, **FLOAT_ULPS)

    if case == "resnet-eager":
        _cpp_runner_gives_python_outputs(model, path, tmp_path)

    with zipfile.ZipFile(path) as z:
        marker = [n for n in z.namelist() if n.endswith("extra/torchquant_package.json")]
        info = json.loads(z.read(marker[0]))
    assert info["dynamic_batch"] is True
    # _int_mm for the eager dynamic models; where oneDNN saturates, the exact decompositions
    # and splits (no call that would saturate elsewhere)
    assert info["onednn_int8"] == (case not in ("minilm-eager", "lstm-eager") and onednn_exact)
    # outside a package compile torchquant's fused ops have no inductor decomposition
    # (torch.compile runs them as they are; inductor refuses an op with both a table entry
    # and a fallback)
    from torch._inductor.decomposition import decompositions

    from torchquant.ops.inductor import exact_decompositions
    assert not set(exact_decompositions.decompositions_by_op()) & set(decompositions)


# Only the headers it uses (<torch/torch.h> took more than twice as long to parse)
_CPP_RUNNER = r"""
#include <ATen/ops/linspace.h>
#include <torch/csrc/inductor/aoti_package/model_package_loader.h>
#include <fstream>
#include <iostream>
// argv: package, output file, then the input's shape; the input is linspace(-2, 2)
int main(int argc, char** argv) {
  c10::InferenceMode mode;
  torch::inductor::AOTIModelPackageLoader loader(argv[1]);
  std::vector<int64_t> shape;
  int64_t numel = 1;
  for (int i = 3; i < argc; ++i) {
    shape.push_back(std::stoll(argv[i]));
    numel *= shape.back();
  }
  auto x = at::linspace(-2, 2, numel).reshape(shape);
  auto out = loader.run({x})[0].contiguous();
  std::ofstream f(argv[2], std::ios::binary);
  f.write(reinterpret_cast<const char*>(out.data_ptr<float>()), out.numel() * sizeof(float));
  std::cout << "ok" << std::endl;
}
"""


def _cpp_runner_gives_python_outputs(model: nn.Module, package: str, tmp_path: Path) -> None:
    """AOTInductor's C++ loader runs ``package`` at a batch size other than the example's and
    gets ``model``'s outputs, bit for bit (g++ is there: inductor has just compiled the
    package with it)."""
    from torch.utils import cpp_extension
    (tmp_path / "runner.cpp").write_text(_CPP_RUNNER)
    lib = str(Path(torch.__file__).parent / "lib")
    flags = [f"-I{d}" for d in cpp_extension.include_paths()]
    abi = f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"
    subprocess.run(["g++", "-std=c++17", "-O1", "-w", str(tmp_path / "runner.cpp"), "-o",
                    str(tmp_path / "runner"), *flags, abi, f"-L{lib}", f"-Wl,-rpath,{lib}",
                    "-ltorch", "-ltorch_cpu", "-lc10"], check=True, capture_output=True,
                   timeout=300)
    shape = (3, *sm.IMAGE)
    done = subprocess.run([str(tmp_path / "runner"), str(package), str(tmp_path / "y.bin"),
                           *map(str, shape)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
    got = torch.frombuffer(bytearray((tmp_path / "y.bin").read_bytes()), dtype=torch.float32)
    x = torch.linspace(-2, 2, torch.Size(shape).numel()).reshape(shape)
    with torch.no_grad():
        expected = model(x)
    assert torch.equal(got.reshape(expected.shape), expected)


def _eager_int8(model: nn.Module, calibration: torch.Tensor) -> nn.Module:
    """``model`` (with ``conv`` / ``relu`` attributes) fused, calibrated on one batch and
    converted with the x86 qconfig."""
    import torchquant.quantization as tq
    model = tq.fuse_modules(model.eval(), [["conv", "relu"]])
    model.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        model(calibration)
    return tq.convert(model, inplace=True)


class _DownsampleCNN(nn.Module):
    """conv + ReLU, a strided 1x1 conv (a ResNet downsample), a Linear."""

    def __init__(self) -> None:
        super().__init__()
        import torchquant.quantization as tq
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.relu = nn.Conv2d(3, 16, 3, padding=1), nn.ReLU()
        self.down = nn.Conv2d(16, 8, 1, stride=2)
        self.fc = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.down(self.relu(self.conv(self.quant(x))))
        return self.dequant(self.fc(torch.flatten(x, 1)))


_SATURATING_PACKAGE = textwrap.dedent("""
    import json, sys, zipfile, warnings
    sys.path.insert(0, sys.argv[2])
    import torch
    import torchquant
    from torchquant.kernels import onednn_exactness
    from test_package import _DownsampleCNN, _eager_int8
    assert not onednn_exactness.onednn_u8s8_exact()  # oneDNN held at AVX2: it saturates

    torch.manual_seed(0)
    model = _eager_int8(_DownsampleCNN(), torch.randn(8, 3, 16, 16))
    path = torchquant.export_package(model, (torch.randn(2, 3, 16, 16),), sys.argv[1])
    sources = torchquant._package.generated_code(path)
    assert not torchquant._package.torchquant_ops_called(sources)
    assert not any("torchquant_native" in text for text in sources.values())
    with zipfile.ZipFile(path) as z:
        marker = [n for n in z.namelist() if n.endswith("extra/torchquant_package.json")]
        assert json.loads(z.read(marker[0]))["onednn_int8"] is False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning that the package's calls saturate
        package = torchquant.load(path)
    for batch in (2, 5):
        x = torch.randn(batch, 3, 16, 16) * 2
        with torch.no_grad():
            assert torch.equal(package(x), model(x)), batch
    print("saturating package: ok")
""")


def test_package_built_where_onednn_saturates_is_exact(tmp_path):
    """Where oneDNN's u8 x s8 products saturate (forced here: oneDNN held at AVX2), an
    eager-converted model's convs and Linear are packaged as the eager kernels' exact split
    (ops/inductor/saturation_safe.py): no torchquant call, no saturation warning on load, and
    the eager model's integers at two batch sizes (inputs well above 128 in every layer)."""
    out = subprocess.run([sys.executable, "-c", _SATURATING_PACKAGE, str(tmp_path / "m.pt2"),
                          str(Path(__file__).parent)],
                         capture_output=True, text=True, timeout=600,
                         env=dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2",
                                  TORCHQUANT_CPU_ISA="avx2", TORCHQUANT_QUIET="1"))
    assert out.returncode == 0 and "saturating package: ok" in out.stdout, out.stderr[-3000:]


def test_load_rejects_what_it_did_not_write(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.pt2"):
        torchquant.load(tmp_path / "missing.pt2")
    not_zip = tmp_path / "text.pt2"
    not_zip.write_text("hello")
    with pytest.raises(ValueError, match="text.pt2.*not a .pt2 archive"):
        torchquant.load(not_zip)
    program = tmp_path / "program.pt2"
    torch.export.save(torch.export.export(nn.Linear(2, 2), (torch.randn(3, 2),)), program)
    with pytest.raises(ValueError, match="program.pt2.*no torchquant marker"):
        torchquant.load(program)
    with pytest.raises(ValueError, match="directory"):
        torchquant.load(tmp_path)


class _Conv1dNet(nn.Module):
    """1-d convs (fused ReLU; stride and dilation) and a transposed 1-d conv (in != out)."""

    def __init__(self) -> None:
        super().__init__()
        import torchquant.quantization as tq
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv, self.relu = nn.Conv1d(4, 8, 3, padding=1), nn.ReLU()
        self.down = nn.Conv1d(8, 6, 3, stride=2, dilation=2, padding=2)
        self.up = nn.ConvTranspose1d(6, 5, 3, stride=2, padding=1, output_padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.up(self.down(self.relu(self.conv(self.quant(x))))))


def test_conv1d_and_conv_transpose_package(tmp_path):
    """1-d int8 convs become oneDNN's 2-d call on the height-1 view (the eager integers); a
    transposed conv the eager op's reference computation (dequantize, float transposed conv,
    quantize), whose float sums inductor may order otherwise, so an output within an ulp of a
    tie can land one step apart: within one step everywhere, equal on >= 99 % (all, measured
    here).  Where oneDNN saturates the 1-d convs are not taken (no exact split for them): the
    error names them."""
    import torchquant.quantization as tq
    torch.manual_seed(0)
    model = tq.fuse_modules(_Conv1dNet().eval(), [["conv", "relu"]])
    model.qconfig = tq.get_default_qconfig("x86")
    model.up.qconfig = tq.default_qconfig  # per-tensor weights: torch's rule for transposed convs
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        model(torch.randn(8, 4, 20))
    tq.convert(model, inplace=True)
    target = tmp_path / "conv1d.pt2"
    if not ops_linear.onednn_u8s8_exact():
        with pytest.raises(PackageError, match="torchquant::conv at conv"):
            torchquant.export_package(model, (torch.randn(2, 4, 20),), target)
        return
    package = torchquant.load(torchquant.export_package(model, (torch.randn(2, 4, 20),), target))
    for batch in (2, 5):
        x = torch.randn(batch, 4, 20) * 2
        with torch.no_grad():
            got, expected = package(x), model(x)
        assert ((got - expected).abs() <= model.up.scale * 1.0001).all(), batch
        assert (got == expected).float().mean().item() >= 0.99, batch


class _QuantizedLayerNorm(nn.Module):
    """An eager-quantized LayerNorm: ``torchquant::layer_norm`` has no C++ form in a package."""

    def __init__(self) -> None:
        super().__init__()
        import torchquant.quantization as tq
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.norm = nn.LayerNorm(8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dequant(self.norm(self.quant(x)))


def test_surviving_op_is_named_and_nothing_is_written(tmp_path):
    import torchquant.quantization as tq
    model = _QuantizedLayerNorm().eval()
    model.qconfig = tq.get_default_qconfig("x86")
    tq.prepare(model, inplace=True)
    model(torch.randn(4, 8))
    tq.convert(model, inplace=True)
    target = tmp_path / "norm.pt2"
    with pytest.raises(PackageError, match="torchquant::layer_norm at layer_norm"):
        torchquant.export_package(model, (torch.randn(4, 8),), target)
    assert list(tmp_path.iterdir()) == []


def test_batch_one_example_and_bad_paths_are_refused(tmp_path):
    model = sm.eager_dynamic(sm.lstm(), {nn.LSTM})
    with pytest.raises(PackageError, match="batch size above 1.*dynamic_batch=False"):
        torchquant.export_package(model, sm.example("lstm", 1), tmp_path / "m.pt2")
    with pytest.raises(ValueError, match="must end in .pt2"):
        torchquant.export_package(model, sm.example("lstm", 2), tmp_path / "m.zip")


# ---- the decompositions, eagerly: the eager ops' integers bit for bit (no compile) ----------

def _weight(rows: int, cols: int, per_channel: bool) -> tuple:
    w = torch.randint(-128, 128, (rows, cols), dtype=torch.int8)
    if per_channel:
        return w, torch.rand(rows, dtype=torch.float64) * 0.02, torch.zeros(rows, dtype=torch.int64)
    return w, torch.tensor(0.013, dtype=torch.float64), torch.tensor(0)


@pytest.mark.parametrize("int_mm", [True, False], ids=["int_mm", "float64_mm"])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("reduce_range", [True, False])
def test_decompositions_dynamic_linear_and_lstm_step(per_channel, reduce_range, int_mm,
                                                     monkeypatch):
    """Both accumulators: torch._int_mm, and the float64 matmul used where oneDNN is held
    below its CPU's ISA (where _int_mm saturates)."""
    from torchquant.ops.inductor import exact_decompositions as D
    if not int_mm:
        monkeypatch.setattr(D, "_int_mm_exact", lambda: False)
    tq_ops = torch.ops.torchquant
    w, ws, wz = _weight(24, 40, per_channel)
    bias = torch.randn(24)
    for shape in [(1, 40), (3, 40), (2, 7, 40), (65, 40)]:
        x = torch.randn(*shape) * 3
        for b in (bias, None):
            expected = tq_ops.linear_dynamic(x, w, ws, wz, b, reduce_range, True)
            assert torch.equal(D.linear_dynamic(x, w, ws, wz, b, reduce_range, True), expected)
        assert torch.equal(D.rnn_input_projection(x, w, ws, wz, bias, reduce_range),
                           tq_ops.rnn_input_projection_dynamic(x, w, ws, wz, bias, reduce_range))
    hw, hs, hz = _weight(64, 16, per_channel)
    ih, h, c = torch.randn(3, 64), torch.randn(3, 16), torch.randn(3, 16)
    b = torch.randn(64)
    expected = tq_ops.lstm_step_dynamic(ih, h, c, hw, hs, hz, b, reduce_range)
    got = D.lstm_step(ih, h, c, hw, hs, hz, b, reduce_range)
    assert all(torch.equal(a, e) for a, e in zip(got, expected))


@pytest.mark.parametrize("shape", [(2, 8, 8, 8), (3, 5, 7, 3)])
def test_decompositions_add_clamp_pools(shape):
    from torchquant.ops.inductor import exact_decompositions as D
    tq_ops = torch.ops.torchquant
    a, b = (torch.randint(0, 256, shape, dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last) for _ in range(2))
    for post_op in ("none", "relu"):
        args = (a, 0.05, 128, b, 0.03, 100, 0.07, 120, "quint8", post_op)
        assert torch.equal(D.add(*args), tq_ops.add(*args))
    for bounds in ((0.0, 6.0), (-1.0, 1.0), (None, 2.0), (0.5, None)):
        args = (a, 0.05, 100, *bounds, "quint8")
        assert torch.equal(D.clamp(*args), tq_ops.clamp(*args))
    pool = (a, [3, 3], [2, 2], [1, 1], [1, 1], False)
    assert torch.equal(D.max_pool2d(*pool), tq_ops.max_pool2d(*pool))
    big = (a, [6, 6], [2, 2], [3, 3], [1, 1], False)   # ATen's window (pooled in float)
    assert torch.equal(D.max_pool2d(*big), tq_ops.max_pool2d(*big))
    assert torch.equal(D.adaptive_avg_pool2d(a, 77, "quint8", [1, 1]),
                       tq_ops.adaptive_avg_pool2d(a, 77, "quint8", [1, 1]))


@pytest.mark.parametrize("channels_last", [True, False])
def test_decompositions_activations_mul_cat_mean(channels_last):
    """The package decompositions of the 8-bit activations (the eager op's value table), mul, the
    scalar add / mul, average pooling, the transposed conv, cat (channels-last along
    channels with a remainder of channels below a vector, and the plain path) and the
    inner-dims mean give the eager ops' integers. Element counts are whole vectors: eager rounds a
    tail of fewer elements than a vector by torch's scalar formula, which the decompositions
    do not reproduce (the module docstring)."""
    from torchquant.ops.inductor import exact_decompositions as D
    tq_ops = torch.ops.torchquant
    layout = torch.channels_last if channels_last else torch.contiguous_format
    a, b = (torch.randint(0, 256, (2, 8, 8, 8), dtype=torch.uint8).contiguous(
        memory_format=layout) for _ in range(2))
    for name in D._MAPPED_ACTIVATIONS:
        params = (1.3,) if name in ("elu", "celu") else ()
        args = (a, 0.05, 120, *params, 1 / 256 if name == "sigmoid" else 0.02, 0 if name ==
                "sigmoid" else 110, "quint8")
        assert torch.equal(D._mapped_decomposition(name)(*args), getattr(tq_ops, name)(*args))
    leaky = (a, 0.05, 120, 0.1, 0.04, 100, "quint8", "dense_input")
    assert torch.equal(D.leaky_relu(*leaky), tq_ops.leaky_relu(*leaky))
    for post_op in ("none", "relu"):
        args = (a, 0.05, 128, b, 0.03, 100, 0.07, 120, "quint8", post_op)
        assert torch.equal(D.mul(*args), tq_ops.mul(*args))
    c = torch.randint(0, 256, (2, 13, 8, 8), dtype=torch.uint8).contiguous(memory_format=layout)
    args = ([a, c, b], [0.05, 0.02, 0.03], [120, 7, 100], 1, 0.06, 90, "quint8")
    assert torch.equal(D.cat(*args), tq_ops.cat(*args))
    args = ([a, b], [0.05, 0.05], [120, 120], 1, 0.05, 120, "quint8")  # same qparams: copies
    assert torch.equal(D.cat(*args), tq_ops.cat(*args))
    for other, post_op in ((0.37, "none"), (-1.2, "relu"), (40.0, "none")):
        args = (a, 0.05, 120, other, 0.06, 100, "quint8", post_op)
        assert torch.equal(D.add_scalar(*args), tq_ops.add_scalar(*args))
    for other in (2.0, 0.0, -0.5):
        assert torch.equal(D.mul_scalar(a, other, "quint8"), tq_ops.mul_scalar(a, other, "quint8"))
    for pool in (([3, 3], [1, 1], [1, 1], False, True, None),
                 ([3, 3], [2, 2], [1, 1], True, False, None),
                 ([2, 2], [2, 2], [0, 0], False, True, 3)):
        args = (c, 7, "quint8", *pool)
        assert torch.equal(D.avg_pool2d(*args), tq_ops.avg_pool2d(*args))
    w = torch.randint(-127, 128, (13, 6, 3, 3), dtype=torch.int8)
    for w_scale, w_zp, post_op in ((torch.rand(6, dtype=torch.float64) / 50,
                                    torch.zeros(6, dtype=torch.int64), "relu"),
                                   (torch.tensor(0.02, dtype=torch.float64),
                                    torch.tensor(0), "none")):
        args = (c, 0.02, 7, w, w_scale, w_zp, torch.randn(6), 1, [2, 2], [1, 1], [1, 1],
                [1, 1], 1, 0.3, 60, post_op)
        assert torch.equal(D.conv_transpose(*args), tq_ops.conv_transpose(*args))
    for keepdim in (True, False):
        assert torch.equal(D.mean_inner_dims(c, 7, "quint8", 2, keepdim),
                           tq_ops.mean_inner_dims(c, 7, "quint8", 2, keepdim))


def test_packaging_entries_reach_the_table_inductor_reads_after_an_earlier_compile():
    """Inductor reads a copy of its decomposition table that the process's first compile makes
    and caches (``fast_random_decomps``): the package's entries must join that copy too, or any
    compile before ``export_package`` (another model, another test) leaves every eager / FX
    op opaque and the package is refused.  They leave both tables afterwards."""
    from torch._inductor.decomposition import select_decomp_table
    from torchquant.ops.inductor import exact_decompositions as ed

    torch.compile(lambda t: t * 2)(torch.randn(3))  # the first compile caches the copy
    graph = torch.fx.Graph()
    graph.output(graph.placeholder("x"))
    add = torch.ops.torchquant.add.default
    with ed.packaging(graph):
        assert add in select_decomp_table()
    assert add not in select_decomp_table()
