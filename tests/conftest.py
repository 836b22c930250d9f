import functools
import io
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

# torch 2.13 warns on every use of its quantized dtypes; here they are only the oracle.
warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")


@functools.cache
def _cpu_paths_report() -> tuple[str, ...]:
    """The CPU and the path each torchquant kernel family takes on it (issue 27)."""
    from torchquant.kernels import cpu_isa
    from torchquant.kernels import onednn_exactness as exactness
    from torchquant.kernels import linear_small_m
    from torchquant.kernels import native
    from torchquant.kernels.native import onednn as onednn_library
    exact_max = exactness.onednn_u8_exact_max()
    if exact_max >= 255:
        int8 = "oneDNN int8, one call for every uint8 input"
        dynamic = "oneDNN int8 accumulator + torch.ao's fused epilogue"
    elif exact_max >= 0:
        int8 = (f"oneDNN int8, inputs above {exact_max} as two exact halves (sparse high half "
                "where it pays)")
        dynamic = (f"<= {linear_small_m.SMALL_M_MAX_ROWS} rows: exact float32 GEMM, else oneDNN "
                   "int8 (split above 128); torch.ao's fused epilogue")
    else:
        int8 = dynamic = "plain-torch reference (no usable oneDNN)"
    if native.available():
        dynamic = "native fbgemm (torch.ao's kernel; full range where it is exact, else " + dynamic + ")"
    return (
        f"cpu: flags {' '.join(cpu_isa.cpu_flags()) or 'unknown'}; ATen "
        f"{torch.backends.cpu.get_cpu_capability()}; ONEDNN_MAX_CPU_ISA="
        f"{os.environ.get('ONEDNN_MAX_CPU_ISA', 'unset')}; TORCHQUANT_CPU_ISA="
        f"{cpu_isa.cpu_isa_cap()}",
        f"torchquant paths: linear / conv: {int8}; dynamic linear: {dynamic}; conv-transpose: "
        f"reference; fp16 linear: float32 GEMM; torch._int_mm exact here: "
        f"{exactness.int_mm_exact_on_cpu()}",
        f"native kernels: {native.describe()}; full-range uint8 through fbgemm: "
        f"{native.available() and native.exact_u8()} (else reduce_range dynamic Linear / RNNs "
        "only)",
        f"eager 2-d convs: {onednn_library.describe()}",
        f"torch.ao oracle exact on full-range uint8 here: {torch_oracle_exact_u8()}",
    )


def pytest_report_header(config):
    return list(_cpu_paths_report())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The same lines after the results, where ``-q`` (``make test``) shows them too; only in
    the process that reports (xdist workers do not)."""
    terminalreporter.section("CPU and kernel paths")
    for line in _cpu_paths_report():
        terminalreporter.write_line(line)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture
def weights_only_roundtrip():
    """``state -> torch.save -> torch.load(weights_only=True)``."""
    def roundtrip(state):
        buffer = io.BytesIO()
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)
    return roundtrip


# --------------------------------------------------------------------------------------------
# What the CPU under the tests does to torch's oracles
# --------------------------------------------------------------------------------------------
#
# The suite runs on AVX-512 VNNI / AMX CPUs (Xeons, an AVX-512 VNNI AMD EPYC) and on AVX2-only
# CPUs (older EPYCs).  On the latter, torch's x86 / fbgemm / onednn int8 GEMMs and convs multiply u8 x s8 with
# ``vpmaddubsw``, which saturates each pair ``u8*s8 + u8*s8`` to int16: with activations above
# 128 torch's quantized Linear / Conv are simply wrong there (e.g. 247 where the exact answer
# is 255).  Activations 0..127 -- what torch's reduce_range qconfigs produce -- never saturate.
# torchquant's own kernels stay exact on such CPUs
# (kernels.onednn_exactness.onednn_u8_exact_max); only the oracle needs care.

def _torch_linear_conv_u8(engine: str) -> tuple[int, int]:
    """torch's quantized Linear and Conv2d output for all-255 activations and all-127 weights
    under ``engine`` (exact: 207 and 233)."""
    nnq = torch.ao.nn.quantized
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine
    try:
        lin = nnq.Linear(64, 16)
        lin.set_weight_bias(torch._make_per_tensor_quantized_tensor(
            torch.full((16, 64), 127, dtype=torch.int8), 1.0, 0), None)
        lin.scale, lin.zero_point = 10000.0, 0
        x = torch._make_per_tensor_quantized_tensor(torch.full((4, 64), 255, dtype=torch.uint8),
                                                    1.0, 0)
        conv = nnq.Conv2d(8, 16, 3)
        conv.set_weight_bias(torch._make_per_tensor_quantized_tensor(
            torch.full((16, 8, 3, 3), 127, dtype=torch.int8), 1.0, 0), None)
        conv.scale, conv.zero_point = 10000.0, 0
        xc = torch._make_per_tensor_quantized_tensor(
            torch.full((1, 8, 5, 5), 255, dtype=torch.uint8), 1.0, 0)
        return int(lin(x).int_repr().min()), int(conv(xc).int_repr().min())
    finally:
        torch.backends.quantized.engine = old


@functools.cache
def torch_oracle_exact_u8() -> bool:
    """Whether torch's x86 / fbgemm / onednn quantized Linear and Conv are exact for quint8
    activations up to 255 on this CPU (False where they saturate int16 pairs, see above)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        engines = [e for e in ("x86", "fbgemm", "onednn")
                   if e in torch.backends.quantized.supported_engines]
        return all(_torch_linear_conv_u8(e) == (207, 233) for e in engines)


def run_python(code: str, **env: str) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter with these environment variables added (and
    torchquant's messages quiet); asserts that it exited 0, showing its stderr if not."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, TORCHQUANT_QUIET="1", **env))
    assert out.returncode == 0, out.stderr
    return out


def run_forked(setup: str, body: str, items: list[str]) -> list[str]:
    """One fresh interpreter runs ``setup`` (at least ``import torch``), then forks a child per
    item that runs ``body`` with ``item`` bound: each child starts as a fresh program would
    after ``setup``, without paying the interpreter's start and torch's import again.  Returns
    the lines the children printed; a child that raises prints ``<item> failed: <traceback>``."""
    script = ("import os, sys, traceback\n" + setup + "\n"
              "for item in sys.argv[1:]:\n"
              "    pid = os.fork()\n"
              "    if pid == 0:\n"
              "        try:\n" + textwrap.indent(body, " " * 12) + "\n"
              "        except BaseException:\n"
              "            print(item, 'failed:', traceback.format_exc(), flush=True)\n"
              "        os._exit(0)\n"
              "    os.waitpid(pid, 0)\n")
    out = subprocess.run([sys.executable, "-c", script, *items], capture_output=True, text=True,
                         timeout=300, env=dict(os.environ, TORCHQUANT_QUIET="1"))
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()


def oracle_u8(size, high=256) -> torch.Tensor:
    """Random uint8 activations torch's x86 / fbgemm / onednn oracle computes exactly here:
    0..high-1 where it is exact on the full range, 0..127 where it saturates (the range of
    torch's own reduce_range qconfigs).  Draws from the global RNG (seeded per test)."""
    return torch.randint(0, high if torch_oracle_exact_u8() else min(high, 128), size,
                         dtype=torch.uint8)


def oracle_input(x: torch.Tensor, scale: float, zero_point: int) -> torch.Tensor:
    """Float activations about to be quantized (quint8, ``scale`` / ``zero_point``) for a
    torch oracle: as given where torch is exact on the full range, else clamped to what
    quantizes to at most 127 (module tests import it: ``from conftest import oracle_input``)."""
    if torch_oracle_exact_u8():
        return x
    assert zero_point < 127, "no room below 128 for the activations"
    return x.clamp(max=(127 - zero_point) * scale)


def assert_equal_but_ties(got: torch.Tensor, expected: torch.Tensor, exact: torch.Tensor,
                          magnitude: torch.Tensor) -> None:
    """``got == expected`` (integer codes) except where the exact unrounded code ``exact``
    (float64) lies within a few float32 ulps of a rounding tie (``k + 0.5``): there a float32
    epilogue may round either way depending on the order of its multiply / add, which differs
    between oneDNN's kernels (e.g. its AVX-512 VNNI conv3d kernel and the one torch.ao's
    module runs: one code in ~10^5 on random 3-d convs here), and one step is allowed.
    ``magnitude`` bounds the float32 intermediates of the epilogue in code units (e.g.
    ``(|acc * scale| + |bias|) / out_scale + |zero_point|``)."""
    diff = (got.to(torch.int32) - expected.to(torch.int32)).abs()
    near_tie = ((exact - exact.floor() - 0.5).abs()
                <= 8 * torch.finfo(torch.float32).eps * (magnitude.double() + 1))
    assert int(diff.max()) <= 1, f"max difference {int(diff.max())} steps"
    assert bool(near_tie[diff != 0].all()), \
        f"{int((diff != 0).sum())} codes differ, {int((diff[~near_tie] != 0).sum())} not at a tie"


def assert_fp16_linear_close(ours: torch.Tensor, theirs: torch.Tensor, x: torch.Tensor,
                             weight16: torch.Tensor) -> None:
    """torchquant's float16 dynamic Linear against torch.ao's, on every CPU: the same float32
    products, summed in another order, so a few float32 roundings of the summed magnitudes
    apart (measured <= 0.6 eps * sum|x_j w_j|; a wrong fp16 weight rounding would be ~2**-11
    relative, and the tests compare the weights exactly).  Why not bit-exact: torch.ao's fbgemm
    fp16 GEMM is a float32 fused multiply-add chain over k in order, bias added after (checked
    bit for bit on an AVX-512 VNNI EPYC, for K up to 1024), while torchquant's is a float32
    GEMM of the widened weight (MKL / oneDNN), whose blocking over k depends on the CPU and
    the library -- equal to torch.ao's on some CPUs, ~10-90 % of outputs an ulp or so off on
    others.  A sequential FMA chain has no fast plain-torch form."""
    magnitude = x.abs() @ weight16.abs().t()
    tol = 8 * torch.finfo(torch.float32).eps * (magnitude + 1.0)
    assert bool(((ours - theirs).abs() <= tol).all()), (ours - theirs).abs().max()


@pytest.fixture(name="torch_oracle_exact_u8")
def _torch_oracle_exact_u8_fixture() -> bool:
    return torch_oracle_exact_u8()


@pytest.fixture(name="oracle_u8")
def _oracle_u8_fixture():
    return oracle_u8

