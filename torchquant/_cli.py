"""The ``quantize``, ``report`` and ``package`` commands of ``python -m torchquant`` / ``torchquant``.

User errors (missing files, a file that is not an exported program, calibration data that does
not fit the program, NaN in it) raise :class:`UserError`; ``__main__`` prints its one line on
stderr and exits non-zero.  Outputs are written through a temporary file and renamed, so a
failed run leaves nothing behind.
"""
from __future__ import annotations

import argparse
import importlib.util
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Callable

import torch

import torchquant

from ._files import atomic_write, commit_staged, stage_file
from ._package import PackageError, export_package
from .quantization.auto_fallback import quantize_pt2e_with_fallback
from .quantization.pt2e import (extract_results_from_loggers, numeric_report,
                                prepare_for_propagation_comparison)
from .quantization.pt2e._numeric_debugger import (generate_numeric_debug_handle,
                                                  get_debug_handle, module_stack_to_str)
from .quantization.pt2e._numeric_report import model_size_bytes
from .quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)
from .quantization.quantizer.xnnpack_quantizer import (XNNPACKQuantizer,
                                                       get_symmetric_quantization_config)

__all__ = ["UserError", "add_subcommands", "run_quantize", "run_report", "run_package"]

_REPORT_BATCHES = 8  # the per-layer table uses at most this many calibration batches
_TABLE_ROWS = 15


class UserError(Exception):
    """A problem with the command's inputs: reported in one line, no traceback."""


# ---- loading and checking inputs ------------------------------------------------------------

def _check_file(path: str, what: str) -> None:
    if not os.path.exists(path):
        raise UserError(f"{what} {path!r} does not exist")
    if os.path.isdir(path):
        raise UserError(f"{what} {path!r} is a directory, not a file")


def load_program(path: str) -> torch.export.ExportedProgram:
    """A program saved with ``torch.export.save``."""
    _check_file(path, "program")
    expected = "expected a .pt2 archive written by torch.export.save"
    # torch logs warnings (and a traceback) before raising; the one line below says enough
    previous_disable = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ep = torch.export.load(path)
    except Exception as e:  # noqa: BLE001 - any failure here means "not a saved program"
        detail = _first_line(e)
        if "warning" in detail.lower() or "must be a buffer or a file ending" in detail:
            detail = ""  # points at the log lines silenced above
        else:
            detail = f"; {type(e).__name__}: {detail}"
        raise UserError(f"{path!r} is not a program saved with torch.export.save ({expected}"
                        f"{detail})") from None
    finally:
        logging.disable(previous_disable)
    if not isinstance(ep, torch.export.ExportedProgram):
        raise UserError(f"{path!r} is not a program saved with torch.export.save ({expected})")
    return ep


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:200] if text else "no detail"


def _input_specs(ep: torch.export.ExportedProgram) -> list[Any]:
    """The example values (``meta["val"]``) of the program's user inputs, in order."""
    user_inputs = set(ep.graph_signature.user_inputs)
    return [n.meta.get("val") for n in ep.graph.nodes
            if n.op == "placeholder" and n.name in user_inputs]


def _shape_text(shape: Sequence[Any]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"


def _fits(t: torch.Tensor, spec: Any) -> bool:
    if not isinstance(spec, torch.Tensor):
        return True
    if t.dim() != spec.dim():
        return False
    return all(not isinstance(d, int) or d == s for d, s in zip(spec.shape, t.shape))


def load_batches(path: str, ep: torch.export.ExportedProgram) -> list[tuple]:
    """Calibration inputs from ``path`` (``torch.save`` of a tensor, or of a list / tuple whose
    items are input tuples or single tensors), checked against the program's inputs."""
    _check_file(path, "calibration data")
    try:
        data = torch.load(path, weights_only=True)
    except Exception as e:  # noqa: BLE001
        raise UserError(f"cannot read calibration data {path!r}: {_first_line(e)} (expected "
                        "torch.save of a tensor or of a list of input tuples)") from None
    specs = _input_specs(ep)
    if isinstance(data, torch.Tensor):
        batches = _split_tensor(data, specs)
    elif isinstance(data, (list, tuple)):
        batches = []
        for i, item in enumerate(data):
            if isinstance(item, torch.Tensor):
                batches.append((item,))
            elif isinstance(item, (list, tuple)) and all(isinstance(t, torch.Tensor)
                                                          for t in item):
                batches.append(tuple(item))
            else:
                raise UserError(f"calibration data {path!r}: item {i} is a "
                                f"{type(item).__name__}, expected a tensor or a tuple of "
                                "tensors")
    else:
        raise UserError(f"calibration data {path!r} holds a {type(data).__name__}; expected "
                        "a tensor or a list / tuple of input tuples")
    if not batches:
        raise UserError(f"calibration data {path!r} is empty")
    for i, batch in enumerate(batches):
        if len(batch) != len(specs):
            raise UserError(f"calibration batch {i} has {len(batch)} input(s), the program "
                            f"takes {len(specs)}")
        for j, (t, spec) in enumerate(zip(batch, specs)):
            if not _fits(t, spec):
                raise UserError(f"calibration batch {i} input {j} has shape "
                                f"{_shape_text(t.shape)}, the program expects "
                                f"{_shape_text(spec.shape)}")
            if isinstance(spec, torch.Tensor) and t.dtype != spec.dtype:
                raise UserError(f"calibration batch {i} input {j} has dtype {t.dtype}, the "
                                f"program expects {spec.dtype}")
    return batches


def _split_tensor(data: torch.Tensor, specs: list[Any]) -> list[tuple]:
    """One tensor is one batch for a one-input program, or a stack of batches when its first
    dimension is a multiple of the program's static batch size."""
    if len(specs) != 1 or not isinstance(specs[0], torch.Tensor) or _fits(data, specs[0]):
        return [(data,)]
    spec = specs[0]
    b0 = spec.shape[0] if spec.dim() else None
    if (isinstance(b0, int) and b0 > 0 and data.dim() == spec.dim()
            and data.shape[0] % b0 == 0 and _fits(data[:b0], spec)):
        return [(chunk,) for chunk in torch.split(data, b0)]
    return [(data,)]


def check_finite(batches: list[tuple], float_model: torch.nn.Module) -> None:
    """NaN / inf in calibration data would poison the observers: name the batch and the layers
    whose float outputs it turns non-finite."""
    for i, batch in enumerate(batches):
        bad = [j for j, t in enumerate(batch) if t.is_floating_point()
               and not bool(torch.isfinite(t).all())]
        if not bad:
            continue
        layers: list[str] = []
        try:
            logged = prepare_for_propagation_comparison(float_model)
            with torch.no_grad():
                logged(*batch)
            results = extract_results_from_loggers(logged)
            for info in sorted(results, key=lambda info: info.handle or 0):
                name, stack, values = results[info]
                v = values[0]
                if isinstance(v, torch.Tensor) and v.is_floating_point() and not bool(
                        torch.isfinite(v).all()):
                    path = module_stack_to_str(stack) if stack else ""
                    layers.append(f"{path} ({name})" if path else str(name))
        except Exception:  # noqa: BLE001 - naming layers is best effort
            pass
        shown = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6
                                         else "")
        where = f"; affected layers: {shown}" if layers else ""
        raise UserError(f"calibration batch {i} input {bad[0]} contains NaN or inf{where}")


# ---- quantizers, progress, measurements ------------------------------------------------------

def make_quantizer(name: str, per_channel: bool, dynamic: bool) -> Any:
    if name == "x86":
        return X86InductorQuantizer().set_global(
            get_default_x86_inductor_quantization_config(is_dynamic=dynamic))
    return XNNPACKQuantizer().set_global(
        get_symmetric_quantization_config(is_per_channel=per_channel, is_dynamic=dynamic))


def progress_bar(desc: str) -> Callable[[Sequence[Any]], Iterable[Any]]:
    """tqdm on stderr when installed, else a plain counter."""
    def wrap(items: Sequence[Any]) -> Iterable[Any]:
        try:
            from tqdm import tqdm
        except ImportError:
            return _simple_progress(items, desc)
        return tqdm(items, desc=desc, file=sys.stderr, leave=False)
    return wrap


def _simple_progress(items: Sequence[Any], desc: str) -> Iterator[Any]:
    n = len(items)
    for i, item in enumerate(items):
        print(f"\r{desc}: {i + 1}/{n}", end="", file=sys.stderr, flush=True)
        yield item
    print(file=sys.stderr)


def measure_latency_ms(fn: Callable[..., Any], args: tuple, runs: int) -> float:
    """Median wall time of ``fn(*args)`` in ms, after two warm-up calls."""
    with torch.no_grad():
        for _ in range(2):
            fn(*args)
        times = []
        for _ in range(max(1, runs)):
            t0 = time.perf_counter()
            fn(*args)
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _compiled_or_eager(model: torch.nn.Module) -> tuple[Callable[..., Any], str]:
    compile_fn = getattr(torchquant, "compile", None)
    if callable(compile_fn):
        try:
            return compile_fn(model), "torchquant.compile"
        except Exception:  # noqa: BLE001 - latency falls back to eager
            pass
    return model, "eager"


def strip_unused_state(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """Drop the parameters, buffers and submodules no node of the graph reads any more (the
    float weights convert replaced by integer ones), so the saved program does not carry them."""
    used = {str(n.target) for n in model.graph.nodes if n.op in ("get_attr", "call_module")}

    def needed(name: str) -> bool:
        return any(u == name or u.startswith(name + ".") or name.startswith(u + ".")
                   for u in used)

    for name, _ in list(model.named_parameters()) + list(model.named_buffers()):
        if not needed(name):
            owner_name, _, attr = name.rpartition(".")
            owner = model.get_submodule(owner_name) if owner_name else model
            delattr(owner, attr)
    for name, _ in list(model.named_children()):
        if not needed(name):
            delattr(model, name)
    return model


def check_output(path: str | None, what: str) -> None:
    """Before any work: ``path`` can be written (not a folder, in an existing folder where a
    file can be created: probed with a temporary file, removed at once)."""
    if path is None:
        return
    if os.path.isdir(path):
        raise UserError(f"{what} {path!r} is a directory, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"{what} {path!r}: folder {folder!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".torchquant-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UserError(f"{what} {path!r} cannot be written: {e.strerror or e}") from None


def check_options(args: argparse.Namespace) -> None:
    """Numeric options: finite, and counts of the right sign (one line each, before any work)."""
    for flag in ("max_drop_db", "threshold_db"):
        value = getattr(args, flag, None)
        if value is not None and not math.isfinite(value):
            raise UserError(f"--{flag.replace('_', '-')} must be a finite number, got {value}")
    for flag, least in (("max_batches", 1), ("latency_runs", 1), ("max_float_layers", 0)):
        value = getattr(args, flag, None)
        if value is not None and value < least:
            raise UserError(f"--{flag.replace('_', '-')} must be at least {least}, got {value}")


class _Outputs:
    """Outputs written to temporary files beside their targets and renamed into place only
    when every one was written, so a failed run leaves no output (nor temporary file) behind."""

    def __init__(self) -> None:
        self.staged: list[tuple[str, str]] = []

    def add(self, path: str, write: Callable[[str], None], suffix: str, what: str) -> None:
        try:
            self.staged.append((stage_file(path, write, suffix), path))
        except UserError:
            raise
        except Exception as e:  # noqa: BLE001 - a write that fails is a user-facing error
            raise UserError(f"cannot write {what} {path!r}: {_first_line(e)}") from None

    def commit(self) -> None:
        commit_staged(self.staged)
        self.staged = []

    def discard(self) -> None:
        for tmp, _ in self.staged:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self.staged = []


def _text_writer(text: str) -> Callable[[str], None]:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
    return write


def _mb(n: float) -> str:
    return f"{n / 1e6:.3f} MB"


def _dynamic_batch(ep: torch.export.ExportedProgram) -> bool:
    """Whether the program's tensor inputs all have a symbolic dimension 0."""
    specs = [s for s in _input_specs(ep) if isinstance(s, torch.Tensor)]
    return bool(specs) and all(s.dim() and not isinstance(s.shape[0], int) for s in specs)


def export_keeping_batch(model: torch.nn.Module, example: tuple,
                         source: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The quantized model exported with the source program's dynamic batch dimension where
    the source had one (``Dim.AUTO``: the export itself decides what the graph allows), else
    with the first calibration batch's shapes."""
    if _dynamic_batch(source):
        shapes = tuple({0: torch.export.Dim.AUTO} if isinstance(t, torch.Tensor) and t.dim()
                       else None for t in example)
        try:
            return torch.export.export(model, example, dynamic_shapes=shapes)
        except Exception:  # noqa: BLE001 - a graph that pins its batch exports statically
            pass
    return torch.export.export(model, example)


# ---- commands -------------------------------------------------------------------------------

def run_quantize(args: argparse.Namespace) -> int:
    check_options(args)
    for out, what in ((args.out, "--out"), (args.report, "--report"), (args.plot, "--plot")):
        check_output(out, what)
    if args.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise UserError("--plot needs matplotlib: pip install 'torchquant[plot]'")
    ep = load_program(args.model)
    batches = load_batches(args.calib, ep)
    generate_numeric_debug_handle(ep)
    float_model = ep.module()
    check_finite(batches, float_model)
    quantizer = make_quantizer(args.quantizer, args.per_channel, args.dynamic)
    result = quantize_pt2e_with_fallback(
        ep, quantizer, batches, fallback_sqnr_db=args.max_drop_db,
        report_batches=batches[:_REPORT_BATCHES], threshold_db=args.threshold_db,
        max_float_layers=args.max_float_layers, progress=progress_bar("calibrating"))
    quantized = strip_unused_state(result.model)
    example = batches[0]
    quantized_ep = export_keeping_batch(quantized, example, ep)
    report = result.report

    float_ms = measure_latency_ms(float_model, example, args.latency_runs)
    quant_fn, how = _compiled_or_eager(quantized)
    quant_ms = measure_latency_ms(quant_fn, example, args.latency_runs)
    if result.kept_float:
        all_q = strip_unused_state(result.model_all_quantized)
        all_fn, _ = _compiled_or_eager(all_q)
        all_ms = measure_latency_ms(all_fn, example, args.latency_runs)
        report.notes.append(
            f"Fallback cost: weights {_mb(result.size_bytes_all_quantized)} -> "
            f"{_mb(result.size_bytes)}, latency {all_ms:.2f} ms -> {quant_ms:.2f} ms")

    # everything computed: now write, each file through a temporary file, all or none
    outputs = _Outputs()
    try:
        outputs.add(args.out, lambda tmp: torch.export.save(quantized_ep, tmp), ".pt2", "--out")
        if args.report is not None:
            outputs.add(args.report, _text_writer(report.to_markdown()), ".md", "--report")
        if args.plot is not None:
            outputs.add(args.plot, report.plot, ".png", "--plot")
        outputs.commit()
    finally:
        outputs.discard()

    size_in, size_out = os.path.getsize(args.model), os.path.getsize(args.out)
    print(f"size: {_mb(size_in)} -> {_mb(size_out)} ({size_out / max(size_in, 1):.2f}x of the "
          f"float program; weights {_mb(model_size_bytes(float_model))} -> {_mb(model_size_bytes(quantized))})")
    print(f"latency (median of {args.latency_runs}, first calibration batch): float "
          f"{float_ms:.2f} ms -> quantized {quant_ms:.2f} ms ({how})")
    print(report.to_markdown(max_rows=_TABLE_ROWS), end="")
    print(f"wrote {args.out}" + (f", {args.report}" if args.report else "")
          + (f", {args.plot}" if args.plot else ""))
    return 0


def run_report(args: argparse.Namespace) -> int:
    check_options(args)
    check_output(args.csv, "--csv")
    check_output(args.plot, "--plot")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UserError("--plot needs matplotlib: pip install 'torchquant[plot]'")
    float_ep = load_program(args.float_model)
    quant_ep = load_program(args.quantized_model)
    batches = load_batches(args.data, float_ep)
    generate_numeric_debug_handle(float_ep)  # deterministic: the numbering `quantize` used
    float_model = float_ep.module()
    check_finite(batches, float_model)
    quant_model = quant_ep.module()
    if not any(get_debug_handle(n) is not None for n in quant_model.graph.nodes):
        raise UserError(f"{args.quantized_model!r} carries no numeric debug handles (quantize "
                        "it with `torchquant quantize`, or call generate_numeric_debug_handle "
                        "before prepare_pt2e)")
    try:
        report = numeric_report(float_model, quant_model, batches[:args.max_batches],
                                threshold_db=args.threshold_db)
    except RuntimeError as e:
        raise UserError(f"the programs do not run on this data: {_first_line(e)}") from None
    outputs = _Outputs()
    try:
        if args.csv is not None:
            outputs.add(args.csv, _text_writer(report.to_csv()), ".csv", "--csv")
        if args.plot is not None:
            outputs.add(args.plot, report.plot, ".png", "--plot")
        outputs.commit()
    finally:
        outputs.discard()
    print(report.to_markdown(), end="")
    return 0


def run_package(args: argparse.Namespace) -> int:
    check_output(args.out, "--out")
    if not args.out.endswith(".pt2"):
        raise UserError(f"--out {args.out!r} must end in .pt2 (an AOTInductor package)")
    ep = load_program(args.model)
    example = load_batches(args.example, ep)[0]
    dynamic = not args.static_batch and _dynamic_batch(ep)
    started = time.perf_counter()
    try:
        atomic_write(args.out, lambda tmp: export_package(ep, example, tmp,
                                                          dynamic_batch=dynamic), ".pt2")
    except PackageError as e:
        raise UserError(f"cannot package {args.model!r}: {_first_line(e)}") from None
    except Exception as e:  # noqa: BLE001 - a compiler failure is reported, not a traceback
        raise UserError(f"cannot package {args.model!r}: {type(e).__name__}: "
                        f"{_first_line(e)}") from None
    batch = "dynamic" if dynamic else f"fixed at {example[0].shape[0] if example[0].dim() else 1}"
    print(f"wrote {args.out} (AOTInductor package, {_mb(os.path.getsize(args.out))}, batch "
          f"{batch}, built in {time.perf_counter() - started:.0f} s); load it with "
          "torch._inductor.aoti_load_package or torchquant.load, no torchquant needed to run it")
    return 0


def add_subcommands(sub: Any) -> None:
    q = sub.add_parser(
        "quantize", help="quantize a program saved with torch.export.save",
        description="Load MODEL.pt2 (torch.export.save), calibrate it on DATA.pt, quantize it "
                    "with a PT2E quantizer, save the quantized program (torch.export.save) and "
                    "print size and latency before / after and the per-layer accuracy table.")
    q.add_argument("model", metavar="MODEL.pt2", help="float program saved with torch.export.save")
    q.add_argument("--calib", required=True, metavar="DATA.pt",
                   help="calibration inputs: torch.save of a tensor or of a list of input "
                        "tuples (loaded with weights_only=True)")
    q.add_argument("--quantizer", choices=("x86", "xnnpack"), default="x86",
                   help="x86: X86InductorQuantizer (u8 activations, per-channel s8 weights); "
                        "xnnpack: XNNPACKQuantizer (s8 symmetric)")
    q.add_argument("--per-channel", action="store_true",
                   help="per-channel weights for xnnpack (x86 always is per channel)")
    q.add_argument("--dynamic", action="store_true",
                   help="dynamic quantization (activation qparams chosen at run time)")
    q.add_argument("--out", required=True, metavar="OUT.pt2", help="quantized program to write")
    q.add_argument("--report", metavar="REPORT.md", help="write the per-layer table (markdown)")
    q.add_argument("--plot", metavar="SQNR.png", help="write a PNG of SQNR by layer (matplotlib)")
    q.add_argument("--max-drop-db", type=float, default=None, metavar="DB",
                   help="auto-fallback: keep the worst conv / linear layers in float until "
                        "every quantized one has SQNR >= DB against float")
    q.add_argument("--max-float-layers", type=int, default=None, metavar="K",
                   help="with --max-drop-db: keep at most K layers in float")
    q.add_argument("--threshold-db", type=float, default=None, metavar="DB",
                   help="flag layers below this SQNR in the table (default: --max-drop-db, "
                        "else 20)")
    q.add_argument("--latency-runs", type=int, default=10, metavar="N",
                   help="timed runs for the latency figures (default 10)")
    q.set_defaults(handler=run_quantize)

    r = sub.add_parser(
        "report", help="compare a quantized program with its float original, layer by layer",
        description="Run FLOAT.pt2 and QUANT.pt2 (written by `torchquant quantize`) on DATA.pt "
                    "and print per-layer SQNR / MSE / max abs error, worst first.")
    r.add_argument("float_model", metavar="FLOAT.pt2")
    r.add_argument("quantized_model", metavar="QUANT.pt2")
    r.add_argument("--data", required=True, metavar="DATA.pt",
                   help="inputs: torch.save of a tensor or of a list of input tuples")
    r.add_argument("--threshold-db", type=float, default=20.0, metavar="DB",
                   help="flag layers below this SQNR (default 20)")
    r.add_argument("--max-batches", type=int, default=_REPORT_BATCHES, metavar="N",
                   help=f"use at most N batches (default {_REPORT_BATCHES})")
    r.add_argument("--csv", metavar="REPORT.csv", help="also write the table as CSV")
    r.add_argument("--plot", metavar="SQNR.png", help="write a PNG of SQNR by layer")
    r.set_defaults(handler=run_report)

    p = sub.add_parser(
        "package", help="turn a quantized program into an AOTInductor package",
        description="Compile QUANT.pt2 (written by `torchquant quantize`) into an AOTInductor "
                    "package that torch._inductor.aoti_load_package (or AOTInductor's C++ "
                    "runner) loads without torchquant.  The batch dimension stays dynamic "
                    "where the program's is.")
    p.add_argument("model", metavar="QUANT.pt2", help="quantized program (torch.export.save)")
    p.add_argument("--example", required=True, metavar="DATA.pt",
                   help="example inputs (the first batch is used): torch.save of a tensor or "
                        "of a list of input tuples")
    p.add_argument("--out", required=True, metavar="MODEL.pt2", help="package to write")
    p.add_argument("--static-batch", action="store_true",
                   help="fix the example's batch size instead of keeping it dynamic")
    p.set_defaults(handler=run_package)
