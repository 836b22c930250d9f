"""ONNX export of converted models (eager, FX, PT2E) in QDQ form, for ONNX Runtime.

``export(model, example_inputs, path)`` captures the converted model with ``torch.export``
(batch dimension dynamic), checks that every ``torch.ops.torchquant`` node has a translation
(else NotImplementedError naming the node, before anything is written), and exports with
``torch.onnx.export(dynamo=True)`` and torchquant's translations: QuantizeLinear /
DequantizeLinear around float ops, int8 weights as initializers with per-channel ``axis``,
MatMulInteger for dynamic Linear (``exact=True``: the static ops in a form ONNX Runtime
computes torchquant's integers with).  onnx and onnxscript (the ``onnx`` extra) are optional:
this module imports without them and ``export`` raises ImportError saying what to install.
"""
from __future__ import annotations

import contextlib
import logging
import os
from typing import Any, Sequence, Union

import torch

from ..quantization.pt2e.lowering import lower_pt2e
from . import _translate
from ._check import check_graph

__all__ = ["export", "DEFAULT_OPSET"]

# ONNX Runtime fuses the QDQ patterns into its integer kernels at every opset >= 13; 18 is the
# opset torch's translations are written for (no version conversion on export).
DEFAULT_OPSET = 18
_INSTALL = "pip install 'torchquant[onnx]'"


def _require() -> None:
    """onnx and onnxscript are optional: say how to get them."""
    missing = []
    for name in ("onnx", "onnxscript", "onnx_ir"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    if missing:
        raise ImportError(f"torchquant.onnx needs {' and '.join(missing)}: {_INSTALL}")


# Warnings that are noise to torchquant's users: torch's ONNX registry warns once per
# torchvision op when torchvision is absent; onnxscript's constant folding warns where it
# leaves a node unfolded (e.g. a Reshape to the symbolic batch).
_NOISY_LOGGERS = ("torch.onnx._internal.exporter._registration",
                  "onnxscript.optimizer._constant_folding")


@contextlib.contextmanager
def _quiet_exporter():
    """The exporter's loggers at ERROR for the export (restored after)."""
    logs = [logging.getLogger(name) for name in _NOISY_LOGGERS]
    levels = [log.level for log in logs]
    for log in logs:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log, level in zip(logs, levels):
            log.setLevel(level)


def _batched(x: Any) -> Any:
    """An example input with batch >= 2: torch.export specializes a dimension of size 1, so a
    batch-1 example is traced as two copies (the export keeps the batch symbolic)."""
    if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.size(0) == 1:
        return torch.cat([x, x])
    return x


def _is_pt2e_reference(model: Any) -> bool:
    """A ``convert_pt2e`` output: a GraphModule calling torchquant's q / dq ops directly."""
    if not isinstance(model, torch.fx.GraphModule):
        return False
    return any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
               and n.target.namespace == "torchquant" for n in model.graph.nodes)


def _capture(model: torch.nn.Module, example_inputs: tuple, dynamic_batch: bool, lower: bool
             ) -> torch.export.ExportedProgram:
    if isinstance(model, torch.export.ExportedProgram):
        return model
    if lower and _is_pt2e_reference(model):
        # The reference graph's float conv / linear between q / dq become torchquant's fused
        # integer ops (same numbers): ORT then gets the same QDQ units as from eager / FX
        # (every conv re-quantized, dynamic Linear as MatMulInteger) instead of float
        # DequantizeLinear -> MatMul, which ORT >= 1.2x rewrites into MatMulNBits with int8
        # per-block activations (other numbers).
        model = lower_pt2e(model)
    if dynamic_batch:
        args = tuple(_batched(x) for x in example_inputs)
        # AUTO rather than a named Dim: a PT2E graph already carries its own batch range
        shapes = tuple({0: torch.export.Dim.AUTO} if isinstance(x, torch.Tensor) and x.dim() >= 1 else None
                       for x in args)
    else:
        args, shapes = tuple(example_inputs), None
    with torch.no_grad():
        return torch.export.export(model, args, dynamic_shapes=shapes, strict=False)


def export(model: Union[torch.nn.Module, torch.export.ExportedProgram],
           example_inputs: Sequence[Any], path: Union[str, os.PathLike], *,
           dynamic_batch: bool = True, opset: int = DEFAULT_OPSET, lower: bool = True,
           exact: bool = False, input_names: Sequence[str] | None = None,
           output_names: Sequence[str] | None = None) -> str:
    """Write ``model`` (converted by ``convert_pt2e``, ``convert_fx``,
    ``torchquant.quantization.convert`` or ``quantize_dynamic``) to ``path`` as ONNX in QDQ
    form and return the path.

    ``dynamic_batch``: dimension 0 of every tensor input is symbolic, named ``batch`` in the
    file (any batch size runs; where the model fixes it, torch.export keeps it static).  A
    ``torch.export.ExportedProgram`` is taken with the shapes it was exported with.  Other
    dimensions stay those of ``example_inputs`` (a dynamic LSTM's time steps are unrolled).
    ``lower``: a PT2E graph is first lowered onto torchquant's fused ops
    (:func:`torchquant.quantization.pt2e.lowering.lower_pt2e`, same numbers), which gives
    ONNX Runtime whole QDQ units to fuse; ``False`` exports the reference graph as it is.
    ``exact``: the static convs, Linears and adds in an integer-exact form instead of QDQ
    units -- the codes minus their zero points and the integer weights as float32 through a
    float Conv / MatMul (exact while partial sums stay below 2**24 in magnitude: certain where
    ``sum |w| * max |x - zp|`` does, and in practice for real activations), then torchquant's
    epilogue op by op -- so ONNX Runtime computes torchquant's integers (up to the rounding
    order of a few ties where torchquant's own kernels differ); ORT runs it as float
    convs, slower than its fused integer kernels (BENCHMARKS.md).  Deep static CNNs converted
    by FX / eager drift 1-3 steps at a few % of outputs in the default QDQ form (ORT adds the
    bias on the integer grid), within one step everywhere in this form.
    ``opset``: the ONNX opset (>= 18: the opset of torch's translations of the float ops).
    Raises ImportError without onnx / onnxscript and NotImplementedError, naming the node,
    for a torchquant op (or op variant) that has no ONNX translation.
    """
    _require()
    if opset < 18:
        raise ValueError(f"torchquant.onnx.export: opset must be >= 18 (torch's dynamo ONNX "
                         f"translations start there), got {opset}")
    program = _capture(model, tuple(example_inputs), dynamic_batch, lower)
    check_graph(program.graph)
    with _quiet_exporter():
        onnx_program = torch.onnx.export(
            program, tuple(example_inputs), dynamo=True, opset_version=opset,
            custom_translation_table=_translate.table(exact), optimize=True, verbose=False,
            input_names=list(input_names) if input_names else None,
            output_names=list(output_names) if output_names else None)
    proto = onnx_program.model_proto
    if dynamic_batch:
        _name_batch_dim(proto)
    path = os.fspath(path)
    import onnx
    onnx.save_model(proto, path)
    return path


def _name_batch_dim(proto: Any) -> None:
    """Call the inputs' symbolic dimension 0 ``batch`` everywhere it appears: torch names it
    after its symbol (``s77``), one per input where the graph does not tie them (an encoder's
    ids and mask), which ``dynamic_batch`` declares one dimension."""
    old = {inp.type.tensor_type.shape.dim[0].dim_param for inp in proto.graph.input
           if inp.type.tensor_type.shape.dim and inp.type.tensor_type.shape.dim[0].dim_param}
    graph = proto.graph
    for info in (*graph.input, *graph.output, *graph.value_info):
        for dim in info.type.tensor_type.shape.dim:
            if dim.dim_param in old:
                dim.dim_param = "batch"
