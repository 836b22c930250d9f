"""The demo behind ``make demo``.

For now it shows the quantized tensor itself: it quantizes a fixed random tensor per tensor and
per channel, for each 8-bit dtype, and prints the measured round-trip error next to the bound
``scale / 2`` that affine quantization guarantees inside the range.  Every number printed is
measured in this run.  (The model demo arrives with the eager workflow.)
"""
from __future__ import annotations

import torch

from . import QTensor, qint8, quantize_per_channel, quantize_per_tensor, quint8


def _row(label: str, x: torch.Tensor, q: QTensor) -> str:
    err = (q.dequantize() - x).abs()
    bound = (q.scale.max() if q.axis is not None else q.scale).item() / 2
    return (f"{label:<34} {q.qdtype!r:<18} {err.max().item():>10.6f} {err.mean().item():>10.6f} "
            f"{bound:>10.6f}")


def run_demo() -> int:
    torch.manual_seed(0)
    x = torch.randn(256, 1024) * torch.linspace(0.1, 3.0, 256)[:, None]
    print("torchquant demo: quantizing a (256, 1024) float tensor (rows of growing scale)\n")
    print(f"{'scheme':<34} {'dtype':<18} {'max err':>10} {'mean err':>10} {'scale/2':>10}")
    lo, hi = x.min().item(), x.max().item()
    for qdtype in (quint8, qint8):
        scale = (hi - lo) / (qdtype.qmax - qdtype.qmin)
        zp = int(round(qdtype.qmin - lo / scale))
        q = quantize_per_tensor(x, scale, zp, qdtype)
        print(_row("per tensor, affine (min/max)", x, q))
    amax = x.abs().amax(dim=1).double()
    scales = amax / 127.5
    qc = quantize_per_channel(x, scales, torch.zeros(256, dtype=torch.int64), 0, qint8)
    print(_row("per channel (axis 0), symmetric", x, qc))
    print("\nmax err <= scale/2 holds inside the range; per-channel error is lower because each"
          " row gets its own scale.")
    return 0
