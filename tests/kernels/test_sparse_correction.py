"""The sparse high half of the saturating-CPU split (kernels/sparse_correction.py) against the
dense split it replaces: the same float32 bits (torch.equal), across conv geometries (1-3 d,
stride, padding, dilation, groups, channels-last, batch > 1), densities from none to dense,
zero points, and for linear.  Also against exact float64 arithmetic, and the oneDNN output
scale formula the sparse half reproduces.

The dense split runs oneDNN calls that are exact on every CPU (their inputs are 0..127 and
0..1), so these tests run wherever oneDNN does, VNNI or not.
"""
import pytest
import torch
import torch.nn.functional as F

from torchquant.kernels import conv as kconv
from torchquant.kernels import linear as klinear
from torchquant.kernels import onednn_exactness as exactness
from torchquant.kernels import sparse_correction as sparse
from torchquant.kernels.packed_linear import pack_linear_weight
from torchquant.kernels.post_ops import PostOp

pytestmark = pytest.mark.skipif(exactness.onednn_u8_exact_max() < 0, reason="no usable oneDNN")

_FLOAT_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


@pytest.fixture(autouse=True)
def _sparse_at_any_size(monkeypatch):
    """The shapes here are small: the sparse half applies whatever a call's size."""
    monkeypatch.setattr(sparse, "SPARSE_MIN_MACS", 0)
_LAYOUT = {2: torch.channels_last, 3: torch.channels_last_3d}


def _input(shape, density, generator, channels_last=False):
    """uint8 activations 0..127 with ``density`` of them lifted above 127 (some to 128)."""
    x = torch.randint(0, 128, shape, dtype=torch.uint8, generator=generator)
    lift = torch.rand(shape, generator=generator) < density
    high = torch.randint(128, 256, shape, dtype=torch.uint8, generator=generator)
    x = torch.where(lift, high, x)
    if x.numel() and density > 0:
        x.view(-1)[0] = 255  # at least one value above 128
    if channels_last and x.dim() in (4, 5):
        x = x.contiguous(memory_format=_LAYOUT[x.dim() - 2])
    return x


def _packed_conv(dims, c_in, c_out, kernel, stride, padding, dilation, groups, per_channel,
                 generator, bias=True):
    w = torch.randint(-128, 128, (c_out, c_in // groups) + (kernel,) * dims, dtype=torch.int8,
                      generator=generator)
    if per_channel:
        scale = torch.rand(c_out, generator=generator, dtype=torch.float64) * 0.01 + 1e-4
        zp, axis = torch.zeros(c_out, dtype=torch.int64), 0
    else:
        scale, zp, axis = torch.tensor(0.0037, dtype=torch.float64), torch.tensor(0), None
    b = torch.randn(c_out, generator=generator) if bias else None
    return kconv.pack_conv_weight(w, scale, zp, axis, b, stride, padding, dilation, groups)


def _both_halves(x, x_scale, x_zp, packed):
    """(sparse, dense) float results of the split for ``x``."""
    bits = sparse.high_bits(x)
    if bits.flat is None:  # too many to list: list them anyway (threshold aside)
        flat = torch.nonzero(sparse.memory_flat(x)[0] > 127).view(-1)
        bits = bits._replace(flat=flat)
    sparse_y = kconv._halves_float(x, bits, x_scale, x_zp, packed)
    dense_y = kconv._halves_float(x, bits._replace(flat=None), x_scale, x_zp, packed)
    return sparse_y, dense_y


def _exact_conv(x, x_scale, x_zp, packed):
    w = packed.weight.double()
    acc = _FLOAT_CONV[packed.spatial_dims](x.double() - x_zp, w, None, packed.stride,
                                          packed.padding, packed.dilation, packed.groups)
    shape = (1, -1) + (1,) * packed.spatial_dims
    y = acc * x_scale * packed.channel_scale.double().view(shape)
    return y if packed.bias is None else y + packed.bias.double().view(shape)


GEOMETRIES = [  # dims, c_in, c_out, kernel, stride, padding, dilation, groups, spatial
    (2, 8, 16, 3, 1, 1, 1, 1, 9),
    (2, 8, 16, 3, 2, 1, 1, 1, 10),
    (2, 8, 16, 3, 2, 0, 2, 1, 11),
    (2, 8, 8, 3, 1, 1, 1, 8, 8),      # depthwise
    (2, 12, 18, 3, 2, 2, 1, 3, 9),    # groups, padding > kernel // 2
    (2, 16, 32, 1, 1, 0, 1, 1, 7),    # 1x1
    (2, 3, 16, 7, 2, 3, 1, 1, 16),    # a ResNet stem
    (2, 16, 8, 1, 2, 0, 1, 1, 8),     # strided 1x1 (a downsample)
    (1, 8, 16, 3, 1, 1, 1, 1, 12),
    (1, 8, 12, 5, 3, 2, 2, 4, 20),
    (3, 4, 8, 3, 1, 1, 1, 1, 5),
    (3, 4, 8, 3, 2, 1, 2, 2, 7),
]


@pytest.mark.parametrize("geometry", GEOMETRIES)
@pytest.mark.parametrize("density", [0.002, 0.05, 0.6])
def test_sparse_half_equals_dense_split(geometry, density):
    dims, c_in, c_out, kernel, stride, padding, dilation, groups, size = geometry
    g = torch.Generator().manual_seed(hash((geometry, density)) % 2**31)
    for per_channel, channels_last, batch, x_zp in ((True, True, 2, 0), (False, False, 3, 25),
                                                    (True, False, 1, 128)):
        packed = _packed_conv(dims, c_in, c_out, kernel, stride, padding, dilation, groups,
                              per_channel, g, bias=x_zp != 25)
        x = _input((batch, c_in) + (size,) * dims, density, g, channels_last)
        assert kconv._sparse_plan(packed, x, 0.0213)[1].order in sparse.SCALE_ORDERS
        sparse_y, dense_y = _both_halves(x, 0.0213, x_zp, packed)
        assert torch.equal(sparse_y, dense_y)
        torch.testing.assert_close(sparse_y.double(), _exact_conv(x, 0.0213, x_zp, packed),
                                   rtol=1e-5, atol=1e-4)


def test_no_high_values_and_a_single_one():
    g = torch.Generator().manual_seed(1)
    packed = _packed_conv(2, 8, 16, 3, 1, 1, 1, 1, True, g)
    x = torch.randint(0, 128, (2, 8, 6, 6), dtype=torch.uint8, generator=g)
    # none above 127: the one oneDNN call on x is the lo call of the split
    y0 = kconv._halves_float(x, sparse.HighBits(127, None, False), 0.05, 3, packed)
    assert torch.equal(y0, kconv._halves_float(x, sparse.HighBits(128, None, False), 0.05, 3,
                                               packed))
    for corner in ((0, 0, 0, 0), (1, 7, 5, 5), (1, 3, 0, 5)):
        x1 = x.clone()
        x1[corner] = 200
        sparse_y, dense_y = _both_halves(x1, 0.05, 3, packed)
        assert torch.equal(sparse_y, dense_y)


def test_float_accumulator_bound_switches_to_int32():
    """Fan-ins whose partial sums could leave float32's exact integers accumulate in int32."""
    assert sparse._accumulator_dtype(3 * 3 * 512) == torch.float32
    assert sparse._accumulator_dtype(1 << 17) == torch.int32
    g = torch.Generator().manual_seed(2)
    w = torch.randint(-128, 128, (4, 1 << 17), dtype=torch.int8, generator=g)
    packed = pack_linear_weight(w, torch.full((4,), 0.001, dtype=torch.float64),
                                        torch.zeros(4, dtype=torch.int64), 0)
    x = torch.full((2, 1 << 17), 255, dtype=torch.uint8)  # every hi set: the largest sums
    bits = sparse.HighBits(255, torch.arange(x.numel()), False)
    y = torch.zeros(2, 4)
    sparse.linear_correction_(y, bits, 0.01, "joint", packed.weight, packed.channel_scale)
    exact = w.double().sum(1).float() * (torch.tensor(1.28, dtype=torch.float32)
                                                 * packed.channel_scale)
    assert torch.equal(y, exact.expand(2, 4))


@pytest.mark.parametrize("shape", [(1000,), (3, 5, 7, 11), (2, 16, 9, 9), (2, 4, 3, 5, 6)])
@pytest.mark.parametrize("layout", ["contiguous", "channels_last", "strided"])
def test_high_positions_finds_every_high_value(shape, layout):
    g = torch.Generator().manual_seed(len(shape))
    x = torch.randint(0, 128, shape, dtype=torch.uint8, generator=g)
    if layout == "channels_last" and x.dim() in (4, 5):
        x = x.contiguous(memory_format=_LAYOUT[x.dim() - 2])
    elif layout == "strided":
        x = x.transpose(0, -1)
    assert sparse.high_bits(x)[:2] == (int(x.max()), None)
    for count in (1, 3, 9):
        y = x.clone(memory_format=torch.preserve_format)
        picks = torch.randperm(y.numel(), generator=g)[:count]
        coords = torch.stack(torch.unravel_index(picks, y.shape), 1)
        y[coords.unbind(1)] = torch.randint(128, 256, (count,), dtype=torch.uint8, generator=g)
        bits = sparse.high_bits(y)
        assert bits.top == int(y.max())
        assert bits.channels_last == (layout == "channels_last" and y.dim() in (4, 5))
        expected = torch.nonzero(y > 127)
        if count > sparse.SPARSE_MAX_DENSITY * y.numel():
            assert bits.flat is None
        else:
            hot = sparse.coordinates(y.shape, bits)
            order = lambda c: sorted(map(tuple, c.tolist()))  # noqa: E731
            assert order(hot) == order(expected)


def test_high_positions_threshold(monkeypatch):
    monkeypatch.setattr(sparse, "SPARSE_MAX_DENSITY", 0.01)
    x = torch.zeros(1000, dtype=torch.uint8)
    x[:10] = 200
    top, flat, _ = sparse.high_bits(x)
    assert top == 200 and sorted(flat.tolist()) == list(range(10))
    x[:11] = 128
    assert sparse.high_bits(x)[:2] == (128, None)  # 1.1 % > SPARSE_MAX_DENSITY
    monkeypatch.setattr(sparse, "SPARSE_MAX_DENSITY", 0.0)
    x[11:] = 0
    x[:1] = 200
    assert sparse.high_bits(x)[1] is None


def test_high_scale_is_onednn_output_scale():
    """oneDNN's float output of a 0/1 input is float32(acc) times the float32 scales in one of
    :data:`SCALE_ORDERS`, bit for bit (what the sparse half reproduces), and
    :func:`matching_scale_order` names it.  The order depends on the kernel oneDNN runs: its
    AVX2 kernels (``ONEDNN_MAX_CPU_ISA=AVX2``, or CPUs without AVX-512) use ``joint``
    ``acc * (s_x * s_w)``, its AVX-512 VNNI kernels ``sequential`` ``(acc * s_x) * s_w``
    (measured on an AMD EPYC with AVX-512 VNNI); hence one probe per weight and shape."""
    g = torch.Generator().manual_seed(3)
    w = torch.randint(-128, 128, (32, 16, 3, 3), dtype=torch.int8, generator=g)
    w_scale = torch.rand(32, generator=g) * 0.01 + 1e-4
    for x_scale in (0.0213, 0.1, 0.003917):
        hi = (torch.rand(2, 16, 8, 8, generator=g) < 0.2).to(torch.uint8)
        geometry = ([1, 1], [1, 1], [1, 1], 1)
        packed = torch.ops.onednn.qconv_prepack(w, w_scale, x_scale * 128, 0, *geometry, None)
        y = torch.ops.onednn.qconv_pointwise(hi, x_scale * 128, 0, packed, w_scale,
                                             torch.zeros(32, dtype=torch.int64), None, *geometry,
                                             1.0, 0, torch.float32, "none", [], "")
        exact = F.conv2d(hi.double(), w.double(), padding=1)
        order = sparse.matching_scale_order(y, exact, x_scale, w_scale.view(1, -1, 1, 1))
        assert order in sparse.SCALE_ORDERS
        assert torch.equal(y, sparse.scaled_high(exact.float(), x_scale,
                                                 w_scale.view(1, -1, 1, 1), order))


@pytest.mark.parametrize("post_op", ["none", "relu", "add"])
def test_quantized_conv_sparse_and_dense_give_the_same_integers(post_op, monkeypatch):
    """End to end through the oneDNN plan, forced to split as on a saturating CPU."""
    monkeypatch.setattr(exactness, "onednn_u8_exact_max", lambda: exactness.ONEDNN_SAFE_U8_MAX)
    g = torch.Generator().manual_seed(4)
    packed = _packed_conv(2, 16, 16, 3, 1, 1, 1, 1, True, g)
    other = torch.randint(0, 256, (2, 16, 10, 10), dtype=torch.uint8, generator=g)
    kwargs = dict(other=other, other_scale=0.1, other_zero_point=120) if post_op == "add" else {}
    reference = kconv.get("quantized_conv", other, packed=packed)  # noqa: F841 (registry warm)
    for density in (0.0, 0.001, 0.004, 0.3):
        x = _input((2, 16, 10, 10), density, g, channels_last=True)
        results = []
        for limit in (1.0, 0.0):  # sparse wherever possible, then never
            monkeypatch.setattr(sparse, "SPARSE_MAX_DENSITY", limit)
            packed.plans.clear()
            results.append(kconv.quantized_conv(x, 0.031, 4, packed, 1, 1, 1, 1, 0.4, 60,
                                                post_op, **kwargs))
        assert torch.equal(results[0], results[1])
        assert results[0].is_contiguous(memory_format=torch.channels_last)
        with torch.no_grad():
            ref = kconv._quantized_conv_reference(
                x, 0.031, 4, packed, 0.4, 60,
                kconv._epilogue(x, packed, post_op, 0.01, kwargs.get("other"), 0.1, 120, "t"),
                kwargs.get("other"))
        assert (results[0].int() - ref.int()).abs().max() <= 1


@pytest.mark.parametrize("density", [0.0, 0.001, 0.01, 0.5])
def test_linear_split_sparse_equals_dense(density, monkeypatch):
    g = torch.Generator().manual_seed(5)
    for rows, k, n, per_channel in ((1, 64, 16, True), (7, 300, 40, False), (33, 512, 8, True)):
        w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
        scale = (torch.rand(n, dtype=torch.float64, generator=g) * 0.01 + 1e-4 if per_channel
                 else torch.tensor(0.002, dtype=torch.float64))
        zp = torch.zeros(n, dtype=torch.int64) if per_channel else torch.tensor(0)
        packed = pack_linear_weight(w, scale, zp, 0 if per_channel else None,
                                    torch.randn(n, generator=g))
        x = _input((rows, k), density, g)
        assert klinear._sparse_scale_order(packed, rows, 0.017) in sparse.SCALE_ORDERS
        if density == 0.5:
            assert sparse.high_bits(x).flat is None
        results = []
        for limit in (1.0, 0.0):
            monkeypatch.setattr(sparse, "SPARSE_MAX_DENSITY", limit)
            results.append(klinear.onednn_split_linear(x, 0.017, 9, packed))
        assert torch.equal(results[0], results[1])
        exact = ((x.double() - 9) @ w.double().t()) * 0.017 * packed.channel_scale.double()
        torch.testing.assert_close(results[0].double(), exact + packed.bias.double(),
                                   rtol=1e-5, atol=1e-4)
        out = klinear._quantized_linear_onednn(x, 0.017, 9, packed, 0.3, 70,
                                               klinear._dt.quint8, PostOp(), None)
        assert out.dtype == torch.uint8


def test_small_convs_keep_the_dense_call(monkeypatch):
    monkeypatch.setattr(sparse, "SPARSE_MIN_MACS", 1 << 24)
    g = torch.Generator().manual_seed(6)
    small = _packed_conv(2, 16, 16, 1, 2, 0, 1, 1, True, g)
    x = _input((1, 16, 56, 56), 0.001, g, channels_last=True)
    assert not kconv._sparse_pays(small, x)
    assert kconv._split_needed(x, False).flat is None
    big = _packed_conv(2, 64, 64, 3, 1, 1, 1, 1, True, g)
    assert kconv._sparse_pays(big, _input((1, 64, 56, 56), 0.0, g))
