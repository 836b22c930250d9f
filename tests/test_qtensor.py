"""QTensor methods against torch's quantized tensors (the oracle)."""
import copy
import io

import pytest
import torch

import torchquant as tq
from torchquant import QTensor


def pair(shape=(4, 6), scale=0.05, zp=10, ours=tq.quint8, theirs=torch.quint8):
    x = torch.randn(shape) * 2
    return tq.quantize_per_tensor(x, scale, zp, ours), torch.quantize_per_tensor(x, scale, zp, theirs)


def pair_pc(axis=0, shape=(4, 6)):
    x = torch.randn(shape)
    n = shape[axis]
    s = torch.rand(n, dtype=torch.float64) * 0.05 + 0.01
    z = torch.randint(-5, 5, (n,))
    return (tq.quantize_per_channel(x, s, z, axis, tq.qint8),
            torch.quantize_per_channel(x, s, z, axis, torch.qint8))


def same(q: QTensor, t: torch.Tensor):
    """Same ints, shape and qparams as a torch quantized tensor."""
    assert isinstance(q, QTensor)
    assert q.shape == t.shape
    assert torch.equal(q.int_repr(), t.int_repr())
    if t.qscheme() == torch.per_tensor_affine:
        assert q.q_scale() == t.q_scale() and q.q_zero_point() == t.q_zero_point()
    else:
        assert torch.equal(q.q_per_channel_scales(), t.q_per_channel_scales())
        assert torch.equal(q.q_per_channel_zero_points(), t.q_per_channel_zero_points())
    assert torch.equal(q.dequantize(), t.dequantize())


def test_basic_properties():
    q, t = pair()
    assert q.is_quantized and q.qdtype is tq.quint8 and q.dtype == torch.uint8
    assert q.size() == t.size() and q.dim() == 2 and q.numel() == 24 and q.shape == (4, 6)
    assert q.qscheme() == tq.per_tensor_affine
    assert "QTensor(" in repr(q) and "torchquant.quint8" in repr(q) and "scale=0.05" in repr(q)
    qc, tc = pair_pc()
    assert "axis=0" in repr(qc)
    with pytest.raises(RuntimeError, match="per-tensor"):
        qc.q_scale()
    with pytest.raises(RuntimeError, match="per-channel"):
        q.q_per_channel_scales()


PER_TENSOR_OPS = [
    lambda t: t.view(6, 4), lambda t: t.view(-1), lambda t: t.flatten(), lambda t: t.reshape(2, 12),
    lambda t: t.select(1, 2), lambda t: t[1], lambda t: t[:, 1:4], lambda t: t[::2],
    lambda t: t.transpose(0, 1), lambda t: t.permute(1, 0), lambda t: t.t(),
    lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(0).squeeze(0), lambda t: t.clone(),
    lambda t: t.expand(3, 4, 6), lambda t: t.view(4, 1, 6).expand(4, 5, 6),
    lambda t: t.as_strided((3, 2), (1, 3)), lambda t: t.as_strided((2, 2), (6, 1), 2),
    lambda t: t.detach(), lambda t: t.contiguous(), lambda t: t.transpose(0, 1).contiguous(),
    lambda t: t.chunk(2)[1], lambda t: t.split(3, dim=1)[0], lambda t: t.narrow(1, 1, 3),
    lambda t: t.max(), lambda t: t.min(), lambda t: t.mean(), lambda t: t.mean(1),
    lambda t: t.mean((0, 1), keepdim=True), lambda t: t.max(1)[0], lambda t: t.min(0, keepdim=True)[0],
    lambda t: t.sort()[0], lambda t: t.sort(0, descending=True)[0], lambda t: t.topk(3)[0],
    lambda t: t.topk(2, dim=0, largest=False)[0], lambda t: torch.relu(t),
    lambda t: torch.nn.functional.relu(t), lambda t: torch.cat([t, t]), lambda t: torch.cat([t, t], 1),
    lambda t: torch.stack([t, t]), lambda t: t.to("cpu"), lambda t: t[torch.tensor([0, 2])],
]


@pytest.mark.parametrize("op", PER_TENSOR_OPS, ids=lambda f: "op")
def test_per_tensor_ops_match_torch(op):
    for ours, theirs in [(tq.quint8, torch.quint8), (tq.qint8, torch.qint8)]:
        q, t = pair(ours=ours, theirs=theirs)
        same(op(q), op(t))


# Composite ops torch decomposes before __torch_dispatch__ except under inference_mode.
INFERENCE_MODE_OPS = PER_TENSOR_OPS + [
    lambda t: torch.flatten(t.view(2, 2, 6), 1), lambda t: t.reshape_as(torch.empty(6, 4)),
    lambda t: t.view_as(torch.empty(24)), lambda t: t.view(4, 1, 6).squeeze(),
    lambda t: t.view(1, 4, 6).squeeze(0), lambda t: t.movedim(0, 1), lambda t: t.swapaxes(0, 1),
    lambda t: t.mT, lambda t: t.ravel(), lambda t: t.flatten().unflatten(0, (2, 12)),
    lambda t: torch.tensor_split(t, 2, 1)[1], lambda t: t.expand_as(torch.empty(3, 4, 6)),
    lambda t: t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t.view(1, 4, 6, 1)
    .contiguous(memory_format=torch.channels_last),
    lambda t: torch.nn.functional.dropout(t, training=False), lambda t: torch.nn.functional.relu6(t),
    lambda t: torch.nn.functional.adaptive_avg_pool2d(t.view(1, 1, 4, 6), 1),
    lambda t: torch.nn.functional.max_pool2d(t.view(1, 1, 4, 6), 2),
]


@pytest.mark.parametrize("op", INFERENCE_MODE_OPS, ids=lambda f: "op")
def test_ops_under_inference_mode_match_torch(op):
    """Under torch.inference_mode() composite ops (flatten, view_as, contiguous, ...) reach
    __torch_dispatch__ undecomposed, and views of normal tensors must stay normal tensors."""
    for ours, theirs in [(tq.quint8, torch.quint8), (tq.qint8, torch.qint8)]:
        q, t = pair(ours=ours, theirs=theirs)
        with torch.inference_mode():
            out, expected = op(q), op(t)
        same(out, expected)
        assert out.is_inference() == expected.is_inference()
        with torch.no_grad():
            same(op(q), expected)
        if ours is tq.quint8:  # a QTensor made in inference mode (an inference tensor)
            with torch.inference_mode():
                q_inf, t_inf = pair(ours=ours, theirs=theirs)
                out, expected = op(q_inf), op(t_inf)
            same(out, expected)
            assert out.is_inference() and expected.is_inference()


def test_flatten_reshape_view_squeeze_under_inference_mode():
    q, t = pair(shape=(2, 3, 1, 4))
    qc, _ = pair_pc(axis=1, shape=(2, 3, 4))
    with torch.inference_mode():
        flat = torch.flatten(q, 1)
        same(flat, torch.flatten(t, 1))
        same(q.reshape(6, 4), t.reshape(6, 4))
        same(q.view_as(torch.empty(24)), t.view_as(torch.empty(24)))
        same(q.squeeze(), t.squeeze())
        same(torch.squeeze(q, 2), torch.squeeze(t, 2))
        flat_c = torch.flatten(qc, 2)
        with pytest.raises(RuntimeError, match="Setting strides"):  # per-channel: as torch
            qc.movedim(1, 2)
    assert flat.shape == (2, 12) and not flat.is_inference()
    assert flat_c.q_per_channel_axis() == 1 and torch.equal(flat_c.int_repr(), qc.int_repr())
    assert torch.equal(flat.int_repr(), q.int_repr().flatten(1))
    # the view shares the base's storage and version counter, as torch's views do
    assert flat.int_data.data_ptr() == q.int_data.data_ptr()
    with torch.inference_mode():
        for f, name in [(lambda: q + q, "add"), (lambda: q.sum(), "sum"),
                        (lambda: q.to(torch.float32), "cannot be cast"),
                        (lambda: torch.exp(q), "exp")]:
            with pytest.raises(NotImplementedError, match=name):
                f()


class _ResidualCNN(torch.nn.Module):
    """QuantStub, conv+relu, max pool, residual add (FloatFunctional), adaptive average pool,
    flatten, linear, DeQuantStub."""

    def __init__(self):
        super().__init__()
        from torchquant.nn.quantized import FloatFunctional
        from torchquant.quantization import DeQuantStub, QuantStub
        nn = torch.nn
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv1, self.relu1 = nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1)
        self.skip = FloatFunctional()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        x = self.pool(self.relu1(self.conv1(self.quant(x))))
        x = self.skip.add(x, self.conv2(x))
        return self.dequant(self.fc(torch.flatten(self.avgpool(x), 1)))


def test_converted_cnn_same_under_inference_mode_and_no_grad(monkeypatch):
    from torchquant import quantization as tqq
    from torchquant.kernels import cpu_compiled
    monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 1)  # compiled kernels too, built in inference mode
    float_model = _ResidualCNN().eval()
    model = tqq.fuse_modules(float_model, [["conv1", "relu1"]])
    model.qconfig = tqq.get_default_qconfig("x86")
    model = tqq.prepare(model)
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(4, 3, 64, 64))
    model = tqq.convert(model)
    assert isinstance(model.skip, tq.nn.quantized.QFunctional)
    x = torch.randn(4, 3, 64, 64)
    with torch.inference_mode():
        under_inference = [model(x) for _ in range(2)]
    with torch.no_grad():
        under_no_grad = model(x)
        expected = float_model(x)
    assert under_no_grad.shape == (4, 5)
    for out in under_inference:
        assert torch.equal(out, under_no_grad)
    assert (under_no_grad - expected).abs().max() < 0.05 * expected.abs().max() + 0.02


def test_indices_match_torch():
    q, t = pair()
    for f in [lambda a: a.max(1), lambda a: a.min(0), lambda a: a.sort(1), lambda a: a.topk(2)]:
        (qv, qi), (tv, ti) = f(q), f(t)
        same(qv, tv)
        assert torch.equal(qi, ti)


@pytest.mark.parametrize("name", ["eq", "ne", "ge", "le", "gt", "lt"])
def test_comparisons_on_real_values(name):
    q, t = pair()
    q2, t2 = pair(scale=0.1, zp=3)
    for other_q, other_t in [(q2, t2), (0.5, 0.5), (q.dequantize(), t.dequantize())]:
        got = getattr(q, name)(other_q)
        assert got.dtype == torch.bool
        assert torch.equal(got, getattr(t, name)(other_t))
    a = tq.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.5, 0, tq.quint8)
    b = tq.quantize_per_tensor(torch.tensor([1.0, 2.0]), 0.25, 4, tq.quint8)
    assert bool((a == b).all())  # same real values, different qparams
    assert not a.equal(b)        # equal() compares representation, as torch


def test_equal_semantics():
    q, t = pair()
    assert q.equal(q.clone()) and torch.equal(q, q.clone())
    r, _ = pair(scale=0.06)
    assert not q.equal(r)
    assert not q.equal(q.dequantize())


def test_copy_semantics_match_torch():
    q, t = pair()
    src = torch.randn(4, 6)
    q.copy_(src)
    t.copy_(src)
    same(q, t)                       # float source: re-quantized with self's qparams
    q2, t2 = pair(scale=0.2, zp=5)
    q.copy_(q2)
    t.copy_(t2)
    same(q, t)                       # quantized source: ints and qparams taken from it


def test_copy_from_qtensor_replaces_cached_qparams():
    """copy_ from a QTensor installs the source's qparams as one record: the cached Python
    numbers the hot paths read (``_scale_zp``, e.g. the quantized add) follow."""
    from torchquant.nn.quantized import _binary
    q, _ = pair()
    other, _ = pair(scale=0.07, zp=3)
    before = _binary.add(q, other, 0.1, 50)  # caches q's (scale, zero_point) numbers
    assert q._scale_zp() == (0.05, 10)
    src, t_src = pair(scale=0.2, zp=5)
    q.copy_(src)
    assert q._scale_zp() == (q.q_scale(), q.q_zero_point()) == (0.2, 5)
    fresh = QTensor.from_int(t_src.int_repr(), 0.2, 5, tq.quint8)
    after = _binary.add(q, other, 0.1, 50)
    assert torch.equal(after.int_repr(), _binary.add(fresh, other, 0.1, 50).int_repr())
    assert not torch.equal(after.int_repr(), before.int_repr())
    assert (src.q_scale(), src.q_zero_point()) == (0.2, 5)  # the source's record is untouched


def test_resize_():
    q, t = pair()
    q.resize_(3, 2)
    t.resize_(3, 2)
    assert q.shape == t.shape == (3, 2)
    assert torch.equal(q.int_repr(), t.int_repr())


@pytest.mark.parametrize("axis", [0, 1])
def test_per_channel_ops(axis):
    q, t = pair_pc(axis)
    same(q.clone(), t.clone())
    same(q.detach(), t.detach())
    for idx in range(q.shape[axis]):
        s = q.select(axis, idx)
        assert s.qscheme() == tq.per_tensor_affine
        same(s, t.select(axis, idx))
    other = 1 - axis
    sel = q.select(other, 1)
    assert sel.q_per_channel_axis() == 0
    assert torch.equal(sel.dequantize(), t.dequantize().select(other, 1))
    with pytest.raises(RuntimeError, match="Setting strides is possible only on uniformly "
                                           "quantized tensor"):  # torch's rule and message
        q.transpose(0, 1)
    v = q.unsqueeze(0)
    assert v.q_per_channel_axis() == axis + 1
    assert torch.equal(v.dequantize(), t.dequantize().unsqueeze(0))
    sl = q.narrow(axis, 1, 2)
    assert torch.equal(sl.dequantize(), t.dequantize().narrow(axis, 1, 2))
    assert torch.equal(sl.q_per_channel_scales(), t.q_per_channel_scales()[1:3])
    assert torch.equal(q == t.dequantize(), t == t.dequantize())


def test_per_channel_view_keeps_channel_axis():
    q, t = pair_pc(0, shape=(4, 2, 3))
    v = q.view(4, 6)
    assert v.q_per_channel_axis() == 0
    assert torch.equal(v.dequantize(), t.dequantize().view(4, 6))
    with pytest.raises(RuntimeError, match="channel dimension"):
        q.view(2, 12)
    with pytest.raises(RuntimeError, match="per-tensor"):
        q.as_strided((2, 2), (1, 1))
    with pytest.raises(NotImplementedError):
        q.max()


def test_sub_byte_ops():
    x = torch.rand(3, 5)
    q = tq.quantize_per_tensor(x, 0.1, 2, tq.quint4x2)
    t = torch.quantize_per_tensor(x, 0.1, 2, torch.quint4x2)
    assert torch.equal(q.clone().int_repr(), t.int_repr())
    assert torch.equal(q.t().dequantize(), t.dequantize().t())
    assert torch.equal(q[1].dequantize(), t.dequantize()[1])
    assert q.view(15).int_repr().numel() == 8


def test_unsupported_ops_raise_naming_op():
    q, _ = pair()
    for f, name in [(lambda: q + q, "add"), (lambda: q * 2, "mul"), (lambda: q.sum(), "sum"),
                    (lambda: q.to(torch.float32), "cannot be cast"), (lambda: torch.exp(q), "exp")]:
        with pytest.raises(NotImplementedError, match=name):
            f()
    with pytest.raises(NotImplementedError, match="dequantize"):
        q.float()


def test_dequantize_function_and_lists():
    q, t = pair()
    x = torch.randn(3)
    assert tq.dequantize(x) is x
    a, b = tq.dequantize([q, q])
    assert torch.equal(a, t.dequantize()) and torch.equal(b, t.dequantize())
    assert torch.equal(torch.dequantize(q), t.dequantize())
    qs = tq.quantize_per_tensor([torch.randn(3), torch.randn(2)], torch.tensor([0.1, 0.2]),
                                torch.tensor([1, 2]), tq.quint8)
    assert len(qs) == 2 and qs[1].q_scale() == pytest.approx(0.2)


def test_cat_requantizes_to_first_inputs_qparams():
    a, ta = pair(scale=0.05, zp=10)
    b, tb = pair(scale=0.1, zp=3)
    got = torch.cat([a, b])
    assert got.q_scale() == 0.05 and got.q_zero_point() == 10
    expected = torch.cat([a.dequantize(), tq.quantize_per_tensor(b.dequantize(), 0.05, 10,
                                                                  tq.quint8).dequantize()])
    assert torch.equal(got.dequantize(), expected)


def test_from_int_validates():
    ints = torch.randint(0, 255, (3, 4), dtype=torch.uint8)
    q = QTensor.from_int(ints, 0.1, 3, tq.quint8)
    assert q.int_data is ints and torch.equal(q.int_repr(), ints)
    with pytest.raises(TypeError, match="dtype"):
        QTensor.from_int(ints.to(torch.int8), 0.1, 3, tq.quint8)
    with pytest.raises(ValueError, match="zero_point"):
        QTensor.from_int(ints, 0.1, 300, tq.quint8)
    q4 = QTensor.from_int(torch.tensor([1, 2, 3], dtype=torch.uint8), 0.5, 0, tq.quint4x2)
    assert q4.int_repr().tolist() == [33, 3] and q4.shape == (3,)


def _roundtrip(obj):
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_save_load_weights_only_and_deepcopy():
    q, _ = pair()
    qc, _ = pair_pc(1)
    qf = tq.quantize_per_channel(torch.randn(3, 4), torch.rand(3) + 0.1, torch.rand(3), 0, tq.quint8)
    q4 = tq.quantize_per_tensor(torch.rand(3, 3), 0.1, 1, tq.quint4x2)
    q32 = tq.quantize_per_tensor(torch.randn(5), 0.001, 7, tq.qint32)
    objs = {"q": q, "qc": qc, "qf": qf, "q4": q4, "q32": q32, "dtype": tq.qint8,
            "scheme": tq.per_channel_symmetric}
    loaded = _roundtrip(objs)
    for k in ["q", "qc", "qf", "q4", "q32"]:
        assert isinstance(loaded[k], QTensor) and loaded[k].equal(objs[k]), k
        assert loaded[k].shape == objs[k].shape
        assert copy.deepcopy(objs[k]).equal(objs[k])
    assert loaded["dtype"] is tq.qint8 and loaded["scheme"] is tq.per_channel_symmetric


def test_compile_and_export_dequantize():
    q, t = pair()
    qc, tc = pair_pc(1)
    f = torch.compile(lambda a: a.dequantize() * 2 + 1, fullgraph=True, backend="aot_eager")
    assert torch.equal(f(q), t.dequantize() * 2 + 1)
    g = torch.compile(lambda a: torch.dequantize(a).sum(0), fullgraph=True, backend="aot_eager")
    assert torch.equal(g(qc), tc.dequantize().sum(0))

    class M(torch.nn.Module):
        def forward(self, a):
            return a.dequantize().relu()

    ep = torch.export.export(M(), (q,))
    assert torch.equal(ep.module()(q), t.dequantize().relu())


@pytest.mark.parametrize("spelling", ["torch.relu", "F.relu", "Tensor.relu", "nn.ReLU",
                                      "F.relu inplace", "nn.ReLU inplace"])
def test_relu_spellings_match_torch(spelling):
    """Every way to write relu on a quantized tensor gives torch's integers (the torch-level
    entry and the aten one share one handler); the in-place forms write into the input."""
    x = torch.randn(4, 6)
    theirs = torch.relu(torch.quantize_per_tensor(x, 0.05, 70, torch.quint8)).int_repr()
    q = tq.quantize_per_tensor(x, 0.05, 70, tq.quint8)
    run = {"torch.relu": torch.relu, "F.relu": torch.nn.functional.relu,
           "Tensor.relu": lambda t: t.relu(), "nn.ReLU": torch.nn.ReLU(),
           "F.relu inplace": lambda t: torch.nn.functional.relu(t, inplace=True),
           "nn.ReLU inplace": torch.nn.ReLU(inplace=True)}[spelling]
    out = run(q)
    assert torch.equal(out.int_repr(), theirs)
    if "inplace" in spelling:
        assert out is q
