"""torchquant's import leaves dynamo and inductor unloaded; its inductor lowerings / passes and
dynamo markers are installed when torch loads them, in whichever order (torchquant/_after_import.py,
ops/inductor/__init__.py).  Fresh interpreters: what is imported is the point."""
import pytest

from conftest import run_python

_STATE = ("import sys, warnings, torch\n"
          "from torchquant.ops import inductor, compile_lowering\n"
          "def state():\n"
          "    from torch._inductor.lowering import lowerings\n"
          "    return (inductor._REGISTERED,\n"
          "            torch.ops.torchquant.quantize_per_tensor.default in lowerings,\n"
          "            getattr(compile_lowering._enabled, '_dynamo_marked_constant', False))\n")


def test_import_loads_neither_dynamo_nor_inductor():
    out = run_python("import sys, torch, torchquant.quantization, torchquant.nn\n"
                     "print(sorted(m for m in ('torch._dynamo', 'torch._inductor') "
                     "if m in sys.modules))")
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("first", [
    "torch._inductor",                 # its chain imports dynamo, which imports inductor back
    "torch._inductor.fx_passes.freezing_patterns",  # imports compile_fx while half imported
])  # dynamo first, then compile_fx: the torch.compile test below
def test_registered_once_torch_loads_inductor(first):
    out = run_python("import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
                     + _STATE + f"assert not inductor._REGISTERED\nimport {first}\n"
                     "import torch._inductor.compile_fx\nprint(state())")
    assert out.stdout.strip() == "(True, True, True)", out.stderr
    assert "setting up" not in out.stderr


def test_registered_at_import_where_inductor_is_loaded():
    out = run_python("import torch, torch._inductor.compile_fx\n" + _STATE + "print(state())")
    assert out.stdout.strip() == "(True, True, True)"


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
