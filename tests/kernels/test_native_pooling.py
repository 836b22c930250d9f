"""kernels.native: the 2-d max pooling of 8-bit codes in C++ gives the separable torch-op path's
integers (torchquant/ops/pooling.py, its reference) and torch's float kernel's, in both layouts,
with padding, dilation and ceil mode; the op layer takes it where it applies and the separable
path when it is switched off."""
import pytest
import torch

from torchquant.kernels import native
from torchquant.ops import pooling

pytestmark = pytest.mark.skipif(not native.available(), reason=native.describe())

# (kernel, stride, padding, dilation, ceil_mode)
WINDOWS = [((3, 3), (2, 2), (1, 1), (1, 1), False),
           ((2, 2), (2, 2), (0, 0), (1, 1), True),
           ((3, 2), (1, 2), (1, 0), (2, 1), True),
           ((3, 3), (3, 3), (1, 1), (1, 1), True),
           ((1, 1), (1, 1), (0, 0), (1, 1), False)]
SHAPES = [(1, 8, 9, 7), (2, 16, 16, 16), (1, 3, 5, 5), (3, 1, 6, 6)]


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("window", WINDOWS)
def test_native_max_pool_equals_the_separable_path_and_torch(dtype, channels_last, shape,
                                                             window):
    kernel, stride, padding, dilation, ceil_mode = window
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(sum(shape))
    values = torch.randint(info.min, info.max + 1, shape, generator=g).to(dtype)
    if channels_last:
        values = values.contiguous(memory_format=torch.channels_last)
    expected = pooling._max_pool_separable(values, 2, kernel, stride, padding, dilation,
                                           ceil_mode, channels_last=not values.is_contiguous())
    sizes = expected.shape[2:]
    ours = native.max_pool2d(values, kernel, stride, padding, dilation, sizes)
    assert torch.equal(ours, expected)
    # dense in the input's layout (the separable path may return a strided view of it)
    layout = torch.channels_last if not values.is_contiguous() else torch.contiguous_format
    assert ours.is_contiguous(memory_format=layout)
    float_pool = torch.max_pool2d(values.float(), kernel, stride, padding, dilation, ceil_mode)
    assert torch.equal(ours, float_pool.to(dtype))


def test_the_op_layer_takes_the_native_pool_and_can_be_forced_off(monkeypatch):
    values = torch.randint(0, 256, (2, 32, 12, 12), dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last)
    calls = []
    real = native.max_pool2d
    monkeypatch.setattr(native, "max_pool2d", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(pooling, "_EAGER_MAX_POOL_PLANS", {})
    ours = pooling.max_pool(values, 2, 3, 2, 1)
    assert calls, "the native pool was not taken"
    monkeypatch.setattr(pooling, "NATIVE_MAX_POOL", False)
    monkeypatch.setattr(pooling, "_EAGER_MAX_POOL_PLANS", {})
    calls.clear()
    separable = pooling.max_pool(values, 2, 3, 2, 1)
    assert not calls and torch.equal(ours, separable)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    # the registered op (what graphs call) takes it as well
    op_out = torch.ops.torchquant.max_pool2d(values, [3, 3], [2, 2], [1, 1], [1, 1], False)
    assert torch.equal(op_out, separable)


def test_native_max_pool_refuses_other_layouts_and_dtypes():
    with pytest.raises(TypeError, match="uint8 or int8"):
        native.max_pool2d(torch.zeros(1, 2, 4, 4), (2, 2), (2, 2), (0, 0), (1, 1), (2, 2))
    strided = torch.zeros(1, 2, 8, 8, dtype=torch.uint8)[..., ::2]
    with pytest.raises(ValueError, match="contiguous or channels-last"):
        native.max_pool2d(strided, (2, 2), (2, 2), (0, 0), (1, 1), (2, 2))


# (shape, spatial dims): global average pooling (adaptive pooling to size 1)
MEAN_SHAPES = [((1, 512, 7, 7), 2), ((3, 40, 5, 9), 2), ((2, 7, 33, 33), 2), ((64, 96, 4, 4), 2),
               ((2, 6, 3, 4, 5), 3), ((1, 1, 2, 2), 2), ((2, 3, 1, 2), 2)]


@pytest.mark.parametrize("dtype, zero_point", [(torch.uint8, 0), (torch.uint8, 131),
                                               (torch.int8, -5), (torch.int8, 0)])
@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
@pytest.mark.parametrize("shape, ndim", MEAN_SHAPES)
def test_native_global_mean_equals_the_torch_op_path(dtype, zero_point, channels_last, shape,
                                                     ndim, monkeypatch):
    """Bit for bit the op layer's torch-op path (its reference: exact sums, the table / formula
    of torch's rounding), in the input's layout."""
    from torchquant import dtypes as qdt
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(sum(shape) + zero_point)
    values = torch.randint(info.min, info.max + 1, shape, generator=g).to(dtype)
    if channels_last:
        values = values.contiguous(memory_format=torch.channels_last if ndim == 2
                                   else torch.channels_last_3d)
    qd = qdt.quint8 if dtype == torch.uint8 else qdt.qint8
    assert native.global_mean_applies(values, ndim)
    ours = native.global_mean(values, ndim, zero_point, qd.qmin, qd.qmax)
    monkeypatch.setattr(pooling, "NATIVE_GLOBAL_MEAN", False)
    expected = pooling._global_mean(values, zero_point, qd, ndim)
    assert torch.equal(ours, expected)
    assert ours.stride() == expected.stride()


@pytest.mark.parametrize("zero_point", [0, 77])
def test_native_global_mean_equals_torch_quantized_adaptive_pool(zero_point):
    """The oracle: torch's quantized adaptive_avg_pool2d to 1x1 (quint8, channels-last as
    ResNet's last block leaves it), through the op layer's native path."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(2, 64, 7, 7, generator=g) * 4 - 1
    tq = torch.quantize_per_tensor(x, 0.02, zero_point, torch.quint8).contiguous(
        memory_format=torch.channels_last)
    expected = torch.nn.functional.adaptive_avg_pool2d(tq, 1).int_repr()
    calls = []
    real = native.global_mean
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native, "global_mean", lambda *a: calls.append(1) or real(*a))
        ours = pooling.adaptive_avg_pool(tq.int_repr(), zero_point, __import__(
            "torchquant").quint8, 2, 1)
    assert calls, "the native global mean was not taken"
    assert torch.equal(ours, expected)
    assert ours.is_contiguous(memory_format=torch.channels_last)


def test_native_global_mean_refuses_other_layouts_and_dtypes():
    with pytest.raises(TypeError, match="uint8 or int8"):
        native.global_mean(torch.zeros(1, 2, 4, 4), 2, 0, 0, 255)
    strided = torch.zeros(1, 2, 8, 8, dtype=torch.uint8)[..., ::2]
    assert not native.global_mean_applies(strided, 2)
    with pytest.raises(ValueError, match="contiguous or channels-last"):
        native.global_mean(strided, 2, 0, 0, 255)
