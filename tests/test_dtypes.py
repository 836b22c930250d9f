import pickle

import pytest
import torch

import torchquant as tq
from torchquant.dtypes import to_qdtype, to_qscheme

TORCH_QDTYPES = [(tq.quint8, torch.quint8), (tq.qint8, torch.qint8), (tq.qint32, torch.qint32),
                 (tq.quint4x2, torch.quint4x2), (tq.quint2x4, torch.quint2x4)]


@pytest.mark.parametrize("ours,theirs", TORCH_QDTYPES)
def test_dtype_attributes_match_torch(ours, theirs):
    info = torch.iinfo(ours.storage_dtype)
    assert ours.torch_dtype is theirs
    assert ours == theirs and hash(ours) == hash(theirs)
    assert to_qdtype(theirs) is ours
    if ours.bits >= 8:
        assert (ours.qmin, ours.qmax) == (info.min, info.max)
    assert ours.qmax - ours.qmin + 1 == 2 ** ours.bits
    assert repr(ours) == f"torchquant.{ours.name}"
    assert pickle.loads(pickle.dumps(ours)) is ours


def test_plain_integer_aliases():
    assert to_qdtype(torch.uint8) is tq.quint8
    assert to_qdtype(torch.int8) is tq.qint8
    assert to_qdtype(torch.int32) is tq.qint32
    assert tq.quint8 == torch.uint8 and tq.quint8 != torch.int8


@pytest.mark.parametrize("bad", [torch.float32, torch.int16, "quint8", 3, None])
def test_unknown_dtype_raises_type_error(bad):
    with pytest.raises(TypeError, match="unsupported quantized dtype"):
        to_qdtype(bad)


@pytest.mark.parametrize("name", ["per_tensor_affine", "per_channel_affine", "per_tensor_symmetric",
                                  "per_channel_symmetric", "per_channel_affine_float_qparams"])
def test_qschemes(name):
    ours, theirs = getattr(tq, name), getattr(torch, name)
    assert ours == theirs and to_qscheme(theirs) is ours and hash(ours) == hash(theirs)
    assert pickle.loads(pickle.dumps(ours)) is ours
    with pytest.raises(TypeError, match="unsupported qscheme"):
        to_qscheme(name)


def test_bits_signedness():
    assert tq.qint8.is_signed and not tq.quint8.is_signed
    assert tq.quint4x2.values_per_byte == 2 and tq.quint2x4.values_per_byte == 4
    assert tq.quint4x2.storage_dtype == torch.uint8


def test_from_torch_quantized_dtype_maps_only_quantized_dtypes():
    import torchquant.dtypes as dt
    assert dt.from_torch_quantized_dtype(torch.quint8) is dt.quint8
    assert dt.from_torch_quantized_dtype(torch.quint4x2) is dt.quint4x2
    for plain in (torch.uint8, torch.int8, torch.float, None, "quint8", dt.quint8):
        assert dt.from_torch_quantized_dtype(plain) is None
