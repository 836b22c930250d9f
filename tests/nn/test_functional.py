"""torchquant.nn.quantized.functional and torch-namespace ops on QTensors, against torch 2.13.

Inputs are integer grids with simple scales (0.05, 0.1, 0.025), so many results sit exactly on
rounding ties.  That is where torch's quantized kernels are delicate: their SIMD body and their
scalar tail round differently (torchquant/nn/quantized/_lanes.py), and which elements take
which path depends on size, layout and thread split.  Every result must match bit for bit,
except bilinear resampling of channels-last input (see its test).
"""
import warnings

import pytest
import torch
import torch.ao.nn.quantized.functional as qF
import torch.nn.functional as F

import torchquant as tq
import torchquant.nn.quantized.functional as tqF

TORCH_DTYPE = {tq.quint8: torch.quint8, tq.qint8: torch.qint8, tq.qint32: torch.qint32}


def make_pair(shape, scale, zero_point, qdtype=tq.quint8, seed=0):
    """The same quantized input for torch and torchquant: random integers, on-grid floats."""
    gen = torch.Generator().manual_seed(seed)
    low, high = max(qdtype.qmin, -1000), min(qdtype.qmax, 1000)
    ints = torch.randint(low, high + 1, shape, generator=gen)
    x = (ints - zero_point).float() * scale
    theirs = torch.quantize_per_tensor(x, scale, zero_point, TORCH_DTYPE[qdtype])
    ours = tq.quantize_per_tensor(x, scale, zero_point, qdtype)
    assert torch.equal(ours.int_repr(), theirs.int_repr())
    return theirs, ours


def assert_same(theirs, ours):
    assert isinstance(ours, tq.QTensor)
    assert ours.shape == theirs.shape
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-12)
    assert ours.q_zero_point() == theirs.q_zero_point()
    mismatch = (ours.int_repr() != theirs.int_repr()).sum().item()
    assert mismatch == 0, f"{mismatch} of {ours.numel()} elements differ"


def _both(torch_fn, ours_fn=None):
    """A case: one callable for torch's tensors, one for ours (default: the same call)."""
    return torch_fn, ours_fn or torch_fn


POINTWISE = {
    "sigmoid": _both(torch.sigmoid),
    "tanh": _both(torch.tanh),
    "hardsigmoid": _both(F.hardsigmoid, tqF.hardsigmoid),
    "F.hardsigmoid": _both(F.hardsigmoid),
    "hardswish": _both(lambda q: qF.hardswish(q, 0.05, 97), lambda q: tqF.hardswish(q, 0.05, 97)),
    "elu": _both(lambda q: qF.elu(q, 0.05, 97, 0.5), lambda q: tqF.elu(q, 0.05, 97, 0.5)),
    "celu": _both(lambda q: qF.celu(q, 0.05, 97, 0.5), lambda q: tqF.celu(q, 0.05, 97, 0.5)),
    "leaky_relu": _both(lambda q: qF.leaky_relu(q, 0.25), lambda q: tqF.leaky_relu(q, 0.25)),
    "F.leaky_relu": _both(lambda q: F.leaky_relu(q, 0.5)),
    "leaky_relu_rescaled": _both(lambda q: qF.leaky_relu(q, 0.5, scale=0.1, zero_point=11),
                                 lambda q: tqF.leaky_relu(q, 0.5, scale=0.1, zero_point=11)),
    "threshold": _both(lambda q: qF.threshold(q, 0.3, -0.5), lambda q: tqF.threshold(q, 0.3, -0.5)),
    "F.threshold": _both(lambda q: F.threshold(q, 0.25, 0.75)),
    "hardtanh": _both(lambda q: qF.hardtanh(q, -0.75, 0.85),
                      lambda q: tqF.hardtanh(q, -0.75, 0.85)),
    "F.relu6": _both(F.relu6),
    "clamp": _both(lambda q: qF.clamp(q, -0.75, 0.85), lambda q: tqF.clamp(q, -0.75, 0.85)),
    "torch.clamp_min": _both(lambda q: torch.clamp(q, min=-0.125)),
    "torch.clamp_max": _both(lambda q: torch.clamp(q, max=0.375)),
    "torch.clamp_empty_range": _both(lambda q: torch.clamp(q, 0.5, -0.25)),
}

LAYOUTS = {
    "contiguous": lambda t: t,
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "transposed": lambda t: t.transpose(-1, -2),
    "strided": lambda t: t[..., ::2],
    "sliced_rows": lambda t: t[..., :-3],
}
# (shape, layouts): a tail-only tensor, vectors plus tail, and one split across threads
SIZES = [((2, 3, 5, 7), list(LAYOUTS)), ((1, 16, 9, 9), list(LAYOUTS)),
         ((130,), ["contiguous", "strided"]), ((2, 8, 50, 50), ["contiguous", "channels_last"])]
GRID = [(0.05, 101), (0.1, 30), (0.025, 200)]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
@pytest.mark.parametrize("shape,layouts", SIZES, ids=["small", "medium", "1d", "threaded"])
@pytest.mark.parametrize("name", list(POINTWISE))
def test_pointwise_bit_exact(name, shape, layouts, qdtype):
    torch_fn, ours_fn = POINTWISE[name]
    for k, (scale, zero_point) in enumerate(GRID):
        if qdtype is tq.qint8:
            zero_point -= 128
        theirs, ours = make_pair(shape, scale, zero_point, qdtype, seed=k)
        for layout in layouts:
            view = LAYOUTS[layout]
            assert_same(torch_fn(view(theirs)), ours_fn(view(ours)))


def test_fixed_output_qparams():
    """SPEC §24: sigmoid / hardsigmoid give (1/256, 0), tanh (2/256, 128) for quint8."""
    _, q = make_pair((4, 5), 0.05, 128)
    for out in (torch.sigmoid(q), F.hardsigmoid(q), tqF.hardsigmoid(q)):
        assert (out.q_scale(), out.q_zero_point()) == (0.00390625, 0)
    out = torch.tanh(q)
    assert (out.q_scale(), out.q_zero_point()) == (0.0078125, 128)
    assert (F.leaky_relu(q, 0.1).q_scale(), F.leaky_relu(q, 0.1).q_zero_point()) == (0.05, 128)
    out = tqF.leaky_relu(q, 0.1, scale=0.1, zero_point=10)
    assert (out.q_scale(), out.q_zero_point()) == (0.1, 10)
    _, q8 = make_pair((4, 5), 0.05, 0, tq.qint8)
    assert (torch.sigmoid(q8).q_scale(), torch.sigmoid(q8).q_zero_point()) == (0.00390625, -128)
    assert (torch.tanh(q8).q_scale(), torch.tanh(q8).q_zero_point()) == (0.0078125, 0)


@pytest.mark.parametrize("name,torch_fn,ours_fn", [
    ("hardtanh", lambda q: qF.hardtanh(q, -0.5, 0.5, inplace=True),
     lambda q: tqF.hardtanh(q, -0.5, 0.5, inplace=True)),
    ("leaky_relu", lambda q: qF.leaky_relu(q, 0.25, inplace=True),
     lambda q: tqF.leaky_relu(q, 0.25, inplace=True)),
    ("hardsigmoid", lambda q: qF.hardsigmoid(q, inplace=True),
     lambda q: tqF.hardsigmoid(q, inplace=True)),
    ("F.hardtanh_", lambda q: F.hardtanh(q, inplace=True), None),
    ("F.leaky_relu_", lambda q: F.leaky_relu(q, 0.5, inplace=True), None),
    ("F.hardsigmoid_", lambda q: F.hardsigmoid(q, inplace=True), None),
])
def test_inplace_variants_write_the_input(name, torch_fn, ours_fn):
    theirs, ours = make_pair((2, 3, 4, 70), 0.05, 77)
    out = (ours_fn or torch_fn)(ours)
    assert out is ours
    assert_same(torch_fn(theirs), ours)


def _conv_for_inplace_tests():
    conv = tq.nn.quantized.Conv2d(3, 4, 3, padding=1)
    weight = tq.quantize_per_channel(torch.randn(4, 3, 3, 3), torch.rand(4) * 0.02 + 0.01,
                                     torch.zeros(4, dtype=torch.long), 0, tq.qint8)
    conv.set_weight_bias(weight, torch.randn(4))
    conv.scale, conv.zero_point = torch.tensor(0.02), torch.tensor(60)
    return conv


@pytest.mark.parametrize("name,fn", [
    ("tqF.hardsigmoid", lambda q: tqF.hardsigmoid(q, inplace=True)),
    ("F.hardsigmoid_", lambda q: F.hardsigmoid(q, inplace=True)),
    ("torch.hardsigmoid_", lambda q: torch.ops.aten.hardsigmoid_(q)),
    ("nnq.LeakyReLU", lambda q: tq.nn.quantized.LeakyReLU(0.03, 20, 0.25, inplace=True)(q)),
    ("tqF.leaky_relu", lambda q: tqF.leaky_relu(q, 0.25, inplace=True)),
    ("tqF.hardtanh", lambda q: tqF.hardtanh(q, -0.5, 0.5, inplace=True)),
])
def test_inplace_qparams_reach_the_hot_paths(name, fn):
    """An in-place op that installs new qparams must not leave the cached per-tensor numbers
    (``_scale_zp``, read by quantized conv) behind: the result is the same integers as a fresh
    QTensor with the new qparams."""
    _, q = make_pair((2, 3, 9, 9), 0.05, 77)
    conv = _conv_for_inplace_tests()
    conv(q)  # caches q's (scale, zero_point) numbers
    assert q._scale_zp() == (0.05, 77)
    old = q.q_scale(), q.q_zero_point()
    assert fn(q) is q
    if name.startswith(("tqF.hardsigmoid", "F.hardsigmoid", "torch.hardsigmoid")):
        assert (q.q_scale(), q.q_zero_point()) == (0.00390625, 0) != old
    elif name == "nnq.LeakyReLU":
        assert (q.q_scale(), q.q_zero_point()) == (pytest.approx(0.03), 20)
    assert q._scale_zp() == (q.q_scale(), q.q_zero_point())
    fresh = tq.QTensor.from_int(q.int_repr(), q.q_scale(), q.q_zero_point(), q.qdtype)
    assert fresh._scale_zp() == q._scale_zp()
    assert torch.equal(conv(q).int_repr(), conv(fresh).int_repr())
    assert torch.equal(q.dequantize(), fresh.dequantize())


AVG_POOL_CASES = [
    dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
    dict(kernel_size=(3, 2), stride=(2, 1), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=3, divisor_override=5), dict(kernel_size=3, padding=1, divisor_override=4),
    dict(kernel_size=(2, 4), stride=(1, 2), padding=(1, 2), ceil_mode=True,
         count_include_pad=False),
]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32], ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_pooling_bit_exact(qdtype, layout):
    """Average pools round the integer mean with torch's formula (ties: zero points of both
    parities); max pools select integers."""
    view = LAYOUTS[layout]
    for zero_point in (47, 48):
        zp = zero_point - 128 if qdtype is tq.qint8 else zero_point
        theirs, ours = make_pair((2, 3, 7, 9), 0.05, zp, qdtype, seed=zero_point)
        theirs, ours = view(theirs), view(ours)
        for cfg in AVG_POOL_CASES:
            assert_same(F.avg_pool2d(theirs, **cfg), tqF.avg_pool2d(ours, **cfg))
            assert_same(F.avg_pool2d(theirs, **cfg), F.avg_pool2d(ours, **cfg))
        for size in (1, 2, 3, (4, 5), (7, 9), (3, 8), (None, 4)):
            assert_same(F.adaptive_avg_pool2d(theirs, size), tqF.adaptive_avg_pool2d(ours, size))
        for size in (1, 2, 3, (4, 5)):  # size 1 reaches QTensor as aten.mean
            assert_same(F.adaptive_avg_pool2d(theirs, size), F.adaptive_avg_pool2d(ours, size))
        for cfg in (dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                    dict(kernel_size=2, dilation=2, padding=1)):
            assert_same(F.max_pool2d(theirs, **cfg), tqF.max_pool2d(ours, **cfg))
            assert_same(F.max_pool2d(theirs, **cfg), F.max_pool2d(ours, **cfg))
        assert_same(torch.max_pool2d(theirs, 2), torch.max_pool2d(ours, 2))


def test_mean_over_inner_dims_bit_exact():
    """torch.mean of a contiguous quantized tensor over its innermost dims uses the integer
    kernel of adaptive pooling; other reductions dequantize (the QTensor default)."""
    for seed, zero_point in enumerate((47, 48)):
        theirs, ours = make_pair((2, 3, 4, 6), 0.05, zero_point, seed=seed)
        for dims, keepdim in (((-1, -2), True), ((2, 3), False), ((-1,), True),
                              ((1, 2, 3), False), ((1,), True), ((0,), False)):
            assert_same(torch.mean(theirs, dims, keepdim), torch.mean(ours, dims, keepdim))


def test_pooling_1d_and_3d_bit_exact():
    theirs, ours = make_pair((2, 3, 11), 0.05, 47)
    assert_same(F.max_pool1d(theirs, 3, 2, 1), tqF.max_pool1d(ours, 3, 2, 1))
    assert_same(F.max_pool1d(theirs, 2), F.max_pool1d(ours, 2))
    assert_same(F.avg_pool1d(theirs, 3, 2, 1), F.avg_pool1d(ours, 3, 2, 1))
    assert_same(F.adaptive_avg_pool1d(theirs, 4), F.adaptive_avg_pool1d(ours, 4))
    theirs, ours = make_pair((2, 3, 5, 6, 7), 0.05, 47)
    for cfg in (dict(kernel_size=3, stride=1, padding=1), dict(kernel_size=2),
                dict(kernel_size=3, stride=2, padding=1, count_include_pad=False, ceil_mode=True)):
        assert_same(F.avg_pool3d(theirs, **cfg), tqF.avg_pool3d(ours, **cfg))
        assert_same(F.avg_pool3d(theirs, **cfg), F.avg_pool3d(ours, **cfg))
    for size in (1, 2, (3, 4, 5)):
        assert_same(F.adaptive_avg_pool3d(theirs, size), tqF.adaptive_avg_pool3d(ours, size))
        assert_same(F.adaptive_avg_pool3d(theirs, size), F.adaptive_avg_pool3d(ours, size))
    assert_same(F.max_pool3d(theirs, 2), F.max_pool3d(ours, 2))


INTERPOLATE_CASES = [
    dict(size=(10, 14)), dict(size=(10, 14), align_corners=True), dict(size=(8, 11)),
    dict(size=(8, 11), align_corners=True), dict(scale_factor=1.7), dict(scale_factor=2.0),
    dict(size=(3, 4)), dict(size=(3, 4), align_corners=True),
]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
def test_interpolate_bit_exact(qdtype):
    for k, zero_point in enumerate((47, 48, 173)):
        zp = zero_point - 128 if qdtype is tq.qint8 else zero_point
        theirs, ours = make_pair((2, 3, 7, 9), [0.05, 0.1, 0.0731][k], zp, qdtype, seed=k)
        for cfg in INTERPOLATE_CASES:
            assert_same(qF.interpolate(theirs, mode="bilinear", **cfg),
                        tqF.interpolate(ours, mode="bilinear", **cfg))
            assert_same(F.interpolate(theirs, mode="bilinear", **cfg),
                        F.interpolate(ours, mode="bilinear", **cfg))
            nearest = {key: v for key, v in cfg.items() if key != "align_corners"}
            assert_same(qF.interpolate(theirs, **nearest), tqF.interpolate(ours, **nearest))
            assert_same(F.interpolate(theirs, mode="nearest-exact", **nearest),
                        F.interpolate(ours, mode="nearest-exact", **nearest))
    theirs, ours = make_pair((2, 3, 4, 5, 6), 0.05, 47, qdtype)
    for cfg in (dict(size=(5, 7, 9)), dict(scale_factor=1.5)):
        assert_same(qF.interpolate(theirs, **cfg), tqF.interpolate(ours, **cfg))
        assert_same(F.interpolate(theirs, **cfg), F.interpolate(ours, **cfg))


def test_bilinear_channels_last_within_one_step():
    """torch's channels-last bilinear kernel orders its float arithmetic differently from the
    contiguous one (which torchquant reproduces exactly), so on channels-last input a value
    within float rounding of a tie can land one step away: tolerate 1 step on <= 1%."""
    theirs, ours = make_pair((2, 3, 7, 9), 0.05, 47)
    theirs = theirs.contiguous(memory_format=torch.channels_last)
    ours = ours.contiguous(memory_format=torch.channels_last)
    for cfg in INTERPOLATE_CASES:
        a = F.interpolate(theirs, mode="bilinear", **cfg).int_repr().int()
        b = F.interpolate(ours, mode="bilinear", **cfg).int_repr().int()
        diff = (a - b).abs()
        assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.01


def test_deprecated_upsample_aliases():
    theirs, ours = make_pair((1, 2, 4, 5), 0.05, 47)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [qF.upsample(theirs, scale_factor=2), qF.upsample_nearest(theirs, size=(7, 9)),
                    qF.upsample_bilinear(theirs, scale_factor=2)]
    with pytest.warns(UserWarning, match="deprecated"):
        got = [tqF.upsample(ours, scale_factor=2)]
    with pytest.warns(UserWarning, match="deprecated"):
        got.append(tqF.upsample_nearest(ours, size=(7, 9)))
    with pytest.warns(UserWarning, match="deprecated"):
        got.append(tqF.upsample_bilinear(ours, scale_factor=2))
    for a, b in zip(expected, got):
        assert_same(a, b)


@pytest.mark.parametrize("name,call", [
    ("avg_pool2d", lambda x: tqF.avg_pool2d(x, 2)),
    ("avg_pool3d", lambda x: tqF.avg_pool3d(x, 2)),
    ("adaptive_avg_pool2d", lambda x: tqF.adaptive_avg_pool2d(x, 2)),
    ("adaptive_avg_pool3d", lambda x: tqF.adaptive_avg_pool3d(x, 2)),
    ("interpolate", lambda x: tqF.interpolate(x, scale_factor=2)),
    ("max_pool1d", lambda x: tqF.max_pool1d(x, 2)),
    ("max_pool2d", lambda x: tqF.max_pool2d(x, 2)),
    ("celu", lambda x: tqF.celu(x, 0.1, 0)),
    ("leaky_relu", lambda x: tqF.leaky_relu(x)),
    ("hardtanh", lambda x: tqF.hardtanh(x)),
    ("hardswish", lambda x: tqF.hardswish(x, 0.1, 0)),
    ("threshold", lambda x: tqF.threshold(x, 0.0, 1.0)),
    ("elu", lambda x: tqF.elu(x, 0.1, 0)),
    ("hardsigmoid", lambda x: tqF.hardsigmoid(x)),
    ("clamp", lambda x: tqF.clamp(x, -1.0, 1.0)),
])
def test_float_input_is_rejected(name, call):
    with pytest.raises(ValueError, match=f"Input to 'quantized.{name}' must be quantized!"):
        call(torch.randn(1, 2, 4, 4, 4))


def test_bad_arguments():
    _, q = make_pair((1, 2, 4, 4), 0.05, 47)
    with pytest.raises(ValueError, match="Input to 'threshold' must be specified!"):
        tqF.threshold(q, None, 1.0)
    with pytest.raises(ValueError, match="Input to 'value' must be specified!"):
        tqF.threshold(q, 1.0, None)
    with pytest.raises(NotImplementedError, match="return_indices"):
        tqF.max_pool2d(q, 2, return_indices=True)
    with pytest.raises(NotImplementedError, match="return_indices"):
        tqF.max_pool1d(q[0], 2, return_indices=True)
    with pytest.raises(NotImplementedError, match="bicubic"):
        tqF.interpolate(q, scale_factor=2, mode="bicubic")
    with pytest.raises(NotImplementedError, match="bilinear"):
        tqF.interpolate(q[0], scale_factor=2, mode="bilinear")
    with pytest.raises(AssertionError, match="Cannot rescale with `inplace`"):
        tqF.leaky_relu(q, 0.1, inplace=True, scale=0.1, zero_point=0)
    per_channel = tq.quantize_per_channel(torch.randn(2, 3), torch.tensor([0.1, 0.2]),
                                          torch.tensor([0, 1]), 0, tq.quint8)
    with pytest.raises(NotImplementedError, match="per-tensor"):
        torch.sigmoid(per_channel)
    with pytest.raises(NotImplementedError, match="per-tensor"):
        tqF.hardtanh(per_channel)
