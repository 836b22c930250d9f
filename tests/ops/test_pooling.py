"""The registered pooling / resampling ops of torchquant/ops/pooling.py.

Each ``torch.ops.torchquant`` op gives the integers, dtype and memory layout of the eager
function (which runs the implementation without the dispatcher), passes
``torch.library.opcheck`` (schema, fake implementation, AOT dispatch), and a QTensor model
exported with ``torch.export`` holds the ops, matches eager and leaves eager working (the
shape-keyed caches must never keep fake tensors).  torch's own quantized kernels are the
oracle of the eager functions in tests/nn/test_pooling_fast.py and tests/nn/test_functional.py.
"""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import torchquant as tq
import torchquant.nn.quantized  # noqa: F401  (registers the QTensor handlers of F.* / aten)
from torchquant.ops import pooling

ops = torch.ops.torchquant

CL = {4: torch.channels_last, 5: torch.channels_last_3d}


def _values(shape, qdtype, layout, seed=0):
    gen = torch.Generator().manual_seed(seed)
    low, high = max(qdtype.qmin, -1000), min(qdtype.qmax, 1000)
    x = torch.randint(low, high + 1, shape, generator=gen).to(qdtype.storage_dtype)
    if layout == "channels_last":
        return x.contiguous(memory_format=CL[len(shape)])
    if layout == "strided":  # neither contiguous nor channels-last
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)[..., ::2]
    return x


def _zero_point(qdtype):
    return {tq.quint8: 47, tq.qint8: -3, tq.qint32: 1000}[qdtype]


def _significant_strides(t):
    return tuple(s for s, n in zip(t.stride(), t.shape) if n != 1)


def _assert_identical(got, expected):
    got = got if isinstance(got, tuple) else (got,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert type(g) is torch.Tensor and type(e) is torch.Tensor
        assert g.dtype == e.dtype and g.shape == e.shape
        assert torch.equal(g, e)
        assert _significant_strides(g) == _significant_strides(e), (g.stride(), e.stride())


# name: (spatial dims, registered op and its arguments, eager-function call), on integers ``v``
# quantized with zero point ``zp`` in ``qd``
CASES = {
    "max_pool1d": (
        1, lambda v, zp, qd: (ops.max_pool1d, (v, [3], [2], [1], [1], True)),
        lambda v, zp, qd: pooling.max_pool(v, 1, 3, 2, 1, ceil_mode=True)),
    "max_pool1d_with_indices": (
        1, lambda v, zp, qd: (ops.max_pool1d_with_indices, (v, [3], [2], [1], [1], False)),
        lambda v, zp, qd: pooling.max_pool(v, 1, 3, 2, 1, return_indices=True)),
    "max_pool2d": (
        2, lambda v, zp, qd: (ops.max_pool2d, (v, [3, 3], [2, 2], [1, 1], [1, 1], False)),
        lambda v, zp, qd: pooling.max_pool(v, 2, 3, 2, 1)),
    "max_pool2d_dilated_ceil": (
        2, lambda v, zp, qd: (ops.max_pool2d, (v, [3, 2], [2, 1], [1, 0], [2, 1], True)),
        lambda v, zp, qd: pooling.max_pool(v, 2, (3, 2), (2, 1), (1, 0), (2, 1), True)),
    "max_pool2d_with_indices": (
        2, lambda v, zp, qd: (ops.max_pool2d_with_indices,
                              (v, [2, 2], [2, 2], [0, 0], [1, 1], False)),
        lambda v, zp, qd: pooling.max_pool(v, 2, 2, return_indices=True)),
    "max_pool3d": (
        3, lambda v, zp, qd: (ops.max_pool3d,
                              (v, [2, 3, 2], [2, 2, 1], [1, 1, 0], [1, 1, 1], True)),
        lambda v, zp, qd: pooling.max_pool(v, 3, (2, 3, 2), (2, 2, 1), (1, 1, 0), 1, True)),
    "max_pool3d_with_indices": (
        3, lambda v, zp, qd: (ops.max_pool3d_with_indices,
                              (v, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False)),
        lambda v, zp, qd: pooling.max_pool(v, 3, 2, return_indices=True)),
    "avg_pool2d": (
        2, lambda v, zp, qd: (ops.avg_pool2d,
                              (v, zp, qd.name, [3, 3], [2, 2], [1, 1], False, True, None)),
        lambda v, zp, qd: pooling.avg_pool(v, zp, qd, 2, 3, 2, 1)),
    "avg_pool2d_ceil_exclude_pad": (
        2, lambda v, zp, qd: (ops.avg_pool2d,
                              (v, zp, qd.name, [2, 3], [2, 1], [1, 1], True, False, None)),
        lambda v, zp, qd: pooling.avg_pool(v, zp, qd, 2, (2, 3), (2, 1), 1, True, False)),
    "avg_pool2d_divisor": (
        2, lambda v, zp, qd: (ops.avg_pool2d,
                              (v, zp, qd.name, [2, 2], [2, 2], [0, 0], False, True, 3)),
        lambda v, zp, qd: pooling.avg_pool(v, zp, qd, 2, 2, divisor_override=3)),
    "avg_pool3d": (
        3, lambda v, zp, qd: (ops.avg_pool3d, (v, zp, qd.name, [2, 2, 2], [1, 2, 2],
                                               [1, 0, 1], True, False, None)),
        lambda v, zp, qd: pooling.avg_pool(v, zp, qd, 3, 2, (1, 2, 2), (1, 0, 1), True, False)),
    "adaptive_avg_pool2d": (
        2, lambda v, zp, qd: (ops.adaptive_avg_pool2d, (v, zp, qd.name, [3, 4])),
        lambda v, zp, qd: pooling.adaptive_avg_pool(v, zp, qd, 2, (3, 4))),
    "adaptive_avg_pool2d_global": (
        2, lambda v, zp, qd: (ops.adaptive_avg_pool2d, (v, zp, qd.name, [1, 1])),
        lambda v, zp, qd: pooling.adaptive_avg_pool(v, zp, qd, 2, 1)),
    "adaptive_avg_pool3d": (
        3, lambda v, zp, qd: (ops.adaptive_avg_pool3d, (v, zp, qd.name, [2, 6, 2])),
        lambda v, zp, qd: pooling.adaptive_avg_pool(v, zp, qd, 3, (2, None, 2))),
    "adaptive_avg_pool3d_global": (
        3, lambda v, zp, qd: (ops.adaptive_avg_pool3d, (v, zp, qd.name, [1, 1, 1])),
        lambda v, zp, qd: pooling.adaptive_avg_pool(v, zp, qd, 3, 1)),
    "mean_inner_dims": (
        2, lambda v, zp, qd: (ops.mean_inner_dims, (v, zp, qd.name, 2, True)),
        lambda v, zp, qd: pooling.mean_inner_dims(v, zp, qd, 2, True)),
    "mean_inner_dims_drop": (
        2, lambda v, zp, qd: (ops.mean_inner_dims, (v, zp, qd.name, 1, False)),
        lambda v, zp, qd: pooling.mean_inner_dims(v, zp, qd, 1, False)),
    "upsample_nearest2d": (
        2, lambda v, zp, qd: (ops.upsample_nearest2d, (v, [13, 10], None, None, False)),
        lambda v, zp, qd: pooling.upsample_nearest(v, (13, 10))),
    "upsample_nearest2d_scales_exact": (
        2, lambda v, zp, qd: (ops.upsample_nearest2d, (v, [10, 21], 1.5, 2.5, True)),
        lambda v, zp, qd: pooling.upsample_nearest(v, (10, 21), (1.5, 2.5), exact=True)),
    "upsample_nearest3d": (
        3, lambda v, zp, qd: (ops.upsample_nearest3d, (v, [8, 5, 14], 2.0, None, 2.0, False)),
        lambda v, zp, qd: pooling.upsample_nearest(v, (8, 5, 14), (2.0, None, 2.0))),
    "upsample_bilinear2d": (
        2, lambda v, zp, qd: (ops.upsample_bilinear2d,
                              (v, zp, qd.name, [13, 10], False, None, None)),
        lambda v, zp, qd: pooling.upsample_bilinear(v, zp, qd, (13, 10), False)),
    "upsample_bilinear2d_align_scales": (
        2, lambda v, zp, qd: (ops.upsample_bilinear2d,
                              (v, zp, qd.name, [14, 9], True, 2.0, 1.3)),
        lambda v, zp, qd: pooling.upsample_bilinear(v, zp, qd, (14, 9), True, (2.0, 1.3))),
}
SHAPES = {1: (2, 5, 17), 2: (2, 5, 7, 9), 3: (2, 3, 4, 6, 7)}


def _layouts(ndim):
    return ("contiguous", "strided") if ndim == 1 else ("contiguous", "channels_last", "strided")


PARAMS = [(name, layout) for name, (ndim, _, _) in CASES.items() for layout in _layouts(ndim)]


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32], ids=str)
@pytest.mark.parametrize("name,layout", PARAMS)
def test_op_equals_eager_function(name, layout, qdtype):
    """Same integers, dtype and strides through the dispatcher as in eager (the channels-last
    and NCHW 8-bit max pooling take the separable integer paths, the rest torch's kernels)."""
    ndim, op_call, eager_call = CASES[name]
    values = _values(SHAPES[ndim], qdtype, layout)
    zero_point = _zero_point(qdtype)
    op, args = op_call(values, zero_point, qdtype)
    _assert_identical(op(*args), eager_call(values, zero_point, qdtype))


@pytest.mark.parametrize("name,layout", [p for p in PARAMS if p[1] != "strided"])
def test_opcheck(name, layout):
    """Schema, fake implementation (shape, dtype, strides) and AOT dispatch of each op."""
    ndim, op_call, _ = CASES[name]
    for qdtype in (tq.quint8, tq.qint32):
        values = _values(SHAPES[ndim], qdtype, layout, seed=1)
        op, args = op_call(values, _zero_point(qdtype), qdtype)
        torch.library.opcheck(op, args)


def test_fake_strides_follow_the_real_kernels():
    """The fake implementations give the real result's shape, dtype and (significant) strides
    for every layout, including the ones whose routes differ (separable, float kernel)."""
    mode = FakeTensorMode()
    for name, (ndim, op_call, _) in CASES.items():
        for layout in _layouts(ndim):
            for qdtype in (tq.quint8, tq.qint8, tq.qint32):
                values = _values(SHAPES[ndim], qdtype, layout, seed=2)
                op, args = op_call(values, _zero_point(qdtype), qdtype)
                real = op(*args)
                with mode:
                    fake = op(mode.from_tensor(values), *args[1:])
                real = real if isinstance(real, tuple) else (real,)
                fake = fake if isinstance(fake, tuple) else (fake,)
                for r, f in zip(real, fake):
                    assert (r.shape, r.dtype) == (f.shape, f.dtype), name
                    assert _significant_strides(r) == _significant_strides(f), \
                        (name, layout, qdtype, r.stride(), f.stride())


def test_fake_checks_like_the_real_op():
    """Arguments the separable max pooling rejects are rejected at trace time too."""
    values = _values((1, 4, 5, 5), tq.quint8, "channels_last")
    mode = FakeTensorMode()
    for bad in (([2, 2], [2, 2], [2, 2], [1, 1]), ([3, 3], [0, 0], [0, 0], [1, 1]),
                ([7, 7], [1, 1], [0, 0], [1, 1])):
        with pytest.raises(RuntimeError):
            ops.max_pool2d(values, *bad, False)
        with pytest.raises(RuntimeError), mode:
            ops.max_pool2d(mode.from_tensor(values), *bad, False)


def test_caches_keep_no_fake_tensors():
    """The shape-keyed tables are built from real tensors only: a call under a fake mode
    computes them without keeping them."""
    pooling._ADAPTIVE_COUNTS.clear()
    pooling._MEAN_TABLES.clear()
    mode = FakeTensorMode()
    with mode:
        counts, _ = pooling._adaptive_counts((7, 9), (3, 4))
        table = pooling._mean_table(9, 5, tq.quint8)
    assert type(counts) is not torch.Tensor and type(table) is not torch.Tensor
    assert not pooling._ADAPTIVE_COUNTS and not pooling._MEAN_TABLES
    counts, _ = pooling._adaptive_counts((7, 9), (3, 4))
    assert type(counts) is torch.Tensor and len(pooling._ADAPTIVE_COUNTS) == 1
    assert type(pooling._mean_table(9, 5, tq.quint8)) is torch.Tensor


class PoolHead(torch.nn.Module):
    """QTensor -> max pooling -> global average pooling -> flatten, float in and out."""

    def forward(self, x):
        q = tq.quantize_per_tensor(x, 0.05, 10, tq.quint8)
        q = F.max_pool2d(q, 3, 2, 1)
        q = F.adaptive_avg_pool2d(q, 1)
        return torch.flatten(q, 1).dequantize()


class Resampler(torch.nn.Module):
    """The other ops through the plain-tensor functions (on QTensors, torch reaches these
    through aten-level handlers, which export does not trace yet): quint8 integers in."""

    def forward(self, v):
        a = pooling.avg_pool(v, 10, tq.quint8, 2, 2, 2, 1, count_include_pad=False)
        b = pooling.adaptive_avg_pool(a, 10, tq.quint8, 2, (3, 2))
        c = pooling.upsample_nearest(b, (6, 4), (2.0, 2.0))
        d = pooling.upsample_bilinear(c, 10, tq.quint8, (5, 7), False)
        e = pooling.mean_inner_dims(d, 10, tq.quint8, 2, True)
        f, indices = pooling.max_pool(d, 2, 2, return_indices=True)
        g = pooling.max_pool(v.unsqueeze(2), 3, (1, 2, 2))
        return d, e, f, indices, g


def _torchquant_ops(graph_module):
    return [str(n.target) for n in graph_module.graph.nodes
            if n.op == "call_function" and str(n.target).startswith("torchquant.")]


@pytest.mark.parametrize("layout", ["contiguous", "channels_last"])
def test_export_pool_head(layout, monkeypatch):
    # the torch-op global mean, whose lookup tables are the cache under test (the native one
    # keeps none)
    monkeypatch.setattr(pooling, "NATIVE_GLOBAL_MEAN", False)
    x = torch.randn(2, 8, 12, 12)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last)
    model = PoolHead()
    expected = model(x)
    # empty caches: export must not fill them with its fake tensors
    pooling._ADAPTIVE_COUNTS.clear()
    pooling._MEAN_TABLES.clear()
    ep = torch.export.export(model, (x,))
    found = _torchquant_ops(ep.graph_module)
    assert found == ["torchquant.quantize_per_tensor.default", "torchquant.max_pool2d.default",
                     "torchquant.adaptive_avg_pool2d.default",
                     "torchquant.dequantize_per_tensor.default"]
    assert all(type(v) is torch.Tensor for v in pooling._MEAN_TABLES.values())
    assert torch.equal(ep.module()(x), expected)
    # eager still works after the export, with the tables real
    again = model(x)
    assert type(again) is torch.Tensor and torch.equal(again, expected)
    assert pooling._MEAN_TABLES and all(type(v) is torch.Tensor
                                        for v in pooling._MEAN_TABLES.values())
    x2 = torch.randn(2, 8, 12, 12) * 4  # saturates
    assert torch.equal(ep.module()(x2), model(x2))


def test_export_resampling_and_averages():
    v = _values((1, 3, 9, 11), tq.quint8, "channels_last")
    model = Resampler()
    expected = model(v)
    pooling._ADAPTIVE_COUNTS.clear()
    pooling._MEAN_TABLES.clear()
    ep = torch.export.export(model, (v,))
    found = set(_torchquant_ops(ep.graph_module))
    assert found == {"torchquant.avg_pool2d.default", "torchquant.adaptive_avg_pool2d.default",
                     "torchquant.upsample_nearest2d.default",
                     "torchquant.upsample_bilinear2d.default",
                     "torchquant.mean_inner_dims.default",
                     "torchquant.max_pool2d_with_indices.default",
                     "torchquant.max_pool3d.default"}
    for got, want in zip(ep.module()(v), expected):
        _assert_identical(got, want)
    for got, want in zip(model(v), expected):  # eager after export
        _assert_identical(got, want)
    assert all(type(t) is torch.Tensor for v in pooling._ADAPTIVE_COUNTS.values() for t in v)
    assert all(type(t) is torch.Tensor for t in pooling._MEAN_TABLES.values())
