"""Calibrate the digits CNN over data sharded across processes (``torch.distributed``).

    python -m torchquant.examples.distributed --nproc 2      # spawns 2 local ranks (gloo)
    torchrun --nproc-per-node 2 -m torchquant.examples.distributed

Each rank calibrates the eager PTQ recipe of :mod:`torchquant.examples.digits` on its own shard
of the training images, then :func:`torchquant.quantization.sync_observers` merges the
observers.  Rank 0 prints whether the ranks' qparams agreed before and after the sync, how far
they are from one process that calibrated on all the data, and every rank's accuracy.

:func:`spawn` (local ranks with a free port and a deadline) is also what the tests use.
"""
from __future__ import annotations

import argparse
import copy
import datetime
import os
import socket
import time
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from .. import quantization as tq
from . import digits


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn: Callable, world_size: int, port: int, timeout_s: float,
           args: tuple) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=timeout_s))
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn(fn: Callable, nprocs: int, args: tuple = (), timeout_s: float = 120.0,
          collective_timeout_s: float = 30.0) -> None:
    """Run ``fn(rank, world_size, *args)`` in ``nprocs`` local processes joined by a gloo
    group (free port; collectives time out after ``collective_timeout_s``).

    A rank that raises ends the others and the error is re-raised here (torch's
    ``ProcessRaisedException``); past ``timeout_s`` the ranks are terminated and
    ``TimeoutError`` raised, so nothing hangs.
    """
    context = mp.start_processes(_entry, args=(fn, nprocs, free_port(), collective_timeout_s, args),
                                 nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout_s
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                if process.is_alive():
                    process.terminate()
            for process in context.processes:
                process.join(5)
            raise TimeoutError(f"spawn: {nprocs} ranks did not finish within {timeout_s:.0f} s")


def observer_qparams(model: nn.Module) -> dict[str, tuple[list, list]]:
    """(scale, zero_point) of every observer that has statistics, by module name."""
    out = {}
    for name, mod in model.named_modules():
        if isinstance(getattr(mod, "min_val", None), torch.Tensor) and hasattr(mod, "calculate_qparams"):
            scale, zero_point = mod.calculate_qparams()
            out[name] = (scale.reshape(-1).tolist(), zero_point.reshape(-1).tolist())
    return out


def _max_relative_gap(a: dict, b: dict) -> tuple[float, int]:
    """Largest relative scale difference and number of differing zero points."""
    gap, zp_diffs = 0.0, 0
    for name, (scale, zp) in a.items():
        other_scale, other_zp = b[name]
        gap = max([gap] + [abs(s - o) / max(abs(o), 1e-30) for s, o in zip(scale, other_scale)])
        zp_diffs += sum(z != o for z, o in zip(zp, other_zp))
    return gap, zp_diffs


def calibrate(float_model: nn.Module, images: torch.Tensor, backend: str = "x86") -> nn.Module:
    """The digits eager PTQ recipe up to (not including) convert."""
    model = tq.fuse_modules(copy.deepcopy(float_model).eval(), digits.FUSE_PATTERNS)
    model.qconfig = tq.get_default_qconfig(backend)
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for batch in images.split(128):
            model(batch)
    return model


def run(rank: int, world_size: int, float_state: dict) -> dict:
    """One rank of the example; returns (on every rank) what rank 0 prints."""
    x_tr, y_tr, x_te, y_te = digits.load_data()
    float_model = digits.DigitsCNN()
    float_model.load_state_dict(float_state)
    float_model.eval()
    shard = x_tr[rank::world_size]  # each rank sees a different slice of the data
    model = calibrate(float_model, shard)

    before = observer_qparams(model)
    everyone_before: list = [None] * world_size
    dist.all_gather_object(everyone_before, before)
    tq.sync_observers(model)
    after = observer_qparams(model)
    everyone_after: list = [None] * world_size
    dist.all_gather_object(everyone_after, after)

    quantized = tq.convert(model)
    accuracy = digits.accuracy(quantized, x_te, y_te)
    accuracies: list = [None] * world_size
    dist.all_gather_object(accuracies, accuracy)

    report = {
        "agree_before": all(q == everyone_before[0] for q in everyone_before),
        "agree_after": all(q == everyone_after[0] for q in everyone_after),
        "observers": len(after),
        "accuracies": accuracies,
    }
    if rank == 0:
        single = observer_qparams(calibrate(float_model, x_tr))
        report["gap_to_single"] = _max_relative_gap(after, single)
        report["float_accuracy"] = digits.accuracy(float_model, x_te, y_te)
        print(f"{world_size} ranks, {len(shard)} calibration images on rank 0, "
              f"{report['observers']} observers")
        print(f"qparams identical on all ranks before sync_observers: {report['agree_before']}")
        print(f"qparams identical on all ranks after sync_observers:  {report['agree_after']}")
        gap, zp_diffs = report["gap_to_single"]
        print(f"vs one process calibrated on all data: max relative scale gap {gap:.2e}, "
              f"{zp_diffs} zero points differ")
        print(f"float accuracy {report['float_accuracy']:.2f}%")
        for r, acc in enumerate(accuracies):
            print(f"rank {r}: int8 accuracy {acc:.2f}%")
    return report


def _spawned(rank: int, world_size: int, float_state: dict) -> None:
    run(rank, world_size, float_state)


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=0,
                        help="spawn this many local ranks (gloo); omit under torchrun")
    opts = parser.parse_args(argv)
    float_state = digits.trained_float_model().state_dict()  # trained/cached once, here
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
        try:
            run(dist.get_rank(), dist.get_world_size(), float_state)
        finally:
            dist.destroy_process_group()
    else:
        spawn(_spawned, max(opts.nproc, 1), (float_state,), timeout_s=600)


if __name__ == "__main__":
    main()
