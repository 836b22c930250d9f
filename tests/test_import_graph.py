"""The package's import graph: layers import downward only, and nothing forms a cycle.

Layers, lowest first (DESIGN.md): dtypes -> affine -> kernels -> ops -> qtensor (the ``tensor``
package, and the compatibility modules ``qtensor`` / ``tensor_functions`` re-exporting from it)
-> nn -> quantization -> examples / demo.  The graph is read from the source
(every ``import`` / ``from ... import`` naming a torchquant module, at module level or inside
a function).  A function-local torchquant import is not allowed at all (test below): it only
ever served to dodge a cycle.  The one import still going up a layer is listed in
KNOWN_UPWARD, the debt this test keeps from growing; an entry that no longer exists fails the
test too, so the list only shrinks.

A call can go up a layer without an import: a higher layer registers its functions into a
hook of a lower one when it loads.  The package has one such edge, nn's workflow hook
(``torchquant.nn._workflow``, filled by ``torchquant.quantization.quantize``), named in
UPWARD_HOOKS; the tests below find every such registration in the source and check that this
one is filled, by its registrar only, whenever the workflow is loaded.
"""
from __future__ import annotations

import ast
import importlib
import pickle
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from conftest import run_forked

import torchquant

PACKAGE = Path(torchquant.__file__).parent

LAYERS = ["dtypes", "affine", "kernels", "ops", "qtensor", "nn", "quantization", "app"]
_LAYER_OF_TOP = {"dtypes": "dtypes", "affine": "affine", "kernels": "kernels", "ops": "ops",
                 "tensor": "qtensor", "qtensor": "qtensor", "tensor_functions": "qtensor",
                 "nn": "nn",
                 "quantization": "quantization", "examples": "app", "demo": "app",
                 "__main__": "app", "__init__": "app",
                 "_log": "dtypes", "_files": "dtypes", "_config": "dtypes",
                 "_graph": "dtypes", "_after_import": "dtypes"}  # helpers every layer may use

# (importing module, imported module) pairs that go up a layer (inside a function); they are
# also the only edges the cycle check leaves out and the only function-local imports allowed.
KNOWN_UPWARD: set[tuple[str, str]] = set()

# Function-local torchquant imports allowed beyond KNOWN_UPWARD: (module, imported module,
# why).  Only an optional part whose import would cost every user start-up time belongs here;
# third-party optional dependencies (tqdm, transformers, sentence-transformers, scikit-learn)
# are imported inside functions where used and are not torchquant imports.
OPTIONAL_LOCAL_IMPORTS: set[tuple[str, str, str]] = {
    ("torchquant", "torchquant._compile",
     "torchquant.compile lowers PT2E graphs with the quantization workflow; loaded on first use "
     "so that `import torchquant` does not load nn / quantization"),
    ("torchquant", "torchquant._package",
     "torchquant.export_package / load (AOTInductor packages) pull in the compile machinery; "
     "loaded on first use like torchquant.compile"),
}


# Calls that go up a layer through a registration point instead of an import: (module holding
# the hook, the one module that registers into it, why).  A hook is found in the source as a
# module-level call of a ``register*`` / ``install*`` function of a lower layer's module.
UPWARD_HOOKS: set[tuple[str, str, str]] = {
    ("torchquant.nn._workflow", "torchquant.quantization.quantize",
     "nn's quantizable LSTM / MultiheadAttention prepare what from_float builds, their "
     "quantized versions convert an observed one, dynamic Linear / Embedding fall back on a "
     "predefined qconfig and the dynamic QAT Linear checks its qconfig, as torch's do (torch "
     "imports torch.ao.quantization inside those functions); nn cannot import the workflow "
     "above it, so the workflow hands these parts down when it loads"),
}


class Import(NamedTuple):
    target: str  # the torchquant module the statement names
    local: bool  # inside a function (run at call time)
    line: int


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_statements(path: Path) -> list[Import]:
    """The torchquant modules ``path``'s import statements name (``from .x import y`` names
    ``.x.y`` when that is a module, else ``.x``; a package names its ``__init__``)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    in_function = {id(node) for f in ast.walk(tree)
                   if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                   for node in ast.walk(f)}
    found = []
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names if a.name.startswith("torchquant")]
        elif isinstance(node, ast.ImportFrom):
            targets = list(_from_import_targets(node, package).values())
        found += [Import(t, id(node) in in_function, node.lineno) for t in targets if t != name]
    return found


def _from_import_targets(node: ast.ImportFrom, package: str) -> dict[str, str]:
    """For ``from X import a as b`` in ``package``, each bound name (``b``) -> the torchquant
    module it names (``X.a`` when that is a module, else ``X``); {} when X is not torchquant."""
    if node.level:
        base = package.split(".")
        base = base[:len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("torchquant"):
        return {}
    return {alias.asname or alias.name: (f"{target}.{alias.name}"
                                         if _exists(f"{target}.{alias.name}") else target)
            for alias in node.names}


def _imports(path: Path) -> set[str]:
    """torchquant modules ``path`` imports."""
    return {i.target for i in _import_statements(path)}


def _exists(module: str) -> bool:
    rel = Path(*module.split(".")[1:])
    return (PACKAGE / rel).with_suffix(".py").exists() or (PACKAGE / rel / "__init__.py").exists()


def _graph() -> dict[str, set[str]]:
    return {_module_name(p): _imports(p) for p in PACKAGE.rglob("*.py")}


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _load_graph() -> dict[str, set[str]]:
    """What each module makes Python execute, as edges module -> module.

    Importing ``a.b.c`` runs ``a/__init__``, then ``a/b/__init__``, then ``a/b/c``.  So an
    import statement in module M adds edges
      * M -> the module it names (a package: its ``__init__``), always -- also when that is
        M's own package (``from . import name`` of a name the ``__init__`` defines needs the
        ``__init__`` to have run that far);
      * M -> each package above the named module, except the packages above M: Python loaded
        those before M, so M importing something inside them never starts them.  A package
        re-exporting its children (``__init__`` -> child) is therefore no cycle by itself,
        while a child of package P importing from package Q whose ``__init__`` leads back
        into P is one, whichever module a user imports first.
    Function-local imports count like module-level ones (they run by the time the function
    does).  KNOWN_UPWARD edges are left out (their own test tracks them).
    """
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        already_loaded = set(_ancestors(module)) | {module}
        edges = graph.setdefault(module, set())
        for imp in _import_statements(path):
            if (module, imp.target) in KNOWN_UPWARD:
                continue
            edges.add(imp.target)
            edges.update(a for a in _ancestors(imp.target) if a not in already_loaded)
        edges.discard(module)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next((c for c in children if c in graph), None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


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


def test_no_import_cycles():
    """No set of modules imports one another, counting package ``__init__`` files and
    function-local imports as :func:`_load_graph` says."""
    assert _cycles(_load_graph()) == []


def test_the_cycle_check_sees_package_cycles():
    """The rule itself: re-exports alone are fine, a child reaching back through another
    package's ``__init__`` is a cycle, and so is ``from . import name`` of an ``__init__``
    that imports the child (what ``torchquant.kernels`` once did)."""
    reexport = {"p": {"p.a"}, "p.a": set()}
    assert _cycles(reexport) == []
    through_other_init = {"p": {"p.a"}, "p.a": {"q", "q.b"}, "q": {"q.b"}, "q.b": {"p", "p.c"},
                          "p.c": set()}
    assert _cycles(through_other_init) == [["p", "p.a", "q", "q.b"]]
    own_init_name = {"p": {"p.a"}, "p.a": {"p"}}
    assert _cycles(own_init_name) == [["p", "p.a"]]


def test_no_function_local_torchquant_imports():
    """torchquant modules import one another at module level: a function-local import is
    either a cycle dodged (fix the structure instead, DESIGN.md) or an optional part listed in
    OPTIONAL_LOCAL_IMPORTS."""
    allowed = KNOWN_UPWARD | {(m, i) for m, i, _why in OPTIONAL_LOCAL_IMPORTS}
    local = {(_module_name(p), imp.target, imp.line) for p in PACKAGE.rglob("*.py")
             for imp in _import_statements(p) if imp.local}
    assert sorted(x for x in local if x[:2] not in allowed) == []
    used = {x[:2] for x in local}
    assert {(m, i) for m, i, _why in OPTIONAL_LOCAL_IMPORTS} - used == set(), \
        "no longer local: remove from OPTIONAL_LOCAL_IMPORTS"


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


FIRST_IMPORTS = [
    "torchquant.nn.quantizable", "torchquant.nn.quantized", "torchquant.nn.qat",
    "torchquant.nn.intrinsic", "torchquant.nn.quantized.dynamic", "torchquant.quantization",
    "torchquant.nn.quantizable.modules.activation", "torchquant.ops", "torchquant.kernels.linear",
    "torchquant.nn.stubs", "torchquant.nn.quantized.modules.rnn",
    "torchquant.quantization.qconfig_mapping", "torchquant.examples.digits",
]

_IMPORT_FIRST = """\
__import__(item)
import torchquant.quantization as tq
m = torch.nn.Sequential(tq.QuantStub(), torch.nn.Linear(4, 4), tq.DeQuantStub())
m.qconfig = tq.default_qconfig
tq.prepare(m, inplace=True); m(torch.randn(2, 4))
tq.convert(m, inplace=True); m(torch.randn(2, 4))
print(item, "ok", flush=True)"""


def test_any_subpackage_imports_first():
    """Whichever part a user imports first, the package loads (and the eager workflow runs);
    each a child of one interpreter that has imported torch, nothing of torchquant."""
    lines = run_forked("import torch", _IMPORT_FIRST, FIRST_IMPORTS)
    assert lines == [f"{m} ok" for m in FIRST_IMPORTS], lines


def test_nn_workflow_calls_without_the_workflow_loaded_say_so():
    """nn cannot import torchquant.quantization (it sits above); the few nn calls that need it
    (here: dynamic Linear's default qconfig for ``qconfig = None``) ask for it to be imported,
    and work once it is."""
    code = ("import torch, torchquant.nn.quantized.dynamic as nnqd; "
            "m = torch.nn.Linear(4, 4); m.qconfig = None\n"
            "try:\n    nnqd.Linear.from_float(m)\nexcept RuntimeError as e:\n    print(e)\n"
            "import torchquant.quantization\n"
            "print(type(nnqd.Linear.from_float(m)) is nnqd.Linear)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "import torchquant.quantization first" in out[0]
    assert out[1] == "True"


def _bound_modules(path: Path) -> dict[str, str]:
    """Names ``path``'s module-level import statements bind, to the torchquant module each
    name is or lives in (``from ..nn import _workflow``: ``_workflow`` -> torchquant.nn._workflow;
    ``from .registry import register``: ``register`` -> torchquant.kernels.registry)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    bound = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            bound.update((a.asname or a.name.split(".")[0], a.name) for a in node.names
                         if a.name.startswith("torchquant") and (a.asname or "." not in a.name))
        elif isinstance(node, ast.ImportFrom):
            bound.update(_from_import_targets(node, package))
    return bound


def _upward_registrations() -> set[tuple[str, str]]:
    """(hook module, registering module) for every module-level call, in any torchquant module,
    of a ``register*`` / ``install*`` function that a lower layer's module defines."""
    found = set()
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        bound = _bound_modules(path)
        for statement in ast.parse(path.read_text()).body:
            if not isinstance(statement, ast.Expr) or not isinstance(statement.value, ast.Call):
                continue
            func = statement.value.func
            chain = []
            while isinstance(func, ast.Attribute):
                chain.append(func.attr)
                func = func.value
            if not isinstance(func, ast.Name) or func.id not in bound:
                continue
            called = chain[0] if chain else func.id
            hook = ".".join([bound[func.id]] + chain[:0:-1])
            hook = hook if _exists(hook) else bound[func.id]
            if called.startswith(("register", "install")) and module != "torchquant" \
                    and _layer(hook) < _layer(module):
                found.add((hook, module))
    return found


def test_upward_hooks_are_the_listed_ones():
    """The only registration going up a layer is the one UPWARD_HOOKS names (nn's workflow
    hook, filled by the eager workflow); a new one, or this one moved or gone, fails here."""
    assert _upward_registrations() == {(hook, by) for hook, by, _why in UPWARD_HOOKS}
    # and the hook module is imported from above nn by its registrar alone
    for hook, by, _why in UPWARD_HOOKS:
        importers = {m for m, imports in _graph().items() if hook in imports
                     and _layer(m) > _layer(hook)}
        assert importers == {by}, importers


_WORKFLOW_HOOK = """\
import torchquant, torchquant.nn._workflow as w
before = w.registered()
__import__(item)
import torchquant.quantization as tq
quantize = sys.modules["torchquant.quantization.quantize"]
parts = dict(prepare=tq.prepare, prepare_qat=tq.prepare_qat, convert=tq.convert,
             default_dynamic_qconfig=tq.default_dynamic_qconfig,
             float_qparams_weight_only_qconfig=tq.float_qparams_weight_only_qconfig,
             activation_is_memoryless=quantize._activation_is_memoryless)
print(item, before, w.registered(), w._parts == parts,
      w.default_dynamic_qconfig() is tq.default_dynamic_qconfig, flush=True)"""


def test_the_workflow_hook_is_filled_by_loading_the_workflow():
    """Importing torchquant alone loads neither side; nn alone leaves the hook empty; whatever
    loads torchquant.quantization fills it, with the workflow's own functions and qconfigs
    (each first import a child of one interpreter that has imported torch)."""
    firsts = ["torchquant.quantization", "torchquant.quantization.qconfig",
              "torchquant.nn.quantized.dynamic"]
    lines = run_forked("import torch", _WORKFLOW_HOOK, firsts)
    assert lines == [f"{m} False True True True" for m in firsts], lines


def test_the_upward_hook_check_sees_a_registration():
    """The rule itself, on a made-up tree: a module-level ``_hook.register(...)`` from a
    higher layer into a lower one is found; one within a layer is not."""
    import tempfile
    global PACKAGE
    saved = PACKAGE
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "torchquant"
        for rel, text in {"__init__.py": "", "nn/__init__.py": "", "nn/_hook.py": "",
                          "kernels/__init__.py": "", "kernels/registry.py": "",
                          "kernels/a.py": "from .registry import register\nregister(1)\n",
                          "quantization/__init__.py": "",
                          "quantization/q.py": "from ..nn import _hook\n_hook.register(f=1)\n",
                          }.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        PACKAGE = root
        try:
            assert _upward_registrations() == {("torchquant.nn._hook",
                                                "torchquant.quantization.q")}
        finally:
            PACKAGE = saved


# Names moved to break cycles: (old module, name, where it is defined now).  Code importing
# the old path and pickles naming it (whole models saved with torch.save) still find it.
MOVED = [
    ("torchquant.quantization.stubs", "QuantStub", "torchquant.nn.stubs"),
    ("torchquant.quantization.stubs", "DeQuantStub", "torchquant.nn.stubs"),
    ("torchquant.nn.quantized.modules.functional_modules", "FloatFunctional",
     "torchquant.nn.float_functional"),
    ("torchquant.nn.quantized.modules.functional_modules", "FXFloatFunctional",
     "torchquant.nn.float_functional"),
    ("torchquant.quantization.observer", "_PartialWrapper",
     "torchquant.quantization._partial_wrapper"),
    ("torchquant.quantization.observer", "_with_args", "torchquant.quantization._partial_wrapper"),
    ("torchquant.quantization.utils", "is_per_channel", "torchquant.quantization.observer"),
    ("torchquant.quantization.utils", "is_per_tensor", "torchquant.quantization.observer"),
    ("torchquant.quantization.qconfig_mapping", "QConfigMapping", "torchquant.quantization.qconfig"),
    ("torchquant.quantization.qconfig_mapping", "get_default_qconfig_mapping",
     "torchquant.quantization.qconfig"),
    ("torchquant.quantization.qconfig_mapping", "_get_qconfig", "torchquant.quantization.qconfig"),
    ("torchquant.kernels", "register", "torchquant.kernels.registry"),
    ("torchquant.kernels", "get", "torchquant.kernels.registry"),
]


@pytest.mark.parametrize("old, name, new", MOVED, ids=lambda x: x if "." not in x else None)
def test_moved_names_keep_their_old_path(old, name, new):
    defined = getattr(importlib.import_module(new), name)
    assert getattr(importlib.import_module(old), name) is defined
    assert pickle.loads(f"c{old}\n{name}\n.".encode()) is defined


def test_ops_is_the_only_door_to_kernels():
    """Only ``torchquant.ops`` (and ``kernels`` itself) imports ``torchquant.kernels``: modules,
    QTensor, the graph modes and the compile entry points reach kernels through the ops, which
    own the plan and pack caches (DESIGN.md's layering, one layer per concern)."""
    through_the_door = ("torchquant.ops", "torchquant.kernels")
    offenders = sorted(
        f"{module} imports {target}"
        for module, targets in _graph().items()
        if not module.startswith(through_the_door)
        for target in targets
        if target == "torchquant.kernels" or target.startswith("torchquant.kernels."))
    assert not offenders, offenders


def _reads_environment(node: ast.AST) -> bool:
    """``os.environ`` / ``os.getenv`` / ``os.environb`` (or those names imported from os)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.value.id == "os" and node.attr in ("environ", "environb", "getenv",
                                                       "getenvb")
    if isinstance(node, ast.ImportFrom) and node.module == "os":
        return any(a.name in ("environ", "environb", "getenv", "getenvb") for a in node.names)
    return False


def test_config_is_a_leaf_of_the_standard_library():
    """``torchquant._config`` reads every environment switch and imports nothing of
    torchquant (nor torch), so every layer may import it."""
    tree = ast.parse((PACKAGE / "_config.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and not n.level}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported
    assert not any(isinstance(n, ast.ImportFrom) and n.level for n in ast.walk(tree))


def test_only_config_reads_the_environment():
    """The package reads the environment in ``_config.py`` only (one documented accessor per
    switch); the app layer (examples, demo) may set third-party variables and read its own
    (``XDG_CACHE_HOME``, torchrun's ``RANK``), but no ``TORCHQUANT_*`` one."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        module = _module_name(path)
        if module == "torchquant._config":
            continue
        tree = ast.parse(path.read_text())
        if _layer(module) < LAYERS.index("app"):
            offenders += [f"{module}:{n.lineno}" for n in ast.walk(tree) if _reads_environment(n)]
            continue
        for n in ast.walk(tree):  # app layer: no read of a TORCHQUANT_* variable
            named = [a for a in ast.walk(n) if isinstance(a, ast.Constant)
                     and isinstance(a.value, str) and a.value.startswith("TORCHQUANT_")]
            if not named:
                continue
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) \
                    and n.func.attr in ("get", "getenv", "pop") \
                    and _reads_environment(n.func.value if n.func.attr != "getenv" else n.func):
                offenders.append(f"{module}:{n.lineno}")
            elif (isinstance(n, ast.Compare) or isinstance(n, ast.Subscript)
                  and isinstance(n.ctx, ast.Load)) and any(_reads_environment(a)
                                                           for a in ast.walk(n)):
                offenders.append(f"{module}:{n.lineno}")
    assert sorted(offenders) == [], "read the switch through torchquant._config"
