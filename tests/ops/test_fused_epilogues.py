"""The fused post-ops of the static linear / conv ops (``post_op``: none, relu, leaky_relu,
tanh, add, add_relu) from the registered op down to torch's fused quantized modules.

* opcheck of ``torchquant::linear`` / ``conv`` / ``conv_transpose`` with every post-op, and
  the op equal to the eager function (the same kernels: bit-exact);
* every kernel implementation within one output step of the reference, also where oneDNN
  must split inputs above 128 into two exact halves (forced here; the real state of AVX2
  CPUs): the post-op composes with the split;
* our fused modules == the op == torch.ao's (LinearReLU, LinearLeakyReLU, LinearTanh,
  ConvReLU1d-3d, ConvAdd2d, ConvAddReLU2d), bit-exact.  torch runs LinearLeakyReLU,
  LinearTanh and ConvAdd only on its onednn engine, so every oracle here runs there (its
  weights packed under it, see tests/nn/test_conv_modules.py): the same oneDNN primitives as
  our fast kernels, hence the same integers.  Activations are those torch's u8 x s8 kernels
  compute exactly on this CPU (0..127 where they saturate int16 pairs, tests/conftest.py);
* a converted model using LinearLeakyReLU, LinearTanh, ConvAddReLU2d and ConvReLU2d under
  torch.export (one torchquant node per fused module) and torch.compile(fullgraph=True),
  both equal to eager.
"""
import contextlib
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchquant as tq
import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.quantization as tqq
from torchquant import kernels
from torchquant.kernels import onednn_exactness as exactness
from torchquant.kernels.conv import pack_conv_weight, quantized_conv
from torchquant.kernels.linear import quantized_linear
from torchquant.kernels.packed_linear import pack_linear_weight
from torchquant.kernels.post_ops import POST_OPS, post_op_of
from torchquant.ops import conv as ops_conv
from torchquant.ops import linear as ops_linear
from torchquant.tensor import QTensor

from conftest import assert_equal_but_ties

ao_nniq = torch.ao.nn.intrinsic.quantized

ADDS = ("add", "add_relu")
NEGATIVE_SLOPE = 0.2
X_SCALE, X_ZP = 0.05, 64
OTHER_SCALE, OTHER_ZP = 0.03, 120
TANH_QPARAMS = (2.0 / 256, 128)  # torch's fixed qparams for a tanh output


@contextlib.contextmanager
def engine(name):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def assert_within_one_step(got, expected, min_exact=0.99):
    assert got.shape == expected.shape
    diff = (got.to(torch.int32) - expected.to(torch.int32)).abs()
    assert diff.max().item() <= 1, f"max difference {diff.max().item()} steps"
    assert (diff == 0).float().mean().item() >= min_exact


def assert_spread(q):
    """A comparison means something only if the output is not one clamped value."""
    assert q.unique().numel() > 10


def float_post_op(y, post_op, other_hat=None):
    if post_op in ADDS:
        y = y + other_hat
    if post_op in ("relu", "add_relu"):
        return torch.relu(y)
    if post_op == "leaky_relu":
        return F.leaky_relu(y, NEGATIVE_SLOPE)
    if post_op == "tanh":
        return torch.tanh(y)
    return y


def out_qparams(y, post_op):
    """Output qparams covering the float result ``y`` after ``post_op`` (uint8)."""
    if post_op == "tanh":
        return TANH_QPARAMS
    lo, hi = min(float(y.min()), 0.0), max(float(y.max()), 0.0)
    scale = (hi - lo) / 255
    return scale, int(round(-lo / scale))


def post_op_kwargs(post_op, other):
    """The keyword arguments of the eager functions / kernels for ``post_op``."""
    if post_op == "leaky_relu":
        return {"negative_slope": NEGATIVE_SLOPE}
    if post_op in ADDS:
        return {"other": other, "other_scale": OTHER_SCALE, "other_zero_point": OTHER_ZP}
    return {}


def op_tail(post_op, other):
    """The trailing op arguments: post_op, negative_slope, other, other_scale, other_zp."""
    return (post_op, NEGATIVE_SLOPE if post_op == "leaky_relu" else 0.01,
            other if post_op in ADDS else None, OTHER_SCALE, OTHER_ZP)


def random_weight(shape, per_channel, axis=0):
    w = torch.randint(-127, 128, shape, dtype=torch.int8)
    if per_channel:
        n = shape[axis]
        return w, torch.rand(n, dtype=torch.float64) * 0.002 + 0.001, \
            torch.zeros(n, dtype=torch.int64)
    return w, torch.tensor(0.002, dtype=torch.float64), torch.tensor(0)


def dequantize(q, scale, zp):
    return (q.double() - zp) * scale


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply to integer outputs
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


# --------------------------------------------------------------------------------------------
# The ops: schema / fake kernels, op == eager function
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("post_op", POST_OPS)
@pytest.mark.parametrize("per_channel", [False, True])
def test_linear_op(post_op, per_channel):
    w, s, z = random_weight((24, 40), per_channel)
    bias = torch.randn(24)
    x = torch.randint(0, 256, (2, 3, 40), dtype=torch.uint8)
    other = torch.randint(0, 256, (2, 3, 24), dtype=torch.uint8)
    y = F.linear(dequantize(x, X_SCALE, X_ZP),
                 dequantize(w, s.reshape(-1, 1) if per_channel else s, 0), bias.double())
    out_scale, out_zp = out_qparams(float_post_op(y, post_op, dequantize(other, OTHER_SCALE,
                                                                          OTHER_ZP)), post_op)
    args = (x, X_SCALE, X_ZP, w, s, z, bias, out_scale, out_zp, torch.uint8,
            *op_tail(post_op, other))
    _opcheck(torch.ops.torchquant.linear.default, args)
    packed = ops_linear.pack_linear(w, s, z, bias)
    eager = ops_linear.linear(x, X_SCALE, X_ZP, packed, out_scale, out_zp, torch.uint8,
                              *op_tail(post_op, other))
    assert torch.equal(torch.ops.torchquant.linear(*args), eager)
    assert_spread(eager)
    with kernels.reference_only():
        reference = ops_linear.linear(x, X_SCALE, X_ZP, packed, out_scale, out_zp, torch.uint8,
                                      *op_tail(post_op, other))
    assert_within_one_step(eager, reference)


@pytest.mark.parametrize("post_op", POST_OPS)
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_op(post_op, dims):
    w, s, z = random_weight((8, 4) + (3,) * dims, True)
    bias = torch.randn(8)
    x = torch.randint(0, 256, (2, 4) + (6,) * dims, dtype=torch.uint8)
    stride, padding = [2] * dims, [1] * dims
    other = torch.randint(0, 256, (2, 8) + (3,) * dims, dtype=torch.uint8)
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    y = conv(dequantize(x, X_SCALE, X_ZP), dequantize(w, s.reshape((-1,) + (1,) * (dims + 1)), 0),
             bias.double(), stride, padding)
    out_scale, out_zp = out_qparams(float_post_op(y, post_op, dequantize(other, OTHER_SCALE,
                                                                          OTHER_ZP)), post_op)
    args = (x, X_SCALE, X_ZP, w, s, z, bias, 0, stride, padding, [1] * dims, 1, out_scale,
            out_zp, *op_tail(post_op, other))
    _opcheck(torch.ops.torchquant.conv.default, args)
    packed = ops_conv.pack_conv_weight(w, s, z, 0, bias, stride, padding, 1, 1)
    eager = ops_conv.conv(x, X_SCALE, X_ZP, packed, out_scale, out_zp, *op_tail(post_op, other))
    assert torch.equal(torch.ops.torchquant.conv(*args), eager)
    assert_spread(eager)
    with kernels.reference_only():
        reference = ops_conv.conv(x, X_SCALE, X_ZP, packed, out_scale, out_zp,
                                  *op_tail(post_op, other))
    assert_within_one_step(eager, reference)


@pytest.mark.parametrize("post_op", POST_OPS)
def test_conv_transpose_op(post_op):
    w, s, z = random_weight((4, 3, 3, 3), True, axis=1)
    bias = torch.randn(6)
    x = torch.randint(0, 256, (2, 4, 5, 5), dtype=torch.uint8)
    other = torch.randint(0, 256, (2, 6, 10, 10), dtype=torch.uint8)
    w_hat = dequantize(w, s.reshape(1, -1, 1, 1), 0)  # per channel along axis 1
    y = F.conv_transpose2d(dequantize(x, X_SCALE, X_ZP), w_hat, bias.double(), 2, 1, 1, 2)
    y = float_post_op(y, post_op, dequantize(other, OTHER_SCALE, OTHER_ZP))
    out_scale, out_zp = out_qparams(y, post_op)
    args = (x, X_SCALE, X_ZP, w, s, z, bias, 1, [2, 2], [1, 1], [1, 1], [1, 1], 2, out_scale,
            out_zp, *op_tail(post_op, other))
    _opcheck(torch.ops.torchquant.conv_transpose.default, args)
    packed = ops_conv.pack_conv_weight(w, s, z, 1, bias, 2, 1, 1, 2, transposed=True,
                                       output_padding=1)
    eager = ops_conv.conv_transpose(x, X_SCALE, X_ZP, packed, out_scale, out_zp,
                                    *op_tail(post_op, other))
    assert torch.equal(torch.ops.torchquant.conv_transpose(*args), eager)
    assert_spread(eager)
    # the reference kernel is the float formula: here evaluated in float64
    expected = torch.clamp(torch.round(y / out_scale) + out_zp, 0, 255)
    assert_within_one_step(eager, expected)


def test_bad_post_op_arguments():
    w, s, z = random_weight((6, 8), False)
    packed = ops_linear.pack_linear(w, s, z, None)
    x = torch.randint(0, 128, (3, 8), dtype=torch.uint8)
    other = torch.randint(0, 256, (3, 6), dtype=torch.uint8)
    with pytest.raises(ValueError, match="post_op must be one of"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "gelu")
    with pytest.raises(TypeError, match="needs the integers of the added tensor"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "add")
    with pytest.raises(ValueError, match="takes no second operand"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "relu", other=other)
    with pytest.raises(ValueError, match="output's shape"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "add", other=other[:2])
    with pytest.raises(TypeError, match="uint8 / int8"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "add", other=other.float())
    with pytest.raises(ValueError, match="other_scale"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "add", other=other,
                          other_scale=0.0)
    with pytest.raises(ValueError, match="negative_slope"):
        ops_linear.linear(x, 0.1, 0, packed, 0.1, 0, torch.uint8, "leaky_relu",
                          negative_slope=float("nan"))
    wc, sc, zc = random_weight((8, 4, 3, 3), False)
    conv_packed = ops_conv.pack_conv_weight(wc, sc, zc, None, None, 1, 1)
    xc = torch.randint(0, 128, (1, 4, 5, 5), dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"output's shape \(1, 8, 5, 5\)"):
        ops_conv.conv(xc, 0.1, 0, conv_packed, 0.1, 0, "add",
                      other=torch.zeros(1, 8, 4, 4, dtype=torch.uint8))


# --------------------------------------------------------------------------------------------
# Kernels: every implementation agrees with the reference, with and without the split
# --------------------------------------------------------------------------------------------

@pytest.fixture(params=["native", "split"])
def onednn_u8_limit(request, monkeypatch):
    """'split': oneDNN treated as saturating int16 pairs (what it does on AVX2 CPUs), so its
    kernels run inputs above 128 as two exact halves (x & 127, x >> 7) with float output."""
    if request.param == "split":
        monkeypatch.setattr(exactness, "onednn_u8_exact_max",
                            lambda: exactness.ONEDNN_SAFE_U8_MAX)
    return request.param


@pytest.mark.parametrize("post_op", POST_OPS)
@pytest.mark.parametrize("rows", [1, 16])
def test_linear_kernels_match_reference(post_op, rows, onednn_u8_limit):
    w, s, z = random_weight((48, 64), True)
    packed = pack_linear_weight(w, s, z, 0, torch.randn(48))
    small = torch.randint(0, 128, (rows, 64), dtype=torch.uint8)
    big = small.clone()
    big[0, 0] = 255  # takes the split where oneDNN saturates
    other = torch.randint(0, 256, (rows, 48), dtype=torch.uint8)
    out_scale, out_zp = TANH_QPARAMS if post_op == "tanh" else (0.04, 100)
    epilogue = post_op_of(post_op, NEGATIVE_SLOPE, other if post_op in ADDS else None,
                                  OTHER_SCALE, OTHER_ZP, (rows, 48), "test")
    impls = kernels.implementations("quantized_linear")
    for x in (small, big):
        args = (x, X_SCALE, X_ZP, packed, out_scale, out_zp, tq.quint8, epilogue,
                other if post_op in ADDS else None)
        reference = impls["reference"].fn(*args)
        if rows > 1:
            assert_spread(reference)
        for name, kernel in impls.items():
            if kernel.available() and (name != "onednn" or packed.onednn_weight is not None):
                assert_within_one_step(kernel.fn(*args), reference)
        got = quantized_linear(x, X_SCALE, X_ZP, packed, out_scale, out_zp, tq.quint8, post_op,
                               **post_op_kwargs(post_op, other))
        assert_within_one_step(got, reference)


@pytest.mark.parametrize("post_op", POST_OPS)
def test_linear_kernels_qint8_add(post_op):
    """qint8 activations, output and added operand (``_int_mm`` and the reference)."""
    w, s, z = random_weight((16, 32), False)
    packed = pack_linear_weight(w, s, z, None, torch.randn(16))
    x = torch.randint(-128, 128, (8, 32), dtype=torch.int8)
    other = torch.randint(-128, 128, (8, 16), dtype=torch.int8)
    kwargs = post_op_kwargs(post_op, other)
    kwargs.update(other_zero_point=-5) if post_op in ADDS else None
    out_scale = TANH_QPARAMS[0] if post_op == "tanh" else 0.05
    got = quantized_linear(x, 0.05, 3, packed, out_scale, 0, tq.qint8, post_op, **kwargs)
    with kernels.reference_only():
        reference = quantized_linear(x, 0.05, 3, packed, out_scale, 0, tq.qint8, post_op,
                                     **kwargs)
    assert got.dtype == torch.int8
    assert_within_one_step(got, reference)


@pytest.mark.parametrize("post_op", POST_OPS)
@pytest.mark.parametrize("dims", [1, 2, 3])
def test_conv_kernels_match_reference(post_op, dims, onednn_u8_limit):
    w, s, z = random_weight((8, 4) + (3,) * dims, True)
    packed = pack_conv_weight(w, s, z, 0, torch.randn(8), 1, 1)
    small = torch.randint(0, 128, (2, 4) + (6,) * dims, dtype=torch.uint8)
    big = small.clone()
    big.view(-1)[7] = 255  # takes the split where oneDNN saturates
    other = torch.randint(0, 256, (2, 8) + (6,) * dims, dtype=torch.uint8)
    kwargs = post_op_kwargs(post_op, other)
    out_scale, out_zp = TANH_QPARAMS if post_op == "tanh" else (0.05, 100)
    reference = kernels.implementations("quantized_conv")["reference"].fn
    epilogue = post_op_of(post_op, NEGATIVE_SLOPE, kwargs.get("other"), OTHER_SCALE,
                                  OTHER_ZP, tuple(other.shape), "test")
    for x in (small, big, small):  # one cached plan serves all three
        got = quantized_conv(x, X_SCALE, X_ZP, packed, 1, 1, 1, 1, out_scale, out_zp, post_op,
                             **kwargs)
        expected = reference(x, X_SCALE, X_ZP, packed, out_scale, out_zp, epilogue,
                             kwargs.get("other"))
        assert_spread(expected)
        assert_within_one_step(got, expected)
        if packed.onednn_weight is not None and dims > 1:  # oneDNN's layout, whichever path
            assert got.movedim(1, -1).is_contiguous()


# --------------------------------------------------------------------------------------------
# Our fused modules == the op == torch.ao's, bit-exact
# --------------------------------------------------------------------------------------------

def torch_and_our_inputs(x_int, scale, zero_point):
    return (torch._make_per_tensor_quantized_tensor(x_int, scale, zero_point),
            QTensor.from_int(x_int, scale, zero_point, tq.quint8))


def torch_and_our_weights(w, s, z, axis=0):
    if s.dim() == 0:
        theirs = torch._make_per_tensor_quantized_tensor(w, float(s), int(z))
        return theirs, QTensor.from_int(w, s, z, tq.qint8)
    theirs = torch._make_per_channel_quantized_tensor(w, s, z, axis)
    return theirs, QTensor.from_int(w, s, z, tq.qint8, axis=axis)


LINEAR_MODULES = {  # post_op: (torch's class, ours, extra constructor args)
    "relu": (ao_nniq.LinearReLU, nniq.LinearReLU, ()),
    "leaky_relu": (ao_nniq.LinearLeakyReLU, nniq.LinearLeakyReLU, (NEGATIVE_SLOPE,)),
    "tanh": (ao_nniq.LinearTanh, nniq.LinearTanh, ()),
}


@pytest.mark.parametrize("post_op", list(LINEAR_MODULES))
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("rows", [1, 16])
def test_fused_linear_modules_match_torch(post_op, per_channel, rows, oracle_u8):
    ao_cls, tq_cls, extra = LINEAR_MODULES[post_op]
    w, s, z = random_weight((48, 64), per_channel)
    bias = torch.randn(48)
    x = oracle_u8((rows, 64))
    y = F.linear(dequantize(x, X_SCALE, X_ZP),
                 dequantize(w, s.reshape(-1, 1) if per_channel else s, 0), bias.double())
    out_scale, out_zp = out_qparams(float_post_op(y, post_op), post_op)
    ao_w, tq_w = torch_and_our_weights(w, s, z)
    ao_x, tq_x = torch_and_our_inputs(x, X_SCALE, X_ZP)
    with engine("onednn"):  # torch packs for the engine current at set_weight_bias
        ao_mod = ao_cls(64, 48, *extra)
        ao_mod.set_weight_bias(ao_w, bias)
        ao_mod.scale, ao_mod.zero_point = out_scale, out_zp
        theirs = ao_mod(ao_x).int_repr()
    tq_mod = tq_cls(64, 48, *extra)
    tq_mod.set_weight_bias(tq_w, bias)
    tq_mod.scale, tq_mod.zero_point = out_scale, out_zp
    ours = tq_mod(tq_x)
    op = torch.ops.torchquant.linear(x, X_SCALE, X_ZP, w, s, z, bias, out_scale, out_zp,
                                     torch.uint8, *op_tail(post_op, None))
    if rows > 1:
        assert_spread(theirs)
    assert (ours.q_scale(), ours.q_zero_point()) == (out_scale, out_zp)
    assert torch.equal(ours.int_repr(), theirs)
    assert torch.equal(op, theirs)


CONV_RELU_MODULES = {1: (ao_nniq.ConvReLU1d, nniq.ConvReLU1d),
                     2: (ao_nniq.ConvReLU2d, nniq.ConvReLU2d),
                     3: (ao_nniq.ConvReLU3d, nniq.ConvReLU3d)}


@pytest.mark.parametrize("dims", [1, 2, 3])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_relu_modules_match_torch(dims, per_channel, oracle_u8):
    ao_cls, tq_cls = CONV_RELU_MODULES[dims]
    w, s, z = random_weight((8, 4) + (3,) * dims, per_channel)
    bias = torch.randn(8)
    x = oracle_u8((2, 4) + (7,) * dims)
    w_scale = s.reshape((-1,) + (1,) * (dims + 1)) if per_channel else s
    conv = (F.conv1d, F.conv2d, F.conv3d)[dims - 1]
    y = conv(dequantize(x, X_SCALE, X_ZP), dequantize(w, w_scale, 0), bias.double(), 1, 1)
    out_scale, out_zp = out_qparams(y, "relu")
    out_zp = 60  # relu clamps at the zero point: leave room below it
    ao_w, tq_w = torch_and_our_weights(w, s, z)
    ao_x, tq_x = torch_and_our_inputs(x, X_SCALE, X_ZP)
    with engine("onednn"):
        ao_mod = ao_cls(4, 8, 3, padding=1)
        ao_mod.set_weight_bias(ao_w, bias)
        ao_mod.scale, ao_mod.zero_point = out_scale, out_zp
        theirs = ao_mod(ao_x).int_repr()
    tq_mod = tq_cls(4, 8, 3, padding=1)
    tq_mod.set_weight_bias(tq_w, bias)
    tq_mod.scale, tq_mod.zero_point = out_scale, out_zp
    ours = tq_mod(tq_x).int_repr()
    op = torch.ops.torchquant.conv(x, X_SCALE, X_ZP, w, s, z, bias, 0, [1] * dims, [1] * dims,
                                   [1] * dims, 1, out_scale, out_zp, "relu")
    assert_spread(theirs)
    assert int(theirs.min()) == out_zp  # the ReLU clamped something
    # Bit-exact but for float32 rounding ties: with full-range activations (CPUs where torch.ao
    # is exact on them: VNNI / AMX) the 3-d case hits one code 1 ulp from a tie, which
    # oneDNN's conv3d kernel rounds down and torch.ao's (another oneDNN kernel) up.
    exact = torch.relu(y) / out_scale + out_zp
    magnitude = ((y - bias.double().view((-1,) + (1,) * dims)).abs()
                 + bias.double().abs().view((-1,) + (1,) * dims)) / out_scale + out_zp
    assert_equal_but_ties(ours, theirs, exact, magnitude)
    assert_equal_but_ties(op, theirs, exact, magnitude)


@pytest.mark.parametrize("post_op", ADDS)
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv_add_modules_match_torch(post_op, per_channel, oracle_u8):
    ao_cls, tq_cls = ((ao_nniq.ConvAdd2d, nniq.ConvAdd2d) if post_op == "add"
                      else (ao_nniq.ConvAddReLU2d, nniq.ConvAddReLU2d))
    w, s, z = random_weight((8, 4, 3, 3), per_channel)
    bias = torch.randn(8)
    x = oracle_u8((2, 4, 8, 8))
    other = torch.randint(0, 256, (2, 8, 8, 8), dtype=torch.uint8)  # added, no GEMM: any value
    w_scale = s.reshape(-1, 1, 1, 1) if per_channel else s
    y = F.conv2d(dequantize(x, X_SCALE, X_ZP), dequantize(w, w_scale, 0), bias.double(), 1, 1)
    y = float_post_op(y, post_op, dequantize(other, OTHER_SCALE, OTHER_ZP))
    out_scale, out_zp = out_qparams(y, post_op)
    ao_w, tq_w = torch_and_our_weights(w, s, z)
    ao_x, tq_x = torch_and_our_inputs(x, X_SCALE, X_ZP)
    ao_other, tq_other = torch_and_our_inputs(other, OTHER_SCALE, OTHER_ZP)
    with engine("onednn"):
        ao_mod = ao_cls(4, 8, 3, padding=1)
        ao_mod.set_weight_bias(ao_w, bias)
        ao_mod.scale, ao_mod.zero_point = out_scale, out_zp
        theirs = ao_mod(ao_x, ao_other).int_repr()
    tq_mod = tq_cls(4, 8, 3, padding=1)
    tq_mod.set_weight_bias(tq_w, bias)
    tq_mod.scale, tq_mod.zero_point = out_scale, out_zp
    other_before = other.clone()
    ours = tq_mod(tq_x, tq_other).int_repr()
    op = torch.ops.torchquant.conv(x, X_SCALE, X_ZP, w, s, z, bias, 0, [1, 1], [1, 1], [1, 1],
                                   1, out_scale, out_zp, *op_tail(post_op, other))
    assert torch.equal(other, other_before)  # oneDNN sums into a copy
    assert_spread(theirs)
    assert torch.equal(ours, theirs)
    assert torch.equal(op, theirs)


# --------------------------------------------------------------------------------------------
# A converted model under torch.export and torch.compile: one node per fused module
# --------------------------------------------------------------------------------------------

class FusedNet(nn.Module):
    """ConvReLU2d stem, a ConvAddReLU2d residual block, LinearLeakyReLU, LinearTanh."""

    def __init__(self):
        super().__init__()
        self.quant = tqq.QuantStub()
        self.stem = nni.ConvReLU2d(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU())
        self.block = nni.ConvAddReLU2d(nn.Conv2d(8, 8, 3, padding=1), torch.add, nn.ReLU())
        self.fc1 = nni.LinearLeakyReLU(nn.Linear(8 * 6 * 6, 32), nn.LeakyReLU(0.1))
        self.fc2 = nni.LinearTanh(nn.Linear(32, 10), nn.Tanh())
        self.dequant = tqq.DeQuantStub()

    def forward(self, x):
        x = self.stem(self.quant(x))
        x = self.block(x, x)
        return self.dequant(self.fc2(self.fc1(torch.flatten(x, 1))))


@pytest.fixture(scope="module")
def fused_net():
    torch.manual_seed(0)
    model = FusedNet().eval()
    model.qconfig = tqq.get_default_qconfig("x86")
    prepared = tqq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(4, 3, 6, 6))
    converted = tqq.convert(prepared)
    assert [type(converted.stem), type(converted.block), type(converted.fc1),
            type(converted.fc2)] == [nniq.ConvReLU2d, nniq.ConvAddReLU2d, nniq.LinearLeakyReLU,
                                     nniq.LinearTanh]
    return converted


def op_argument(node, name):
    """An argument of an op node by its schema name: export leaves trailing arguments that
    equal their defaults out of ``node.args``."""
    arguments = node.target._schema.arguments
    index = [a.name for a in arguments].index(name)
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name, arguments[index].default_value)


def test_fused_model_export_one_node_per_fused_module(fused_net):
    x = torch.randn(3, 3, 6, 6)
    ep = torch.export.export(fused_net, (x,))
    nodes = [n for n in ep.graph_module.graph.nodes
             if n.op == "call_function" and str(n.target).startswith("torchquant.")]
    names = [str(n.target).removeprefix("torchquant.").removesuffix(".default") for n in nodes]
    assert names == ["quantize_per_tensor", "conv", "conv", "linear", "linear",
                     "dequantize_per_tensor"]
    assert [op_argument(n, "post_op") for n in nodes[1:5]] == ["relu", "add_relu",
                                                              "leaky_relu", "tanh"]
    assert op_argument(nodes[3], "negative_slope") == pytest.approx(0.1)
    assert op_argument(nodes[2], "other") is op_argument(nodes[2], "x")  # block(x, x)
    with torch.no_grad():
        expected = fused_net(x)
        assert torch.equal(ep.module()(x), expected)
        x2 = torch.randn(3, 3, 6, 6) * 3  # saturates: the clamps agree too
        assert torch.equal(ep.module()(x2), fused_net(x2))
    assert expected.unique().numel() > 10


def test_fused_model_compile_fullgraph_matches_eager(fused_net):
    x = torch.randn(3, 3, 6, 6)
    compiled = torch.compile(copy.deepcopy(fused_net), fullgraph=True)
    with torch.no_grad():
        assert torch.equal(compiled(x), fused_net(x))
    with torch.inference_mode():
        x2 = torch.randn(3, 3, 6, 6)
        assert torch.equal(compiled(x2), fused_net(x2))
