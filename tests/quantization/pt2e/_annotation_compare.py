"""Compare the annotations two quantizers (torchao's and torchquant's) wrote on two exports of
one model, node by node, in a form independent of which library built the specs."""
from __future__ import annotations

import torch

KEY = "quantization_annotation"


def ctr_summary(ctr):
    """An observer / fake-quant constructor as (class name, sorted keyword summaries)."""
    if isinstance(ctr, type):
        return (ctr.__name__, ())
    partial = getattr(ctr, "p", None)
    if partial is None:
        return (repr(ctr), ())
    keywords = {k: ctr_summary(v) if (isinstance(v, type) or hasattr(v, "p")) else v
                for k, v in partial.keywords.items()}
    return (partial.func.__name__, tuple(sorted(keywords.items())))


def qscheme_name(q):
    if q is None:
        return None
    return getattr(q, "name", None) or str(q).replace("torch.", "")


def edge_summary(e):
    if isinstance(e, torch.fx.Node):
        return e.name
    return tuple(n.name for n in e)


def spec_summary(spec):
    if spec is None:
        return None
    kind = type(spec).__name__
    if kind == "SharedQuantizationSpec":
        return (kind, edge_summary(spec.edge_or_node))
    if kind == "QuantizationSpec":
        return (kind, str(spec.dtype), spec.quant_min, spec.quant_max, qscheme_name(spec.qscheme),
                spec.ch_axis, spec.is_dynamic, ctr_summary(spec.observer_or_fake_quant_ctr))
    if kind == "FixedQParamsQuantizationSpec":
        return (kind, str(spec.dtype), spec.scale, spec.zero_point, spec.quant_min,
                spec.quant_max, qscheme_name(spec.qscheme), spec.is_dynamic)
    if kind == "DerivedQuantizationSpec":
        return (kind, [edge_summary(e) for e in spec.derived_from], str(spec.dtype),
                spec.quant_min, spec.quant_max, qscheme_name(spec.qscheme), spec.ch_axis,
                spec.is_dynamic)
    raise AssertionError(f"unknown spec {spec!r}")


def annotation_summary(annotation):
    return {
        "inputs": [(n.name, spec_summary(s)) for n, s in annotation.input_qspec_map.items()],
        "output": spec_summary(annotation.output_qspec),
        "allow_implicit_sharing": annotation.allow_implicit_sharing,
        "_annotated": annotation._annotated,
        "_is_output_of_quantized_pattern": getattr(annotation, "_is_output_of_quantized_pattern", None),
    }


def graph_annotations(gm: torch.fx.GraphModule) -> dict:
    return {n.name: annotation_summary(n.meta[KEY]) for n in gm.graph.nodes if KEY in n.meta}


def graph_structure(gm: torch.fx.GraphModule) -> list:
    return [(n.op, str(n.target), str(n.args)) for n in gm.graph.nodes]


def assert_same_annotations(ours: torch.fx.GraphModule, theirs: torch.fx.GraphModule) -> dict:
    """Same graph after transform_for_annotation, same annotated nodes, same annotations."""
    assert graph_structure(ours) == graph_structure(theirs)
    a, b = graph_annotations(ours), graph_annotations(theirs)
    assert sorted(a) == sorted(b), f"annotated nodes differ: ours {sorted(a)} torchao {sorted(b)}"
    for name in a:
        assert a[name] == b[name], f"node {name}: ours {a[name]}\n torchao {b[name]}"
    return a
