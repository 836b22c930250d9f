"""Quantized Embedding / EmbeddingBag against torch 2.13 (torch.ao.nn.quantized as the oracle).

Lookups and 'sum' bags reproduce torch's fbgemm numerics (per-row scale and bias, float16 for
4-bit rows, sequential fused multiply-add accumulation), so they are compared bit for bit.
torch's quantized EmbeddingBag ignores its ``mode`` (it always sums) and its
``Embedding.from_float`` drops a 4-bit qconfig's dtype; torchquant does what the arguments say
instead, so 'mean' is checked as torch's sum divided by the bag length (bit for bit) and 'max'
against ``F.embedding_bag`` over torch's lookup table (exact: a max does no arithmetic), and the
4-bit Embedding oracle is torch's module built with ``dtype=torch.quint4x2`` directly.
"""
import io

import pytest
import torch
import torch.nn.functional as F
import torch.ao.nn.qat as tnnqat
import torch.ao.nn.quantized as nnq
import torch.ao.nn.quantized.reference as nnqr
import torch.ao.quantization as tq_ao

import torchquant as tq
import torchquant.kernels as kernels
import torchquant.nn.qat as nnqat
import torchquant.nn.quantized as qnn
from torchquant import quantization as tqq
from torchquant.kernels import embedding as kemb

KEYS = ["_packed_params.dtype", "_packed_params._packed_weight"]
QCONFIGS = {8: (tq_ao.float_qparams_weight_only_qconfig, tqq.float_qparams_weight_only_qconfig),
            4: (tq_ao.float_qparams_weight_only_qconfig_4bit,
                tqq.float_qparams_weight_only_qconfig_4bit)}
TORCH_DTYPE = {8: torch.quint8, 4: torch.quint4x2}


def float_table(n, d, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, d, generator=gen) * 2 + torch.randn(n, 1, generator=gen)
    w[1] = 0.0        # constant rows take the scale-1 fallback
    w[2] = 0.75
    return w


def make_pair(kind, bits, n=64, d=16, seed=0, **kw):
    """(torch's quantized module, ours) converted from the same float weights."""
    float_cls = torch.nn.Embedding if kind == "emb" else torch.nn.EmbeddingBag
    theirs_f, ours_f = float_cls(n, d, **kw), float_cls(n, d, **kw)
    w = float_table(n, d, seed)
    theirs_f.weight.data.copy_(w)
    ours_f.weight.data.copy_(w)
    theirs_f.qconfig, ours_f.qconfig = QCONFIGS[bits]
    if kind == "emb":
        theirs = nnq.Embedding.from_float(theirs_f)
        if bits == 4:  # torch's from_float keeps dtype quint8 (and then reads 4-bit rows as bytes)
            fixed = nnq.Embedding(n, d, dtype=torch.quint4x2)
            fixed.set_weight(theirs.weight())
            theirs = fixed
        ours = qnn.Embedding.from_float(ours_f)
    else:
        theirs = nnq.EmbeddingBag.from_float(theirs_f)
        ours = qnn.EmbeddingBag.from_float(ours_f)
    return theirs, ours


def torch_sum(theirs, indices, offsets=None, **kw):
    """torch's bag output with mode forced to 'sum' (what its module computes anyway)."""
    mode = theirs.mode
    theirs.mode = "sum"
    try:
        return theirs(indices, offsets, **kw)
    finally:
        theirs.mode = mode


def random_bags(n_idx, n_bags, n_rows, seed, empty=True, span=None):
    gen = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, n_rows, (n_idx,), generator=gen)
    offs = torch.sort(torch.randint(0, span or n_idx, (n_bags,), generator=gen)).values
    offs[0] = 0
    if empty:
        offs[3] = offs[4]  # at least one empty bag
    return idx, offs


def roundtrip(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def unpack4(packed, n, d):
    return torch.stack([packed & 15, packed >> 4], 1).reshape(-1)[:n * d].reshape(n, d)


# ---- weights ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["emb", "bag"])
@pytest.mark.parametrize("bits", [8, 4])
def test_weight_matches_torch(kind, bits):
    theirs, ours = make_pair(kind, bits, n=50, d=12)
    tw, ow = theirs.weight(), ours.weight()
    assert isinstance(ow, tq.QTensor)
    assert ow.qdtype is (tq.quint8 if bits == 8 else tq.quint4x2)
    assert ow.qscheme() is tq.per_channel_affine_float_qparams and ow.q_per_channel_axis() == 0
    assert tuple(ow.shape) == (50, 12)
    assert torch.equal(ow.int_repr(), tw.int_repr())
    assert torch.equal(ow.q_per_channel_scales().float(), tw.q_per_channel_scales())
    assert torch.equal(ow.q_per_channel_zero_points().float(), tw.q_per_channel_zero_points())
    assert ours.dtype is ow.qdtype


# ---- lookups ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_matches_torch(bits, index_dtype):
    theirs, ours = make_pair("emb", bits, n=80, d=24 if bits == 4 else 23)
    gen = torch.Generator().manual_seed(1)
    for shape in [(37,), (6, 9), (0,)]:
        idx = torch.randint(0, 80, shape, generator=gen).to(index_dtype)
        out = ours(idx)
        assert out.dtype == torch.float32 and out.shape == (*shape, ours.embedding_dim)
        assert torch.equal(out, theirs(idx))
    # every row, and rows beyond two dimensions (torch only takes 1-D / 2-D indices)
    table = theirs(torch.arange(80))
    assert torch.equal(ours(torch.arange(80)), table)
    idx3 = torch.randint(0, 80, (2, 3, 4), generator=gen)
    assert torch.equal(ours(idx3), table[idx3])


def test_lookup_rows_are_torchs_dequantized_rows_up_to_rounding():
    """torch looks rows up as ``q * scale + bias`` (bias = -zp * scale), not ``(q - zp) * scale``:
    the two agree to float rounding only, which is why the kernel follows torch's form."""
    theirs, ours = make_pair("emb", 8, n=40, d=16)
    out = ours(torch.arange(40))
    deq = ours.weight().dequantize()
    torch.testing.assert_close(out, deq, rtol=0, atol=1e-5)
    w = ours.weight()
    s, z = w.q_per_channel_scales().float()[:, None], w.q_per_channel_zero_points()[:, None]
    fma = (w.int_repr().double() * s.double() + (-(z * s)).double()).float()
    assert torch.equal(out, fma)


# ---- bags -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
def test_bag_sum_matches_torch(bits):
    theirs, ours = make_pair("bag", bits, n=100, d=32, mode="sum")
    idx, offs = random_bags(400, 30, 100, seed=2)
    assert torch.equal(ours(idx, offs), theirs(idx, offs))
    assert torch.equal(ours(idx.int(), offs.int()), theirs(idx.int(), offs.int()))
    # per-sample weights (sum only)
    psw = torch.randn(400, generator=torch.Generator().manual_seed(3))
    assert torch.equal(ours(idx, offs, per_sample_weights=psw),
                       theirs(idx, offs, per_sample_weights=psw))
    # 2-D indices: fixed-length bags, no offsets
    idx2 = idx[:390].view(39, 10)
    assert torch.equal(ours(idx2), theirs(idx2))
    psw2 = psw[:390].view(39, 10)
    assert torch.equal(ours(idx2, per_sample_weights=psw2), theirs(idx2, per_sample_weights=psw2))
    # compressed_indices_mapping is ignored (the table is never pruned), as in torch
    cim = torch.zeros(100, dtype=torch.int32)
    assert torch.equal(ours(idx, offs, compressed_indices_mapping=cim), theirs(idx, offs))


@pytest.mark.parametrize("bits", [8, 4])
def test_bag_include_last_offset_matches_torch(bits):
    theirs, ours = make_pair("bag", bits, n=60, d=8, mode="sum", include_last_offset=True)
    assert ours.include_last_offset
    idx, offs = random_bags(120, 12, 60, seed=4, span=100)
    # The last offset closes the last bag; trailing indices are unused (torch's 8-bit kernel
    # and F.embedding_bag's 'sum'; torch's 4-bit kernel refuses a last offset short of the end).
    for end in (120, 100) if bits == 8 else (120,):
        o = torch.cat([offs, torch.tensor([end])])
        out = ours(idx, o)
        assert out.shape == (12, 8)
        assert torch.equal(out, theirs(idx, o))
    psw = torch.rand(120)
    o = torch.cat([offs, torch.tensor([120])])
    assert torch.equal(ours(idx, o, per_sample_weights=psw),
                       theirs(idx, o, per_sample_weights=psw))
    assert ours(idx, torch.tensor([0])).shape == (0, 8)
    short = torch.cat([offs, torch.tensor([100])])  # trailing indices unused, at 4 bits too
    assert torch.equal(ours(idx, short), ours(idx[:100], short))


def test_bag_long_bag_and_empty_input():
    theirs, ours = make_pair("bag", 8, n=30, d=8, mode="sum")
    idx = torch.randint(0, 30, (700,))
    offs = torch.tensor([0, 1, 650])
    assert torch.equal(ours(idx, offs), theirs(idx, offs))
    empty = torch.tensor([], dtype=torch.long)
    assert torch.equal(ours(empty, torch.tensor([0, 0])), theirs(empty, torch.tensor([0, 0])))
    assert torch.equal(ours(empty, torch.tensor([0, 0])), torch.zeros(2, 8))


@pytest.mark.parametrize("bits", [8, 4])
def test_bag_mean_is_sum_over_length(bits):
    theirs, ours = make_pair("bag", bits, n=50, d=16)  # nn.EmbeddingBag's default mode: mean
    assert ours.mode == "mean" and theirs.mode == "mean"
    idx, offs = random_bags(200, 20, 50, seed=5)
    t_sum = theirs(idx, offs)
    assert torch.equal(t_sum, torch_sum(theirs, idx, offs))  # torch ignores its mode
    lengths = torch.diff(torch.cat([offs, torch.tensor([200])])).float()
    out = ours(idx, offs)
    assert torch.equal(out, t_sum / lengths.clamp(min=1)[:, None])
    assert torch.equal(out[3], torch.zeros(16))  # empty bag
    table = theirs(torch.arange(50), torch.arange(50))  # one row per bag: the lookup table
    torch.testing.assert_close(out, F.embedding_bag(idx, table, offs, mode="mean"),
                               rtol=1e-5, atol=1e-5)  # float summation order differs
    idx2 = idx[:200].view(20, 10)
    assert torch.equal(ours(idx2), torch_sum(theirs, idx2) / 10)


@pytest.mark.parametrize("bits", [8, 4])
def test_bag_max_is_elementwise_max(bits):
    theirs, ours = make_pair("bag", bits, n=50, d=16, mode="max")
    idx, offs = random_bags(200, 20, 50, seed=6)
    table = nnq.Embedding(50, 16, dtype=TORCH_DTYPE[bits])
    table.set_weight(theirs.weight())
    rows = table(torch.arange(50))
    assert torch.equal(ours(idx, offs), F.embedding_bag(idx, rows, offs, mode="max"))
    idx2 = idx.view(20, 10)
    assert torch.equal(ours(idx2), F.embedding_bag(idx2, rows, mode="max"))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_padding_idx_is_skipped(mode):
    theirs, ours = make_pair("bag", 8, n=40, d=8, mode=mode, padding_idx=7)
    assert ours.padding_idx == 7
    gen = torch.Generator().manual_seed(7)
    idx = torch.randint(0, 40, (90,), generator=gen)
    idx[::4] = 7
    offs = torch.tensor([0, 10, 10, 30, 31, 60])
    idx[31:60] = 7  # a bag of padding only
    keep = idx != 7
    kept_idx = idx[keep]
    kept_offs = torch.cumsum(torch.cat([torch.tensor([0]), keep.long()]), 0)[offs]
    expected = torch_sum(theirs, kept_idx, kept_offs)
    counts = torch.diff(torch.cat([kept_offs, torch.tensor([kept_idx.numel()])])).float()
    out = ours(idx, offs)
    if mode == "sum":
        assert torch.equal(out, expected)
    elif mode == "mean":
        assert torch.equal(out, expected / counts.clamp(min=1)[:, None])
    else:
        table = nnq.Embedding(40, 8)
        table.set_weight(theirs.weight())
        rows = table(torch.arange(40))
        assert torch.equal(out, F.embedding_bag(idx, rows, offs, mode="max", padding_idx=7))
    assert torch.equal(out[4], torch.zeros(8))
    # an Embedding's padding row is looked up like any other (padding only matters to training)
    t_emb, o_emb = make_pair("emb", 8, n=40, d=8, padding_idx=-3)
    assert o_emb.padding_idx == 37
    assert torch.equal(o_emb(torch.tensor([37, 1])), t_emb(torch.tensor([37, 1])))


# ---- kernels ----------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
def test_fast_kernels_match_reference(bits):
    """Every registered implementation agrees bit for bit with the float64-fma reference."""
    _, bag = make_pair("bag", bits, n=60, d=16, mode="sum")
    packed = bag._packed_params._packed_weight
    idx, offs = random_bags(150, 15, 60, seed=8)
    psw = torch.rand(150)
    bag_calls = [(idx, offs, "sum", None, False, None), (idx, offs, "sum", psw, False, None),
                 (idx, offs, "mean", None, False, 3), (idx, offs, "max", None, False, None),
                 (idx.view(15, 10), None, "sum", psw.view(15, 10), False, None),
                 (idx.view(15, 10), None, "mean", None, False, None),
                 (idx, torch.cat([offs, torch.tensor([150])]), "sum", None, True, None)]
    bag_impls = kernels.implementations("embedding_bag")
    lookup_impls = kernels.implementations("embedding_lookup")
    assert set(bag_impls) == set(lookup_impls) == {"reference", "cpu_addcmul"}
    for name, impl in bag_impls.items():
        for args in bag_calls:
            assert torch.equal(impl.fn(packed, *args), bag_impls["reference"].fn(packed, *args))
    for name, impl in lookup_impls.items():
        assert torch.equal(impl.fn(packed, idx.view(10, 15)),
                           lookup_impls["reference"].fn(packed, idx.view(10, 15)))
    if kemb._addcmul_is_fused() and kernels.mode() == "auto":  # the default fast path
        assert kernels.get("embedding_bag", packed.values) is bag_impls["cpu_addcmul"].fn
    with kernels.reference_only():
        assert kernels.get("embedding_bag", packed.values) is bag_impls["reference"].fn
        ref = bag(idx, offs)
    assert torch.equal(bag(idx, offs), ref)


def test_four_bit_odd_dim_rows():
    """Odd 4-bit rows straddle bytes in the packed QTensor; lookups still read each row whole
    (torch pads such rows and returns a wider output, so there is no oracle here)."""
    w = tq.quantize_per_channel(float_table(9, 5, 9), torch.full((9,), 0.25),
                                torch.full((9,), 7.0), 0, tq.quint4x2)
    emb = qnn.Embedding(9, 5, _weight=w, dtype=tq.quint4x2)
    out = emb(torch.arange(9))
    assert out.shape == (9, 5)
    vals = unpack4(w.int_repr(), 9, 5).float()
    assert torch.equal(out, vals * 0.25 - 1.75)


# ---- state dict -------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["emb", "bag"])
@pytest.mark.parametrize("bits", [8, 4])
def test_state_dict_round_trip(kind, bits):
    theirs, ours = make_pair(kind, bits, n=30, d=8, **({"mode": "sum"} if kind == "bag" else {}))
    state = ours.state_dict()
    assert list(state.keys()) == list(theirs.state_dict().keys()) == KEYS
    assert state["_packed_params.dtype"] is ours.dtype
    assert isinstance(state["_packed_params._packed_weight"], tq.QTensor)
    loaded = roundtrip(state)
    fresh = qnn.Embedding(30, 8) if kind == "emb" else qnn.EmbeddingBag(30, 8, mode="sum")
    assert fresh.dtype is tq.quint8
    fresh.load_state_dict(loaded)
    assert fresh.dtype is ours.dtype  # a 4-bit checkpoint switches a fresh quint8 module
    w0, w1 = ours.weight(), fresh.weight()
    assert torch.equal(w0.int_repr(), w1.int_repr())
    assert torch.equal(w0.q_per_channel_scales(), w1.q_per_channel_scales())
    assert torch.equal(w0.q_per_channel_zero_points(), w1.q_per_channel_zero_points())
    idx = torch.randint(0, 30, (24,))
    if kind == "emb":
        assert torch.equal(fresh(idx), ours(idx))
    else:
        offs = torch.tensor([0, 5, 5, 17])
        assert torch.equal(fresh(idx, offs), ours(idx, offs))


def test_load_state_dict_errors():
    _, ours = make_pair("emb", 8, n=30, d=8)
    state = ours.state_dict()
    with pytest.raises(RuntimeError, match="size mismatch"):
        qnn.Embedding(20, 8).load_state_dict(state)
    bad = dict(state)
    bad["_packed_params._packed_weight"] = torch.zeros(30, 8)
    fresh = qnn.Embedding(30, 8)
    with pytest.raises(RuntimeError, match="QTensor"):
        fresh.load_state_dict(bad)
    assert fresh.dtype is tq.quint8  # left as it was
    with pytest.raises(RuntimeError, match="Missing key"):
        qnn.Embedding(30, 8).load_state_dict({"_packed_params.dtype": tq.quint8})


# ---- construction, repr, conversion -----------------------------------------------------------

def test_fresh_module_and_repr():
    emb, bag = qnn.Embedding(10, 4), qnn.EmbeddingBag(10, 4, dtype=tq.quint4x2)
    assert emb._get_name() == "QuantizedEmbedding" and bag._get_name() == "QuantizedEmbeddingBag"
    assert repr(emb) == ("QuantizedEmbedding(num_embeddings=10, embedding_dim=4, "
                         "dtype=torchquant.quint8, "
                         "qscheme=torchquant.per_channel_affine_float_qparams)")
    assert repr(bag).startswith("QuantizedEmbeddingBag(num_embeddings=10, embedding_dim=4, "
                                "dtype=torchquant.quint4x2")
    assert torch.equal(emb(torch.tensor([1, 9])), torch.zeros(2, 4))
    assert bag.mode == "sum" and not bag.include_last_offset and bag.dtype is tq.quint4x2
    with pytest.raises(NotImplementedError, match="quint8 and quint4x2"):
        qnn.Embedding(10, 4, dtype=tq.qint8)
    with pytest.raises(NotImplementedError, match="quint8 and quint4x2"):
        qnn.EmbeddingBag(10, 4, dtype=torch.float32)
    with pytest.raises(ValueError, match="mode"):
        qnn.EmbeddingBag(10, 4, mode="min")
    with pytest.raises(AssertionError, match="Shape of weight"):
        qnn.Embedding(5, 4, _weight=emb.weight())
    with pytest.raises(AssertionError, match="Padding_idx"):
        qnn.Embedding(10, 4, padding_idx=10)


def test_weight_and_set_weight():
    theirs, ours = make_pair("emb", 8, n=20, d=6)
    fresh = qnn.Embedding(20, 6)
    fresh.set_weight(ours.weight())
    assert torch.equal(fresh(torch.arange(20)), theirs(torch.arange(20)))
    built = qnn.Embedding(20, 6, _weight=ours.weight())
    assert torch.equal(built(torch.arange(20)), theirs(torch.arange(20)))
    with pytest.raises(TypeError, match="QTensor"):
        fresh.set_weight(torch.rand(20, 6))
    with pytest.raises(ValueError, match="per_channel_affine_float_qparams"):
        fresh.set_weight(tq.quantize_per_tensor(torch.rand(20, 6), 0.1, 0, tq.quint8))
    with pytest.raises(ValueError, match="per_channel_affine_float_qparams"):
        fresh.set_weight(tq.quantize_per_channel(torch.rand(20, 6), torch.ones(20),
                                                 torch.zeros(20, dtype=torch.long), 0,
                                                 tq.quint8))
    with pytest.raises(ValueError, match="does not fit"):
        fresh.set_weight(tq.quantize_per_channel(torch.rand(5, 6), torch.ones(5),
                                                 torch.zeros(5), 0, tq.quint8))
    four = tq.quantize_per_channel(torch.rand(20, 6), torch.ones(20), torch.zeros(20), 0,
                                   tq.quint4x2)
    with pytest.raises(TypeError, match="quint4x2"):
        fresh.set_weight(four)


def test_from_float_checks():
    mod = torch.nn.Embedding(10, 4)
    with pytest.raises(AssertionError, match="must have qconfig"):
        qnn.Embedding.from_float(mod)
    mod.qconfig = None  # no qconfig weight: the 8-bit default, as torch
    theirs_mod = torch.nn.Embedding(10, 4)
    theirs_mod.weight.data.copy_(mod.weight.data)
    theirs_mod.qconfig = None
    assert torch.equal(qnn.Embedding.from_float(mod).weight().int_repr(),
                       nnq.Embedding.from_float(theirs_mod).weight().int_repr())
    mod.qconfig = tqq.default_qconfig
    with pytest.raises(AssertionError, match="float_qparams_weight_only_qconfig"):
        qnn.Embedding.from_float(mod)
    mod.qconfig = tqq.QConfig(activation=tqq.PlaceholderObserver,
                              weight=tqq.PerChannelMinMaxObserver.with_args(
                                  dtype=tq.qint8, qscheme=tq.per_channel_affine_float_qparams))
    with pytest.raises(AssertionError, match="quint8 and quint4x2"):
        qnn.Embedding.from_float(mod)
    bag = torch.nn.EmbeddingBag(10, 4)
    bag.qconfig = tqq.float_qparams_weight_only_qconfig
    with pytest.raises(AssertionError, match="only works for Embedding"):
        qnn.Embedding.from_float(bag)
    mod.qconfig = tqq.float_qparams_weight_only_qconfig
    with pytest.raises(AssertionError, match="only works for EmbeddingBag"):
        qnn.EmbeddingBag.from_float(mod)
    with pytest.raises(AssertionError, match="float_qparams_weight_only_qconfig"):
        bag.qconfig = tqq.default_qconfig
        qnn.EmbeddingBag.from_float(bag)


@pytest.mark.parametrize("bits", [8, 4])
def test_from_qat(bits):
    qc_t = tq_ao.default_embedding_qat_qconfig if bits == 8 else \
        tq_ao.default_embedding_qat_qconfig_4bit
    qc_o = tqq.default_embedding_qat_qconfig if bits == 8 else \
        tqq.default_embedding_qat_qconfig_4bit
    w = float_table(30, 8, 10)
    theirs_q = tnnqat.Embedding(30, 8, _weight=w.clone(), qconfig=qc_t)
    ours_q = nnqat.Embedding(30, 8, _weight=w.clone(), qconfig=qc_o)
    theirs = nnq.Embedding.from_float(theirs_q)
    ours = qnn.Embedding.from_float(ours_q)
    assert ours.dtype.bits == bits
    assert torch.equal(ours.weight().int_repr(), theirs.weight().int_repr())
    if bits == 8:
        assert torch.equal(ours(torch.arange(30)), theirs(torch.arange(30)))
    theirs_b = tnnqat.EmbeddingBag(30, 8, mode="sum", _weight=w.clone(), qconfig=qc_t)
    ours_b = nnqat.EmbeddingBag(30, 8, mode="sum", _weight=w.clone(), qconfig=qc_o)
    idx, offs = random_bags(60, 8, 30, seed=11)
    assert torch.equal(qnn.EmbeddingBag.from_float(ours_b)(idx, offs),
                       nnq.EmbeddingBag.from_float(theirs_b)(idx, offs))


@pytest.mark.parametrize("bits", [8, 4])
def test_from_reference_matches_torch(bits):
    w = float_table(40, 12, 12)
    obs = QCONFIGS[bits][0].weight()
    obs(w)
    scale, zp = obs.calculate_qparams()
    qparams = {"qscheme": torch.per_channel_affine_float_qparams, "dtype": TORCH_DTYPE[bits],
               "scale": scale, "zero_point": zp, "axis": 0}
    ref_bag = nnqr.EmbeddingBag(40, 12, mode="sum", _weight=w.clone(), weight_qparams=qparams)
    idx, offs = random_bags(80, 10, 40, seed=13)
    theirs, ours = nnq.EmbeddingBag.from_reference(ref_bag), qnn.EmbeddingBag.from_reference(ref_bag)
    assert ours.dtype.bits == bits and ours.mode == "sum"
    assert torch.equal(ours.weight().int_repr(), theirs.weight().int_repr())
    assert torch.equal(ours(idx, offs), theirs(idx, offs))
    ref_emb = nnqr.Embedding(40, 12, _weight=w.clone(), weight_qparams=qparams)
    theirs_e, ours_e = nnq.Embedding.from_reference(ref_emb), qnn.Embedding.from_reference(ref_emb)
    assert torch.equal(ours_e(idx), theirs_e(idx))


# ---- bad inputs -------------------------------------------------------------------------------

def test_bad_indices_raise():
    _, emb = make_pair("emb", 8, n=20, d=4)
    _, bag = make_pair("bag", 8, n=20, d=4, mode="sum")
    offs = torch.tensor([0, 2])
    with pytest.raises(TypeError, match="int32 or int64"):
        emb(torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError, match="int32 or int64"):
        bag(torch.tensor([1.0, 2.0, 3.0]), offs)
    with pytest.raises(TypeError, match="int32 or int64"):
        emb(torch.tensor([1, 2], dtype=torch.uint8))
    with pytest.raises(IndexError, match="out of range"):
        emb(torch.tensor([3, 20]))
    with pytest.raises(IndexError, match="out of range"):
        emb(torch.tensor([-1]))
    with pytest.raises(IndexError, match="out of range"):
        bag(torch.tensor([1, 2, 25]), offs)
    with pytest.raises(ValueError, match="need offsets"):
        bag(torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="offsets must be None"):
        bag(torch.tensor([[1, 2, 3]]), offs)
    with pytest.raises(ValueError, match="non-decreasing"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([0, 3, 1]))
    with pytest.raises(ValueError, match=r"offsets\[0\] has to be 0"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([1, 2]))
    bag.include_last_offset = True
    with pytest.raises(ValueError, match="non-decreasing"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 4]))
    with pytest.raises(ValueError, match="1-D or 2-D"):
        bag(torch.zeros(1, 2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="offsets"):
        bag(torch.tensor([1, 2, 3]), torch.tensor([0.0, 1.0]))


def test_bad_per_sample_weights_raise():
    _, bag = make_pair("bag", 8, n=20, d=4, mode="sum")
    idx, offs = torch.tensor([1, 2, 3]), torch.tensor([0, 2])
    with pytest.raises(TypeError, match="float32"):
        bag(idx, offs, per_sample_weights=torch.ones(3, dtype=torch.float64))
    with pytest.raises(ValueError, match="shape"):
        bag(idx, offs, per_sample_weights=torch.ones(2))
    bag.mode = "mean"
    with pytest.raises(NotImplementedError, match="mode='sum'"):
        bag(idx, offs, per_sample_weights=torch.ones(3))
    with pytest.raises(ValueError, match="mode must be one of"):
        kemb.embedding_bag(bag._packed_params._packed_weight, idx, offs, mode="min")
