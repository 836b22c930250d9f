"""Bad input to the tensor constructors: clear errors naming the argument, never NaN."""
import math

import pytest
import torch

import torchquant as tq


@pytest.mark.parametrize("x", [torch.arange(4), torch.ones(3, dtype=torch.bool), [1.0, 2.0]])
def test_non_float_input(x):
    with pytest.raises(TypeError, match="float"):
        tq.quantize_per_tensor(x if isinstance(x, torch.Tensor) else torch.tensor(x).int(),
                               0.1, 0, tq.quint8)


def test_quantizing_a_qtensor_is_rejected():
    q = tq.quantize_per_tensor(torch.randn(3), 0.1, 0, tq.quint8)
    with pytest.raises(TypeError, match="already quantized"):
        tq.quantize_per_tensor(q, 0.1, 0, tq.quint8)


@pytest.mark.parametrize("scale", [0.0, -0.1, math.nan, math.inf, torch.tensor(-1.0)])
def test_bad_scale(scale):
    with pytest.raises(ValueError, match="scale"):
        tq.quantize_per_tensor(torch.randn(3), scale, 0, tq.quint8)
    with pytest.raises(ValueError, match="scale"):
        tq.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, float(scale)]),
                                torch.tensor([0, 0]), 0, tq.qint8)


@pytest.mark.parametrize("dtype,zp", [(tq.quint8, -1), (tq.quint8, 256), (tq.qint8, 128),
                                      (tq.qint8, -129), (tq.quint4x2, 16)])
def test_zero_point_out_of_range(dtype, zp):
    with pytest.raises(ValueError, match="zero_point"):
        tq.quantize_per_tensor(torch.randn(3), 0.1, zp, dtype)


def test_fractional_zero_point():
    with pytest.raises(ValueError, match="integer"):
        tq.quantize_per_tensor(torch.randn(3), 0.1, 2.5, tq.quint8)


def test_per_channel_length_and_axis():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match="needs 3 scales"):
        tq.quantize_per_channel(x, torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 1, tq.qint8)
    with pytest.raises(ValueError, match="axis 2 is out of range"):
        tq.quantize_per_channel(x, torch.tensor([0.1, 0.2]), torch.tensor([0, 0]), 2, tq.qint8)
    with pytest.raises(ValueError, match="zero_points"):
        tq.quantize_per_channel(x, torch.tensor([0.1, 0.2]), torch.tensor([0, 300]), 0, tq.qint8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int16, "qint8", torch.per_tensor_affine])
def test_unknown_dtype(dtype):
    with pytest.raises(TypeError, match="unsupported quantized dtype"):
        tq.quantize_per_tensor(torch.randn(3), 0.1, 0, dtype)


def test_torch_aliases_accepted():
    x = torch.randn(5)
    a = tq.quantize_per_tensor(x, 0.1, 3, torch.quint8)
    b = tq.quantize_per_tensor(x, 0.1, 3, torch.uint8)
    assert a.qdtype is b.qdtype is tq.quint8 and a.equal(b)


def test_tensor_qparams_accepted():
    x = torch.randn(5)
    a = tq.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(3), tq.quint8)
    b = torch.quantize_per_tensor(x, torch.tensor(0.1), torch.tensor(3), torch.quint8)
    assert torch.equal(a.int_repr(), b.int_repr()) and a.q_scale() == b.q_scale()


def test_empty_tensors():
    q = tq.quantize_per_tensor(torch.empty(0, 3), 0.1, 0, tq.quint8)
    assert q.shape == (0, 3) and q.int_repr().numel() == 0 and q.dequantize().shape == (0, 3)
    qc = tq.quantize_per_channel(torch.empty(0, 3), torch.ones(3), torch.zeros(3), 1, tq.qint8)
    assert qc.shape == (0, 3)
    q4 = tq.quantize_per_tensor(torch.empty(0), 0.1, 0, tq.quint4x2)
    assert q4.numel() == 0


def test_no_nan_out():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.0])
    q = tq.quantize_per_tensor(x, 0.1, 10, tq.quint8)
    assert q.int_repr().tolist() == [255, 255, 0, 20]  # NaN -> 255 as torch (test_affine.py)
    assert not torch.isnan(q.dequantize()).any()
    with pytest.raises(ValueError, match="NaN or Inf"):
        tq.quantize_per_tensor_dynamic(x, tq.quint8, False)


def test_fake_quantize_bad_input():
    with pytest.raises(TypeError, match="floating"):
        tq.fake_quantize_per_tensor_affine(torch.arange(3), 0.1, 0, 0, 255)
    with pytest.raises(ValueError, match="quant_min"):
        tq.fake_quantize_per_tensor_affine(torch.randn(3), 0.1, 0, 10, 5)
    with pytest.raises(ValueError, match="channels"):
        tq.fake_quantize_per_channel_affine(torch.randn(2, 3), torch.ones(2), torch.zeros(2), 1, 0, 255)


@pytest.mark.parametrize("qdtype", ["quint8", "qint8"])
@pytest.mark.parametrize("reduce_range", [False, True])
def test_quantize_per_tensor_dynamic_keeps_torchs_double_scale(qdtype, reduce_range):
    """torch keeps the double scale ATen computes (not its float32 rounding); so do we."""
    torch.manual_seed(0)
    x = torch.randn(100) * 3.3
    ours = tq.quantize_per_tensor_dynamic(x, getattr(tq, qdtype), reduce_range)
    theirs = torch.quantize_per_tensor_dynamic(x, getattr(torch, qdtype), reduce_range)
    assert ours.q_scale() == theirs.q_scale()
    assert ours.q_zero_point() == theirs.q_zero_point()
    assert torch.equal(ours.int_repr(), theirs.int_repr())


def test_quantize_per_tensor_shares_qparams_made_outside_tracing_only():
    """Python-number qparams become 0-d tensors once and are shared in eager mode; a call under
    a fake mode (export, make_fx) neither uses nor fills that cache (a fake scale kept there
    would reach later eager tensors)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(4, 6)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = tq.quantize_per_tensor(mode.from_tensor(x), 0.0123, 7, tq.quint8)
        assert fake.int_data.shape == (4, 6)
        real_input = tq.quantize_per_tensor(x, 0.0123, 7, tq.quint8)  # a constant, traced
        assert real_input.int_data.shape == (4, 6)
    q1 = tq.quantize_per_tensor(x, 0.0123, 7, tq.quint8)
    q2 = tq.quantize_per_tensor(x * 2, 0.0123, 7, tq.quint8)
    assert type(q1.scale) is torch.Tensor and type(q1.zero_point) is torch.Tensor
    assert q1.scale is q2.scale and q1.zero_point is q2.zero_point
    with tq.kernels.reference_only():
        ref = tq.quantize_per_tensor(x, 0.0123, 7, tq.quint8)
    assert torch.equal(q1.int_repr(), ref.int_repr())
    assert torch.equal(q1.int_repr(), torch.quantize_per_tensor(x, 0.0123, 7,
                                                                torch.quint8).int_repr())
    with pytest.raises(ValueError, match="scale"):
        tq.quantize_per_tensor(x, -1.0, 7, tq.quint8)
    with pytest.raises(ValueError, match="zero_point"):
        tq.quantize_per_tensor(x, 0.1, 300, tq.quint8)
