"""Int8 Linear / Conv2d kernels: torchquant vs torch.ao (engine x86) vs float, side by side.

    .venv/bin/python bench/bench_kernels.py [--quick]

Every number is one full kernel call as a module would make it: ours includes the dispatch,
argument checks, the per-call activation quantization of the dynamic paths and any layout
conversion; torch.ao is timed at its op level (``torch.ops.quantized.*`` on torch quantized
tensors, no module overhead), float is the eager ``F.linear`` / ``F.conv2d``.  Times are the
best of several interleaved rounds (the minimum resists noise from other processes); compare
ratios, absolute times drift between runs.
"""
from __future__ import annotations

import argparse
import math
import time
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from torchquant.kernels.conv import pack_conv_weight, quantized_conv
from torchquant.kernels.linear import dynamic_linear, per_token_dynamic_linear, quantized_linear
from torchquant.kernels.packed_linear import pack_linear_weight

warnings.filterwarnings("ignore", message="torch.quantize_per_tensor, torch.quantize_per_channel")

LINEAR_SHAPES = [(1, 768, 3072), (32, 768, 3072), (128, 768, 3072), (512, 1024, 1024)]
# ResNet-18's distinct 3x3 and 1x1 convs at 224x224: (in, out, input size, kernel, stride).
CONV_SHAPES = [(64, 64, 56, 3, 1), (64, 128, 56, 3, 2), (128, 128, 28, 3, 1),
               (128, 256, 28, 3, 2), (256, 256, 14, 3, 1), (256, 512, 14, 3, 2),
               (512, 512, 7, 3, 1), (64, 128, 56, 1, 2), (128, 256, 28, 1, 2),
               (256, 512, 14, 1, 2)]
CONV_BATCHES = [1, 8]
# The native conv's range (torchquant.kernels.native.conv_preferred): ResNet-18-shaped (width
# 32) and MobileNetV2-shaped (width 0.5) convs on 3x32x32 inputs, (in, out, input size, kernel,
# stride, groups).
SMALL_CONV_SHAPES = [(32, 32, 32, 3, 1, 1), (32, 64, 32, 3, 2, 1), (64, 64, 16, 3, 1, 1),
                     (128, 128, 8, 3, 1, 1), (256, 256, 4, 3, 1, 1), (128, 256, 8, 1, 2, 1),
                     (48, 48, 16, 3, 1, 48), (96, 96, 8, 3, 2, 96), (96, 32, 8, 1, 1, 1)]
SMALL_CONV_BATCHES = [1, 4, 16, 64]


def best_times(fns: dict[str, Callable[[], object]], budget_s: float,
               block_s: float = 0.002) -> dict[str, float]:
    """Seconds per call for each function.  Calls run in short blocks (~block_s), the blocks of
    the different functions interleaved until ``budget_s`` is spent, and the fastest block
    counts: short blocks let some of them dodge the stalls other processes cause."""
    numbers = {}
    for name, fn in fns.items():
        for _ in range(3):
            fn()
        t0 = time.perf_counter()
        fn()
        numbers[name] = max(1, int(block_s / max(time.perf_counter() - t0, 1e-7)))
    best = {name: math.inf for name in fns}
    start = time.perf_counter()
    rounds = 0
    while rounds < 5 or time.perf_counter() - start < budget_s:
        for name, fn in fns.items():
            n = numbers[name]
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t0) / n)
        rounds += 1
    return best


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def per_channel_qweight(w: torch.Tensor) -> torch.Tensor:
    scales = w.abs().amax(dim=tuple(range(1, w.dim()))).double() / 127.5
    return torch.quantize_per_channel(w, scales, torch.zeros(w.size(0), dtype=torch.long), 0,
                                      torch.qint8)


def linear_cases(timing: dict) -> tuple[list, list]:
    import torch.ao.nn.quantized as nnq
    static_rows, dynamic_rows = [], []
    for m, k, n in LINEAR_SHAPES:
        x = torch.randn(m, k)
        w, b = torch.randn(n, k) * 0.05, torch.randn(n)
        qw = per_channel_qweight(w)
        torch_packed = nnq.Linear(k, n)
        torch_packed.set_weight_bias(qw, b)
        torch_params = torch_packed._packed_params._packed_params
        packed = pack_linear_weight(qw.int_repr(), qw.q_per_channel_scales(),
                                    qw.q_per_channel_zero_points(), 0, b)
        qx = torch.quantize_per_tensor(x, 0.03, 64, torch.quint8)
        # Python-number qparams, as torch.ao's call takes its output qparams and as modules call
        x_int, x_scale, x_zp = qx.int_repr(), 0.03, 64
        out_scale, out_zp = 0.2, 70
        t = best_times({
            "ours": lambda: quantized_linear(x_int, x_scale, x_zp, packed, out_scale, out_zp),
            "torch.ao": lambda: torch.ops.quantized.linear(qx, torch_params, 0.2, 70),
            "float": lambda: F.linear(x, w, b),
        }, **timing)
        static_rows.append(((m, k, n), t, 2 * m * k * n))
        t = best_times({
            "ours": lambda: dynamic_linear(x, packed),
            "torch.ao": lambda: torch.ops.quantized.linear_dynamic(x, torch_params, True),
            "per_token": lambda: per_token_dynamic_linear(x, packed),
            "float": lambda: F.linear(x, w, b),
        }, **timing)
        dynamic_rows.append(((m, k, n), t, 2 * m * k * n))
    return static_rows, dynamic_rows


def conv_cases(timing: dict) -> list:
    import torch.ao.nn.quantized as nnq
    rows = []
    for batch in CONV_BATCHES:
        for cin, cout, size, ksize, stride in CONV_SHAPES:
            pad = ksize // 2
            x = torch.randn(batch, cin, size, size)
            w, b = torch.randn(cout, cin, ksize, ksize) * 0.05, torch.randn(cout)
            qw = per_channel_qweight(w)
            torch_conv = nnq.Conv2d(cin, cout, ksize, stride, pad)
            torch_conv.set_weight_bias(qw, b)
            # A quantized net hands each conv the channels-last output of the previous one.
            qx = torch.quantize_per_tensor(x, 0.03, 64, torch.quint8).contiguous(
                memory_format=torch.channels_last)
            x_int = qx.int_repr()
            # Python-number qparams, as torch.ao's call takes its output qparams and as modules
            # call (tensor qparams take the unplanned, re-checked path every call)
            x_scale, x_zp, out_scale, out_zp = 0.03, 64, 0.2, 70
            packed = pack_conv_weight(qw.int_repr(), qw.q_per_channel_scales(),
                                      qw.q_per_channel_zero_points(), 0, b, stride, pad)
            t = best_times({
                "ours": lambda: quantized_conv(x_int, x_scale, x_zp, packed, packed.stride,
                                               packed.padding, packed.dilation, 1, out_scale,
                                               out_zp),
                "torch.ao": lambda: torch.ops.quantized.conv2d(qx, torch_conv._packed_params,
                                                               0.2, 70),
                "float": lambda: F.conv2d(x, w, b, stride, pad),
            }, **timing)
            out = size // stride
            rows.append(((batch, cin, cout, size, ksize, stride), t,
                         2 * batch * cin * cout * ksize * ksize * out * out))
    return rows


def small_conv_cases(timing: dict) -> list:
    """torchquant's native conv against the oneDNN call the compiled graph makes otherwise (both
    at op level, weights prepacked / cached) and torch.ao's op, u8 out."""
    import torch.ao.nn.quantized as nnq
    from torchquant.kernels import native
    assert native.available(), native.describe()   # loads torch.ops.torchquant_native
    rows = []
    for batch in SMALL_CONV_BATCHES:
        for cin, cout, size, ksize, stride, groups in SMALL_CONV_SHAPES:
            pad = ksize // 2
            geometry = ([stride] * 2, [pad] * 2, [1, 1], groups)
            x = torch.randn(batch, cin, size, size)
            w, b = torch.randn(cout, cin // groups, ksize, ksize) * 0.05, torch.randn(cout)
            qw = per_channel_qweight(w)
            w_int, w_scale = qw.int_repr(), qw.q_per_channel_scales().float()
            w_zp = torch.zeros(cout, dtype=torch.int64)
            torch_conv = nnq.Conv2d(cin, cout, ksize, stride, pad, groups=groups)
            torch_conv.set_weight_bias(qw, b)
            qx = torch.quantize_per_tensor(x, 0.03, 64, torch.quint8).contiguous(
                memory_format=torch.channels_last)
            x_int = qx.int_repr()
            onednn_w = torch.ops.onednn.qconv_prepack(w_int, w_scale, 0.03, 64, *geometry,
                                                      list(x.shape))
            t = best_times({
                "ours": lambda: torch.ops.torchquant_native.qconv2d(
                    x_int, 0.03, 64, w_int, w_scale, b, *geometry, None, 1.0, 0, "none", [],
                    0.2, 70, torch.uint8),
                "oneDNN": lambda: torch.ops.onednn.qconv_pointwise(
                    x_int, 0.03, 64, onednn_w, w_scale, w_zp, b, *geometry, 0.2, 70,
                    torch.uint8, "none", [], ""),
                "torch.ao": lambda: torch.ops.quantized.conv2d(qx, torch_conv._packed_params,
                                                               0.2, 70),
                "float": lambda: F.conv2d(x, w, b, stride, pad, 1, groups),
            }, **timing)
            out = (size + 2 * pad - ksize) // stride + 1
            rows.append(((batch, cin, cout, size, ksize, stride, groups), t,
                         2 * batch * cin // groups * cout * ksize * ksize * out * out))
    return rows


def elementwise_cases(timing: dict) -> list:
    """ReLU / add / cat / max-pool on a (8, 64, 56, 56) quint8 activation, module level."""
    import torch.ao.nn.quantized as ao_nnq
    import torchquant as tq
    from torchquant.nn.quantized import QFunctional
    x, y = torch.randn(8, 64, 56, 56), torch.randn(8, 64, 56, 56)
    ours_x = tq.quantize_per_tensor(x, 0.03, 64, tq.quint8)
    ours_y = tq.quantize_per_tensor(y, 0.04, 60, tq.quint8)
    ao_x = torch.quantize_per_tensor(x, 0.03, 64, torch.quint8)
    ao_y = torch.quantize_per_tensor(y, 0.04, 60, torch.quint8)
    ours_f, ao_f = QFunctional(), ao_nnq.QFunctional()
    for f in (ours_f, ao_f):
        f.scale, f.zero_point = 0.05, 64
    cases = {
        "relu": (lambda: F.relu(ours_x), lambda: F.relu(ao_x)),
        "add": (lambda: ours_f.add(ours_x, ours_y), lambda: ao_f.add(ao_x, ao_y)),
        "cat (dim 1)": (lambda: ours_f.cat([ours_x, ours_y], 1), lambda: ao_f.cat([ao_x, ao_y], 1)),
        "max_pool2d 3/2": (lambda: F.max_pool2d(ours_x, 3, 2, 1), lambda: F.max_pool2d(ao_x, 3, 2, 1)),
    }
    float_cases = {
        "relu": lambda: F.relu(x), "add": lambda: x + y, "cat (dim 1)": lambda: torch.cat([x, y], 1),
        "max_pool2d 3/2": lambda: F.max_pool2d(x, 3, 2, 1),
    }
    rows = []
    for name, (ours, theirs) in cases.items():
        t = best_times({"ours": ours, "torch.ao": theirs, "float": float_cases[name]}, **timing)
        rows.append((name, t, x.numel()))
    return rows


def print_table(title: str, rows: list, columns: list[str], label: Callable) -> dict:
    print(f"\n## {title}\n")
    head = " | ".join(f"{c} us" for c in columns)
    ratio_cols = [c for c in columns if c != "torch.ao"]
    print(f"| shape | {head} | " + " | ".join(f"{c}/torch.ao" for c in ratio_cols)
          + " | ours/float | ours GOP/s |")
    print("|" + "---|" * (len(columns) + len(ratio_cols) + 3))
    ratios = {c: [] for c in ratio_cols}
    vs_float = []
    for shape, t, ops in rows:
        for c in ratio_cols:
            ratios[c].append(t[c] / t["torch.ao"])
        vs_float.append(t["ours"] / t["float"])
        print(f"| {label(shape)} | " + " | ".join(f"{t[c] * 1e6:.0f}" for c in columns) + " | "
              + " | ".join(f"{t[c] / t['torch.ao']:.2f}" for c in ratio_cols)
              + f" | {vs_float[-1]:.2f} | {ops / t['ours'] / 1e9:.0f} |")
    summary = {c: (geomean(v), max(v)) for c, v in ratios.items()}
    print("\n" + "; ".join(f"{c}/torch.ao geomean {g:.2f} (max {mx:.2f})"
                           for c, (g, mx) in summary.items())
          + f"; ours/float geomean {geomean(vs_float):.2f}")
    return {"vs_torch": summary["ours"], "vs_float": geomean(vs_float)}


def small_conv_table(timing: dict) -> None:
    from torchquant.kernels import native
    if not (native.available() and (native.amx() or native.exact_u8())):
        print(f"\n(no native conv here: {native.describe()})")
        return
    small = small_conv_cases(timing)
    print_table(f"Small Conv2d: the native conv ('ours', {native.isa()}) vs the oneDNN call "
                "(3x32x32 models)", small, ["ours", "oneDNN", "torch.ao", "float"],
                lambda s: f"b{s[0]} {s[1]}->{s[2]} {s[3]}x{s[3]} k{s[4]} s{s[5]} g{s[6]}")
    chosen = [t["ours"] / t["oneDNN"] for (b, ci, co, sz, k, st, g), t, _ in small
              if native.conv_preferred((b, ci, sz, sz), (co, ci // g, k, k), [st] * 2,
                                       [k // 2] * 2, [1, 1], g)]
    print(f"\nnative/oneDNN where conv_preferred picks the native conv: geomean "
          f"{geomean(chosen):.2f}, max {max(chosen):.2f} ({len(chosen)} of {len(small)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter rounds")
    parser.add_argument("--only-small-conv", action="store_true",
                        help="only the small-conv table (the native conv against oneDNN's call)")
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    torch.backends.quantized.engine = "x86"
    timing = {"budget_s": 0.3 if args.quick else 1.5}
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"engine {torch.backends.quantized.engine}, CPU {torch.backends.cpu.get_cpu_capability()}")
    from torchquant.kernels import cpu_isa, native
    print(f"CPU flags: {' '.join(cpu_isa.cpu_flags())}; {native.describe()}")
    if args.only_small_conv:
        small_conv_table(timing)
        return
    static_rows, dynamic_rows = linear_cases(timing)
    lin = lambda s: f"{s[0]}x{s[1]}x{s[2]}"
    static = print_table("Static Linear (u8 x s8 per-channel, u8 out)", static_rows,
                         ["ours", "torch.ao", "float"], lin)
    dynamic = print_table("Dynamic Linear (reduce_range, float out; per_token = int8 per-row)",
                          dynamic_rows, ["ours", "per_token", "torch.ao", "float"], lin)
    conv = print_table("Conv2d (ResNet-18 3x3 / 1x1, channels-last u8 in)", conv_cases(timing),
                       ["ours", "torch.ao", "float"],
                       lambda s: f"b{s[0]} {s[1]}->{s[2]} {s[3]}x{s[3]} k{s[4]} s{s[5]}")
    small_conv_table(timing)
    print_table("Elementwise / pooling on (8, 64, 56, 56) quint8 (last column: elements/ns)",
                elementwise_cases(timing), ["ours", "torch.ao", "float"], str)
    print("\n## Targets\n")
    checks = [
        ("static Linear geomean ours/torch.ao <= 0.8", static["vs_torch"][0] <= 0.8),
        ("static Linear no shape > 1.3", static["vs_torch"][1] <= 1.3),
        ("dynamic Linear geomean ours/torch.ao <= 0.8", dynamic["vs_torch"][0] <= 0.8),
        ("dynamic Linear no shape > 1.3", dynamic["vs_torch"][1] <= 1.3),
        ("Conv2d geomean ours/torch.ao <= 1.0", conv["vs_torch"][0] <= 1.0),
        ("Conv2d no shape > 1.3", conv["vs_torch"][1] <= 1.3),
        ("Conv2d ours >= 2x faster than float (geomean)", conv["vs_float"] <= 0.5),
    ]
    for text, ok in checks:
        print(f"- [{'x' if ok else ' '}] {text}")


if __name__ == "__main__":
    main()
