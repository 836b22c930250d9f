"""QTensor moved from ``torchquant.qtensor`` into the ``torchquant.tensor`` package: the old
import paths still work, and files pickled under the old module path still load.

``tests/data/qtensor_pre_tensor_package.pt`` was written with ``torch.save`` by the code before
the move (its pickle names ``torchquant.qtensor._rebuild_qtensor``): a per-tensor quint8
QTensor, a per-channel qint8 one and the state dict of a quantized ``Linear(3, 4)`` holding it.
"""
from __future__ import annotations

import io
import pickle
import zipfile
from pathlib import Path

import torch

import torchquant
import torchquant.qtensor
import torchquant.tensor
import torchquant.tensor.functions
import torchquant.tensor.qtensor
import torchquant.tensor_functions
from torchquant.nn.quantized import Linear

OLD_FILE = Path(__file__).parent / "data" / "qtensor_pre_tensor_package.pt"
PER_CHANNEL_INTS = [[4, 8, -7], [-1, -2, 2], [-4, 3, -5], [2, 1, 3]]


def _pickle_bytes(path: Path) -> bytes:
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))


def _check_old_contents(data):
    q, qc = data["per_tensor"], data["per_channel"]
    assert isinstance(q, torchquant.QTensor) and isinstance(qc, torchquant.QTensor)
    assert q.qdtype is torchquant.quint8 and q.q_scale() == 0.05 and q.q_zero_point() == 3
    assert q.int_repr().tolist() == [[34, 0, 0], [14, 0, 0]]
    assert qc.qdtype is torchquant.qint8 and qc.q_per_channel_axis() == 0
    assert qc.q_per_channel_scales().tolist() == [0.1, 0.2, 0.3, 0.4]
    assert qc.q_per_channel_zero_points().tolist() == [0, 1, -1, 2]
    assert qc.int_repr().tolist() == PER_CHANNEL_INTS
    fresh = Linear(3, 4)
    fresh.load_state_dict(data["linear"])
    assert fresh.weight().int_repr().tolist() == PER_CHANNEL_INTS
    assert torch.equal(fresh.weight().dequantize(), qc.dequantize())


def test_file_saved_under_old_module_path_loads_weights_only():
    assert b"torchquant.qtensor\n_rebuild_qtensor" in _pickle_bytes(OLD_FILE)
    _check_old_contents(torch.load(OLD_FILE, weights_only=True))


def test_file_saved_under_old_module_path_loads_unrestricted():
    _check_old_contents(torch.load(OLD_FILE, weights_only=False))


def _legacy_save(obj) -> bytes:
    """torch.save's legacy format: one plain protocol-2 pickle stream, module paths as text."""
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def test_old_module_path_rebuilds_in_pickles_built_here():
    q = torchquant.quantize_per_channel(torch.randn(3, 2), torch.tensor([0.1, 0.2, 0.3]),
                                        torch.tensor([1, 0, 2]), 0, torchquant.quint8)
    new = _legacy_save({"q": q})
    assert b"torchquant.tensor.qtensor\n_rebuild_qtensor" in new
    old = new.replace(b"torchquant.tensor.qtensor\n", b"torchquant.qtensor\n")
    assert b"torchquant.tensor.qtensor" not in old
    for data in (new, old):
        for weights_only in (True, False):
            back = torch.load(io.BytesIO(data), weights_only=weights_only)["q"]
            assert torch.equal(back.int_repr(), q.int_repr()) and back.axis == q.axis
            assert torch.equal(back.q_per_channel_scales(), q.q_per_channel_scales())
    plain = pickle.dumps(q, protocol=2)
    back = pickle.loads(plain.replace(b"torchquant.tensor.qtensor\n", b"torchquant.qtensor\n"))
    assert torch.equal(back.dequantize(), q.dequantize())


def test_files_saved_now_round_trip_weights_only():
    q = torchquant.quantize_per_tensor(torch.randn(5), 0.1, 4, torchquant.qint8)
    lin = Linear(3, 4)
    buf = io.BytesIO()
    torch.save({"q": q, "linear": lin.state_dict()}, buf)
    buf.seek(0)
    back = torch.load(buf, weights_only=True)
    assert torch.equal(back["q"].dequantize(), q.dequantize())
    fresh = Linear(3, 4)
    fresh.load_state_dict(back["linear"])
    assert torch.equal(fresh.weight().dequantize(), lin.weight().dequantize())


def test_old_import_paths_are_the_new_objects():
    assert torchquant.QTensor is torchquant.tensor.QTensor is torchquant.qtensor.QTensor
    assert torchquant.qtensor._rebuild_qtensor is torchquant.tensor.qtensor._rebuild_qtensor
    assert torchquant.qtensor._OPS is torchquant.tensor.qtensor._OPS  # other names: the module's
    assert torchquant.QTensor.__module__ == "torchquant.tensor.qtensor"
    for name in torchquant.tensor_functions.__all__:
        assert getattr(torchquant.tensor_functions, name) is getattr(torchquant.tensor, name) \
            is getattr(torchquant, name) is getattr(torchquant.tensor.functions, name)
