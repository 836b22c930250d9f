"""The embedding ops (``torchquant::embedding``, ``torchquant::embedding_bag``) and the float16
dynamic Linear op (``torchquant::linear_dynamic_fp16``): fake kernels (``opcheck``), the op
equal to the eager function and module beside it (the same kernel call, so bit-exact), torch's
quantized modules as oracles, and ``torch.export`` of a small quantized recommender model.

Oracles: torch's quantized Embedding / EmbeddingBag (fbgemm numerics) are matched bit for bit
for lookups and 'sum' bags; torch's EmbeddingBag ignores its ``mode`` (always sums), so 'mean'
is torch's sum divided by the bag length and 'max' is ``F.embedding_bag`` over torch's lookup
table (a max does no arithmetic).  The float16 Linear follows the tolerance rule of
tests/conftest.py (:func:`assert_fp16_linear_close`: a summation-order tolerance on every
CPU, and why).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.dynamic as ao_nnqd
import torch.ao.quantization as aoq

import torchquant.nn.quantized as qnn
import torchquant.nn.quantized.dynamic as nnqd
from torchquant import quantization as tqq
from torchquant.ops import embedding as ops_embedding
from torchquant.ops import linear_fp16 as ops_fp16

from conftest import assert_fp16_linear_close

QCONFIGS = {8: (aoq.float_qparams_weight_only_qconfig, tqq.float_qparams_weight_only_qconfig),
            4: (aoq.float_qparams_weight_only_qconfig_4bit,
                tqq.float_qparams_weight_only_qconfig_4bit)}
QDTYPE = {8: "quint8", 4: "quint4x2"}
ROWS, DIM = 40, 16


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply (inference-only ops)
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


def _float_table(seed=0):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(ROWS, DIM, generator=gen) * 2 + torch.randn(ROWS, 1, generator=gen)
    w[1] = 0.0  # a constant row (scale-1 fallback)
    return w


def _pair(kind, bits, **kw):
    """(torch's quantized module, ours) from the same float table."""
    float_cls = nn.Embedding if kind == "emb" else nn.EmbeddingBag
    theirs_f, ours_f = float_cls(ROWS, DIM, **kw), float_cls(ROWS, DIM, **kw)
    w = _float_table()
    theirs_f.weight.data.copy_(w)
    ours_f.weight.data.copy_(w)
    theirs_f.qconfig, ours_f.qconfig = QCONFIGS[bits]
    if kind == "emb":
        theirs = ao_nnq.Embedding.from_float(theirs_f)
        if bits == 4:  # torch's from_float keeps quint8 whatever the qconfig: rebuild it 4-bit
            fixed = ao_nnq.Embedding(ROWS, DIM, dtype=torch.quint4x2)
            fixed.set_weight(theirs.weight())
            theirs = fixed
        return theirs, qnn.Embedding.from_float(ours_f)
    return ao_nnq.EmbeddingBag.from_float(theirs_f), qnn.EmbeddingBag.from_float(ours_f)


def _graph_args(module):
    packed = module._packed_params._packed_weight
    return packed, (packed.values, packed.scale, packed.zero_point, QDTYPE[packed.bits])


def _torch_lookup_table(bits):
    """torch's lookup values of every row (what its kernels read), float32 [ROWS, DIM]."""
    theirs, _ = _pair("emb", bits)
    return theirs(torch.arange(ROWS))


# ---- embedding ------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_embedding_op(bits, index_dtype):
    theirs, ours = _pair("emb", bits)
    packed, weight_args = _graph_args(ours)
    gen = torch.Generator().manual_seed(1)
    indices = torch.randint(0, ROWS, (3, 5), generator=gen, dtype=index_dtype)
    indices[0, 0] = 1
    _opcheck(torch.ops.torchquant.embedding.default, (indices, *weight_args))
    got = torch.ops.torchquant.embedding(indices, *weight_args)
    assert got.shape == (3, 5, DIM) and got.dtype == torch.float32
    assert torch.equal(got, ops_embedding.embedding(indices, packed))
    assert torch.equal(got, ours(indices))
    flat = indices.reshape(-1)
    assert torch.equal(got.reshape(-1, DIM), theirs(flat))  # torch's fbgemm lookup, exact


def test_embedding_op_checks_indices():
    _, ours = _pair("emb", 8)
    _, weight_args = _graph_args(ours)
    with pytest.raises(IndexError, match="out of range"):
        torch.ops.torchquant.embedding(torch.tensor([0, ROWS]), *weight_args)
    with pytest.raises(TypeError, match="int32 or int64"):
        torch.ops.torchquant.embedding(torch.tensor([0.0]), *weight_args)


# ---- embedding_bag --------------------------------------------------------------------------

def _bag_case(name):
    """(indices, offsets, per_sample_weights, include_last_offset, mode, padding_idx)."""
    gen = torch.Generator().manual_seed(2)
    idx = torch.randint(0, ROWS, (17,), generator=gen)
    idx[[2, 9]] = 3
    offs = torch.tensor([0, 4, 4, 9, 13])  # bag 1 is empty
    weights = torch.rand(17, generator=gen) * 2 - 0.5
    return {
        "sum": (idx, offs, None, False, "sum", None),
        "sum_int32": (idx.int(), offs.int(), None, False, "sum", None),
        "sum_last_offset": (idx, torch.cat([offs, torch.tensor([17])]), None, True, "sum", None),
        "sum_weighted": (idx, offs, weights, False, "sum", None),
        "sum_2d": (idx[:15].reshape(5, 3), None, None, False, "sum", None),
        "sum_2d_weighted": (idx[:15].reshape(5, 3), None, weights[:15].reshape(5, 3), False,
                            "sum", None),
        "sum_padding": (idx, offs, None, False, "sum", 3),
        "mean": (idx, offs, None, False, "mean", None),
        "mean_padding": (idx, offs, None, False, "mean", 3),
        "max": (idx, offs, None, False, "max", None),
        "max_2d_padding": (idx[:15].reshape(5, 3), None, None, False, "max", 3),
    }[name]


def _bag_oracle(theirs, bits, indices, offsets, weights, last, mode, padding_idx):
    """torch's answer: its (sum-only) module for 'sum' / 'mean', F.embedding_bag over its
    lookup table for 'max'.  Padding entries are torch's sum with those rows weighted 0 (an
    exact no-op in the fused multiply-add chain: ``fma(0, q, acc + 0) == acc``)."""
    if mode == "max":
        return F.embedding_bag(indices, _torch_lookup_table(bits), offsets, mode="max",
                               include_last_offset=last, padding_idx=padding_idx)
    keep = torch.ones(indices.shape) if padding_idx is None else (indices != padding_idx).float()
    if weights is None and padding_idx is not None:
        weights = keep
    elif weights is not None:
        weights = weights * keep
    theirs.mode = "sum"  # what torch's module computes anyway
    theirs.include_last_offset = last
    total = theirs(indices.long(), None if offsets is None else offsets.long(),
                   per_sample_weights=weights)
    if mode == "sum":
        return total
    if indices.dim() == 2:
        counts = keep.sum(1)
    else:
        ends = offsets[1:] if last else torch.cat([offsets[1:], torch.tensor([indices.numel()])])
        counts = torch.stack([keep[s:e].sum() for s, e in zip(offsets[:len(ends)], ends)])
    return total / counts.clamp(min=1)[:, None]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("case", ["sum", "sum_int32", "sum_last_offset", "sum_weighted",
                                  "sum_2d", "sum_2d_weighted", "sum_padding", "mean",
                                  "mean_padding", "max", "max_2d_padding"])
def test_embedding_bag_op(bits, case):
    indices, offsets, weights, last, mode, padding_idx = _bag_case(case)
    theirs, ours = _pair("bag", bits, mode=mode, include_last_offset=last,
                         padding_idx=padding_idx)
    packed, weight_args = _graph_args(ours)
    args = (indices, *weight_args, offsets, mode, weights, last, padding_idx)
    _opcheck(torch.ops.torchquant.embedding_bag.default, args)
    got = torch.ops.torchquant.embedding_bag(*args)
    bags = indices.size(0) if indices.dim() == 2 else offsets.numel() - int(last)
    assert got.shape == (bags, DIM) and got.dtype == torch.float32
    assert torch.equal(got, ops_embedding.embedding_bag(indices, packed, offsets, mode, weights,
                                                        last, padding_idx))
    assert torch.equal(got, ours(indices, offsets, per_sample_weights=weights))
    expected = _bag_oracle(theirs, bits, indices, offsets, weights, last, mode, padding_idx)
    assert torch.equal(got, expected)


def test_embedding_bag_op_rejects_what_the_module_rejects():
    _, ours = _pair("bag", 8)
    _, weight_args = _graph_args(ours)
    idx, offs = torch.tensor([0, 1, 2]), torch.tensor([0, 2])
    with pytest.raises(ValueError, match="mode must be one of"):
        torch.ops.torchquant.embedding_bag(idx, *weight_args, offs, "min", None, False, None)
    with pytest.raises(NotImplementedError, match="only supported for mode='sum'"):
        torch.ops.torchquant.embedding_bag(idx, *weight_args, offs, "mean", torch.ones(3),
                                           False, None)
    with pytest.raises(ValueError, match="offsets\\[0\\] has to be 0"):
        torch.ops.torchquant.embedding_bag(idx, *weight_args, torch.tensor([1, 2]), "sum",
                                           None, False, None)


def test_embedding_pack_cache_follows_in_place_qparam_changes():
    """The op packs its table from the plain tensors; changing a qparam in place repacks."""
    _, ours = _pair("emb", 8)
    packed, (values, scale, zero_point, qdtype) = _graph_args(ours)
    values, scale, zero_point = values.clone(), scale.clone(), zero_point.clone()
    idx = torch.tensor([0, 5, 7])
    before = torch.ops.torchquant.embedding(idx, values, scale, zero_point, qdtype)
    assert torch.equal(before, ours(idx))
    scale.mul_(2)
    after = torch.ops.torchquant.embedding(idx, values, scale, zero_point, qdtype)
    repacked = ops_embedding.pack_embedding(values, scale, zero_point, qdtype)
    assert torch.equal(after, ops_embedding.embedding(idx, repacked))
    assert not torch.equal(after, before)


# ---- float16 dynamic Linear -----------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("relu", [False, True])
def test_linear_dynamic_fp16_op(bias, relu):
    torch.manual_seed(3)
    lin = nn.Linear(24, 12, bias=bias)
    lin.weight.data[0, 0] = 1e6  # saturates to float16's max, as torch's fp16 prepack
    lin.qconfig = tqq.float16_dynamic_qconfig
    ours = nnqd.Linear.from_float(lin)
    ours._FUSED_RELU = relu
    w16, b = ours._packed_params.packed
    assert w16.dtype == torch.float16
    x = torch.randn(2, 3, 24)
    args = (x, w16, b, relu)
    _opcheck(torch.ops.torchquant.linear_dynamic_fp16.default, args)
    got = torch.ops.torchquant.linear_dynamic_fp16(*args)
    assert got.shape == (2, 3, 12)
    assert torch.equal(got, ops_fp16.linear_dynamic_fp16(x, ops_fp16.pack_linear_fp16(w16, b),
                                                         relu))
    with torch.no_grad():
        assert torch.equal(got, ours(x))
    theirs_f = copy.deepcopy(lin)
    theirs_f.qconfig = aoq.float16_dynamic_qconfig
    theirs = ao_nnqd.Linear.from_float(theirs_f)
    with torch.no_grad():
        expected = theirs(x)
    if relu:
        expected = torch.relu(expected)
    assert_fp16_linear_close(got, expected, x, w16.float())
    # float64 input: computed in float32, returned as float64 (the module's contract)
    assert ops_fp16.linear_dynamic_fp16(x.double(), ops_fp16.pack_linear_fp16(w16, b),
                                        relu).dtype == torch.float64


# ---- export: EmbeddingBag + dynamic Linears (float16 and int8) ------------------------------

class _Recommender(nn.Module):
    """Pooled id features through two dense layers."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(ROWS, DIM, mode="sum")
        self.fc16 = nn.Linear(DIM, 32)
        self.fc8 = nn.Linear(32, 4)

    def forward(self, indices, offsets, weights):
        pooled = self.bag(indices, offsets, per_sample_weights=weights)
        return self.fc8(torch.relu(self.fc16(pooled)))


@pytest.fixture(scope="module")
def recommender():
    torch.manual_seed(4)
    model = _Recommender().eval()
    model.bag.qconfig = tqq.float_qparams_weight_only_qconfig_4bit
    model.fc16.qconfig = tqq.float16_dynamic_qconfig
    model.fc8.qconfig = tqq.default_dynamic_qconfig
    model.bag = qnn.EmbeddingBag.from_float(model.bag)
    model.fc16 = nnqd.Linear.from_float(model.fc16)
    model.fc8 = nnqd.Linear.from_float(model.fc8)
    return model


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_export_embedding_bag_with_dynamic_linears(recommender, context):
    gen = torch.Generator().manual_seed(5)
    indices = torch.randint(0, ROWS, (20,), generator=gen)
    offsets = torch.tensor([0, 3, 7, 7, 12])
    weights = torch.rand(20, generator=gen)
    ep = torch.export.export(recommender, (indices, offsets, weights))
    targets = [str(n.target) for n in ep.graph_module.graph.nodes if n.op == "call_function"]
    assert {"torchquant.embedding_bag.default", "torchquant.linear_dynamic_fp16.default",
            "torchquant.linear_dynamic.default"} <= set(targets)
    assert not any(t.startswith("aten.linear") or t.startswith("aten.embedding") for t in targets)
    constants = dict(ep.constants).values()  # the table as plain 4-bit values, the fp16 weight
    assert any(t.dtype == torch.uint8 and t.shape == (ROWS, DIM) for t in constants)
    assert any(t.dtype == torch.float16 and t.shape == (32, DIM) for t in constants)
    with context():
        expected = recommender(indices, offsets, weights)
        assert torch.equal(ep.module()(indices, offsets, weights), expected)
        other = torch.randint(0, ROWS, (20,), generator=gen)
        assert torch.equal(ep.module()(other, offsets, weights),
                           recommender(other, offsets, weights))


def test_compile_fullgraph_embedding_bag_with_dynamic_linears(recommender):
    indices = torch.randint(0, ROWS, (20,))
    offsets = torch.tensor([0, 3, 7, 7, 12])
    weights = torch.rand(20)
    compiled = torch.compile(copy.deepcopy(recommender), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(indices, offsets, weights),
                           recommender(indices, offsets, weights))
