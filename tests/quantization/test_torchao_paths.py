"""torchao's PT2E module paths work under the torchquant prefix (porting is a rename): each
alias imports, is the very module it names (one class per name), and offers what torchao's
module of that path offers for the flow (torchao 0.18 as the oracle of the names)."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchquant.quantization._torchao_paths import TORCHAO_PT2E_PATHS

ROOT = Path(__file__).resolve().parents[2]
# names torchao's modules export that torchquant does not have (yet)
_NOT_PORTED = {"pt2e.quantizer": {"DuplicateDQPass", "PortNodeMetaForQDQ"},
               "pt2e.fake_quantize": {"AffineFakeQuantize", "default_affine_fake_quant",
                                      "default_groupwise_fake_quant",
                                      "default_affine_per_axis_fake_quant"},
               "pt2e.graph_utils": {"get_equivalent_types", "update_equivalent_types_dict",
                                    "bfs_trace_with_node_process", "collect_producer_nodes"}}


@pytest.mark.parametrize("alias", sorted(TORCHAO_PT2E_PATHS))
def test_alias_is_the_module_it_names(alias):
    ours = importlib.import_module(f"torchquant.quantization.{alias}")
    target = importlib.import_module(f"torchquant.quantization.{TORCHAO_PT2E_PATHS[alias]}")
    assert ours is target
    assert ours.__name__ == target.__spec__.name  # the module keeps its own identity


@pytest.mark.parametrize("alias", sorted(TORCHAO_PT2E_PATHS))
def test_alias_offers_torchaos_names(alias):
    theirs = importlib.import_module(f"torchao.quantization.{alias}")  # the path exists there
    names = set(getattr(theirs, "__all__", ())) - _NOT_PORTED.get(alias, set())
    ours = importlib.import_module(f"torchquant.quantization.{alias}")
    assert not [n for n in sorted(names) if not hasattr(ours, n)]


def test_renamed_torchao_script_runs_in_a_fresh_process():
    """The literal rename of torchao's PT2E tutorial imports, in a new interpreter (so nothing
    imported before helps)."""
    script = (
        "import torch\n"
        "from torchquant.quantization.pt2e.quantize_pt2e import prepare_pt2e, convert_pt2e\n"
        "import torchquant.quantization.pt2e.quantizer.x86_inductor_quantizer as xiq\n"
        "from torchquant.quantization.pt2e.quantizer.x86_inductor_quantizer import "
        "X86InductorQuantizer\n"
        "m = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()\n"
        "x = torch.randn(2, 4)\n"
        "q = X86InductorQuantizer().set_global(xiq.get_default_x86_inductor_quantization_config())\n"
        "p = prepare_pt2e(torch.export.export(m, (x,)).module(), q)\n"
        "p(x)\n"
        "print(convert_pt2e(p)(x).shape)\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, timeout=300,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "torch.Size([2, 4])" in done.stdout
