"""Quantized Conv1d/2d/3d, ConvTranspose1d/2d/3d, ConvReLU, ConvAdd(ReLU) and functional conv
against torch 2.13 (engine x86; onednn for conv + add and qnnpack for per-channel transposed
convs, the only engines torch runs those on; fbgemm for per-tensor transposed convs, see
test_conv_transpose_matches_torch).

Both sides quantize the same weight (our observers are bit-exact with torch's) and compute the
same integer accumulator; they differ in how the float requantization is evaluated: torch's
kernels multiply by a float32 ``x_scale * w_scale / out_scale`` (oneDNN associates the product
differently again) while our reference path dequantizes, convolves in float (another summation
order) and quantizes.  A value within float rounding of a .5 tie can then land one step apart,
so outputs may differ by one LSB on at most 1 % of the elements.
"""
import contextlib
import copy
import io

import pytest
import torch
import torch.ao.nn.intrinsic as ao_nni
import torch.ao.nn.intrinsic.quantized as ao_nniq
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.functional as ao_qF
import torch.ao.nn.quantized.reference as ao_nnqr
import torch.ao.quantization as ao_q
from torch import nn

import torchquant as tq
import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.nn.qat as nnqat
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.functional as qF
import torchquant.quantization as tqq
from torchquant import kernels

from conftest import oracle_input


@contextlib.contextmanager
def engine(name):
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def assert_close_int(theirs, ours, max_frac=0.01):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-7)
    assert ours.q_zero_point() == theirs.q_zero_point()
    a, b = theirs.int_repr().long(), ours.int_repr().long()
    assert a.shape == b.shape
    diff = (a - b).abs()
    assert int(diff.max()) <= 1
    assert float((diff > 0).float().mean()) <= max_frac


def assert_same_weight(theirs, ours):
    assert torch.equal(ours.int_repr(), theirs.int_repr())
    if theirs.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        assert ours.q_per_channel_axis() == theirs.q_per_channel_axis()
        assert torch.equal(ours.q_per_channel_scales().double(),
                           theirs.q_per_channel_scales().double())
    else:
        assert ours.q_scale() == theirs.q_scale()


def observe(ao_mod, tq_mod, ao_qconfig, tq_qconfig, *data):
    """Attach output observers from the two qconfigs and run the same calibration data."""
    with torch.no_grad():  # run first: an observer child would join a Sequential's forward
        ao_out, tq_out = ao_mod(*data), tq_mod(*data)
    ao_mod.qconfig, tq_mod.qconfig = ao_qconfig, tq_qconfig
    ao_mod.activation_post_process = ao_qconfig.activation()
    tq_mod.activation_post_process = tq_qconfig.activation()
    ao_mod.activation_post_process(ao_out)
    tq_mod.activation_post_process(tq_out)


def quantized_inputs(x, scale=0.05, zero_point=64):
    return (torch.quantize_per_tensor(x, scale, zero_point, torch.quint8),
            tq.quantize_per_tensor(x, scale, zero_point, tq.quint8))


def oracle_inputs(x, scale=0.05, zero_point=64):
    """:func:`quantized_inputs` for a comparison with torch's x86 / fbgemm / onednn GEMM or
    conv: where those saturate int16 pairs of u8 x s8 products (CPUs without VNNI, see
    tests/conftest.py) ``x`` is clamped to what quantizes to at most 127, which torch computes
    exactly; unchanged elsewhere."""
    return quantized_inputs(oracle_input(x, scale, zero_point), scale, zero_point)


X86 = (ao_q.get_default_qconfig("x86"), tqq.get_default_qconfig("x86"))  # per-channel weights
PER_TENSOR = (ao_q.default_qconfig, tqq.default_qconfig)
QCONFIGS = [pytest.param(*X86, id="x86-per-channel"),
            pytest.param(*PER_TENSOR, id="per-tensor")]

CONV_CASES = [  # (float conv class, quantized classes (torch, ours), ctor kwargs, input shape)
    pytest.param(nn.Conv1d, (ao_nnq.Conv1d, nnq.Conv1d), dict(kernel_size=3, stride=2, padding=1),
                 (2, 4, 17), id="1d-stride-pad"),
    pytest.param(nn.Conv1d, (ao_nnq.Conv1d, nnq.Conv1d),
                 dict(kernel_size=3, padding=2, padding_mode="reflect", bias=False),
                 (2, 4, 11), id="1d-reflect-nobias"),
    pytest.param(nn.Conv2d, (ao_nnq.Conv2d, nnq.Conv2d), dict(kernel_size=3, padding=1),
                 (2, 4, 9, 9), id="2d-pad"),
    pytest.param(nn.Conv2d, (ao_nnq.Conv2d, nnq.Conv2d),
                 dict(kernel_size=(3, 2), stride=(2, 1), dilation=2, groups=2),
                 (1, 4, 12, 10), id="2d-groups-dilation-stride"),
    pytest.param(nn.Conv2d, (ao_nnq.Conv2d, nnq.Conv2d),
                 dict(kernel_size=3, padding=(1, 2), padding_mode="reflect"),
                 (1, 4, 8, 9), id="2d-reflect"),
    pytest.param(nn.Conv2d, (ao_nnq.Conv2d, nnq.Conv2d), dict(kernel_size=3, groups=4, bias=False),
                 (1, 4, 8, 8), id="2d-depthwise"),
    pytest.param(nn.Conv3d, (ao_nnq.Conv3d, nnq.Conv3d), dict(kernel_size=3, padding=1, stride=2),
                 (1, 4, 6, 7, 6), id="3d"),
]


def make_float(float_cls, in_c=4, out_c=8, **kwargs):
    torch.manual_seed(1)
    return float_cls(in_c, out_c, **kwargs)


@pytest.mark.parametrize("ao_qc,tq_qc", QCONFIGS)
@pytest.mark.parametrize("float_cls,qclasses,kwargs,shape", CONV_CASES)
def test_conv_matches_torch(ao_qc, tq_qc, float_cls, qclasses, kwargs, shape):
    ao_cls, tq_cls = qclasses
    ao_float = make_float(float_cls, **kwargs)
    tq_float = copy.deepcopy(ao_float)
    observe(ao_float, tq_float, ao_qc, tq_qc, torch.randn(*shape) * 2)
    ao_mod, tq_mod = ao_cls.from_float(ao_float), tq_cls.from_float(tq_float)
    assert_same_weight(ao_mod.weight(), tq_mod.weight())
    assert repr(tq_mod) == repr(ao_mod)
    ao_x, tq_x = oracle_inputs(torch.randn(*shape) * 2)
    with engine("x86"):
        theirs = ao_mod(ao_x)
    ours = tq_mod(tq_x)
    assert isinstance(ours, tq.QTensor) and ours.qdtype is tq.quint8
    assert_close_int(theirs, ours)


TRANSPOSE_CASES = [
    pytest.param(nn.ConvTranspose1d, (ao_nnq.ConvTranspose1d, nnq.ConvTranspose1d),
                 dict(kernel_size=3, stride=2, padding=1, output_padding=1), (2, 4, 9), id="1d"),
    pytest.param(nn.ConvTranspose2d, (ao_nnq.ConvTranspose2d, nnq.ConvTranspose2d),
                 dict(kernel_size=3, stride=2, groups=2, dilation=2, bias=False), (1, 4, 6, 5),
                 id="2d-groups-dilation"),
    pytest.param(nn.ConvTranspose3d, (ao_nnq.ConvTranspose3d, nnq.ConvTranspose3d),
                 dict(kernel_size=2, stride=2, padding=1), (1, 4, 4, 3, 4), id="3d"),
]


@pytest.mark.parametrize("float_cls,qclasses,kwargs,shape", TRANSPOSE_CASES)
def test_conv_transpose_matches_torch(float_cls, qclasses, kwargs, shape):
    ao_cls, tq_cls = qclasses
    ao_float = make_float(float_cls, out_c=6, **kwargs)
    tq_float = copy.deepcopy(ao_float)
    # torch's x86 kernels reject per-channel transposed weights: per-tensor, as its default
    # qconfig mapping does for transposed convs.
    observe(ao_float, tq_float, *PER_TENSOR, torch.randn(*shape))
    # fbgemm (packing and running): torch 2.13's x86 / onednn transposed conv is off by tens
    # of steps whenever in_channels != out_channels (it reads the [in, out/groups, k] weight
    # in the wrong layout); fbgemm and qnnpack agree with the float formula, and so do we.
    with engine("fbgemm"):
        ao_mod = ao_cls.from_float(ao_float)
    tq_mod = tq_cls.from_float(tq_float)
    assert_same_weight(ao_mod.weight(), tq_mod.weight())
    assert repr(tq_mod) == repr(ao_mod)
    ao_x, tq_x = oracle_inputs(torch.randn(*shape))
    with engine("fbgemm"):
        theirs = ao_mod(ao_x)
    assert_close_int(theirs, tq_mod(tq_x))


def test_conv_transpose_per_channel_axis1_matches_qnnpack():
    """Per-channel transposed weights are quantized along axis 1 (output channels) in torch;
    only its qnnpack engine runs them."""
    torch.manual_seed(2)
    w = torch.randn(4, 6, 3, 3) * 0.2
    bias = torch.randn(6)
    obs = ao_q.PerChannelMinMaxObserver(ch_axis=1, dtype=torch.qint8,
                                        qscheme=torch.per_channel_symmetric)
    obs(w)
    scales, zps = obs.calculate_qparams()
    ao_w = torch.quantize_per_channel(w, scales.double(), zps.long(), 1, torch.qint8)
    tq_w = tq.quantize_per_channel(w, scales.double(), zps.long(), 1, tq.qint8)
    ao_mod = ao_nnq.ConvTranspose2d(4, 6, 3, stride=2, padding=1)
    tq_mod = nnq.ConvTranspose2d(4, 6, 3, stride=2, padding=1)
    ao_x, tq_x = quantized_inputs(torch.randn(2, 4, 5, 5), 0.04, 100)
    with engine("qnnpack"):
        ao_mod.set_weight_bias(ao_w, bias)
        ao_mod.scale, ao_mod.zero_point = 0.07, 120
        theirs = ao_mod(ao_x)
    tq_mod.set_weight_bias(tq_w, bias)
    tq_mod.scale, tq_mod.zero_point = 0.07, 120
    assert tq_mod.weight().q_per_channel_axis() == 1
    assert_close_int(theirs, tq_mod(tq_x))


CONV_RELU_CASES = [
    pytest.param(nn.Conv1d, (ao_nni.ConvReLU1d, nni.ConvReLU1d),
                 (ao_nniq.ConvReLU1d, nniq.ConvReLU1d),
                 (2, 4, 15), id="1d"),
    pytest.param(nn.Conv2d, (ao_nni.ConvReLU2d, nni.ConvReLU2d),
                 (ao_nniq.ConvReLU2d, nniq.ConvReLU2d),
                 (2, 4, 8, 9), id="2d"),
    pytest.param(nn.Conv3d, (ao_nni.ConvReLU3d, nni.ConvReLU3d),
                 (ao_nniq.ConvReLU3d, nniq.ConvReLU3d),
                 (1, 4, 5, 6, 5), id="3d"),
]


@pytest.mark.parametrize("ao_qc,tq_qc", QCONFIGS)
@pytest.mark.parametrize("float_cls,fused,quantized,shape", CONV_RELU_CASES)
def test_conv_relu_matches_torch(ao_qc, tq_qc, float_cls, fused, quantized, shape):
    conv = make_float(float_cls, kernel_size=3, padding=1)
    ao_float = fused[0](conv, nn.ReLU())
    tq_float = fused[1](copy.deepcopy(conv), nn.ReLU())
    observe(ao_float, tq_float, ao_qc, tq_qc, torch.randn(*shape) * 2)
    ao_float[0].qconfig = ao_qc  # torch reads the child's qconfig (propagate_qconfig_ sets it)
    ao_mod, tq_mod = quantized[0].from_float(ao_float), quantized[1].from_float(tq_float)
    assert tq_mod._get_name() == ao_mod._get_name()
    assert repr(tq_mod) == repr(ao_mod)
    ao_x, tq_x = oracle_inputs(torch.randn(*shape) * 2)
    with engine("x86"):
        theirs = ao_mod(ao_x)
    ours = tq_mod(tq_x)
    assert int(ours.int_repr().min()) >= ours.q_zero_point()
    assert_close_int(theirs, ours)


@pytest.mark.parametrize("relu", [False, True])
def test_conv_add_matches_torch_onednn(relu, torch_oracle_exact_u8):
    """torch runs ConvAdd only on its onednn engine, so its weight is packed under onednn too:
    packed under x86 it is an fbgemm weight on CPUs without VNNI (x86 prefers oneDNN only
    with AVX-512 VNNI), which onednn's conv_add then reads as its own and crashes (segfault,
    seen on an AVX2 AMD EPYC).  On such CPUs onednn also saturates int16 pairs of u8 x s8
    products above 128 (tests/conftest.py), so there torch gets the conv input with zero
    point 64 clamped to 0..127; ours is checked on the full-range input against the float
    formula everywhere."""
    conv = make_float(nn.Conv2d, kernel_size=3, padding=1)
    if relu:
        ao_float = ao_nni.ConvAddReLU2d(conv, torch.add, nn.ReLU())
        tq_float = nni.ConvAddReLU2d(copy.deepcopy(conv), torch.add, nn.ReLU())
        ao_cls, tq_cls = ao_nniq.ConvAddReLU2d, nniq.ConvAddReLU2d
    else:
        ao_float = ao_nni.ConvAdd2d(conv, torch.add)
        tq_float = nni.ConvAdd2d(copy.deepcopy(conv), torch.add)
        ao_cls, tq_cls = ao_nniq.ConvAdd2d, nniq.ConvAdd2d
    x1, x2 = torch.randn(2, 4, 8, 8), torch.randn(2, 8, 8, 8)
    observe(ao_float, tq_float, *X86, x1, x2)
    ao_float[0].qconfig = X86[0]
    with engine("onednn"):
        ao_mod = ao_cls.from_float(ao_float)
    tq_mod = tq_cls.from_float(tq_float)
    assert repr(tq_mod) == repr(ao_mod)
    ao_a, tq_a = oracle_inputs(x1, 0.04, 128 if torch_oracle_exact_u8 else 64)
    ao_b, tq_b = quantized_inputs(x2, 0.03, 120)  # the added operand: no GEMM
    with engine("onednn"):
        theirs = ao_mod(ao_a, ao_b)
    assert_close_int(theirs, tq_mod(tq_a, tq_b))
    # ours, on the full-range input, is the float formula
    # quantize(relu?(conv(x_hat, w_hat, b) + extra_hat))
    tq_a = tq.quantize_per_tensor(x1, 0.04, 128, tq.quint8)
    ours = tq_mod(tq_a, tq_b)
    y = torch.nn.functional.conv2d(tq_a.dequantize(), tq_mod.weight().dequantize(),
                                   tq_mod.bias(), padding=1) + tq_b.dequantize()
    y = torch.relu(y) if relu else y
    expected = tq.quantize_per_tensor(y, float(tq_mod.scale), int(tq_mod.zero_point), tq.quint8)
    assert torch.equal(ours.int_repr(), expected.int_repr())


def test_functional_conv2d_matches_torch():
    torch.manual_seed(3)
    w = torch.randn(6, 2, 3, 3) * 0.3
    bias = torch.randn(6)
    ao_w = torch.quantize_per_tensor(w, 0.01, 0, torch.qint8)
    tq_w = tq.quantize_per_tensor(w, 0.01, 0, tq.qint8)
    ao_x, tq_x = oracle_inputs(torch.randn(2, 4, 9, 9))
    kwargs = dict(stride=2, padding=1, dilation=1, groups=2, scale=0.2, zero_point=90)
    with engine("x86"):
        theirs = ao_qF.conv2d(ao_x, ao_w, bias, **kwargs)
    assert_close_int(theirs, qF.conv2d(tq_x, tq_w, bias, **kwargs))
    # conv1d / conv3d run through the same path
    ao_x1, tq_x1 = oracle_inputs(torch.randn(2, 4, 11))
    w1 = torch.randn(5, 4, 3) * 0.3
    with engine("x86"):
        theirs = ao_qF.conv1d(ao_x1, torch.quantize_per_tensor(w1, 0.01, 0, torch.qint8), None,
                              scale=0.1, zero_point=70)
    assert_close_int(theirs, qF.conv1d(tq_x1, tq.quantize_per_tensor(w1, 0.01, 0, tq.qint8), None,
                                       scale=0.1, zero_point=70))
    _, tq_x3 = quantized_inputs(torch.randn(1, 2, 4, 4, 4))
    w3 = tq.quantize_per_tensor(torch.randn(3, 2, 2, 2, 2) * 0.3, 0.01, 0, tq.qint8)
    assert qF.conv3d(tq_x3, w3, None, scale=0.1, zero_point=70).shape == (1, 3, 3, 3, 3)


def test_functional_conv_bad_arguments():
    _, x = quantized_inputs(torch.randn(1, 4, 6, 6))
    w = tq.quantize_per_tensor(torch.randn(4, 4, 3, 3), 0.01, 0, tq.qint8)
    with pytest.raises(NotImplementedError, match="zero-padding"):
        qF.conv2d(x, w, None, padding_mode="reflect")
    with pytest.raises(ValueError, match="must be quantized"):
        qF.conv2d(torch.randn(1, 4, 6, 6), w, None)
    with pytest.raises(NotImplementedError, match="qint8"):
        qF.conv2d(x, torch.randn(4, 4, 3, 3), None)
    with pytest.raises(ValueError, match="Input shape"):
        qF.conv3d(x, w, None)


def test_fast_kernel_matches_reference():
    ao_float = make_float(nn.Conv2d, kernel_size=3, padding=1, groups=2)
    ao_float.qconfig = tqq.get_default_qconfig("x86")
    ao_float.activation_post_process = ao_float.qconfig.activation()
    ao_float.activation_post_process(ao_float(torch.randn(2, 4, 10, 10)))
    mod = nnq.Conv2d.from_float(ao_float)
    _, x = quantized_inputs(torch.randn(2, 4, 10, 10))
    fast = mod(x)
    with kernels.reference_only():
        ref = mod(x)
    diff = (fast.int_repr().long() - ref.int_repr().long()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01
    relu = nniq.ConvReLU2d(4, 8, 3, padding=1, groups=2)
    relu.set_weight_bias(mod.weight(), mod.bias())
    relu.scale, relu.zero_point = mod.scale, mod.zero_point
    fast = relu(x)
    with kernels.reference_only():
        ref = relu(x)
    diff = (fast.int_repr().long() - ref.int_repr().long()).abs()
    assert int(diff.max()) <= 1 and float((diff > 0).float().mean()) <= 0.01


def test_from_reference_matches_torch():
    conv = make_float(nn.Conv2d, kernel_size=3, padding=1)
    obs = ao_q.PerChannelMinMaxObserver(ch_axis=0, dtype=torch.qint8,
                                        qscheme=torch.per_channel_affine)
    obs(conv.weight)
    scales, zps = obs.calculate_qparams()
    qparams = {"qscheme": torch.per_channel_affine, "dtype": torch.qint8, "scale": scales,
               "zero_point": zps, "axis": 0}
    ref = ao_nnqr.Conv2d.from_float(conv, qparams)
    ao_mod = ao_nnq.Conv2d.from_reference(ref, 0.0625, 60)
    tq_mod = nnq.Conv2d.from_reference(ref, 0.0625, 60)
    assert_same_weight(ao_mod.weight(), tq_mod.weight())
    assert torch.equal(tq_mod.bias(), ao_mod.bias())
    assert repr(tq_mod) == repr(ao_mod)
    # a fused reference container contributes its conv (nniq.ConvReLU2d.from_reference)
    fused = nni.ConvReLU2d(nn.Conv2d(4, 8, 3), nn.ReLU())  # torch's constructor takes a
    fused[0] = ref  # float Conv2d only; its FX convert puts the reference conv in afterwards
    tq_relu = nniq.ConvReLU2d.from_reference(fused, 0.0625, 60)
    assert torch.equal(tq_relu.weight().int_repr(), tq_mod.weight().int_repr())
    # per-tensor reference transposed conv
    convt = make_float(nn.ConvTranspose2d, kernel_size=2, stride=2)
    qparams = {"qscheme": torch.per_tensor_affine, "dtype": torch.qint8,
               "scale": torch.tensor(0.01), "zero_point": torch.tensor(0)}
    reft = ao_nnqr.ConvTranspose2d.from_float(convt, qparams)
    assert_same_weight(ao_nnq.ConvTranspose2d.from_reference(reft, 0.1, 60).weight(),
                       nnq.ConvTranspose2d.from_reference(reft, 0.1, 60).weight())

    class OurRef(nn.Conv2d):  # only get_quantized_weight(), no weight_* attributes
        def get_quantized_weight(self):
            return tq.quantize_per_tensor(self.weight.detach(), 0.02, 0, tq.qint8)

    ours = nnq.Conv2d.from_reference(OurRef(4, 8, 3), 0.1, 60)
    assert ours.weight().q_scale() == 0.02


def test_qat_conv_from_float():
    qat = nnqat.Conv2d(4, 8, 3, qconfig=tqq.get_default_qat_qconfig("x86"))
    qat.activation_post_process = qat.qconfig.activation()
    x = torch.randn(2, 4, 8, 8)
    qat.activation_post_process(qat(x))
    mod = nnq.Conv2d.from_float(qat, use_precomputed_fake_quant=True)
    scale, zp = qat.weight_fake_quant.calculate_qparams()
    assert torch.equal(mod.weight().q_per_channel_scales().float(), scale.float())
    _, qx = quantized_inputs(x)
    assert mod(qx).shape == (2, 8, 6, 6)


@pytest.mark.parametrize("make", [
    lambda m: m.Conv2d(3, 8, 3), lambda m: m.Conv1d(3, 6, 3, bias=False),
    lambda m: m.ConvTranspose2d(4, 8, 3), lambda m: m.Conv3d(2, 4, 2)],
    ids=["2d", "1d", "t2d", "3d"])
def test_state_dict_keys_match_torch(make):
    ours, theirs = make(nnq).state_dict(), make(ao_nnq).state_dict()
    assert list(ours) == list(theirs)
    for key in ("scale", "zero_point"):
        assert ours[key].dtype == theirs[key].dtype and ours[key].shape == theirs[key].shape
    assert ours["weight"].shape == theirs["weight"].shape
    assert (ours["bias"] is None) == (theirs["bias"] is None)
    assert list(nniq.ConvAddReLU2d(3, 8, 3).state_dict()) == list(
        ao_nniq.ConvAddReLU2d(3, 8, 3).state_dict())


@pytest.mark.parametrize("qconfig", [tqq.get_default_qconfig("x86"), tqq.default_qconfig],
                         ids=["per-channel", "per-tensor"])
def test_weights_only_round_trip(qconfig):
    conv = make_float(nn.Conv2d, kernel_size=3, padding=1, padding_mode="reflect")
    conv.qconfig = qconfig
    conv.activation_post_process = qconfig.activation()
    conv.activation_post_process(conv(torch.randn(2, 4, 8, 8)))
    mod = nnq.Conv2d.from_float(conv)
    buf = io.BytesIO()
    torch.save(mod.state_dict(), buf)
    buf.seek(0)
    fresh = nnq.Conv2d(4, 8, 3, padding=1, padding_mode="reflect")
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    _, x = quantized_inputs(torch.randn(2, 4, 8, 8))
    assert torch.equal(fresh(x).int_repr(), mod(x).int_repr())
    assert fresh.scale == mod.scale and fresh.zero_point == mod.zero_point
    assert torch.equal(fresh.weight().int_repr(), mod.weight().int_repr())
    assert fresh.weight().qscheme() == mod.weight().qscheme()
    assert torch.equal(fresh.bias(), mod.bias())
    clone = copy.deepcopy(mod)
    assert torch.equal(clone(x).int_repr(), mod(x).int_repr())


def test_load_state_dict_errors():
    sd = nnq.Conv2d(3, 8, 3).state_dict()
    with pytest.raises(RuntimeError, match="size mismatch"):
        nnq.Conv2d(3, 4, 3).load_state_dict(sd)
    bad = dict(sd, weight=sd["weight"].dequantize())
    with pytest.raises(RuntimeError, match="qint8 QTensor"):
        nnq.Conv2d(3, 8, 3).load_state_dict(bad)
    bad = dict(sd, bias=torch.zeros(5))
    with pytest.raises(RuntimeError, match="size mismatch"):
        nnq.Conv2d(3, 8, 3).load_state_dict(bad)
    missing = {k: v for k, v in sd.items() if k != "scale"}
    with pytest.raises(RuntimeError, match="Missing key"):
        nnq.Conv2d(3, 8, 3).load_state_dict(missing)


def test_bad_inputs_and_arguments_raise():
    mod = nnq.Conv2d(3, 8, 3)
    with pytest.raises(ValueError, match="must be quantized"):
        mod(torch.randn(1, 3, 5, 5))
    with pytest.raises(ValueError, match="input channels"):
        mod(tq.quantize_per_tensor(torch.randn(1, 5, 5, 5), 0.1, 0, tq.quint8))
    with pytest.raises(ValueError, match="Input shape"):
        mod(tq.quantize_per_tensor(torch.randn(3, 5, 5), 0.1, 0, tq.quint8))
    with pytest.raises(TypeError, match="quint8"):
        mod(tq.quantize_per_tensor(torch.randn(1, 3, 5, 5), 0.1, 0, tq.qint8))
    with pytest.raises(ValueError, match="circular"):
        nnq.Conv2d(3, 8, 3, padding_mode="circular")
    with pytest.raises(ValueError, match="zeros"):
        nnq.ConvTranspose2d(3, 8, 3, padding_mode="reflect")
    with pytest.raises(ValueError, match="divisible"):
        nnq.Conv2d(3, 8, 3, groups=2)
    with pytest.raises(TypeError, match="qint8"):
        mod.set_weight_bias(tq.quantize_per_tensor(torch.randn(8, 3, 3, 3), 0.1, 0, tq.quint8),
                            None)
    with pytest.raises(ValueError, match="shape"):
        mod.set_weight_bias(tq.quantize_per_tensor(torch.randn(8, 3, 2, 2), 0.1, 0, tq.qint8),
                            None)
    conv = nn.Conv2d(3, 8, 3)
    conv.qconfig = tqq.default_qconfig
    with pytest.raises(AssertionError, match="only works for"):
        nnq.Conv1d.from_float(conv)
    with pytest.raises(AssertionError, match="only works for"):
        nniq.ConvReLU2d.from_float(conv)
    add = nniq.ConvAdd2d(3, 8, 3, padding=1)
    x = tq.quantize_per_tensor(torch.randn(1, 3, 5, 5), 0.1, 0, tq.quint8)
    with pytest.raises(ValueError, match="added tensor must have the output.s shape"):
        add(x, tq.quantize_per_tensor(torch.randn(1, 8, 4, 4), 0.1, 0, tq.quint8))
    with pytest.raises(ValueError, match="must be quantized"):
        add(x, torch.randn(1, 8, 5, 5))
