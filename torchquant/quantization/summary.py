"""Quantization coverage: which modules of a model are float, observed or quantized, and why
each float one stayed float -- so a model that "quantized" but stayed float is visible.

``prepare`` / ``convert`` / ``quantize_dynamic`` record the reasons they know on the model
and log one line through the ``torchquant`` logger; :func:`summary` reads the model.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from typing import Optional

from torch import nn

from .._log import emit
from ..nn.intrinsic.modules.fused import _FusedModule
from . import _pt2e_summary
from .pt2e.export_utils import model_is_exported
from .quantization_mappings import (get_default_dynamic_quant_module_mappings,
                                    get_default_static_quant_module_mappings)

__all__ = ["ModuleCoverage", "QuantizationSummary", "summary"]

logger = logging.getLogger("torchquant")

_REASONS_ATTR = "_torchquant_float_reasons"
_QUANTIZED_PACKAGES = ("torchquant.nn.quantized", "torchquant.nn.intrinsic.quantized")
_OBSERVED_PACKAGES = ("torchquant.nn.qat", "torchquant.nn.intrinsic.qat",
                      "torchquant.nn.quantizable")
# Modules that run unchanged on quantized tensors (or hold no computation of their own).
_TRANSPARENT = (nn.ReLU, nn.Identity, nn.Flatten, nn.Unflatten, nn.MaxPool1d, nn.MaxPool2d,
                nn.MaxPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d,
                nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.Hardtanh, nn.Upsample)
# Modules with no quantized form by design: staying float is what torch.ao does too.
_FLOAT_BY_DESIGN = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout,
                    nn.FeatureAlphaDropout, nn.Identity, nn.Flatten, nn.Unflatten)


@dataclass(frozen=True)
class ModuleCoverage:
    name: str
    type_name: str
    state: str  # "float", "observed", "quantized" or (PT2E) "fused"
    reason: Optional[str] = None
    # For a float module: True when staying float is by design (no quantized form, or the
    # qconfig left it float), False when the user probably wanted it quantized.
    by_design: bool = True


@dataclass(frozen=True)
class QuantizationSummary:
    modules: tuple[ModuleCoverage, ...]
    # what the entries are: "modules" (eager, FX) or "ops" (PT2E: ops of the exported graph)
    unit: str = "modules"

    def count(self, state: str) -> int:
        return sum(m.state == state for m in self.modules)

    @property
    def fused(self) -> tuple[ModuleCoverage, ...]:
        """Ops fused into the quantized op before them (PT2E: the ReLU of conv + ReLU)."""
        return tuple(m for m in self.modules if m.state == "fused")

    @property
    def float_modules(self) -> tuple[ModuleCoverage, ...]:
        return tuple(m for m in self.modules if m.state == "float")

    @property
    def unexpectedly_float(self) -> tuple[ModuleCoverage, ...]:
        """Float modules that had a qconfig (the user asked) yet stayed float."""
        return tuple(m for m in self.float_modules if not m.by_design)

    def line(self, verb: str = "quantized") -> str:
        state = "observed" if verb == "observed" else "quantized"
        fused = len(self.fused)
        done, total = self.count(state), len(self.modules) - fused
        left = self.float_modules
        text = f"{verb} {done} of {total} {self.unit}"
        if fused:
            text += f" ({fused} activation{'s' if fused > 1 else ''} fused into them)"
        if left:
            shown = ", ".join(f"{m.name} ({m.reason or 'float'})" for m in left[:8])
            more = f", ... ({len(left) - 8} more)" if len(left) > 8 else ""
            text += f"; {len(left)} left in float: {shown}{more}"
        wanted = self.unexpectedly_float
        if wanted and state == "quantized":
            names = ", ".join(m.name for m in wanted[:8])
            text += (f"; {len(wanted)} of them had a qconfig but no quantized form ({names}): "
                     "fuse them, map them, or set their qconfig to None")
        return text

    def __str__(self) -> str:
        width = max([len(m.name) for m in self.modules] + [6])
        name, kind = ("module", "type") if self.unit == "modules" else ("node", "op")
        rows = [f"{name:<{width}}  {kind:<28} {'state':<9} reason"]
        rows += [f"{m.name:<{width}}  {m.type_name:<28} {m.state:<9} {m.reason or ''}"
                 + ("" if m.by_design or m.state != "float" else "  <- wanted quantized?")
                 for m in self.modules]
        return "\n".join(rows + [self.line()])


def _state(m: nn.Module) -> Optional[str]:
    module_path = type(m).__module__
    if module_path.startswith(_QUANTIZED_PACKAGES):
        return "quantized"
    if module_path.startswith(_OBSERVED_PACKAGES) or hasattr(m, "weight_fake_quant"):
        return "observed"
    if hasattr(m, "activation_post_process") and isinstance(m.activation_post_process,
                                                            nn.Module):
        return "observed"
    return None


def _is_observer(m: nn.Module) -> bool:
    path = type(m).__module__
    return path.startswith(("torchquant.quantization.observer",
                            "torchquant.quantization.fake_quantize"))


def _units(model: nn.Module, prefix: str = ""):
    """Modules that count: quantized / observed units, and float leaves with parameters or a
    quantized counterpart, skipping observers and modules that run on QTensors as they are."""
    for name, child in model.named_children():
        qual = f"{prefix}.{name}" if prefix else name
        if _is_observer(child) or name == "_packed_params":
            continue
        state = _state(child)
        if state is not None or isinstance(child, _FusedModule):
            yield qual, child, state or "float"
            continue
        if len(child._modules) == 0 or all(_is_observer(c) for c in child.children()):
            if isinstance(child, _TRANSPARENT) or type(child).__name__ in ("DeQuantStub",):
                continue
            if any(True for _ in child.parameters(recurse=False)) or \
                    type(child).__name__ == "QuantStub" or _has_counterpart(child):
                yield qual, child, "float"
            continue
        yield from _units(child, qual)


def _has_counterpart(m: nn.Module) -> bool:
    return (type(m) in get_default_static_quant_module_mappings()
            or type(m) in get_default_dynamic_quant_module_mappings())


def summary(model: nn.Module) -> QuantizationSummary:
    """Per module: float / observed / quantized, and for each float one why (as recorded by
    the last prepare / convert / quantize_dynamic on this model).  For an exported (PT2E)
    model: per op of the graph, with ``name`` the node and ``type_name`` the op, counted as
    "ops"; an activation fused into the quantized op before it is "fused", not float."""
    if model_is_exported(model):
        return QuantizationSummary(tuple(ModuleCoverage(*row)
                                         for row in _pt2e_summary.node_coverage(model)),
                                   unit="ops")
    reasons = getattr(model, _REASONS_ATTR, {})
    entries = []
    for name, module, state in _units(model):
        reason, by_design = None, True
        if name in reasons:  # a recorded why: float, even a (reference) module of nn.quantized
            state = "float"
        if state == "float":
            reason = reasons.get(name)
            if reason is None:
                reason = ("no qconfig" if getattr(module, "qconfig", None) is None
                          else "not converted yet")
            by_design = (reason.startswith("no qconfig") or reason == "not converted yet"
                         or isinstance(module, _FLOAT_BY_DESIGN))
        entries.append(ModuleCoverage(name, type(module).__name__, state, reason, by_design))
    entries.extend(_quantized_calls(model))
    return QuantizationSummary(tuple(entries))


def _quantized_calls(model: nn.Module) -> list[ModuleCoverage]:
    """The quantized weighted ops an FX-converted graph calls as functions rather than modules
    (a functional ``F.linear`` under a dynamic qconfig, as torch.ao keeps it): each counts as a
    quantized unit named by its node."""
    graph = getattr(model, "graph", None)
    if graph is None:
        return []
    rows = []
    for node in graph.nodes:
        packet = getattr(node.target, "overloadpacket", None) if node.op == "call_function" \
            else None
        name = getattr(packet, "__name__", "")
        if getattr(packet, "_qualified_op_name", "").startswith("torchquant::") and \
                name.startswith(("linear", "conv")):
            rows.append(ModuleCoverage(node.name, name, "quantized"))
    return rows


def record(model: nn.Module, stage: str, reasons: Optional[dict] = None) -> QuantizationSummary:
    """Store ``reasons`` on ``model``, log the coverage line, warn if convert did nothing."""
    if reasons is not None:
        object.__setattr__(model, _REASONS_ATTR, dict(reasons))
    report = summary(model)
    verb = "observed" if stage == "prepare" else "quantized"
    # WARNING when something the user asked for stayed float, INFO otherwise; shown on stderr
    # when logging is not configured (see torchquant._log).
    level = logging.WARNING if stage == "convert" and report.unexpectedly_float else logging.INFO
    emit(level, report.line(verb))
    if stage == "convert" and report.modules and report.count("quantized") == 0:
        warnings.warn(f"convert: no module was quantized ({report.line()}); check the "
                      "qconfigs and that the model was prepared", stacklevel=3)
    return report
