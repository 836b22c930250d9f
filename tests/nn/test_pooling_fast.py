"""The integer fast paths of torchquant/ops/pooling.py against torch 2.13.

Channels-last max pooling (separable maxima on the NHWC memory) and global average pooling
(exact integer sums, table requantization) must give torch's integers bit for bit and keep
torch's output memory format.
"""
import pytest
import torch
import torch.nn.functional as F

import torchquant as tq
import torchquant.nn.quantized.functional as tqF
from torchquant.ops import pooling as _pooling

TORCH_DTYPE = {tq.quint8: torch.quint8, tq.qint8: torch.qint8, tq.qint32: torch.qint32}
CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def make_pair(shape, zero_point, qdtype, seed, layout="channels_last"):
    """The same random integers as a torch quantized tensor and a QTensor, in ``layout``."""
    gen = torch.Generator().manual_seed(seed)
    low, high = max(qdtype.qmin, -1000), min(qdtype.qmax, 1000)
    x = (torch.randint(low, high + 1, shape, generator=gen) - zero_point).float() * 0.05
    theirs = torch.quantize_per_tensor(x, 0.05, zero_point, TORCH_DTYPE[qdtype])
    ours = tq.quantize_per_tensor(x, 0.05, zero_point, qdtype)
    if layout == "channels_last":
        theirs = theirs.contiguous(memory_format=CL[len(shape)])
        ours = ours._with(ours.int_data.contiguous(memory_format=CL[len(shape)]))
    assert torch.equal(ours.int_repr(), theirs.int_repr())
    return theirs, ours


def assert_same(theirs, ours):
    """Same integers, qparams and memory layout (strides of size-1 dims do not matter)."""
    assert isinstance(ours, tq.QTensor)
    assert ours.shape == theirs.shape
    assert ours.q_scale() == theirs.q_scale() and ours.q_zero_point() == theirs.q_zero_point()
    mismatch = (ours.int_repr() != theirs.int_repr()).sum().item()
    assert mismatch == 0, f"{mismatch} of {ours.numel()} elements differ"
    data = ours.int_data
    for fmt in (torch.contiguous_format, CL.get(theirs.dim())):
        if fmt is not None:
            assert data.is_contiguous(memory_format=fmt) == theirs.is_contiguous(memory_format=fmt)
    for size, mine, torchs in zip(theirs.shape, data.stride(), theirs.stride()):
        assert size == 1 or mine == torchs, (data.stride(), theirs.stride())


MAX_POOL_2D = [
    dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True), dict(kernel_size=3),
    dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0)),
    dict(kernel_size=2, dilation=2, padding=1), dict(kernel_size=3, dilation=(2, 1), stride=2),
    dict(kernel_size=(5, 3), stride=(3, 2), padding=(2, 1), ceil_mode=True),
    dict(kernel_size=4, stride=3, padding=2, dilation=2, ceil_mode=True),
    dict(kernel_size=1, stride=2),
]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
@pytest.mark.parametrize("shape", [(1, 64, 16, 16), (2, 5, 11, 9), (1, 3, 7, 13)])
def test_max_pool2d_channels_last(qdtype, shape):
    for seed, zero_point in enumerate((3, 100)):
        zp = zero_point - 128 if qdtype is tq.qint8 else zero_point
        theirs, ours = make_pair(shape, zp, qdtype, seed)
        assert _pooling._channels_last_view(ours.int_data, 2) is not None
        for cfg in MAX_POOL_2D:
            expected = F.max_pool2d(theirs, **cfg)
            assert_same(expected, tqF.max_pool2d(ours, **cfg))
            assert_same(expected, F.max_pool2d(ours, **cfg))
            args = [_pooling._tuple(cfg.get(k, d), 2) for k, d in
                    (("kernel_size", 1), ("stride", cfg["kernel_size"]), ("padding", 0),
                     ("dilation", 1))]
            ops = torch.ops.quantized.max_pool2d(theirs, *args, cfg.get("ceil_mode", False))
            assert torch.equal(ops.int_repr(), expected.int_repr())


def test_max_pool2d_channels_last_module_and_resnet_stem():
    """A quantized ResNet's stem pool: channels-last in, channels-last out."""
    theirs, ours = make_pair((1, 64, 112, 112), 0, tq.quint8, 7)
    pool = torch.nn.MaxPool2d(3, 2, 1)
    assert_same(pool(theirs), pool(ours))


def test_max_pool3d_channels_last():
    for seed, qdtype in enumerate((tq.quint8, tq.qint8)):
        theirs, ours = make_pair((2, 6, 5, 7, 9), 1, qdtype, seed)
        for cfg in (dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                    dict(kernel_size=(3, 2, 3), stride=(1, 2, 2), ceil_mode=True)):
            assert_same(F.max_pool3d(theirs, **cfg), F.max_pool3d(ours, **cfg))


def test_max_pool2d_fast_path_matches_fallback():
    """The NHWC path equals the float round trip of the same integers."""
    _, ours = make_pair((2, 7, 10, 13), 5, tq.quint8, 3)
    for cfg in MAX_POOL_2D:
        fast = tqF.max_pool2d(ours, **cfg).int_repr()
        slow = F.max_pool2d(ours.int_data.float(), **cfg).to(torch.uint8)
        assert torch.equal(fast, slow)


@pytest.mark.parametrize("cfg", [dict(kernel_size=2, padding=2), dict(kernel_size=3, stride=0),
                                 dict(kernel_size=7), dict(kernel_size=3, dilation=3)])
def test_max_pool2d_channels_last_rejects_bad_arguments(cfg):
    theirs, ours = make_pair((1, 4, 5, 5), 3, tq.quint8, 0)
    with pytest.raises(RuntimeError):
        F.max_pool2d(theirs, **cfg)
    with pytest.raises(RuntimeError):
        tqF.max_pool2d(ours, **cfg)


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_global_adaptive_avg_pool(qdtype, layout):
    """Output size 1: rounding ties of both parities (zero points 47, 48) and 2-D / 3-D."""
    for seed, zero_point in enumerate((0, 47, 48, 255)):
        zp = zero_point - 128 if qdtype is tq.qint8 else zero_point
        # (2, 64, 1, 1): windows of one element, whose mean is the element itself
        for shape in ((1, 512, 7, 7), (2, 5, 3, 11), (3, 1, 4, 4), (2, 64, 1, 1)):
            theirs, ours = make_pair(shape, zp, qdtype, seed, layout)
            for size in (1, (1, 1)):
                assert_same(F.adaptive_avg_pool2d(theirs, size),
                            tqF.adaptive_avg_pool2d(ours, size))
            assert_same(F.adaptive_avg_pool2d(theirs, 1), F.adaptive_avg_pool2d(ours, 1))
            module = torch.nn.AdaptiveAvgPool2d((1, 1))
            assert_same(module(theirs), module(ours))
        for shape in ((2, 6, 3, 5, 7), (2, 6, 1, 1, 1)):
            theirs, ours = make_pair(shape, zp, qdtype, seed, layout)
            assert_same(F.adaptive_avg_pool3d(theirs, 1), tqF.adaptive_avg_pool3d(ours, 1))
            assert_same(F.adaptive_avg_pool3d(theirs, 1), F.adaptive_avg_pool3d(ours, 1))


def test_global_mean_table_equals_tensor_requantization():
    """Table and scalar formula equal the per-window tensor requantization of the general
    path at every possible sum; a window too large for a table uses the formula."""
    for qdtype, zero_point in ((tq.quint8, 47), (tq.quint8, 48), (tq.qint8, -3)):
        for count in (1, 9, 49, 4100):
            sums = torch.arange(count * qdtype.qmin, count * qdtype.qmax + 1)
            n = torch.tensor(count)
            expected = _pooling._requantize_mean(sums.double(), n, n, zero_point, qdtype)
            assert torch.equal(_pooling._mean_table(count, zero_point, qdtype), expected)
            assert torch.equal(_pooling._mean_formula(sums, count, zero_point, qdtype), expected)
    theirs, ours = make_pair((1, 3, 70, 70), 47, tq.quint8, 1)
    assert_same(F.adaptive_avg_pool2d(theirs, 1), tqF.adaptive_avg_pool2d(ours, 1))


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_adaptive_avg_pool_cached_window_counts(layout):
    """The general path (cached counts, scalar zero point): layouts, 2-D and 3-D, repeated
    calls with other zero points reuse the cache."""
    for seed, zero_point in enumerate((47, 48, 0)):
        theirs, ours = make_pair((2, 6, 7, 9), zero_point, tq.quint8, seed, layout)
        for size in (2, (3, 4), (7, 1), (5, 9)):
            assert_same(F.adaptive_avg_pool2d(theirs, size), tqF.adaptive_avg_pool2d(ours, size))
        theirs, ours = make_pair((1, 4, 5, 6, 7), zero_point - 128, tq.qint8, seed, layout)
        for size in (2, (3, 4, 5)):
            assert_same(F.adaptive_avg_pool3d(theirs, size), tqF.adaptive_avg_pool3d(ours, size))


def test_module_and_functional_calls_take_the_integer_paths(monkeypatch):
    """nn.MaxPool2d / F.max_pool2d / nn.AdaptiveAvgPool2d on a QTensor are taken before torch
    decomposes them (max_pool2d would become the with-indices op, whose indices force the
    float path): same integers and layout as torch, and no float round trip."""
    theirs, ours = make_pair((1, 16, 15, 15), 7, tq.quint8, seed=3)
    float_route = []
    real = _pooling._exact_float
    monkeypatch.setattr(_pooling, "_exact_float", lambda v: float_route.append(1) or real(v))
    assert_same(torch.nn.MaxPool2d(3, 2, 1)(theirs), torch.nn.MaxPool2d(3, 2, 1)(ours))
    assert_same(F.max_pool2d(theirs, 2), F.max_pool2d(ours, 2))
    assert_same(torch.max_pool2d(theirs, [3, 3], [2, 2]), torch.max_pool2d(ours, [3, 3], [2, 2]))
    assert_same(torch.nn.AdaptiveAvgPool2d(1)(theirs), torch.nn.AdaptiveAvgPool2d(1)(ours))
    assert not float_route
    # indices still come back when asked for (torch has no quantized kernel for that; the
    # float kernel on the same integers is the oracle)
    values, indices = F.max_pool2d(ours, 3, 2, 1, return_indices=True)
    f_values, f_indices = F.max_pool2d(ours.int_repr().float(), 3, 2, 1, return_indices=True)
    assert torch.equal(values.int_repr(), f_values.to(torch.uint8))
    assert torch.equal(indices, f_indices)
