"""torchquant's import leaves dynamo and inductor unloaded; its inductor lowerings / passes and
dynamo markers are installed when torch loads them, in whichever order (torchquant/_after_import.py,
ops/inductor/__init__.py).  Fresh interpreters: what is imported is the point."""

from conftest import run_forked, run_python

_STATE = ("import sys, warnings, torch\n"
          "from torchquant.ops import inductor, compile_lowering\n"
          "def state():\n"
          "    from torch._inductor.lowering import lowerings\n"
          "    return (inductor._REGISTERED,\n"
          "            torch.ops.torchquant.quantize_per_tensor.default in lowerings,\n"
          "            getattr(compile_lowering._enabled, '_dynamo_marked_constant', False))\n")


# Each import order a child of one interpreter that has imported torch alone, as a fresh
# program would have after ``import torch``.
_ORDERS = {
    "torchquant alone": [],
    # its chain imports dynamo, which imports inductor modules back
    "torchquant, then torch._inductor": ["torch._inductor"],
    # imports compile_fx while itself half imported
    "torchquant, then freezing_patterns": ["torch._inductor.fx_passes.freezing_patterns"],
    "compile_fx, then torchquant": None,
}
_IN_ORDER = """\
warnings.simplefilter("error", RuntimeWarning)  # a failed registration warns
then = ORDERS[item]
if then is None:
    import torch._inductor.compile_fx
import torchquant.quantization
from torchquant.ops import inductor, compile_lowering
loaded = sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules)
for name in then or []:
    __import__(name)
from torch._inductor.lowering import lowerings
state = (inductor._REGISTERED,
         torch.ops.torchquant.quantize_per_tensor.default in lowerings,
         getattr(compile_lowering._enabled, "_dynamo_marked_constant", False))
print(item, "|", loaded if then == [] else "", "|", state, flush=True)"""


def test_inductor_and_dynamo_are_loaded_by_torch_and_registered_in_every_order():
    """Importing torchquant loads neither dynamo nor inductor; whichever order they are loaded
    in, the lowerings and passes are registered and the dynamo markers set, without a warning."""
    lines = run_forked(f"import warnings, torch\nORDERS = {_ORDERS!r}", _IN_ORDER,
                       list(_ORDERS))
    assert lines == ["torchquant alone | [] | (True, True, True)",
                     "torchquant, then torch._inductor |  | (True, True, True)",
                     "torchquant, then freezing_patterns |  | (True, True, True)",
                     "compile_fx, then torchquant |  | (True, True, True)"]


def test_plain_torch_compile_of_a_converted_model_fuses():
    """The user's own ``torch.compile`` with nothing imported beforehand: the first compile
    loads inductor, which installs the lowerings before they are needed."""
    code = _STATE + (
        "from torch._inductor.utils import run_and_get_code\n"
        "import torchquant.quantization as tq\n"
        "m = torch.nn.Sequential(tq.QuantStub(), torch.nn.Linear(8, 8), torch.nn.ReLU(),\n"
        "                        tq.DeQuantStub()).eval()\n"
        "m.qconfig = tq.default_qconfig\n"
        "tq.prepare(m, inplace=True); m(torch.randn(4, 8)); tq.convert(m, inplace=True)\n"
        "x = torch.randn(4, 8)\n"
        "with torch.no_grad():\n"
        "    out, code = run_and_get_code(torch.compile(m), x)\n"
        "    assert torch.equal(out, m(x))\n"
        "print(state(), 'torch.ops.torchquant.quantize_per_tensor' in ''.join(code))")
    assert run_python(code).stdout.strip() == "(True, True, True) False"
