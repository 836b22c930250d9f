"""Which torchquant ops the ONNX export translates, checked on the exported graph before any
file is written (no onnx import needed), so an unsupported op fails naming its node."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

_STATIC_POST_OPS = ("none", "relu", "add", "add_relu")
_BYTE_QDTYPES = ("quint8", "qint8")


def _post_op(args: dict) -> Optional[str]:
    if args.get("post_op", "none") not in _STATIC_POST_OPS:
        return f"post_op {args['post_op']!r} (supported: {', '.join(_STATIC_POST_OPS)})"
    return None


def _qdtype(args: dict) -> Optional[str]:
    if args.get("qdtype", "quint8") not in _BYTE_QDTYPES:
        return f"qdtype {args['qdtype']!r} (supported: quint8, qint8)"
    return None


def _int8_weight(args: dict) -> Optional[str]:
    weight = args.get("weight")
    val = getattr(weight, "meta", {}).get("val")
    if val is not None and val.dtype not in (torch.int8, torch.uint8):
        return f"a {val.dtype} weight (only int8 weights are translated)"
    if args.get("weight_scale", 0) is None:
        return "a weight without qparams"
    return None


def _linear(args: dict) -> Optional[str]:
    if args.get("out_dtype") not in (torch.uint8, torch.int8, torch.float32):
        return f"out_dtype {args.get('out_dtype')}"
    if args.get("out_dtype") == torch.float32 and args.get("post_op", "none") not in (
            "none", "relu"):
        return f"a float output with post_op {args['post_op']!r} (supported: none, relu)"
    return _post_op(args) or _int8_weight(args)


def _global_pool(args: dict) -> Optional[str]:
    if any(s != 1 for s in args["output_size"]):
        return f"output_size {list(args['output_size'])} (only global pooling, size 1)"
    return _qdtype(args)


def _conv(args: dict) -> Optional[str]:
    weight = args["weight"].meta.get("val") if hasattr(args["weight"], "meta") else None
    if weight is not None and weight.dim() != 4:
        return f"a {weight.dim() - 2}-d convolution (only 2-d)"
    return _post_op(args) or _int8_weight(args)


def _none(args: dict) -> Optional[str]:
    return None


# op name -> check of its bound arguments (None: fine; else what is not supported)
CHECKS: dict[str, Callable[[dict], Optional[str]]] = {
    "quantize_per_tensor": lambda a: _qdtype(a) or (
        None if a.get("rounding") in (None, "decomposed")
        else f"rounding {a['rounding']!r} (supported: None, 'decomposed')"),
    "dequantize_per_tensor": _none,
    "quantize_per_channel": _qdtype,
    "dequantize_per_channel": _none,
    "conv": _conv,
    "linear": _linear,
    "add": lambda a: _qdtype(a) or _post_op(a),
    "cat": _qdtype,
    "clamp": _qdtype,
    "max_pool2d": _none,
    "adaptive_avg_pool2d": _global_pool,
    "quantize_dynamic_per_tensor": _qdtype,
    "linear_dynamic": _int8_weight,
    "rnn_input_projection_dynamic": _int8_weight,
    "lstm_step_dynamic": _int8_weight,
}


def bound_arguments(node: torch.fx.Node) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled in."""
    schema = node.target._schema
    out: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
    return out


def check_graph(graph: torch.fx.Graph) -> None:
    """Raise NotImplementedError naming the first torchquant node the export cannot
    translate (an op without translation, or arguments its translation does not cover)."""
    for node in graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        if node.target.namespace != "torchquant":
            continue
        name = node.target._opname
        check = CHECKS.get(name)
        if check is None:
            raise NotImplementedError(
                f"torchquant.onnx.export: node {node.name!r} calls torch.ops.torchquant.{name}, "
                f"which has no ONNX translation (translated: {', '.join(sorted(CHECKS))})")
        problem = check(bound_arguments(node))
        if problem is not None:
            raise NotImplementedError(
                f"torchquant.onnx.export: node {node.name!r} (torch.ops.torchquant.{name}) has "
                f"{problem}, which the ONNX translation does not cover")
