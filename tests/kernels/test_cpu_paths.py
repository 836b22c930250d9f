"""Every CPU path gives the same integers: each kernel family run once per path this machine
can take (``TORCHQUANT_CPU_ISA`` levels through :func:`forced_cpu_isa`) against the
plain-torch reference.

On an AVX-512 VNNI / AMX CPU the levels take different paths: ``default`` runs oneDNN's int8
kernels on full-range uint8 activations in one call, ``avx2`` / ``avx512`` the saturating
CPUs' paths (two exact halves, the sparse high half, the small-M float32 GEMM).  On an
AVX2-only CPU every level takes the saturating paths (a level cannot raise what the CPU
measures), so the test still compares them with the reference.  ``ONEDNN_MAX_CPU_ISA`` /
``ATEN_CPU_CAPABILITY`` (set before torch starts) move the oneDNN / ATen side:
tests/kernels/test_cpu_isa_subprocess.py runs that in a child process.

Integer codes equal the reference's except where the exact value lies within float32
rounding of a tie (``conftest.assert_equal_but_ties``); the paths of one family give
identical codes; the dynamic Linear's float outputs are identical on every path (torch.ao's
fused epilogue on an exact accumulator).
"""
import pytest
import torch
import torch.nn.functional as F

from torchquant import kernels
from torchquant.kernels import conv as kconv
from torchquant.kernels import cpu_isa
from torchquant.kernels import linear as klinear
from torchquant.kernels import onednn_exactness as exactness
from torchquant.kernels.packed_linear import pack_linear_weight
from torchquant.kernels import sparse_correction

from conftest import assert_equal_but_ties

LEVELS = ["default", "avx512_vnni", "avx512", "avx2"]
pytestmark = pytest.mark.skipif(not exactness.onednn_usable(), reason="no usable oneDNN")

X_SCALE, X_ZP = 0.04, 100


def _full_range(shape, generator):
    """uint8 activations over 0..255 with some at the top (what saturating CPUs split)."""
    x = torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)
    x.view(-1)[:4] = 255
    return x


def _run_per_level(fn):
    """``{level: fn()}`` with torchquant's CPU choices capped at each level, and the
    reference's result under ``'reference'``."""
    out = {}
    for level in LEVELS:
        with cpu_isa.forced_cpu_isa(level):
            out[level] = fn()
    with kernels.reference_only():
        out["reference"] = fn()
    return out


def test_levels_change_what_torchquant_measures():
    with cpu_isa.forced_cpu_isa("default"):  # also where TORCHQUANT_CPU_ISA caps this run
        measured = exactness.onednn_u8_exact_max()
    with cpu_isa.forced_cpu_isa("avx2"):
        assert exactness.onednn_u8_exact_max() == min(measured, exactness.ONEDNN_SAFE_U8_MAX)
        assert not exactness.onednn_u8s8_exact()
    with cpu_isa.forced_cpu_isa("avx512_vnni"):
        assert exactness.onednn_u8_exact_max() == measured
    assert cpu_isa.cpu_isa_cap() == "default" or cpu_isa.cpu_isa_cap() in cpu_isa.ISA_LEVELS
    with pytest.raises(ValueError, match="TORCHQUANT_CPU_ISA"):
        cpu_isa.set_cpu_isa_cap("sse2")


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("post_op", ["none", "relu"])
def test_linear_paths_agree(per_channel, post_op):
    g = torch.Generator().manual_seed(11)
    k, n = 96, 40
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    scale = (torch.rand(n, generator=g) * 0.01 + 0.002) if per_channel else torch.tensor(0.006)
    bias = torch.randn(n, generator=g)
    x = _full_range((24, k), g)
    out_scale, out_zp = 0.35, 90
    exact_y = (x.double() - X_ZP) * X_SCALE @ (w.double() * scale.double().view(-1, 1)
                                               if per_channel else w.double() * float(scale)).t()
    exact_y = exact_y + bias.double()
    if post_op == "relu":
        exact_y = exact_y.relu()
    exact = exact_y / out_scale + out_zp
    magnitude = (exact_y.abs() + 2 * bias.double().abs()) / out_scale + out_zp

    def run():
        packed = pack_linear_weight(w, scale, torch.zeros(n, dtype=torch.int64)
                                    if per_channel else torch.tensor(0),
                                    0 if per_channel else None, bias)
        return klinear.quantized_linear(x, X_SCALE, X_ZP, packed, out_scale, out_zp,
                                        post_op=post_op)

    codes = _run_per_level(run)
    for level, got in codes.items():
        assert_equal_but_ties(got, codes["reference"], exact, magnitude)
        assert_equal_but_ties(got, codes["default"], exact, magnitude)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_paths_agree(dims, sparse, monkeypatch):
    if sparse:  # the sparse high half on this small conv too (it pays only on big ones)
        monkeypatch.setattr(sparse_correction, "SPARSE_MIN_MACS", 0)
        monkeypatch.setattr(sparse_correction, "SPARSE_MAX_DENSITY", 0.05)
    g = torch.Generator().manual_seed(5 + dims)
    c_in, c_out = 8, 16
    w = torch.randint(-127, 128, (c_out, c_in) + (3,) * dims, dtype=torch.int8, generator=g)
    scale = torch.rand(c_out, generator=g) * 0.004 + 0.001
    bias = torch.randn(c_out, generator=g)
    spatial = (9,) * dims
    if sparse:  # a few values above 127 only
        x = torch.randint(0, 128, (2, c_in) + spatial, dtype=torch.uint8, generator=g)
        x.view(-1)[torch.randperm(x.numel(), generator=g)[:3]] = 250
    else:
        x = _full_range((2, c_in) + spatial, g)
    out_scale, out_zp = 0.3, 80
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    y = conv((x.double() - X_ZP) * X_SCALE,
             w.double() * scale.double().view((-1,) + (1,) * (dims + 1)), bias.double(),
             1, 1)
    exact = y / out_scale + out_zp
    b = bias.double().view((-1,) + (1,) * dims)
    magnitude = ((y - b).abs() + b.abs()) / out_scale + out_zp

    def run():
        packed = kconv.pack_conv_weight(w, scale, torch.zeros(c_out, dtype=torch.int64), 0,
                                        bias, 1, 1, 1, 1)
        return kconv.quantized_conv(x, X_SCALE, X_ZP, packed, 1, 1, 1, 1, out_scale,
                                    out_zp).contiguous()

    codes = _run_per_level(run)
    for level, got in codes.items():
        assert_equal_but_ties(got, codes["reference"], exact, magnitude)
        assert_equal_but_ties(got, codes["default"], exact, magnitude)


def test_conv_transpose_paths_agree():
    """Transposed convs run the reference kernel on every CPU (no CPU choice); the levels
    must not change that."""
    g = torch.Generator().manual_seed(2)
    w = torch.randint(-127, 128, (8, 6, 3, 3), dtype=torch.int8, generator=g)
    x = _full_range((1, 8, 5, 5), g)

    def run():
        packed = kconv.pack_conv_weight(w, torch.tensor(0.003), torch.tensor(0), None,
                                        torch.randn(6, generator=torch.Generator()
                                                    .manual_seed(0)),
                                        2, 1, 1, 1, transposed=True, output_padding=1)
        return kconv.quantized_conv_transpose(x, X_SCALE, X_ZP, packed, 2, 1, 1, 1, 1, 0.2, 70)

    codes = _run_per_level(run)
    for got in codes.values():
        assert torch.equal(got, codes["reference"])


@pytest.mark.parametrize("rows", [3, 40])
@pytest.mark.parametrize("reduce_range", [True, False])
@pytest.mark.parametrize("per_channel", [False, True])
def test_dynamic_linear_paths_agree(rows, reduce_range, per_channel):
    """Float outputs identical on every path: the exact integer accumulator (oneDNN in one
    call, two halves, or the small-M float32 GEMM) and torch.ao's epilogue
    ``fma(acc, x_scale * w_scale, bias)``.  The reference (float64 dequantized GEMM) is a
    float rounding or so apart."""
    g = torch.Generator().manual_seed(rows)
    k, n = 64, 24
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    scale = (torch.rand(n, generator=g) * 0.01 + 0.002) if per_channel else torch.tensor(0.006)
    bias = torch.randn(n, generator=g)
    x = torch.randn(rows, k, generator=g) * 3

    def run():
        packed = pack_linear_weight(w, scale, torch.zeros(n, dtype=torch.int64)
                                    if per_channel else torch.tensor(0),
                                    0 if per_channel else None, bias)
        return klinear.dynamic_linear(x, packed, reduce_range)

    outs = _run_per_level(run)
    for level in LEVELS:
        assert torch.equal(outs[level], outs["default"]), level
    # a few float32 roundings of outputs up to ~50 (the reference sums in float64)
    torch.testing.assert_close(outs["default"], outs["reference"].float(), rtol=1e-6,
                               atol=2e-5)
