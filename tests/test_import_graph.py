"""The package's import graph: layers import downward only, and nothing forms a cycle.

Layers, lowest first (DESIGN.md): dtypes -> affine -> kernels -> ops -> qtensor (with
tensor_functions) -> nn -> quantization -> examples / demo.  The graph is read from the source
(every ``import`` / ``from ... import`` naming a torchquant module, at module level or inside
a function).  Function-local imports that still dodge a cycle are listed in KNOWN_UPWARD:
the debt this test keeps from growing; an entry that no longer exists fails the test too, so
the list only shrinks.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import torchquant

PACKAGE = Path(torchquant.__file__).parent

LAYERS = ["dtypes", "affine", "kernels", "ops", "qtensor", "nn", "quantization", "app"]
_LAYER_OF_TOP = {"dtypes": "dtypes", "affine": "affine", "kernels": "kernels", "ops": "ops",
                 "qtensor": "qtensor", "tensor_functions": "qtensor", "_qtensor_ops": "qtensor",
                 "_qtensor_pointwise": "qtensor", "_validation": "qtensor", "nn": "nn",
                 "quantization": "quantization", "examples": "app", "demo": "app",
                 "__main__": "app", "__init__": "app"}

# (importing module, imported module) pairs that go up a layer inside a function.
KNOWN_UPWARD = {
    ("torchquant.nn.quantized.modules.embedding_ops", "torchquant.quantization.qconfig"),
    ("torchquant.nn.quantized.modules.activation_mha", "torchquant.quantization.quantize"),
    ("torchquant.nn.quantized.modules.rnn", "torchquant.quantization.quantize"),
    ("torchquant.nn.quantized.dynamic.modules.linear", "torchquant.quantization.qconfig"),
    ("torchquant.nn.quantizable.modules.rnn", "torchquant.quantization.quantize"),
    ("torchquant.nn.quantizable.modules.activation", "torchquant.quantization.quantize"),
    ("torchquant.nn.qat.dynamic.modules.linear", "torchquant.quantization.qconfig"),
    # at module level: QuantStub / DeQuantStub belong below nn (torch keeps them in
    # torch.ao.quantization.stubs, which nn.quantizable uses)
    ("torchquant.nn.quantizable.modules.activation", "torchquant.quantization.stubs"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """torchquant modules ``path`` imports (``from .x import y`` counts ``.x.y`` when that is a
    module, else ``.x``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("torchquant"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("torchquant"):
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if _exists(sub) else target)
    found.discard(name)
    return found


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _layer(module: str) -> int:
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    return LAYERS.index(_LAYER_OF_TOP.get(top, "app"))


def test_layers_import_downward_only():
    upward = {(m, i) for m, imports in _graph().items() for i in imports
              if _layer(i) > _layer(m) and not i.endswith(".__init__")}
    # the package's own __init__ re-exports from below and is the top
    upward = {(m, i) for m, i in upward if m != "torchquant"}
    assert upward - KNOWN_UPWARD == set(), "new upward imports"
    assert KNOWN_UPWARD - upward == set(), "fixed: remove these from KNOWN_UPWARD"


def test_ops_and_kernels_stay_below_the_tensor_layer():
    for module, imports in _graph().items():
        if module.startswith(("torchquant.ops", "torchquant.kernels")):
            bad = [i for i in imports if _layer(i) >= LAYERS.index("qtensor")]
            assert not bad, f"{module} imports {bad}"


def test_import_torchquant_does_not_load_nn_or_quantization():
    code = ("import sys, torchquant; "
            "print(sorted(m for m in sys.modules if m.startswith(('torchquant.nn', "
            "'torchquant.quantization'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]", out


@pytest.mark.parametrize("first", [
    "torchquant.nn.quantizable", "torchquant.nn.quantized", "torchquant.nn.qat",
    "torchquant.nn.intrinsic", "torchquant.nn.quantized.dynamic", "torchquant.quantization",
    "torchquant.nn.quantizable.modules.activation", "torchquant.ops",
])
def test_any_subpackage_imports_first(first):
    """Whichever part a user imports first, the package loads (and the eager workflow runs)."""
    code = (f"import {first}; import torch, torchquant.quantization as tq; "
            "m = torch.nn.Sequential(tq.QuantStub(), torch.nn.Linear(4, 4), tq.DeQuantStub()); "
            "m.qconfig = tq.default_qconfig; tq.prepare(m, inplace=True); m(torch.randn(2, 4)); "
            "tq.convert(m, inplace=True); m(torch.randn(2, 4))")
    subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
