"""Int8 conv kernels against torch.ao's quantized Conv1d/2d/3d / ConvTranspose2d (engine x86).

Tolerance: every kernel folds dequantize -> conv -> quantize differently in float (torch's
oneDNN, our oneDNN call, our float reference), so an output can land one step apart where it
sits within float rounding of a tie: |diff| <= 1 everywhere, exact on >= 99 % of elements.

On CPUs without VNNI / AMX (AVX2 only) torch's x86 conv saturates int16 pairs of u8 x s8
products for activations above 128 and is wrong there (see tests/conftest.py): the oracle
comparisons draw their activations with ``oracle_u8`` (0..127 on such CPUs, the full range
elsewhere); the full range is checked against the exact integer truth and the reference
(test_no_int16_saturation, test_fast_vs_reference_many_outputs).
"""
import copy
import pickle

import pytest
import torch

import torchquant as tq
from torchquant import kernels
from torchquant.kernels import cpu_isa
from torchquant.kernels.conv import (PackedConvWeight, pack_conv_weight, quantized_conv,
                                     quantized_conv_transpose)
from torchquant.kernels.post_ops import PostOp

nnq = torch.ao.nn.quantized
nniq = torch.ao.nn.intrinsic.quantized
TORCH_CONV = {1: nnq.Conv1d, 2: nnq.Conv2d, 3: nnq.Conv3d}


@pytest.fixture(autouse=True)
def _x86_engine():
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = "x86"
    yield
    torch.backends.quantized.engine = old


def random_weight(shape, per_channel, axis=0, zero_point=0):
    """int8 weights with their qparams, and the same as a torch quantized tensor."""
    w_int = torch.randint(-128, 128, shape, dtype=torch.int8)
    if per_channel:
        n = shape[axis]
        scale = torch.rand(n, dtype=torch.float64) * 0.01 + 0.001
        zp = torch.full((n,), zero_point, dtype=torch.int64)
        return w_int, scale, zp, axis, torch._make_per_channel_quantized_tensor(w_int, scale, zp,
                                                                                 axis)
    return (w_int, torch.tensor(0.004, dtype=torch.float64), torch.tensor(zero_point), None,
            torch._make_per_tensor_quantized_tensor(w_int, 0.004, zero_point))


def assert_within_one_step(got, expected, min_exact=0.99):
    assert got.shape == expected.shape
    diff = (got.to(torch.int32) - expected.to(torch.int32)).abs()
    assert diff.max().item() <= 1, f"max difference {diff.max().item()} steps"
    assert (diff == 0).float().mean().item() >= min_exact


def torch_conv_output(module, x_int, x_scale, x_zp, out_scale, out_zp):
    module.scale, module.zero_point = out_scale, out_zp
    return module(torch._make_per_tensor_quantized_tensor(x_int, x_scale, x_zp)).int_repr()


def each_kernel(op, *args, post_op="none"):
    """(name, output) of every available implementation of ``op`` (``post_op`` without a
    second operand)."""
    for name, kernel in kernels.implementations(op).items():
        if kernel.available() and (kernel.applies is None or kernel.applies(args[0], packed=args[3])):
            yield name, kernel.fn(*args, PostOp(post_op), None)


CONV2D_CASES = [  # (in, out, kernel, stride, padding, dilation, groups, batch, size)
    (8, 16, 3, 1, 1, 1, 1, 2, 9),
    (8, 12, 3, 2, 0, 1, 1, 1, 10),
    (8, 16, (3, 1), (1, 2), (1, 0), 2, 1, 1, 11),
    (8, 16, 1, 1, 0, 1, 2, 2, 6),
    (16, 16, 3, 1, 1, 1, 16, 1, 8),  # depthwise
]


@pytest.mark.parametrize("case", CONV2D_CASES)
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("x_zp", [0, 70])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv2d_matches_torch(case, per_channel, x_zp, relu, with_bias, oracle_u8):
    cin, cout, ksize, stride, padding, dilation, groups, batch, size = case
    kh, kw = (ksize, ksize) if isinstance(ksize, int) else ksize
    w_int, w_scale, w_zp, axis, torch_w = random_weight((cout, cin // groups, kh, kw), per_channel)
    bias = torch.randn(cout) if with_bias else None
    x_int = oracle_u8((batch, cin, size, size))  # what torch's oracle computes exactly here
    module = (nniq.ConvReLU2d if relu else nnq.Conv2d)(cin, cout, ksize, stride, padding,
                                                       dilation, groups, bias=with_bias)
    module.set_weight_bias(torch_w, bias)
    expected = torch_conv_output(module, x_int, 0.03, x_zp, 0.4, 60)

    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, bias, stride, padding, dilation, groups)
    post_op = "relu" if relu else "none"
    got = quantized_conv(x_int, 0.03, x_zp, packed, stride, padding, dilation, groups, 0.4, 60,
                         post_op)
    assert_within_one_step(got, expected)
    for name, out in each_kernel("quantized_conv", x_int, 0.03, x_zp, packed, 0.4, 60,
                                 post_op=post_op):
        assert_within_one_step(out, expected)


@pytest.mark.parametrize("dims", [1, 3])
@pytest.mark.parametrize("per_channel", [False, True])
def test_conv1d_conv3d_match_torch(dims, per_channel, oracle_u8):
    cin, cout, batch = 4, 6, 2
    spatial = (13,) if dims == 1 else (5, 6, 7)
    w_int, w_scale, w_zp, axis, torch_w = random_weight((cout, cin) + (3,) * dims, per_channel)
    bias = torch.randn(cout)
    x_int = oracle_u8((batch, cin) + spatial)
    module = TORCH_CONV[dims](cin, cout, 3, 1, 1)
    module.set_weight_bias(torch_w, bias)
    expected = torch_conv_output(module, x_int, 0.05, 20, 0.5, 100)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, bias, 1, 1)
    got = quantized_conv(x_int, 0.05, 20, packed, 1, 1, 1, 1, 0.5, 100)
    assert_within_one_step(got, expected)
    for name, out in each_kernel("quantized_conv", x_int, 0.05, 20, packed, 0.5, 100):
        assert_within_one_step(out, expected)


def test_fast_vs_reference_many_outputs():
    w_int, w_scale, w_zp, axis, _ = random_weight((32, 16, 3, 3), True)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, torch.randn(32), 1, 1)
    x_int = torch.randint(0, 256, (2, 16, 14, 14), dtype=torch.uint8)
    outputs = dict(each_kernel("quantized_conv", x_int, 0.02, 128, packed, 0.3, 110))
    for name, out in outputs.items():
        assert_within_one_step(out, outputs["reference"])


@pytest.mark.parametrize("dims,groups", [(1, 1), (2, 1), (2, 8), (3, 1)])
def test_no_int16_saturation(dims, groups):
    """Activations 200..255 against weights of one sign per output channel: every pair
    ``u8*s8 + u8*s8`` leaves int16, which ``vpmaddubsw`` (x86 without VNNI / AMX) saturates.
    Every kernel must still give the exactly rounded float64 truth (the torch oracle is wrong
    on such CPUs; ours runs those inputs on the reference there)."""
    cin, cout = 8, 8
    w_int = torch.randint(100, 128, (cout, cin // groups) + (3,) * dims, dtype=torch.int8)
    w_int[cout // 2:] *= -1
    packed = pack_conv_weight(w_int, torch.tensor(0.01), torch.tensor(0), None, None, 1, 1,
                              1, groups)
    x_int = torch.randint(200, 256, (2, cin) + (5,) * dims, dtype=torch.uint8)
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d,
            3: torch.nn.functional.conv3d}[dims]
    y = conv((x_int.double() - 3) * 0.05, w_int.double() * 0.01, None, 1, 1, 1, groups)
    out_scale = 4.0 if groups == 1 else 0.5
    expected = torch.clamp(torch.round(y / out_scale) + 128, 0, 255)
    assert (expected - 128).abs().max() > 30  # far from 0: a saturated sum would show
    got = quantized_conv(x_int, 0.05, 3, packed, 1, 1, 1, groups, out_scale, 128)
    assert_within_one_step(got, expected, min_exact=0.9)
    for name, out in each_kernel("quantized_conv", x_int, 0.05, 3, packed, out_scale, 128):
        assert_within_one_step(out, expected, min_exact=0.9)


def test_saturation_guard(monkeypatch):
    """Where oneDNN saturates int16 pairs (forced here; the real state on AVX2-only CPUs) a
    oneDNN conv plan runs inputs above 128 on the reference, returned channels-last like
    oneDNN's output, and inputs <= 128 on oneDNN."""
    from torchquant.kernels import onednn_exactness as exactness
    monkeypatch.setattr(exactness, "onednn_u8_exact_max", lambda: exactness.ONEDNN_SAFE_U8_MAX)
    w_int, w_scale, w_zp, axis, _ = random_weight((16, 8, 3, 3), True)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, torch.randn(16), 1, 1)
    if packed.onednn_weight is None:
        pytest.skip("oneDNN not available")
    small = torch.randint(0, 129, (2, 8, 6, 6), dtype=torch.uint8)
    big = small.clone()
    big[1, 2, 3, 4] = 200
    reference = kernels.implementations("quantized_conv")["reference"].fn
    for post_op in ("none", "relu"):
        args = (0.03, 9, packed, 1, 1, 1, 1, 0.2, 70, post_op)
        ref_args = (0.03, 9, packed, 0.2, 70, PostOp(post_op), None)
        for x in (small, big, small):  # the same plan serves all three calls
            got = quantized_conv(x, *args)
            assert got.is_contiguous(memory_format=torch.channels_last)
            if x is big:
                assert torch.equal(got, reference(x, *ref_args))
            else:
                assert_within_one_step(got, reference(x, *ref_args))


def test_layouts():
    """NCHW and channels-last inputs give the same values; oneDNN returns channels-last."""
    w_int, w_scale, w_zp, axis, _ = random_weight((16, 8, 3, 3), True)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, None, 1, 1)
    x_int = torch.randint(0, 256, (2, 8, 7, 7), dtype=torch.uint8)
    nchw = quantized_conv(x_int, 0.02, 5, packed, 1, 1, 1, 1, 0.3, 10)
    nhwc = quantized_conv(x_int.contiguous(memory_format=torch.channels_last), 0.02, 5, packed,
                          1, 1, 1, 1, 0.3, 10)
    assert nchw.shape == (2, 16, 7, 7) and torch.equal(nchw, nhwc)
    if packed.onednn_weight is not None:
        assert nchw.is_contiguous(memory_format=torch.channels_last)
    with kernels.reference_only():
        ref = quantized_conv(x_int, 0.02, 5, packed, 1, 1, 1, 1, 0.3, 10)
    assert ref.is_contiguous()
    assert_within_one_step(nchw, ref)


def test_batch_one_and_asymmetric_weights():
    w_int, w_scale, w_zp, axis, _ = random_weight((6, 4, 3, 3), True, zero_point=3)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, None, 1, 1)
    assert packed.onednn_weight is None  # oneDNN needs symmetric weights: reference
    x_int = torch.randint(0, 256, (1, 4, 5, 5), dtype=torch.uint8)
    w_hat = (w_int.double() - 3) * w_scale[:, None, None, None]
    y = torch.nn.functional.conv2d((x_int.double() - 9) * 0.05, w_hat, None, 1, 1)
    expected = torch.clamp(torch.round(y / 0.2) + 30, 0, 255)
    assert_within_one_step(quantized_conv(x_int, 0.05, 9, packed, 1, 1, 1, 1, 0.2, 30), expected)


@pytest.mark.parametrize("relu", [False, True])
def test_conv_transpose2d_matches_torch(relu, oracle_u8):
    """Per-tensor weights (torch disables per-channel transposed conv on x86).  Activations
    torch's oracle computes exactly on this CPU (ours is the reference either way)."""
    cin, cout, groups = 8, 6, 2
    w_int, w_scale, w_zp, axis, torch_w = random_weight((cin, cout // groups, 3, 3), False)
    bias = torch.randn(cout)
    x_int = oracle_u8((2, cin, 5, 5))
    module = nnq.ConvTranspose2d(cin, cout, 3, stride=2, padding=1, output_padding=1,
                                 groups=groups)
    module.set_weight_bias(torch_w, bias)
    expected = torch_conv_output(module, x_int, 0.05, 12, 0.3, 40)
    if relu:  # quantize(relu(y)) == max(quantize(y), zero_point)
        expected = torch.clamp(expected, min=40)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, bias, 2, 1, 1, groups, transposed=True,
                              output_padding=1)
    got = quantized_conv_transpose(x_int, 0.05, 12, packed, 2, 1, 1, 1, groups, 0.3, 40,
                                   "relu" if relu else "none")
    assert got.shape == expected.shape == (2, cout, 10, 10)
    assert_within_one_step(got, expected)


def test_conv_transpose_per_channel_axis1():
    """Per-output-channel weights of a transposed conv live on axis 1 of [in, out, k, k]."""
    w_int, w_scale, w_zp, axis, _ = random_weight((4, 6, 3, 3), True, axis=1)
    x_int = torch.randint(0, 256, (1, 4, 5, 5), dtype=torch.uint8)
    w_hat = w_int.double() * w_scale[None, :, None, None]
    y = torch.nn.functional.conv_transpose2d((x_int.double() - 7) * 0.05, w_hat, None, 1, 1)
    expected = torch.clamp(torch.round(y / 0.1) + 128, 0, 255)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, None, transposed=True, padding=1)
    assert_within_one_step(quantized_conv_transpose(x_int, 0.05, 7, packed, 1, 1, 0, 1, 1, 0.1,
                                                    128), expected)


def test_copy_and_pickle_repack():
    w_int, w_scale, w_zp, axis, _ = random_weight((16, 8, 3, 3), True)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, torch.randn(16), 2, 1)
    x_int = torch.randint(0, 256, (1, 8, 9, 9), dtype=torch.uint8)
    expected = quantized_conv(x_int, 0.02, 5, packed, 2, 1, 1, 1, 0.3, 10)
    for clone in (copy.deepcopy(packed), pickle.loads(pickle.dumps(packed))):
        assert isinstance(clone, PackedConvWeight) and clone.stride == (2, 2)
        assert torch.equal(quantized_conv(x_int, 0.02, 5, clone, 2, 1, 1, 1, 0.3, 10), expected)


def test_errors():
    w_int, w_scale, w_zp, axis, _ = random_weight((16, 8, 3, 3), True)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, None, 1, 1)
    x_int = torch.zeros(1, 8, 5, 5, dtype=torch.uint8)
    with pytest.raises(ValueError, match="packed for stride"):
        quantized_conv(x_int, 0.1, 0, packed, 2, 1, 1, 1, 0.1, 0)
    with pytest.raises(ValueError, match="8 channels"):
        quantized_conv(torch.zeros(1, 4, 5, 5, dtype=torch.uint8), 0.1, 0, packed, 1, 1, 1, 1,
                       0.1, 0)
    with pytest.raises(ValueError, match="4-D input"):
        quantized_conv(torch.zeros(8, 5, 5, dtype=torch.uint8), 0.1, 0, packed, 1, 1, 1, 1, 0.1, 0)
    with pytest.raises(TypeError, match="uint8 / int8"):
        quantized_conv(x_int.float(), 0.1, 0, packed, 1, 1, 1, 1, 0.1, 0)
    with pytest.raises(ValueError, match="out_scale"):
        quantized_conv(x_int, 0.1, 0, packed, 1, 1, 1, 1, -1.0, 0)
    with pytest.raises(ValueError, match="out_zero_point"):
        quantized_conv(x_int, 0.1, 0, packed, 1, 1, 1, 1, 0.1, 300)
    with pytest.raises(ValueError, match="transposed"):
        quantized_conv_transpose(x_int, 0.1, 0, packed, 1, 1, 0, 1, 1, 0.1, 0)
    with pytest.raises(ValueError, match="groups=3"):
        pack_conv_weight(w_int, w_scale, w_zp, axis, None, groups=3)
    with pytest.raises(ValueError, match="stride"):
        pack_conv_weight(w_int, w_scale, w_zp, axis, None, stride=0)
    with pytest.raises(ValueError, match="3-D, 4-D or 5-D"):
        pack_conv_weight(w_int[0, 0], w_scale, w_zp, axis, None)
    with pytest.raises(ValueError, match="axis 1"):
        pack_conv_weight(w_int, torch.ones(8), torch.zeros(8), 1, None)
    with pytest.raises(TypeError, match="int8"):
        pack_conv_weight(w_int.float(), w_scale, w_zp, axis, None)


@pytest.mark.parametrize("level", ["avx2", "default"])
@pytest.mark.parametrize("in_channels,size,stride", [(8, 4, 2), (24, 4, 2), (8, 6, 3), (16, 7, 2)])
def test_strided_pointwise_conv_is_deterministic(in_channels, size, stride, level):
    with cpu_isa.forced_cpu_isa(level):
        _check_strided_pointwise(in_channels, size, stride)


def _check_strided_pointwise(in_channels, size, stride):
    """oneDNN's int8 1x1 strided conv read memory it never wrote for some small inputs on an
    AVX2 CPU ([1, 8, 4, 4] at stride 2 changed from call to call).  torchquant runs such convs
    as the stride-1 conv of every stride-th position where oneDNN's int8 kernels are the AVX2 /
    AVX-512 ones, and calls the strided kernel directly on VNNI CPUs (no such variation there):
    every call gives the same integers, those of the stride-1 packing on the sliced input,
    within one step of the reference.  (tests/kernels/test_cpu_paths.py runs the forced-AVX2
    path on any CPU.)"""
    torch.manual_seed(3)
    w_int, w_scale, w_zp, axis, _ = random_weight((16, in_channels, 1, 1), True)
    bias = torch.randn(16)
    packed = pack_conv_weight(w_int, w_scale, w_zp, axis, bias, stride, 0)
    unit = pack_conv_weight(w_int, w_scale, w_zp, axis, bias, 1, 0)
    x_int = torch.randint(0, 128, (1, in_channels, size, size), dtype=torch.uint8)
    x_int = x_int.contiguous(memory_format=torch.channels_last)
    outs = []
    for _ in range(120):
        torch.randint(0, 256, (4096,), dtype=torch.uint8)  # recycle the allocator's blocks
        outs.append(quantized_conv(x_int, 0.0147, 0, packed, stride, 0, 1, 1, 0.0128, 40))
    for out in outs[1:]:
        assert torch.equal(out, outs[0])
    sliced = x_int[:, :, ::stride, ::stride].contiguous(memory_format=torch.channels_last)
    assert torch.equal(outs[0], quantized_conv(sliced, 0.0147, 0, unit, 1, 0, 1, 1, 0.0128, 40))
    with kernels.reference_only():
        expected = quantized_conv(x_int, 0.0147, 0, packed, stride, 0, 1, 1, 0.0128, 40)
    assert_within_one_step(outs[0], expected)
