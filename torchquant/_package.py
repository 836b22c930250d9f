"""``torchquant.export_package`` / ``torchquant.load``: a converted model as an AOTInductor
package, a file that runs without Python's torchquant (and without Python: AOTInductor's C++
runner loads it).

The model is exported (``torch.export``, the batch dimension dynamic) and compiled by
``torch._inductor.aoti_compile_and_package`` with inductor freezing, where torchquant's
inductor passes (:mod:`torchquant.ops.inductor`, registered at import) turn torchquant's ops
into code torch implements in C++: quantize / dequantize into generated loops, 1-d / 2-d int8
convs and static Linears into oneDNN calls with weights prepacked at freezing, transposed
convs into dequantize / float transposed conv / quantize (torchquant's reference for them),
dynamic Linears and LSTM steps into ``torch._int_mm`` and tensor arithmetic, adds,
multiplies, concatenations, clamps, 8-bit activations (value tables), means and max /
average / global pooling into generated loops.  The generated code is then searched for calls
back into torchquant (its ops or its native library); any left (e.g. 3-d convs, quantized
LayerNorm) is an error naming the op and the model's nodes, before the file is written.

Which CPUs a package is exact on (the same integers as the Python model):

* oneDNN u8 x s8 calls -- the int8 convs and static Linears of eager- and FX-converted models,
  and the convs / Linears (static or dynamic) of PT2E models packaged on a CPU with AVX-512
  VNNI or AMX -- are exact on CPUs with VNNI / AMX (for PT2E: the integers of torchquant's
  lowered model, which makes these calls; the ``convert_pt2e`` graph's float conv + quantize
  can round a tie one step apart).  On AVX2-only CPUs oneDNN saturates
  int16 pairs, so such a package can be off there (:func:`load` warns).  Packaged on a CPU
  without exact oneDNN int8, eager / FX convs and Linears take the eager kernels' split there
  (two exact oneDNN calls on the input's low and high bits, :mod:`.ops.inductor.saturation_safe`:
  exact on every CPU, about twice the int8 work), and a PT2E model keeps its float conv on
  dequantized values (what its Python graph computes: exact everywhere).
* the dynamic Linears / LSTM steps of eager ``quantize_dynamic`` models (``torch._int_mm``):
  exact on every CPU except one whose oneDNN is held below its ISA (``ONEDNN_MAX_CPU_ISA``
  lower than the CPU has); packaged there, they use an exact float64 matmul instead.
* float parts (LayerNorm, softmax, GELU, LSTM gates, float-output epilogues) are inductor's
  generated code: within an ulp or so of ATen's kernels.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
import zipfile
from typing import Any, Sequence, Union

import torch

from ._files import atomic_write
from .ops.inductor import exact_decompositions

__all__ = ["export_package", "load", "PackageError"]

# a file inside the package saying torchquant wrote it (PT2 archives keep extra files here)
_MARKER = "extra/torchquant_package.json"
_FORMAT = 1
_TORCHQUANT_CALL = re.compile(r"torchquant(?:_native)?::(\w+)")  # native ops: torchquant's too
_ONEDNN_INT8_CALL = re.compile(r"onednn::q(?:conv|linear)\w*|qconv\w*_pointwise|qlinear_pointwise")


class PackageError(ValueError):
    """The model cannot be packaged so that it runs without torchquant."""


def _as_tuple(example_inputs: Any) -> tuple:
    if isinstance(example_inputs, torch.Tensor):
        return (example_inputs,)
    if isinstance(example_inputs, (list, tuple)):
        return tuple(example_inputs)
    raise TypeError(f"example_inputs must be a tensor or a tuple of inputs, got "
                    f"{type(example_inputs).__name__}")


def _batch_shapes(example: tuple) -> tuple:
    """``dynamic_shapes`` with dimension 0 of every tensor input dynamic."""
    return tuple({0: torch.export.Dim.DYNAMIC} if isinstance(t, torch.Tensor) and t.dim() else None
                 for t in example)


def _export(model: Any, example: tuple, dynamic_batch: bool) -> torch.export.ExportedProgram:
    if isinstance(model, torch.export.ExportedProgram):
        model = model.module()
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"export_package takes a converted model (nn.Module, GraphModule or "
                        f"ExportedProgram), got {type(model).__name__}")
    with torch.no_grad():
        if not dynamic_batch:
            return torch.export.export(model, example)
        if any(isinstance(t, torch.Tensor) and t.dim() and t.size(0) == 1 for t in example):
            raise PackageError("a dynamic batch needs example inputs with a batch size above 1 "
                               "(torch.export specializes size 1); pass dynamic_batch=False "
                               "for a batch-1 package")
        try:
            return torch.export.export(model, example, dynamic_shapes=_batch_shapes(example))
        except Exception as e:  # noqa: BLE001 - export's own errors are long; say what to do
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise PackageError(f"the model does not export with a dynamic batch dimension "
                               f"({type(e).__name__}: {first[:300]}); pass "
                               f"dynamic_batch=False for a fixed batch size") from e


def generated_code(path: str) -> dict[str, str]:
    """An AOTInductor package's generated sources and extern-call tables, by archive name."""
    with zipfile.ZipFile(path) as z:
        return {name: z.read(name).decode("utf-8", errors="replace") for name in z.namelist()
                if name.endswith((".cpp", ".h", ".json")) and "/aotinductor/" in name}


def torchquant_ops_called(sources: dict[str, str]) -> list[str]:
    """The ``torchquant::`` ops the generated code calls (each a call back into Python): the
    names, sorted."""
    return sorted({op for text in sources.values() for op in _TORCHQUANT_CALL.findall(text)})


def _node_names(ep: torch.export.ExportedProgram, op_name: str) -> list[str]:
    """The exported graph's nodes calling ``torchquant::op_name``, by module path where known."""
    names = []
    for node in ep.graph.nodes:
        if node.op != "call_function" or not str(node.target).startswith(
                f"torchquant.{op_name}."):
            continue
        stack = node.meta.get("nn_module_stack") or {}
        path = next(reversed(stack.values()))[0] if stack else ""
        names.append(f"{node.name} ({path})" if path else node.name)
    return names


def _check_no_torchquant(sources: dict[str, str], ep: torch.export.ExportedProgram) -> None:
    surviving = torchquant_ops_called(sources)
    if not surviving:
        return
    parts = []
    for op in surviving:
        nodes = _node_names(ep, op)
        shown = ", ".join(nodes[:5]) + (f" and {len(nodes) - 5} more" if len(nodes) > 5 else "")
        parts.append(f"torchquant::{op}" + (f" at {shown}" if shown else ""))
    hint = ""
    if not exact_decompositions.onednn_int8_exact() and any(op.startswith(("conv", "linear"))
                                                for op in surviving):
        hint = (" (oneDNN's u8 x s8 int8 is not exact on this CPU: only 2-d convs and "
                "Linears without a post-op other than ReLU / an add (convs) become its exact "
                "split; build the package on a CPU with AVX-512 VNNI or AMX, or quantize "
                "with PT2E)")
    raise PackageError("these ops have no C++ implementation in torch, and the package would "
                       "need torchquant to run them: " + "; ".join(parts) + hint)


def _compile(ep: torch.export.ExportedProgram, path: str) -> None:
    from torch._inductor import aoti_compile_and_package
    configs = {
        "freezing": True,  # the int8 fusions run on frozen weights
        # the decompositions' rounding is exact only without float contraction / fast math
        "cpp.enable_floating_point_contract_flag": "off",
        "cpp.enable_unsafe_math_opt_flag": False,
    }
    # inference graphs only are frozen; the decompositions apply to packages only
    with torch.no_grad(), exact_decompositions.packaging(ep.graph):
        aoti_compile_and_package(ep, package_path=path, inductor_configs=configs)


def _add_marker(path: str, sources: dict[str, str], dynamic_batch: bool) -> None:
    # oneDNN int8 calls that saturate on CPUs without VNNI / AMX: those of a package built
    # where they do not (built where they do, every call is one of the exact split's)
    onednn_int8 = (exact_decompositions.onednn_int8_exact()
                   and any(_ONEDNN_INT8_CALL.search(text) for text in sources.values()))
    with zipfile.ZipFile(path) as z:
        root = z.namelist()[0].split("/", 1)[0]
    info = {"format": _FORMAT, "writer": "torchquant", "dynamic_batch": dynamic_batch,
            "onednn_int8": onednn_int8}
    with zipfile.ZipFile(path, "a") as z:
        z.writestr(f"{root}/{_MARKER}", json.dumps(info))


def export_package(model: Any, example_inputs: Union[torch.Tensor, Sequence[Any]],
                   path: Union[str, os.PathLike], *, dynamic_batch: bool = True) -> str:
    """Write ``model`` (a ``convert_pt2e``, ``convert_fx`` or eager ``convert`` /
    ``quantize_dynamic`` output, or an ``ExportedProgram`` of one) as an AOTInductor package
    at ``path`` (``.pt2``); returns the path.

    The package loads with ``torch._inductor.aoti_load_package(path)`` (or
    :func:`torchquant.load`) in a process that never imports torchquant, and with AOTInductor's
    C++ runner.  ``dynamic_batch`` makes dimension 0 of every input dynamic (the example's
    batch size must then be above 1); ``False`` fixes the example's shapes.  Raises
    :class:`PackageError` (a ``ValueError``) naming the ops and nodes that would still need
    torchquant, or when the batch cannot be dynamic.  The module docstring says on which CPUs
    the package computes the Python model's integers exactly.
    """
    path = os.fspath(path)
    if not path.endswith(".pt2"):
        raise ValueError(f"an AOTInductor package path must end in .pt2, got {path!r}")
    example = _as_tuple(example_inputs)
    ep = _export(model, example, dynamic_batch)
    folder = os.path.dirname(os.path.abspath(path))
    with tempfile.TemporaryDirectory(dir=folder, prefix=".torchquant-package-") as tmpdir:
        built = os.path.join(tmpdir, "model.pt2")
        _compile(ep, built)
        sources = generated_code(built)
        _check_no_torchquant(sources, ep)
        _add_marker(built, sources, dynamic_batch)

        def write(tmp: str) -> None:
            os.replace(built, tmp)
        atomic_write(path, write, suffix=".pt2")
    return path


def _package_info(path: str) -> dict:
    """The marker :func:`export_package` put in the package; ValueError if there is none."""
    try:
        with zipfile.ZipFile(path) as z:
            names = [n for n in z.namelist() if n.endswith("/" + _MARKER)]
            if not names:
                raise ValueError(f"{path!r} is not a package written by "
                                 "torchquant.export_package (no torchquant marker in it)")
            return json.loads(z.read(names[0]))
    except zipfile.BadZipFile:
        raise ValueError(f"{path!r} is not a package written by torchquant.export_package "
                         "(not a .pt2 archive)") from None


def load(path: Union[str, os.PathLike]) -> Any:
    """The callable model of a package written by :func:`export_package`
    (``torch._inductor.aoti_load_package``).  FileNotFoundError if ``path`` does not exist,
    ValueError if it is not such a package; a warning where the package's oneDNN int8 calls
    are not exact on this CPU."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"package {path!r} does not exist")
    if os.path.isdir(path):
        raise ValueError(f"package {path!r} is a directory, not a .pt2 file")
    info = _package_info(path)
    if info.get("writer") != "torchquant" or info.get("format") != _FORMAT:
        raise ValueError(f"{path!r}: unknown torchquant package format {info.get('format')!r}")
    if info.get("onednn_int8") and not exact_decompositions.onednn_int8_exact():
        import warnings
        warnings.warn(f"{path!r} runs oneDNN int8 kernels, which saturate on this CPU (no "
                      "AVX-512 VNNI / AMX): its outputs can differ from the Python model's",
                      RuntimeWarning, stacklevel=2)
    from torch._inductor import aoti_load_package
    return aoti_load_package(path)
