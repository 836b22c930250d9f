"""Freezing pass of ``torchquant.compile``'s graphs: ATen's CPU flash attention becomes
torchquant's native float32 attention where that is faster (short sequences).

The quantized encoders torchquant compiles keep their attention in float (the quantizers
annotate the Linears), and at the sizes of a sentence encoder (all-MiniLM: 12 heads of 32,
128 tokens) ATen's flash attention, blocked for long sequences, took a large share of the
compiled forward (BENCHMARKS.md, 2026-12-07 eleventh session).  ``torchquant_native::attention`` computes the same softmax(q k^T * scale + mask) v in
float32 with another summation order (within float32 rounding of it; tests bound it).

Only in the graphs ``torchquant.compile`` compiles (ahead of time for this process, or through
``torch.compile``): the pattern matches a float op of the user's model, so plain
``torch.compile`` graphs (the PT2E tutorial's flow among them) and AOTInductor packages, which
run without torchquant, keep ATen's.
"""
from __future__ import annotations

import operator
from typing import Any, Optional

import torch
from torch import fx

from ..._graph import is_call
from ...kernels import attention as _attention
from ...kernels import native as _native
from .packaging_state import in_torchquant_compile

__all__ = ["register"]

_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default


def _sizes(node: Any) -> Optional[tuple]:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if val is None or val.dtype != torch.float32 or val.dim() != 4 or val.device.type != "cpu":
        return None
    if not all(isinstance(d, int) for d in val.shape[1:]):
        return None   # only the batch may be symbolic
    return tuple(val.shape)


def _rewrite(node: fx.Node) -> bool:
    q, k, v = node.args[:3]
    dropout_p = node.args[3] if len(node.args) > 3 else node.kwargs.get("dropout_p", 0.0)
    is_causal = node.args[4] if len(node.args) > 4 else node.kwargs.get("is_causal", False)
    mask = node.kwargs.get("attn_mask")
    scale = node.kwargs.get("scale")
    if dropout_p != 0.0 or is_causal or node.kwargs.get("enable_gqa", False):
        return False
    shapes = [_sizes(t) for t in (q, k, v)]
    if any(s is None for s in shapes):
        return False
    (_, heads, q_len, head_size), (_, k_heads, kv_len, k_size) = shapes[:2]
    _, v_heads, v_len, v_size = shapes[2]
    if (k_heads, v_heads, k_size, v_len) != (heads, heads, head_size, kv_len):
        return False
    if mask is not None:
        mval = mask.meta.get("val") if isinstance(mask, fx.Node) else None
        if mval is None or mval.dtype != torch.float32 or mval.dim() > 4:
            return False
    users = list(node.users)
    if not users or not all(is_call(u, operator.getitem) and u.args[1] == 0 for u in users):
        return False   # the log-sum-exp is used
    if not _attention.native_attention_preferred(q_len, kv_len, head_size, v_size):
        return False
    scale = _attention.default_scale(head_size) if scale is None else float(scale)
    graph = node.graph
    args = (q, k, v, mask, scale, _native.attention_lanes())
    with graph.inserting_before(node):
        new = graph.call_function(torch.ops.torchquant_native.attention.default, args)
    new.meta.update({key: value for key, value in node.meta.items() if key != "val"})
    new.meta.pop("eager_input_vals", None)
    new.meta["val"] = torch.ops.torchquant_native.attention.default(
        *(a.meta["val"] if isinstance(a, fx.Node) else a for a in args))
    for user in users:
        user.replace_all_uses_with(new)
        graph.erase_node(user)
    graph.erase_node(node)
    return True


def _handler(match: Any, *args: Any, **kwargs: Any) -> None:
    _rewrite(match.output_node())


def _applies(match: Any) -> bool:
    return in_torchquant_compile() and _native.available()


def register() -> None:
    """Register the rewrite as a pattern of inductor's first freezing pass."""
    from torch._inductor.fx_passes.freezing_patterns import pass_patterns
    from torch._inductor.pattern_matcher import MULTIPLE, CallFunctionVarArgs, register_graph_pattern

    register_graph_pattern(CallFunctionVarArgs(_FLASH, users=MULTIPLE), extra_check=_applies,
                           pass_dict=pass_patterns[0], prepend=True)(_handler)
