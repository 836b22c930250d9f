"""PyTorch's own quantized-tensor tests (test/quantization/core/test_quantized_tensor.py,
test_workflow_ops.py), the parts that check errors and layouts, ported by renaming
``torch.quantize_per_*`` -> ``torchquant.quantize_per_*`` and run against torch side by side:
torchquant raises where torch raises, with the message the tests match."""
from __future__ import annotations

import itertools

import pytest
import torch

import torchquant as tq

_LIBS = {"torch": (torch, torch.qint8, torch.quint8, torch.qint32),
         "torchquant": (tq, tq.qint8, tq.quint8, tq.qint32)}


@pytest.mark.parametrize("lib", sorted(_LIBS))
def test_per_channel_permute(lib):
    ns, qint8, _, _ = _LIBS[lib]
    g = torch.Generator().manual_seed(0)
    r = torch.rand(20, 10, 2, 2, generator=g) * 4 - 2
    scales = torch.rand(10, generator=g) * 0.02 + 0.01
    zero_points = torch.round(torch.rand(10, generator=g) * 2 - 1).to(torch.long)
    qr = ns.quantize_per_channel(r, scales, zero_points, 1, qint8)
    with pytest.raises(RuntimeError):  # "we can't reorder the axis"
        qr.transpose(0, 1)
    qlast = qr.contiguous(memory_format=torch.channels_last)
    assert list(qr.stride()) == sorted(qr.stride(), reverse=True)
    assert list(qlast.stride()) != sorted(qlast.stride(), reverse=True)
    assert torch.equal(qr.int_repr(), qlast.int_repr())
    assert qlast.q_per_channel_axis() == 1
    assert torch.equal(qlast.dequantize(), qr.dequantize())


@pytest.mark.parametrize("lib", sorted(_LIBS))
def test_squeeze_of_the_channel_axis(lib):
    ns, _, quint8, _ = _LIBS[lib]
    x = torch.randn(3, 4)
    qx = ns.quantize_per_channel(x.unsqueeze(0), torch.tensor([1.0]), torch.tensor([0]), 0,
                                 quint8)
    qy = qx.unsqueeze(0)
    assert tuple(qy.shape) == (1, 1, 3, 4) and qy.q_per_channel_axis() == 1
    qz = qy.squeeze(0)
    assert qz.q_per_channel_axis() == 0
    for fn in (lambda: qy.squeeze(1), lambda: qy.squeeze()):
        with pytest.raises(RuntimeError, match="Squeeze is only possible on non-axis dimension "
                                               "for Per-Channel"):
            fn()


@pytest.mark.parametrize("lib", sorted(_LIBS))
def test_channel_float_assignment_into_a_non_contiguous_slice(lib):
    ns, qint8, quint8, qint32 = _LIBS[lib]
    g = torch.Generator().manual_seed(0)
    t1, t2 = torch.rand(2, 3, 5, 5, generator=g), torch.rand(2, 3, 5, 5, generator=g)
    for axis, dtype in itertools.product(range(t1.ndim), (qint8, quint8, qint32)):
        scales = torch.rand(t1.size(axis), generator=g, dtype=torch.float64) + 0.01
        zero_points = torch.randint(0, 50, (t1.size(axis),), generator=g)
        qt1 = ns.quantize_per_channel(t1, scales, zero_points, axis, dtype)
        qt2 = ns.quantize_per_channel(t2, scales, zero_points, axis, dtype)
        qt1[0][1] = t2[0][1]
        assert torch.equal(qt1[0][1].int_repr(), qt2[0][1].int_repr())
        qt1[:1] = t2[:1]
        assert torch.equal(qt1[:1].int_repr(), qt2[:1].int_repr())
        with pytest.raises(RuntimeError, match="Quantized copy only works with contiguous and "
                                               "NHWC Tensors"):
            qt1[:, 0] = t2[:, 0]


@pytest.mark.parametrize("lib", sorted(_LIBS))
@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (3, 1, 2, 2), (3, 4, 1, 1)])
def test_per_tensor_to_memory_format(lib, shape):
    """``to(memory_format=...)`` lays the integers out as a float tensor's ``to`` does, also in
    the degenerate shapes (c == 1, h == w == 1) where ``contiguous`` keeps the old strides."""
    ns, _, quint8, _ = _LIBS[lib]
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0))
    qx = ns.quantize_per_tensor(x, 0.1, 3, quint8)
    via_to = qx.to(memory_format=torch.channels_last)
    via_contiguous = qx.contiguous(memory_format=torch.channels_last)
    assert via_to.stride() == x.to(memory_format=torch.channels_last).stride()
    degenerate = shape[1] == 1 or shape[2:] == (1, 1)
    assert (via_to.stride() != via_contiguous.stride()) == degenerate
    assert torch.equal(via_to.int_repr(), qx.int_repr())


@pytest.mark.parametrize("lib", sorted(_LIBS))
def test_per_channel_to_memory_format(lib):
    ns, _, quint8, _ = _LIBS[lib]
    x = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(0))
    for axis in range(x.ndim):
        qx = ns.quantize_per_channel(x, torch.rand(x.size(axis)) + 1e-5,
                                     torch.randint(0, 10, (x.size(axis),)), axis, quint8)
        assert qx.to(memory_format=torch.channels_last).stride() == \
            x.to(memory_format=torch.channels_last).stride()


@pytest.mark.parametrize("lib", sorted(_LIBS))
def test_per_channel_fake_quant_rejects_bad_qparams(lib):
    fake_quantize = (torch.fake_quantize_per_channel_affine if lib == "torch"
                     else tq.fake_quantize_per_channel_affine)
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError, match="`zero_point` must be between `quant_min` and "
                                           "`quant_max`"):
        fake_quantize(x, torch.ones(3), torch.tensor([0, 300, 0], dtype=torch.int32), 0, 0, 255)
    for dtype, name in ((torch.float64, "Double"), (torch.float16, "Half")):
        with pytest.raises(RuntimeError, match=f"Scale must be Float or BFloat16, found {name}"):
            fake_quantize(x, torch.ones(3, dtype=dtype), torch.zeros(3, dtype=torch.int32), 0,
                          0, 255)
