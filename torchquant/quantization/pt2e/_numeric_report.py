"""Where did the accuracy go: a per-layer report comparing a quantized model with its float
original on the same inputs (the auto-fallback built on it is
:mod:`torchquant.quantization.auto_fallback`).

* PT2E (``convert_pt2e`` output): one row per numeric debug handle, from the propagation
  loggers of :mod:`._numeric_debugger` (call ``generate_numeric_debug_handle`` on the exported
  program before ``prepare_pt2e``).
* eager / FX converted models: one row per quantized module, its output (dequantized) against
  the output of its float counterpart, both models run on the same inputs (forward hooks).
  A quantized module that absorbed fused float modules (conv + bn + relu) is compared with the
  output of the last of them.

Errors propagate: a row is the error of that layer's output as the quantized model computes
it, including what earlier layers contributed.  SQNR in the report is
``10 * log10(sum(ref**2) / sum((ref - actual)**2))`` over all batches, the float output being
the signal (``QuantizationComparisonResult.sqnr`` follows torchao and uses the actual value).
"""
from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.fx import GraphModule, Node

from ..._files import atomic_write
from ..._graph import read_attr
from ._numeric_debugger import (extract_results_from_loggers, get_debug_handle,
                                module_stack_to_str, prepare_for_propagation_comparison)

__all__ = ["LayerAccuracy", "NumericReport", "numeric_report", "model_size_bytes",
           "DEFAULT_THRESHOLD_DB"]

DEFAULT_THRESHOLD_DB = 20.0

# Float modules that eager / FX fusion folds into the quantized module before them.
_FUSABLE_AFTER = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.ReLU, nn.ReLU6)


@dataclass(frozen=True)
class LayerAccuracy:
    """One row: the layer's output in the quantized model against the float model's."""
    index: int  # position in graph / execution order
    handle: Optional[int]
    node: str
    module_path: str
    op: str
    sqnr_db: float
    mse: float
    max_abs_error: float
    flagged: bool
    kept_float: bool = False  # left in float by the auto-fallback


@dataclass
class NumericReport:
    """Per-layer accuracy of a quantized model; ``rows`` worst first, ``in_order`` as run."""
    rows: list[LayerAccuracy]
    threshold_db: float
    output_sqnr_db: Optional[float] = None
    kept_float: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def in_order(self) -> list[LayerAccuracy]:
        return sorted(self.rows, key=lambda r: r.index)

    @property
    def flagged(self) -> list[LayerAccuracy]:
        return [r for r in self.rows if r.flagged]

    def worst(self, k: int = 5) -> list[LayerAccuracy]:
        return self.rows[:k]

    def to_markdown(self, max_rows: Optional[int] = None) -> str:
        lines = []
        if self.output_sqnr_db is not None:
            lines.append(f"Model output SQNR vs float: {_fmt(self.output_sqnr_db)} dB")
        lines.append(f"{len(self.flagged)} of {len(self.rows)} layers below "
                     f"{self.threshold_db:g} dB (flagged `!`), worst first.")
        if self.kept_float:
            lines.append(f"Kept in float: {', '.join(self.kept_float)}")
        lines.extend(self.notes)
        lines.append("")
        lines.append("| | node | module | op | SQNR (dB) | MSE | max abs err |")
        lines.append("|---|---|---|---|---:|---:|---:|")
        rows = self.rows if max_rows is None else self.rows[:max_rows]
        for r in rows:
            mark = "float" if r.kept_float else ("!" if r.flagged else "")
            lines.append(f"| {mark} | {r.node} | {r.module_path or '-'} | "
                         f"{r.op} | {_fmt(r.sqnr_db)} | {r.mse:.3g} | {r.max_abs_error:.3g} |")
        if max_rows is not None and len(self.rows) > max_rows:
            lines.append(f"| | ... {len(self.rows) - max_rows} more | | | | | |")
        return "\n".join(lines) + "\n"

    def to_csv(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["handle", "node", "module_path", "op", "sqnr_db", "mse",
                         "max_abs_error", "flagged", "kept_float"])
        for r in self.rows:
            writer.writerow(["" if r.handle is None else r.handle, r.node, r.module_path, r.op,
                             f"{r.sqnr_db:.4f}", f"{r.mse:.6g}", f"{r.max_abs_error:.6g}",
                             int(r.flagged), int(r.kept_float)])
        return buf.getvalue()

    def plot(self, path: str | os.PathLike) -> str:
        """Write a PNG of SQNR by layer in graph order (needs matplotlib: the ``plot`` extra)."""
        try:
            import matplotlib
            matplotlib.use("Agg", force=False)
            import matplotlib.pyplot as plt
        except ImportError as e:
            raise ImportError("NumericReport.plot needs matplotlib: pip install "
                              "'torchquant[plot]'") from e
        rows = self.in_order
        finite = [r.sqnr_db for r in rows if math.isfinite(r.sqnr_db)]
        top = (max(finite) if finite else self.threshold_db) + 10
        values = [min(r.sqnr_db, top) if not math.isnan(r.sqnr_db) else 0.0 for r in rows]
        fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * len(rows) + 2), 4.5))
        try:
            colors = ["tab:gray" if r.kept_float else "tab:red" if r.flagged else "tab:blue"
                      for r in rows]
            ax.bar(range(len(rows)), values, color=colors)
            ax.axhline(self.threshold_db, color="tab:red", linestyle="--", linewidth=1,
                       label=f"threshold {self.threshold_db:g} dB")
            ax.set_xticks(range(len(rows)))
            ax.set_xticklabels([r.module_path or r.node for r in rows], rotation=90,
                               fontsize=7)
            ax.set_ylabel("SQNR vs float (dB)")
            title = "Per-layer SQNR (graph order)"
            if self.output_sqnr_db is not None:
                title += f"; output {_fmt(self.output_sqnr_db)} dB"
            ax.set_title(title)
            ax.legend(loc="best", fontsize=8)
            fig.tight_layout()
            atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=100), ".png")
        finally:
            plt.close(fig)
        return os.fspath(path)

    def __str__(self) -> str:
        return self.to_markdown()


def _fmt(db: float) -> str:
    return f"{db:.1f}" if math.isfinite(db) else ("inf" if db > 0 else str(db))


class _Stats:
    """Running sums over batches of one layer's float / quantized outputs."""

    def __init__(self) -> None:
        self.signal = 0.0
        self.noise = 0.0
        self.count = 0
        self.max_abs = 0.0

    def add(self, ref: torch.Tensor, actual: torch.Tensor) -> None:
        ref = ref.detach().to(torch.float64)
        err = actual.detach().to(torch.float64) - ref
        self.signal += float((ref * ref).sum())
        self.noise += float((err * err).sum())
        self.count += ref.numel()
        if err.numel():
            self.max_abs = max(self.max_abs, float(err.abs().max()))

    def sqnr_db(self) -> float:
        if self.noise != self.noise or self.signal != self.signal:
            return float("nan")
        if self.noise == 0:
            return float("inf")
        if self.signal == 0:
            return float("-inf")
        return 10 * math.log10(self.signal / self.noise)

    def mse(self) -> float:
        return self.noise / self.count if self.count else float("nan")


def _dequant(x: Any) -> Any:
    if isinstance(x, torch.Tensor) and type(x) is not torch.Tensor and hasattr(x, "int_repr"):
        return x.dequantize()
    return x


def _float_tensors(x: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a (nested) output, dequantizing QTensors."""
    x = _dequant(x)
    if isinstance(x, torch.Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (list, tuple)):
        return [t for e in x for t in _float_tensors(e)]
    if isinstance(x, dict):
        return [t for e in x.values() for t in _float_tensors(e)]
    return []


def _pair_stats(stats: _Stats, ref: Any, actual: Any) -> bool:
    refs, acts = _float_tensors(ref), _float_tensors(actual)
    if len(refs) != len(acts) or not refs:
        return False
    for r, a in zip(refs, acts):
        if r.shape != a.shape:
            return False
        stats.add(r, a)
    return True


def _as_args(batch: Any) -> tuple:
    return tuple(batch) if isinstance(batch, (list, tuple)) else (batch,)


def _run_all(model: Callable, batches: Sequence[tuple]) -> list[Any]:
    with torch.no_grad():
        return [model(*b) for b in batches]


def _output_sqnr(ref_outputs: list[Any], actual_outputs: list[Any]) -> Optional[float]:
    stats = _Stats()
    ok = all(_pair_stats(stats, r, a) for r, a in zip(ref_outputs, actual_outputs))
    return stats.sqnr_db() if ok and stats.count else None


def _has_handles(model: nn.Module) -> bool:
    return isinstance(model, GraphModule) and any(
        get_debug_handle(n) is not None for n in model.graph.nodes)


def _op_name(node: Node) -> str:
    if node.op == "call_function":
        name = str(node.target)
        return name[:-len(".default")] if name.endswith(".default") else name
    if node.op == "call_module":
        return f"module {node.target}"
    return node.op


def _make_report(stats: dict[Any, _Stats], meta: dict[Any, tuple], threshold_db: float,
                 output_sqnr_db: Optional[float]) -> NumericReport:
    rows = []
    for key, s in stats.items():
        index, handle, node, module_path, op = meta[key]
        sqnr = s.sqnr_db()
        rows.append(LayerAccuracy(index=index, handle=handle, node=node,
                                  module_path=module_path, op=op, sqnr_db=sqnr, mse=s.mse(),
                                  max_abs_error=s.max_abs,
                                  flagged=not (sqnr >= threshold_db)))
    rows.sort(key=lambda r: (-math.inf if math.isnan(r.sqnr_db) else r.sqnr_db, r.index))
    return NumericReport(rows=rows, threshold_db=threshold_db, output_sqnr_db=output_sqnr_db)


def _absorbed_followers(float_model: GraphModule, quantized_model: GraphModule
                        ) -> dict[int, int]:
    """``{handle: handle of the last float op folded into it}``: a conv whose batch norm
    prepare folded computes, in the quantized model, what the batch norm computes in float."""
    quant_handles = {get_debug_handle(n) for n in quantized_model.graph.nodes}
    quant_handles.discard(None)
    result = {}
    for node in float_model.graph.nodes:
        handle = get_debug_handle(node)
        if handle is None or handle not in quant_handles:
            continue
        current = node
        while True:
            users = [u for u in current.users if u.op != "output"]
            if len(users) != 1 or len(current.users) != 1:
                break
            follower = users[0]
            fh = get_debug_handle(follower)
            if fh is None or fh in quant_handles or "batch_norm" not in str(follower.target):
                break
            current = follower
        if current is not node:
            result[handle] = get_debug_handle(current)
    return result


def _pt2e_report(float_model: GraphModule, quantized_model: GraphModule,
                 batches: Sequence[tuple], threshold_db: float) -> NumericReport:
    ref_logged = prepare_for_propagation_comparison(float_model)
    act_logged = prepare_for_propagation_comparison(quantized_model)
    ref_out = _run_all(ref_logged, batches)
    act_out = _run_all(act_logged, batches)
    ref = {info.handle: v for info, v in extract_results_from_loggers(ref_logged).items()}
    act = {info.handle: v for info, v in extract_results_from_loggers(act_logged).items()}
    nodes = {n.name: n for n in float_model.graph.nodes}
    order = {}
    for i, n in enumerate(float_model.graph.nodes):
        h = get_debug_handle(n)
        if h is not None:
            order[h] = i
    absorbed_into = _absorbed_followers(float_model, quantized_model)
    stats: dict[Any, _Stats] = {}
    meta: dict[Any, tuple] = {}
    for handle, (ref_name, ref_stack, ref_values) in ref.items():
        if handle not in act:
            continue
        follower = absorbed_into.get(handle)
        if follower is not None and follower in ref:
            ref_values = ref[follower][2]
        s = _Stats()
        if not all(_pair_stats(s, r, a) for r, a in zip(ref_values, act[handle][2])):
            continue
        if not s.count:
            continue
        node = nodes.get(ref_name or "")
        op = _op_name(node) if node is not None else "?"
        stack = module_stack_to_str(ref_stack) if ref_stack else ""
        stats[handle] = s
        meta[handle] = (order.get(handle, 0), handle, ref_name or "", stack, op)
    return _make_report(stats, meta, threshold_db, _output_sqnr(ref_out, act_out))


def _is_quantized_module(m: nn.Module) -> bool:
    mod = type(m).__module__
    return mod.startswith(("torchquant.nn.quantized", "torchquant.nn.intrinsic.quantized"))


def _module_report(float_model: nn.Module, quantized_model: nn.Module,
                   batches: Sequence[tuple], threshold_db: float) -> NumericReport:
    fmods = dict(float_model.named_modules())
    qmods = dict(quantized_model.named_modules())
    float_leaves = [n for n, m in float_model.named_modules() if n and not list(m.children())]
    pairs: list[tuple[str, list[str], nn.Module, nn.Module]] = []
    for i, name in enumerate(float_leaves):
        q = qmods.get(name)
        if q is None or not _is_quantized_module(q):
            continue
        absorbed: list[str] = []
        for later in float_leaves[i + 1:]:
            gone = later not in qmods or isinstance(qmods[later], nn.Identity)
            if gone and isinstance(fmods[later], _FUSABLE_AFTER):
                absorbed.append(later)
            else:
                break
        counterpart = absorbed[-1] if absorbed else name
        pairs.append((name, absorbed, q, fmods[counterpart]))
    if not pairs:
        raise ValueError("numeric_report: no quantized module of the quantized model has a "
                         "float counterpart of the same name in the float model")
    ref_rec: dict[str, list] = {p[0]: [] for p in pairs}
    act_rec: dict[str, list] = {p[0]: [] for p in pairs}
    hooks = []
    for name, _, q, f in pairs:
        hooks.append(q.register_forward_hook(
            lambda _m, _i, out, key=name: act_rec[key].append(_dequant(out))))
        hooks.append(f.register_forward_hook(
            lambda _m, _i, out, key=name: ref_rec[key].append(out)))
    try:
        ref_out = _run_all(float_model, batches)
        act_out = _run_all(quantized_model, batches)
    finally:
        for h in hooks:
            h.remove()
    stats: dict[Any, _Stats] = {}
    meta: dict[Any, tuple] = {}
    for index, (name, absorbed, q, _) in enumerate(pairs):
        s = _Stats()
        if len(ref_rec[name]) != len(act_rec[name]) or not all(
                _pair_stats(s, r, a) for r, a in zip(ref_rec[name], act_rec[name])):
            continue
        if not s.count:
            continue
        op = type(q).__name__
        if absorbed:
            op += " (+" + ", ".join(a.rsplit(".", 1)[-1] for a in absorbed) + ")"
        stats[name] = s
        meta[name] = (index, None, name, name, op)
    return _make_report(stats, meta, threshold_db, _output_sqnr(ref_out, act_out))


def numeric_report(float_model: nn.Module, quantized_model: nn.Module,
                   example_batches: Iterable[Any],
                   threshold_db: float = DEFAULT_THRESHOLD_DB) -> NumericReport:
    """Per-layer SQNR / MSE / max abs error of ``quantized_model`` against ``float_model`` on
    ``example_batches`` (each a tuple of positional inputs, or one tensor), worst first; layers
    below ``threshold_db`` are flagged.  PT2E models need numeric debug handles
    (``generate_numeric_debug_handle`` before ``prepare_pt2e``); eager / FX converted models
    are matched module by module."""
    batches = [_as_args(b) for b in example_batches]
    if not batches:
        raise ValueError("numeric_report: example_batches is empty")
    if isinstance(quantized_model, GraphModule) and _has_handles(quantized_model):
        if not _has_handles(float_model):
            raise ValueError("numeric_report: the float model has no numeric debug handles; "
                             "call generate_numeric_debug_handle(ep) on the exported program "
                             "and pass ep.module()")
        return _pt2e_report(float_model, quantized_model, batches, threshold_db)
    if _has_handles(float_model):
        raise ValueError("numeric_report: the quantized model has no numeric debug handles; "
                         "call generate_numeric_debug_handle(ep) before prepare_pt2e")
    return _module_report(float_model, quantized_model, batches, threshold_db)


def model_size_bytes(model: nn.Module) -> int:
    """Bytes of the tensors ``model`` computes with, each counted once: for a GraphModule the
    tensors its graph reads (``get_attr``) and the state of the submodules it calls (float
    weights that convert replaced by integer ones are not counted); otherwise all parameters
    and buffers."""
    seen: dict[int, torch.Tensor] = {}
    if not isinstance(model, GraphModule):
        for t in list(model.parameters()) + list(model.buffers()):
            seen[id(t)] = t
        return sum(t.numel() * t.element_size() for t in seen.values())
    for n in model.graph.nodes:
        if n.op not in ("get_attr", "call_module"):
            continue
        obj = read_attr(model, str(n.target), None)
        if isinstance(obj, torch.Tensor):
            seen[id(obj)] = obj
        elif isinstance(obj, nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                seen[id(t)] = t
    return sum(t.numel() * t.element_size() for t in seen.values())
