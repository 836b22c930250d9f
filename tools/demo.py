"""``make demo``: torchquant's demo with torch.ao columns beside it.

torchquant never imports torch.ao (a project rule); this script, outside the package, hands
torch.ao.quantization to the demo as the peer it measures against.
"""
from __future__ import annotations

import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's torchquant

import torch.ao.nn.intrinsic.qat as ao_nniqat  # noqa: E402
import torch.ao.quantization as aoq  # noqa: E402

from torchquant.demo import run_demo  # noqa: E402

if __name__ == "__main__":
    warnings.filterwarnings("ignore", module="torch.ao")  # torch's deprecation notices
    sys.exit(run_demo(peer=aoq, peer_freeze_bn_stats=ao_nniqat.freeze_bn_stats))
