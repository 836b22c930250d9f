"""QTensor operations real torch.ao code uses, against torch 2.13's quantized tensors (the oracle).

Each function runs on a torchquant QTensor and on torch's quantized tensor of the same values;
results are compared bit for bit (integers and qparams), and where torch raises, torchquant
raises the same exception type (with torch's message where PyTorch's own tests match it).
"""
import pytest
import torch
import torch.ao.quantization as taq
import torch.nn as nn
import torch.nn.functional as F

import torchquant as tq
import torchquant.quantization as tqq

SCALE = 0.05
PAIRS = [(tq.quint8, torch.quint8, 100), (tq.qint8, torch.qint8, -3)]


def _pair(x, ours=tq.quint8, theirs=torch.quint8, zero_point=100):
    return (tq.quantize_per_tensor(x, SCALE, zero_point, ours),
            torch.quantize_per_tensor(x, SCALE, zero_point, theirs))


def _same(got, want):
    assert isinstance(got, tq.QTensor)
    assert got.shape == want.shape
    assert (got.q_scale(), got.q_zero_point()) == (want.q_scale(), want.q_zero_point())
    assert torch.equal(got.int_repr(), want.int_repr())


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2


def _raises_like_torch(fn, ours, theirs):
    with pytest.raises(Exception) as want:
        fn(theirs)
    with pytest.raises(want.type):
        fn(ours)


# ---- per-tensor ops -----------------------------------------------------------------------------

LAYOUT_CASES = {
    "repeat": lambda t: t.repeat(1, 2, 1, 3),
    "repeat more dims": lambda t: t.repeat(2, 1, 1, 1, 1),
    "repeat non-contiguous": lambda t: t.transpose(1, 3).repeat(1, 1, 2, 1),
    "index_select": lambda t: t.index_select(1, torch.tensor([2, 0, 2])),
    "torch.index_select": lambda t: torch.index_select(t, 3, torch.tensor([4, 1])),
    "torch.channel_shuffle": lambda t: torch.channel_shuffle(t.repeat(1, 2, 1, 1), 3),
    "F.channel_shuffle": lambda t: F.channel_shuffle(t.repeat(1, 2, 1, 1), 2),
    "nn.ChannelShuffle": lambda t: nn.ChannelShuffle(3)(t),
    "native_channel_shuffle": lambda t: torch.native_channel_shuffle(t, 3),
}


@pytest.mark.parametrize("name", list(LAYOUT_CASES))
@pytest.mark.parametrize("ours,theirs,zero_point", PAIRS)
def test_layout_ops_match_torch(name, ours, theirs, zero_point):
    q, tq_ = _pair(_x(2, 3, 4, 5), ours, theirs, zero_point)
    if "shuffle" in name.lower() and ours is tq.qint8 and "native" not in name:
        _raises_like_torch(LAYOUT_CASES[name], q, tq_)  # torch's kernel takes quint8 only
        return
    _same(LAYOUT_CASES[name](q), LAYOUT_CASES[name](tq_))


WRITE_CASES = {
    # values on ties of the scale (k + 1/2 steps), off ties, and beyond the range
    "index_put_ tensor": lambda t: t.index_put_(
        (torch.tensor([0, 1]), torch.tensor([2, 0]), torch.tensor([1, 3]), torch.tensor([4, 0])),
        torch.tensor([0.125, -0.075])),
    "index_put_ broadcast": lambda t: t.index_put_((torch.tensor([1]),), torch.tensor(0.025)),
    "index_put_ bool": lambda t: t.index_put_((torch.tensor([True, False]),),
                                              torch.linspace(-9, 9, 60).reshape(3, 4, 5)),
    "index_put out of place": lambda t: t.index_put((torch.tensor([0]),), torch.tensor(0.175)),
    "setitem tensor index": lambda t: t.__setitem__(torch.tensor([1]), torch.tensor(-0.225)) or t,
    "masked_fill_": lambda t: t.masked_fill_(_MASK, 0.075),
    "masked_fill_ tensor": lambda t: t.masked_fill_(_MASK, torch.tensor(-0.125)),
    "masked_fill_ broadcast": lambda t: t.masked_fill_(_MASK[0, 0, 0], 7.0),
    "masked_fill": lambda t: t.masked_fill(_MASK, -0.025),
    "torch.masked_fill": lambda t: torch.masked_fill(t, _MASK, 0.3333),
    "fill_ contiguous": lambda t: (t[1].fill_(0.275), t)[1],
}
_MASK = torch.rand(2, 3, 4, 5, generator=torch.Generator().manual_seed(9)) > 0.5


@pytest.mark.parametrize("name", list(WRITE_CASES))
@pytest.mark.parametrize("ours,theirs,zero_point", PAIRS)
def test_writes_quantize_values_as_torch(name, ours, theirs, zero_point):
    q, tq_ = _pair(_x(2, 3, 4, 5, seed=1), ours, theirs, zero_point)
    _same(WRITE_CASES[name](q), WRITE_CASES[name](tq_))


def test_item_is_the_real_value():
    q, tq_ = _pair(_x(3, 4))
    assert q[1, 2].item() == tq_[1, 2].item()
    w = _x(4, 3)
    scales, zps = torch.tensor([0.1, 0.02, 0.3, 0.05]), torch.tensor([0, 3, -2, 1])
    qc = tq.quantize_per_channel(w, scales, zps, 0, tq.qint8)
    tqc = torch.quantize_per_channel(w, scales, zps, 0, torch.qint8)
    assert qc[2:3, 1:2].item() == tqc[2:3, 1:2].item()
    assert isinstance(q[0, 0].item(), float)


def _grids(n, h, w, seed):
    gen = torch.Generator().manual_seed(seed)
    grid = torch.rand(n, h, w, 2, generator=gen) * 2.6 - 1.3  # some points outside the image
    # exact pixel centres / corners and the borders
    grid[:, 0, :, :] = torch.tensor([-1.0, 1.0])
    grid[:, 1, : w // 2, 0] = torch.linspace(-1, 1, w // 2)
    return grid


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch(padding_mode, align_corners):
    for seed, (n, c, h, w) in enumerate([(2, 3, 7, 9), (1, 4, 1, 5), (3, 2, 16, 16)]):
        q, tq_ = _pair(_x(n, c, h, w, seed=seed), zero_point=37)
        grid = _grids(n, 11, 13, seed)
        _same(F.grid_sample(q, grid, padding_mode=padding_mode, align_corners=align_corners),
              F.grid_sample(tq_, grid, padding_mode=padding_mode, align_corners=align_corners))
        # torch.grid_sampler (the aten op F.grid_sample calls) takes the same path
        mode = ["zeros", "border", "reflection"].index(padding_mode)
        _same(torch.grid_sampler(q, grid, 0, mode, align_corners),
              torch.grid_sampler(tq_, grid, 0, mode, align_corners))


def test_grid_sample_errors_like_torch():
    q, tq_ = _pair(_x(1, 2, 4, 4))
    grid = _grids(1, 3, 3, 0)
    for mode in ("nearest", "bicubic"):
        _raises_like_torch(lambda t: F.grid_sample(t, grid, mode=mode, align_corners=False), q, tq_)
    q8, tq8 = _pair(_x(1, 2, 4, 4), tq.qint8, torch.qint8, 0)
    _raises_like_torch(lambda t: F.grid_sample(t, grid, align_corners=False), q8, tq8)


# ---- errors where torch raises --------------------------------------------------------------

def test_per_tensor_errors_like_torch():
    q, tq_ = _pair(_x(2, 3, 4, 5))
    for fn in (lambda t: t.index_put_((torch.tensor([0]),), torch.tensor(1.0), accumulate=True),
               lambda t: t.index_put_((torch.tensor([0]),), t[1]),  # a quantized value
               lambda t: t.masked_fill_(_MASK, torch.tensor([0.5])),  # not 0-d
               lambda t: torch.channel_shuffle(t[0], 3)):  # 3-D
        _raises_like_torch(fn, q.clone(), tq_.clone())


def _per_channel_pair(w, axis=0):
    gen = torch.Generator().manual_seed(3)
    scales = torch.rand(w.shape[axis], generator=gen) * 0.1 + 0.01
    zps = torch.randint(-5, 5, (w.shape[axis],), generator=gen)
    return (tq.quantize_per_channel(w, scales, zps, axis, tq.qint8),
            torch.quantize_per_channel(w, scales, zps, axis, torch.qint8), scales, zps)


def test_per_channel_ops_raise_like_torch():
    qc, tqc, _, _ = _per_channel_pair(_x(4, 3, 2))
    for fn in (lambda t: t.repeat(1, 2, 1),
               lambda t: t.index_select(1, torch.tensor([0])),
               lambda t: t.index_put_((torch.tensor([0]),), torch.tensor(1.0)),
               lambda t: t.masked_fill(torch.ones(4, 3, 2, dtype=torch.bool), 0.5)):
        _raises_like_torch(fn, qc.clone(), tqc.clone())


@pytest.mark.parametrize("axis", [0, 1, 2])
def test_squeezing_the_channel_axis_raises_like_torch(axis):
    shape = [3, 2, 2]
    shape[axis] = 1
    w = _x(*shape)
    qc = tq.quantize_per_channel(w, torch.tensor([0.1]), torch.tensor([2]), axis, tq.quint8)
    tqc = torch.quantize_per_channel(w, torch.tensor([0.1]), torch.tensor([2]), axis,
                                     torch.quint8)
    for fn in (lambda t: t.squeeze(axis), lambda t: t.squeeze(), lambda t: torch.squeeze(t)):
        _raises_like_torch(fn, qc, tqc)


def test_per_channel_squeeze_of_other_dims_matches_torch():
    qc, tqc, _, _ = _per_channel_pair(_x(4, 1, 2))
    for fn in (lambda t: t.squeeze(1), lambda t: t.squeeze(), lambda t: t.squeeze(-2)):
        got, want = fn(qc), fn(tqc)
        assert got.q_per_channel_axis() == want.q_per_channel_axis()
        assert torch.equal(got.int_repr(), want.int_repr())


def test_assigning_into_a_non_contiguous_per_channel_slice_raises_like_torch():
    def assign(value, index):
        def run(t):
            t[index] = value
            return t
        return run
    qc, tqc, _, _ = _per_channel_pair(_x(4, 3, 2))
    for index, value in (((slice(None), 0), torch.ones(4, 2)), ((Ellipsis, 1), torch.ones(4, 3)),
                         ((slice(None), 0), 0.5)):
        _raises_like_torch(assign(value, index), qc.clone(), tqc.clone())
    _raises_like_torch(lambda t: t[:, 1].copy_(torch.ones(4, 2)), qc.clone(), tqc.clone())
    # contiguous slices (whole channels) and quantized sources work, as in torch
    for index, value in ((0, torch.full((3, 2), 0.3)), (slice(1, 3), torch.full((2, 3, 2), -0.2))):
        got, want = assign(value, index)(qc.clone()), assign(value, index)(tqc.clone())
        assert torch.equal(got.int_repr(), want.int_repr())
    got = qc.clone()
    got[:, 0] = got[:, 1]
    want = tqc.clone()
    want[:, 0] = want[:, 1]
    assert torch.equal(got.int_repr(), want.int_repr())


@pytest.mark.parametrize("view", ["transpose", "t", "permute"])
def test_transposing_a_per_channel_tensor_raises_like_torch(view):
    """torch refuses with "Setting strides is possible only on uniformly quantized tensor";
    so does torchquant (PyTorch's own tests, ported by renaming, check it)."""
    w = _x(4, 3, 2)
    qc, tqc, _, _ = _per_channel_pair(w)
    fn = {"transpose": lambda t: t.transpose(0, 1), "t": lambda t: t[..., 0].t(),
          "permute": lambda t: t.permute(2, 0, 1)}[view]
    for t in (qc, tqc):
        with pytest.raises(RuntimeError,
                           match="Setting strides is possible only on uniformly quantized"):
            fn(t)
    # changing the memory format still works, as in torch
    qc4 = tq.quantize_per_channel(_x(2, 3, 2, 2), torch.tensor([0.1, 0.2, 0.3]),
                                  torch.tensor([1, 2, 3]), 1, tq.qint8)
    last = qc4.contiguous(memory_format=torch.channels_last)
    assert last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(last.int_repr(), qc4.int_repr())


# ---- comparisons and repr ---------------------------------------------------------------------

def test_assert_close_and_equal_compare_values_as_torch():
    x = _x(3, 4)
    q1, t1 = _pair(x)
    q2, t2 = _pair(x + 0.07)  # one or two steps apart
    torch.testing.assert_close(q1, q1.clone())
    torch.testing.assert_close(q1, q2, atol=0.15, rtol=0)
    torch.testing.assert_close(t1, t2, atol=0.15, rtol=0)
    for args in ((q1, q2), ):
        with pytest.raises(AssertionError):
            torch.testing.assert_close(*args, atol=0.01, rtol=0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(t1, t2, atol=0.01, rtol=0)
    # different qschemes do not compare equal, as in torch
    qc, _, _, _ = _per_channel_pair(x, 0)
    with pytest.raises(AssertionError):
        torch.testing.assert_close(q1, qc)
    # torch.equal: same qparams and integers
    x3 = _x(3, 4, seed=5)
    for a, b in ((x, x), (x, x + 0.07), (x, x3)):
        assert torch.equal(_pair(a)[0], _pair(b)[0]) == torch.equal(_pair(a)[1], _pair(b)[1])
    other_zp = tq.quantize_per_tensor(x, SCALE, 99, tq.quint8)
    assert torch.equal(q1, other_zp) == torch.equal(
        t1, torch.quantize_per_tensor(x, SCALE, 99, torch.quint8))
    assert torch.equal(qc, qc.clone())


def test_repr_of_an_empty_qtensor():
    q, _ = _pair(torch.empty(0, 4, 3))
    text = repr(q)
    assert text.startswith("QTensor([], size=(0, 4, 3), dtype=torchquant.quint8")
    assert text.count("size=") == 1 and "scale=0.05, zero_point=100" in text
    assert repr(q[:0, :1]).count("size=") == 1


# ---- the eager workflow ---------------------------------------------------------------------

class _Tiled(nn.Module):
    """Normalized features tiled along channels, then shuffled: repeat and channel_shuffle on
    quantized activations between quantized modules, as real models do."""

    def __init__(self, lib):
        super().__init__()
        self.quant, self.dequant = lib.QuantStub(), lib.DeQuantStub()
        self.conv = nn.Conv2d(3, 4, 1)
        self.norm = nn.InstanceNorm2d(8, affine=True)
        self.shuffle = nn.ChannelShuffle(2)

    def forward(self, x):
        x = self.conv(self.quant(x))
        x = self.norm(x.repeat(1, 2, 1, 1))
        return self.dequant(self.shuffle(x).index_select(1, torch.tensor([0, 5, 7])))


def test_eager_workflow_with_repeat_matches_torch():
    torch.manual_seed(0)
    ours, theirs = _Tiled(tqq), _Tiled(taq)
    theirs.load_state_dict(ours.state_dict())
    data = [_x(2, 3, 5, 5, seed=s) for s in range(3)]
    results = []
    for lib, model in ((tqq, ours), (taq, theirs)):
        model.eval()
        model.qconfig = lib.get_default_qconfig("fbgemm")
        lib.prepare(model, inplace=True)
        for x in data:
            model(x)
        lib.convert(model, inplace=True)
        results.append(model(data[0]))
    assert torch.equal(results[0], results[1])


class _RepeatNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.norm = nn.LayerNorm([8, 5, 5])

    def forward(self, x):
        return self.norm(self.conv(x).repeat(1, 2, 1, 1))


def test_fx_convert_of_a_normalization_model_with_repeat_matches_torch():
    """convert_fx keeps ``repeat`` between quantized ops (a general shape op): it runs on the
    QTensor, as on torch's quantized tensor."""
    from torch.ao.quantization import quantize_fx as ao_fx
    from torchquant.quantization import quantize_fx as tq_fx
    torch.manual_seed(0)
    ours, theirs = _RepeatNorm().eval(), _RepeatNorm().eval()
    theirs.load_state_dict(ours.state_dict())
    x = _x(2, 3, 5, 5)
    results = []
    for lib, fx, model in ((tqq, tq_fx, ours), (taq, ao_fx, theirs)):
        prepared = fx.prepare_fx(model, lib.get_default_qconfig_mapping("fbgemm"), (x,))
        prepared(x)
        results.append(fx.convert_fx(prepared)(x))
    assert torch.equal(results[0], results[1])
