"""PT2E (export) quantization: ``prepare_pt2e`` / ``prepare_qat_pt2e`` insert observers or fake
quants where a :class:`~torchquant.quantization.quantizer.Quantizer` annotated an exported graph;
``convert_pt2e`` turns them into ``torch.ops.torchquant`` quantize / dequantize ops on plain
integer tensors.  Semantics of torchao 0.18's ``torchao.quantization.pt2e.quantize_pt2e``.

    m = torch.export.export(model.eval(), example_inputs).module()
    m = prepare_pt2e(m, XNNPACKQuantizer().set_global(get_symmetric_quantization_config()))
    m(*calibration_inputs)
    m = convert_pt2e(m)
"""
from __future__ import annotations

import copy
import warnings
from typing import Any

from torch.fx import GraphModule

from . import _pt2e_summary
from . import distributed as _distributed
from .pt2e import convert as _convert
from .pt2e import prepare as _prepare
from .pt2e import qat as _qat
from .pt2e import reference_representation as _reference
from .pt2e.utils import (disallow_train_eval, fold_bn_into_weighted_ops, is_observer_node,
                         set_graph_train_mode)
from .quantizer.quantizer import Q_ANNOTATION_KEY, Quantizer
from .quantizer.utils import is_valid_annotation

__all__ = ["prepare_pt2e", "prepare_qat_pt2e", "convert_pt2e"]

_PREPARED_FLAG = "_torchquant_pt2e_prepared"


def _check_inputs(model: object, quantizer: object, fn: str) -> None:
    if not isinstance(model, GraphModule):
        raise TypeError(f"{fn} expects the GraphModule of an exported model "
                        "(torch.export.export(model, args).module()), got "
                        f"{type(model).__name__}")
    if not any("val" in n.meta for n in model.graph.nodes):
        raise TypeError(f"{fn} expects a model from torch.export.export(...).module(); this "
                        "GraphModule has no export metadata (symbolic_trace output?)")
    if not isinstance(quantizer, Quantizer):
        raise TypeError(f"{fn} expects a torchquant Quantizer, got {type(quantizer).__name__}")


def _warn_if_nothing_annotated(model: GraphModule, fn: str) -> None:
    if not any(is_valid_annotation(n.meta.get(Q_ANNOTATION_KEY)) for n in model.graph.nodes):
        ops = sorted({str(n.target) for n in model.graph.nodes if n.op == "call_function"})
        warnings.warn(f"{fn}: the quantizer annotated no node, so the model stays float "
                      f"(ops in the graph: {', '.join(ops) or 'none'})", UserWarning, stacklevel=5)


def _warn_annotated_but_float(model: GraphModule, fn: str, what: str,
                              stacklevel: int = 3) -> None:
    missing = _pt2e_summary.annotated_but_float(model, prepared=fn != "convert_pt2e")
    if missing:
        warnings.warn(f"{fn}: the quantizer annotated these ops for quantization but {what} "
                      f"around them, so they stay float: {', '.join(missing)}", UserWarning,
                      stacklevel=stacklevel)


class _Snapshot:
    """What prepare changes on the user's model (its graph, node metadata, and attributes),
    so that a failing prepare can leave the model as it was."""

    def __init__(self, model: GraphModule) -> None:
        with warnings.catch_warnings():  # torch's pytree codegen deepcopy: FutureWarning
            warnings.simplefilter("ignore", FutureWarning)
            self.graph = copy.deepcopy(model.graph)  # node meta dicts copied, not shared
        self.dicts = {name: dict(getattr(model, name)) for name in _MODULE_DICTS}
        self.attrs = dict(model.__dict__)

    def restore(self, model: GraphModule) -> None:
        for name, saved in self.dicts.items():
            current = getattr(model, name)
            current.clear()
            current.update(saved)
        for key in [k for k in model.__dict__ if k not in self.attrs]:
            del model.__dict__[key]
        model.__dict__.update(self.attrs)
        model.graph = self.graph
        model.recompile()


_MODULE_DICTS = ("_parameters", "_buffers", "_modules")


def _prepare_common(model: GraphModule, quantizer: Quantizer, is_qat: bool,
                    fn: str) -> GraphModule:
    snapshot = _Snapshot(model)
    try:
        return _prepare_steps(model, quantizer, is_qat, fn)
    except Exception:
        snapshot.restore(model)
        raise


def _prepare_steps(model: GraphModule, quantizer: Quantizer, is_qat: bool,
                   fn: str) -> GraphModule:
    original_meta = dict(model.meta)
    if not is_qat:
        fold_bn_into_weighted_ops(model)
    model = quantizer.transform_for_annotation(model)
    quantizer.annotate(model)
    quantizer.validate(model)
    _warn_if_nothing_annotated(model, fn)
    if is_qat:
        _qat.fuse_conv_bn_for_qat(model)
    model = _prepare.prepare(model, is_qat=is_qat,
                             obs_or_fq_callback=quantizer.prepare_obs_or_fq_callback)
    model.meta.update(original_meta)
    _warn_annotated_but_float(model, fn, "no observer was inserted", stacklevel=5)
    setattr(model, _PREPARED_FLAG, True)
    return disallow_train_eval(model)


def prepare_pt2e(model: GraphModule, quantizer: Quantizer,
                 sync_across_ranks: Any = False) -> GraphModule:
    """Fold eval-mode BN into conv / linear, let ``quantizer`` transform, annotate and validate
    the exported ``model``, then insert an observer for every annotated edge / output.
    Calibrate the result by calling it; its ``train()`` / ``eval()`` raise.
    ``sync_across_ranks`` (True or a process group): observers reduce every batch across the
    ranks (:func:`~torchquant.quantization.observe_across_ranks`)."""
    _check_inputs(model, quantizer, "prepare_pt2e")
    return _distributed._apply_prepare_option(
        _prepare_common(model, quantizer, is_qat=False, fn="prepare_pt2e"), sync_across_ranks)


def prepare_qat_pt2e(model: GraphModule, quantizer: Quantizer,
                     sync_across_ranks: Any = False) -> GraphModule:
    """As :func:`prepare_pt2e` for quantization-aware training: the quantizer's (QAT) specs
    insert fake-quant modules, and each conv + BN is rewritten so the weight fake quant sees the
    BN-scaled weight (BN itself stays, with batch statistics in training); train the result,
    then :func:`convert_pt2e` folds BN back into the conv."""
    _check_inputs(model, quantizer, "prepare_qat_pt2e")
    return _distributed._apply_prepare_option(
        _prepare_common(model, quantizer, is_qat=True, fn="prepare_qat_pt2e"), sync_across_ranks)


def convert_pt2e(model: GraphModule, use_reference_representation: bool = False,
                 fold_quantize: bool = True) -> GraphModule:
    """Replace each observer / fake quant of a prepared model by quantize -> dequantize ops
    (``torch.ops.torchquant``); with ``fold_quantize`` the quantized weights are stored as
    integer tensors feeding a dequantize.  With ``use_reference_representation`` the int8
    q/dq patterns are then rewritten into plain integer arithmetic (see
    :mod:`torchquant.quantization.pt2e.reference_representation`).  The result's dropout / batch_norm ops run in eval
    mode."""
    if not isinstance(use_reference_representation, bool):
        raise ValueError("use_reference_representation must be a bool, got "
                         f"{use_reference_representation!r} (a positional argument meant for "
                         "something else?)")
    if not isinstance(model, GraphModule):
        raise TypeError(f"convert_pt2e expects a model returned by prepare_pt2e, got "
                        f"{type(model).__name__}")
    modules = dict(model.named_modules(remove_duplicate=False))
    has_observers = any(is_observer_node(n, modules) for n in model.graph.nodes)
    if not getattr(model, _PREPARED_FLAG, False) and not has_observers:
        raise ValueError("convert_pt2e: this model was not prepared (run prepare_pt2e or "
                         "prepare_qat_pt2e and calibrate / train it first)")
    original_meta = dict(model.meta)
    _qat.fold_conv_bn_after_qat(model)
    model = _convert.convert(model)
    _convert.duplicate_dequantize(model)
    if fold_quantize:
        _convert.fold_quantize_constants(model)
    if use_reference_representation:
        _reference.reference_representation_rewrite(model)
    model.graph.lint()
    model.recompile()
    set_graph_train_mode(model, False)  # a converted model runs in eval mode (as torchao's)
    model.meta.update(original_meta)
    _warn_annotated_but_float(model, "convert_pt2e", "no quantize / dequantize was inserted")
    return model
