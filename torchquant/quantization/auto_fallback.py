"""Auto-fallback: quantize an exported program with a PT2E quantizer and keep its worst conv /
linear layers in float, one at a time, until every quantized one is at or above an SQNR
threshold against float (the per-layer numbers of
:func:`torchquant.quantization.pt2e.numeric_report`); the result says which layers stayed
float and what that cost in size.

    result = quantize_pt2e_with_fallback(ep, quantizer, calibration_batches,
                                         fallback_sqnr_db=30.0)
    result.model, result.kept_float, result.report.to_markdown()
"""
from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
from torch.fx import GraphModule

from .pt2e._numeric_debugger import generate_numeric_debug_handle, get_debug_handle
from .pt2e._numeric_report import (DEFAULT_THRESHOLD_DB, LayerAccuracy, NumericReport, _as_args,
                                   _fmt, model_size_bytes, numeric_report)
from .quantize_pt2e import convert_pt2e, prepare_pt2e
from .quantizer.quantizer import Q_ANNOTATION_KEY, Quantizer

__all__ = ["quantize_pt2e_with_fallback", "FallbackResult", "WEIGHTED_OPS"]

#: The aten ops the fallback may keep in float (the layers that hold weights).
WEIGHTED_OPS = ("aten.conv1d", "aten.conv2d", "aten.conv3d", "aten.conv_transpose1d",
                "aten.conv_transpose2d", "aten.conv_transpose3d", "aten.linear")


class _KeepFloat(Quantizer):
    """Wraps a quantizer and removes its annotations from the nodes of chosen debug handles,
    so those layers stay float."""

    def __init__(self, inner: Quantizer, handles: set[int]) -> None:
        super().__init__()
        self.inner = inner
        self.handles = set(handles)

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        return self.inner.transform_for_annotation(model)

    def annotate(self, model: GraphModule) -> GraphModule:
        model = self.inner.annotate(model) or model
        for node in model.graph.nodes:
            if get_debug_handle(node) in self.handles:
                node.meta.pop(Q_ANNOTATION_KEY, None)
        return model

    def validate(self, model: GraphModule) -> None:
        self.inner.validate(model)

    def prepare_obs_or_fq_callback(self, model: GraphModule, edge_or_node_to_obs_or_fq: dict
                                   ) -> None:
        self.inner.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)


@dataclass
class FallbackResult:
    """What :func:`quantize_pt2e_with_fallback` produced."""
    model: GraphModule
    report: NumericReport
    kept_float: list[str]  # module paths (node names where a layer has no module)
    kept_float_handles: list[int]
    size_bytes: int
    size_bytes_all_quantized: int
    report_all_quantized: NumericReport
    model_all_quantized: GraphModule


def _is_weighted(row: LayerAccuracy) -> bool:
    return row.op.startswith(WEIGHTED_OPS)


def quantize_pt2e_with_fallback(ep: torch.export.ExportedProgram, quantizer: Quantizer,
                                calibration_batches: Iterable[Any],
                                fallback_sqnr_db: Optional[float] = None,
                                report_batches: Optional[Iterable[Any]] = None,
                                threshold_db: Optional[float] = None,
                                max_float_layers: Optional[int] = None,
                                progress: Optional[Callable[[Iterable], Iterable]] = None
                                ) -> FallbackResult:
    """Quantize an exported program (``prepare_pt2e`` -> calibrate -> ``convert_pt2e``) and
    report per-layer accuracy.  With ``fallback_sqnr_db``, the worst quantized conv / linear
    below that SQNR is kept in float and the program re-quantized, one layer at a time, until
    every quantized conv / linear is at or above it (or ``max_float_layers`` are float).
    Adds numeric debug handles to ``ep`` if it has none."""
    calib = [_as_args(b) for b in calibration_batches]
    if not calib:
        raise ValueError("quantize_pt2e_with_fallback: the calibration set is empty")
    report_set = calib if report_batches is None else [_as_args(b) for b in report_batches]
    if threshold_db is None:
        threshold_db = DEFAULT_THRESHOLD_DB if fallback_sqnr_db is None else fallback_sqnr_db
    generate_numeric_debug_handle(ep)
    float_model = ep.module()
    iterate = progress or (lambda xs: xs)

    def quantize(handles: set[int], show_progress: bool) -> GraphModule:
        q = _KeepFloat(copy.deepcopy(quantizer), handles) if handles else quantizer
        prepared = prepare_pt2e(ep.module(), q)
        with torch.no_grad():
            for b in (iterate(calib) if show_progress else calib):
                prepared(*b)
        return convert_pt2e(prepared)

    model = quantize(set(), True)
    report = numeric_report(float_model, model, report_set, threshold_db)
    first_model, first_report, first_size = model, report, model_size_bytes(model)
    kept: list[LayerAccuracy] = []
    if fallback_sqnr_db is not None:
        limit = max_float_layers if max_float_layers is not None else math.inf
        while len(kept) < limit:
            kept_handles = {r.handle for r in kept}
            candidates = [r for r in report.rows if _is_weighted(r) and r.handle not in
                          kept_handles and not (r.sqnr_db >= fallback_sqnr_db)]
            if not candidates:
                break
            kept.append(candidates[0])
            model = quantize({r.handle for r in kept}, False)
            report = numeric_report(float_model, model, report_set, threshold_db)
    names = [r.module_path or r.node for r in kept]
    report.kept_float = names
    kept_handles = {r.handle for r in kept}
    report.rows = [dataclasses.replace(r, kept_float=True, flagged=False)
                   if r.handle in kept_handles else r for r in report.rows]
    size = model_size_bytes(model)
    if kept:
        report.notes.append(f"Fallback: {len(kept)} layer(s) kept in float; size "
                            f"{first_size / 1e6:.3f} MB -> {size / 1e6:.3f} MB; output SQNR "
                            f"{_fmt(first_report.output_sqnr_db or float('nan'))} dB -> "
                            f"{_fmt(report.output_sqnr_db or float('nan'))} dB")
    return FallbackResult(model=model, report=report, kept_float=names,
                          kept_float_handles=[r.handle for r in kept if r.handle is not None],
                          size_bytes=size, size_bytes_all_quantized=first_size,
                          report_all_quantized=first_report, model_all_quantized=first_model)
