"""torchquant's integers do not move when oneDNN is held to AVX2 (``ONEDNN_MAX_CPU_ISA=AVX2``,
read once when torch starts, hence a child process).  On an AVX-512 VNNI / AMX CPU the child's
oneDNN saturates int16 pairs of u8 x s8 products, torchquant measures that and takes the
split paths, and the codes must equal this process's (oneDNN exact in one call).  On an
AVX2-only CPU both processes take the same paths.  torch.ao's own x86 conv changes in the
child (issue 27: 96 % of codes equal on full-range inputs): not an oracle for this.
"""
import os
import subprocess
import sys
from pathlib import Path

import torch

from torchquant.kernels import conv as kconv
from torchquant.kernels import linear as klinear
from torchquant.kernels import onednn_exactness as exactness
from torchquant.kernels.packed_linear import pack_linear_weight

ROOT = Path(__file__).resolve().parents[2]


def codes() -> dict:
    """Conv 1-3d (full-range uint8 input, per-channel, ReLU on 2-d), static Linear, dynamic
    Linear (reduce_range False: activations up to 255; 3 and 40 rows)."""
    g = torch.Generator().manual_seed(0)
    out = {}
    for dims in (1, 2, 3):
        w = torch.randint(-127, 128, (16, 8) + (3,) * dims, dtype=torch.int8, generator=g)
        scale = torch.rand(16, generator=g) * 0.004 + 0.001
        x = torch.randint(0, 256, (2, 8) + (8,) * dims, dtype=torch.uint8, generator=g)
        packed = kconv.pack_conv_weight(w, scale, torch.zeros(16, dtype=torch.int64), 0,
                                        torch.randn(16, generator=g), 1, 1, 1, 1)
        out[f"conv{dims}d"] = kconv.quantized_conv(
            x, 0.04, 100, packed, 1, 1, 1, 1, 0.3, 80,
            "relu" if dims == 2 else "none").contiguous()
    w = torch.randint(-127, 128, (40, 96), dtype=torch.int8, generator=g)
    packed = pack_linear_weight(w, torch.rand(40, generator=g) * 0.01 + 0.002,
                                torch.zeros(40, dtype=torch.int64), 0,
                                torch.randn(40, generator=g))
    x = torch.randint(0, 256, (24, 96), dtype=torch.uint8, generator=g)
    out["linear"] = klinear.quantized_linear(x, 0.04, 100, packed, 0.35, 90)
    for rows in (3, 40):
        xf = torch.randn(rows, 96, generator=g) * 2
        out[f"dynamic_linear_{rows}"] = klinear.dynamic_linear(xf, packed, reduce_range=False)
    out["onednn_u8_exact_max"] = torch.tensor(exactness.onednn_u8_exact_max())
    return out


def test_codes_unchanged_with_onednn_held_to_avx2(tmp_path):
    target = tmp_path / "avx2.pt"
    env = dict(os.environ, ONEDNN_MAX_CPU_ISA="AVX2",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "kernels"),
                                           os.environ.get("PYTHONPATH", "")]))
    script = ("import torch, test_cpu_isa_subprocess as t; "
              f"torch.save(t.codes(), {str(target)!r})")
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=300,
                   cwd=ROOT)
    child = torch.load(target)
    here = codes()
    # the child's oneDNN saturates (the variable took effect), whatever this CPU does
    assert int(child.pop("onednn_u8_exact_max")) == min(int(here.pop("onednn_u8_exact_max")),
                                                        exactness.ONEDNN_SAFE_U8_MAX)
    for name, value in here.items():
        assert torch.equal(child[name], value), name
