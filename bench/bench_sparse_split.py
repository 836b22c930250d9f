"""The saturating-CPU conv split with a sparse vs a dense high half (issue #16), side by side.

    .venv/bin/python bench/bench_sparse_split.py [--size 224] [--rounds 11]

On CPUs whose oneDNN saturates u8 x s8 pairs above 128 (AVX2 without VNNI) every conv whose
input exceeds 128 is split; the high half ``x >> 7`` is computed either by a second oneDNN conv
(dense) or from its few nonzero inputs (``kernels/sparse_correction.py``).  On the
ResNet-18-shaped model, calibrated as ``bench_peers.py`` does, this prints:

* the density of ``x > 127`` at each conv input (fresh input);
* per conv (its real input, interleaved rounds, medians): the dense split, the sparse half and
  the single saturating oneDNN call (wrong above 128: the floor);
* the whole eager model at batch 1: torch.ao eager, dense, sparse, single.

The sparse / dense switch is ``sparse_correction.SPARSE_MAX_DENSITY`` (read per call).  One
thread; compare ratios, not absolute times, on a shared machine.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import time
from types import SimpleNamespace

import torch
import torch.ao.nn.quantized as ao_nnq
import torch.ao.quantization as aoq

import torchquant.quantization as tq
from torchquant.examples.resnet import ResNet18, randomize_bn
from torchquant.kernels import conv as kconv
from torchquant.kernels import sparse_correction as sparse


def _medians(fns: dict, rounds: int, calls: int = 1) -> dict:
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(v) for name, v in times.items()}


def _single_call_plan(x, args, kwargs):
    """The conv's oneDNN plan as on a CPU that does not saturate: one fused call."""
    x_scale, x_zp, packed = args[1:4]
    post_op = args[10] if len(args) > 10 else kwargs.get("post_op", "none")
    other = kwargs.get("other")
    epilogue = kconv._epilogue(x, packed, post_op, kwargs.get("negative_slope", 0.01), other,
                               kwargs.get("other_scale", 1.0), kwargs.get("other_zero_point", 0),
                               "bench")
    real = kconv.onednn_u8s8_exact
    kconv.onednn_u8s8_exact = lambda: True
    try:
        plan = kconv._onednn_plan(x, x_scale, x_zp, packed, args[8], args[9], epilogue, other)
    finally:
        kconv.onednn_u8s8_exact = real
    return lambda: plan(x, other)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--rounds", type=int, default=11)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    torch.backends.quantized.engine = "x86"
    torch.manual_seed(0)
    float_model = randomize_bn(ResNet18()).eval()
    ao_ops = SimpleNamespace(QuantStub=aoq.QuantStub, DeQuantStub=aoq.DeQuantStub,
                             FloatFunctional=ao_nnq.FloatFunctional)
    ao_float = ResNet18(ops=ao_ops).eval()
    ao_float.load_state_dict(float_model.state_dict())
    calib = [torch.randn(2, 3, opts.size, opts.size) for _ in range(2)]

    def recipe(lib, model):
        model = lib.fuse_modules(copy.deepcopy(model), model.fuse_patterns())
        model.qconfig = lib.get_default_qconfig("x86")
        lib.prepare(model, inplace=True)
        with torch.no_grad():
            for c in calib:
                model(c)
        return lib.convert(model)

    model, ao_model = recipe(tq, float_model), recipe(aoq, ao_float)
    x = torch.randn(1, 3, opts.size, opts.size)
    calls = []
    real_conv = kconv.quantized_conv

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        return real_conv(*args, **kwargs)

    kconv.quantized_conv = record
    try:
        with torch.no_grad():
            model(x)
    finally:
        kconv.quantized_conv = real_conv

    def with_density(fn, limit):
        def run():
            sparse.SPARSE_MAX_DENSITY = limit
            return fn()
        return run

    default = sparse.SPARSE_MAX_DENSITY
    print(f"per conv ({opts.size}x{opts.size}, batch 1; us, medians of {opts.rounds})")
    totals = {"single": 0.0, "dense": 0.0, "sparse": 0.0}
    for args, kwargs in calls:
        conv_in, packed = args[0], args[3]
        conv = lambda a=args, k=kwargs: real_conv(*a, **k)  # noqa: E731
        fns = {"single": _single_call_plan(conv_in, args, kwargs),
               "dense": with_density(conv, 0.0), "sparse": with_density(conv, default)}
        assert torch.equal(fns["dense"](), fns["sparse"]())
        start = time.perf_counter()
        conv()
        repeat = max(1, int(0.02 / (time.perf_counter() - start)))
        med = _medians(fns, opts.rounds, repeat)
        for name in totals:
            totals[name] += med[name]
        density = (conv_in > 127).float().mean().item()
        print(f"  {str(tuple(conv_in.shape)):18s} w{tuple(packed.weight.shape)} "
              f"s{packed.stride[0]}  x>127 {density * 100:.3f} %  single {med['single'] * 1e6:6.0f}"
              f"  dense {med['dense'] * 1e6:6.0f}  sparse {med['sparse'] * 1e6:6.0f}  "
              f"dense/sparse {med['dense'] / med['sparse']:.2f}")
    print(f"  sum: dense/sparse {totals['dense'] / totals['sparse']:.2f}, "
          f"sparse/single {totals['sparse'] / totals['single']:.2f}")

    single_model = copy.deepcopy(model)
    real = kconv.onednn_u8s8_exact
    kconv.onednn_u8s8_exact = lambda: True
    with torch.no_grad():
        single_model(x)  # its conv plans are built as on a CPU that does not saturate
    kconv.onednn_u8s8_exact = real
    dense_model = copy.deepcopy(model)
    fns = {"torch.ao eager (saturates)": lambda: ao_model(x),
           "torchquant dense split": with_density(lambda: dense_model(x), 0.0),
           "torchquant sparse": with_density(lambda: model(x), default),
           "torchquant single call (saturates)": lambda: single_model(x)}
    with torch.no_grad():
        med = _medians(fns, opts.rounds)
    sparse.SPARSE_MAX_DENSITY = default
    base = med["torch.ao eager (saturates)"]
    print(f"whole model, eager, batch 1 (ms, medians of {opts.rounds})")
    for name, seconds in med.items():
        print(f"  {name:36s} {seconds * 1e3:8.2f}  / torch.ao {seconds / base:.2f}")


if __name__ == "__main__":
    main()
