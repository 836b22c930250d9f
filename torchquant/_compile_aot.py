"""``torchquant.compile``'s ahead-of-time path: the converted model exported and compiled by
AOTInductor (``torch._inductor.aoti_compile_and_package``) for the shapes it is called with.

The same freezing pass as the ``torch.compile`` path turns the int8 convs / linears into
oneDNN or torchquant's native C++ calls; what AOTInductor removes is the Python around them
(Dynamo's guards, the wrapper's Python frame, the boxed call of each native op from C++ that
the JIT wrapper builds), which was a third of a batch-1 forward (BENCHMARKS.md).

Shapes: the first call compiles a graph for its exact input shapes; a call whose inputs differ
from a compiled signature only in the batch size (dimension 0, at least 2) compiles one graph
with a symbolic batch that then serves every such batch (Dynamo's "automatic dynamic" rule);
batch 1 always gets its own graph (torch.export specializes it).  Each compile says so on the
``torchquant`` logger.  Calls it cannot serve -- keyword arguments, non-tensor arguments, a
gradient to record, a model AOTInductor cannot compile, an op with no C++ implementation --
go to the ``torch.compile`` path, built on first need.
"""
from __future__ import annotations

import logging
import tempfile
import threading
import time
from typing import Any, Callable, Optional

import torch
import torch.utils._pytree as pytree
from torch._inductor import aoti_compile_and_package, aoti_load_package

from ._log import emit
from ._package import generated_code, torchquant_ops_called
from .ops.inductor import exact_decompositions
from .ops.inductor import fusion as _fusion

__all__ = ["AOTCompiledModel"]

# what the freezing pass needs, and the exact rounding of the fused quantize / dequantize loops
# (no float contraction or fast math), for these compiles only
INDUCTOR_CONFIGS = {
    "freezing": True,
    "cpp.enable_floating_point_contract_flag": "off",
    "cpp.enable_unsafe_math_opt_flag": False,
}


def _signature(leaves: list) -> tuple:
    return tuple((tuple(t.shape), t.stride(), t.dtype, t.device) for t in leaves)


def _unbatched(signature: tuple) -> Optional[tuple]:
    """The signature without dimension 0 (every input batched alike, batch >= 2), or None."""
    batches = {shape[0] if shape else None for shape, *_ in signature}
    if len(batches) != 1 or None in batches or next(iter(batches)) < 2:
        return None
    return tuple((shape[1:], stride[1:], dtype, device)
                 for shape, stride, dtype, device in signature)


class AOTCompiledModel(torch.nn.Module):
    """A converted model run through AOTInductor graphs compiled for its call signatures
    (module docstring).  ``model`` stays a submodule (its state dict, ``repr``); the graphs
    hold frozen copies of its weights, as ``torch.compile`` with freezing does."""

    def __init__(self, model: torch.nn.Module, fallback: Callable[[], Callable]) -> None:
        super().__init__()
        self.model = model
        self._make_fallback = fallback
        self._fallback: Optional[Callable] = None
        # signature -> (the loaded graph's run, its output structure)
        self._graphs: dict[tuple, tuple] = {}
        self._batched: dict[tuple, Optional[tuple]] = {}  # unbatched signature -> graph
        self._failed: Optional[str] = None
        self._compiles = 0  # names each graph's file
        self._lock = threading.Lock()
        self._folder = tempfile.TemporaryDirectory(prefix="torchquant-aot-")

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        graph = self._graph_for(args, kwargs)
        if graph is None:
            return self._torch_compiled()(*args, **kwargs)
        run, out_spec, leaves = graph
        return pytree.tree_unflatten(run(leaves), out_spec)

    # ---- which graph ------------------------------------------------------------------------
    def _graph_for(self, args: tuple, kwargs: dict) -> Optional[tuple]:
        """``(run, out_spec, leaves)`` for this call, or None for the torch.compile path."""
        if kwargs or self._failed is not None:
            return None
        if all(type(a) is torch.Tensor for a in args):  # the common call: no pytree walk
            leaves, spec = list(args), len(args)
        else:
            leaves, spec = pytree.tree_flatten(args)
            if not leaves or not all(type(t) is torch.Tensor for t in leaves):
                return None
        if torch.is_grad_enabled() and (any(t.requires_grad for t in leaves) or any(
                p.requires_grad for p in self.model.parameters())):
            return None  # the torch.compile path keeps grad mode and says why it is slow
        key = (spec, _signature(leaves), torch.get_num_threads())
        graph = self._graphs.get(key)
        if graph is None:
            with self._lock:
                graph = self._graphs.get(key)
                if graph is None and self._failed is None:
                    graph = self._compile_for(key, args)
                    if graph is not None:
                        self._graphs[key] = graph
            if graph is None:
                return None
        return (*graph, leaves)

    def _compile_for(self, key: tuple, args: tuple) -> Optional[tuple]:
        spec, signature, threads = key
        # (an int spec: the arguments are that many tensors, each of which can take a batch dim)
        rest = _unbatched(signature) if isinstance(spec, int) else None
        if rest is not None and any(k[0] == spec and k[2] == threads
                                    and _unbatched(k[1]) == rest for k in self._graphs):
            # another batch size of a signature already compiled: one symbolic-batch graph
            if (rest, threads) not in self._batched:
                self._batched[(rest, threads)] = self._compile(args, dynamic_batch=True)
            graph = self._batched[(rest, threads)]
            if graph is not None:
                return graph
        return self._compile(args, dynamic_batch=False)

    # ---- compiling --------------------------------------------------------------------------
    def _compile(self, args: tuple, dynamic_batch: bool) -> Optional[tuple]:
        shapes = ", ".join(str(tuple(t.shape)) for t in pytree.tree_leaves(args))
        what = "a symbolic batch" if dynamic_batch else f"input shapes {shapes}"
        emit(logging.INFO, f"torchquant.compile: compiling for {what} with AOTInductor "
                           f"(seconds to a minute, once per signature)")
        start = time.perf_counter()
        self._compiles += 1
        path = f"{self._folder.name}/graph{self._compiles}.pt2"
        try:
            with torch.no_grad():
                batch = tuple({0: torch.export.Dim.DYNAMIC} for _ in args)
                program = torch.export.export(self.model, args,
                                              dynamic_shapes=batch if dynamic_batch else None)
                configs = {**INDUCTOR_CONFIGS,
                           "aot_inductor.custom_ops_to_c_shims": _fusion.aoti_c_shims()}
                # the exact decompositions of the package compile (eager / FX models' adds,
                # pools, Linears), the native ops kept: the code runs in this process
                with exact_decompositions.packaging(program.graph, in_process=True):
                    aoti_compile_and_package(program, package_path=path,
                                             inductor_configs=configs)
            python_ops = torchquant_ops_called(generated_code(path))
            if python_ops:
                raise RuntimeError("ops with no C++ implementation left in the graph: "
                                   + ", ".join(f"torchquant::{op}" for op in python_ops))
            loaded = aoti_load_package(path)
            # the loader's own run and the output structure, read once (the loaded model's
            # __call__ parses its call spec on every call: most of a batch-1 call's overhead)
            graph = (loaded.loader.run,
                     pytree.treespec_loads(loaded.loader.get_call_spec()[1]))
        except Exception as e:  # noqa: BLE001 - any failure: the torch.compile path serves
            reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
            if dynamic_batch:
                emit(logging.INFO, f"torchquant.compile: no symbolic-batch graph "
                                   f"({type(e).__name__}: {reason}); one graph per batch size")
                return None
            self._failed = f"{type(e).__name__}: {reason}"
            emit(logging.INFO, f"torchquant.compile: AOTInductor could not compile this model "
                               f"({self._failed}); using torch.compile")
            return None
        emit(logging.INFO, f"torchquant.compile: compiled in {time.perf_counter() - start:.1f} s")
        return graph

    def _torch_compiled(self) -> Callable:
        if self._fallback is None:
            with self._lock:
                if self._fallback is None:
                    self._fallback = self._make_fallback()
        return self._fallback
