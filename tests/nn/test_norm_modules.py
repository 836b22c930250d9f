"""Quantized BatchNorm / BNReLU / LayerNorm / GroupNorm / InstanceNorm against torch 2.13.

Batch norm reproduces torch's fused kernel, so it must match bit for bit.  Layer, group and
instance norm follow the reference definition (dequantize, normalize in float, quantize)
while torch's kernels compute the statistics from the integers; the two agree except where a
value lands within float rounding of a tie, so they may differ by one step on at most 1% of
the elements (in practice they match).
"""
import io

import pytest
import torch
import torch.ao.nn.intrinsic as nni
import torch.ao.nn.intrinsic.quantized as nniq
import torch.ao.nn.quantized as nnq
from torch.ao.quantization import MinMaxObserver

import torchquant as tq
from torchquant.nn.intrinsic.quantized.modules import bn_relu
from torchquant.nn.quantized.modules import batchnorm, normalization

BN_KEYS = ["weight", "bias", "running_mean", "running_var", "num_batches_tracked", "scale",
           "zero_point"]


def make_pair(shape, scale, zero_point, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randint(0, 256, shape, generator=gen) - zero_point).float() * scale
    return (torch.quantize_per_tensor(x, scale, zero_point, torch.quint8),
            tq.quantize_per_tensor(x, scale, zero_point, tq.quint8))


def assert_same(theirs, ours):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-12)
    assert ours.q_zero_point() == theirs.q_zero_point()
    assert torch.equal(ours.int_repr(), theirs.int_repr())


def assert_within_one_step(theirs, ours):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-12)
    assert ours.q_zero_point() == theirs.q_zero_point()
    diff = (ours.int_repr().int() - theirs.int_repr().int()).abs()
    assert diff.max() <= 1 and (diff > 0).float().mean() <= 0.01


def roundtrip(module):
    buffer = io.BytesIO()
    torch.save(module.state_dict(), buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def fill_bn(mod, channels, seed, ties=False):
    gen = torch.Generator().manual_seed(seed)
    if ties:  # unit weight and variance: outputs land on half steps
        weight, bias = torch.ones(channels), torch.randint(-3, 3, (channels,), generator=gen) * 0.05
        mean, var = torch.zeros(channels), torch.ones(channels) - 1e-5
    else:
        weight, bias = torch.randn(channels, generator=gen), torch.randn(channels, generator=gen)
        mean, var = torch.randn(channels, generator=gen), torch.rand(channels, generator=gen) + 0.1
    mod.weight = torch.nn.Parameter(weight)
    mod.bias = torch.nn.Parameter(bias)
    mod.running_mean, mod.running_var = mean, var
    mod.scale, mod.zero_point = torch.tensor(0.1 if ties else 0.07), torch.tensor(9)
    return mod


BN_PAIRS = [(nnq.BatchNorm2d, batchnorm.BatchNorm2d, 4),
            (nnq.BatchNorm3d, batchnorm.BatchNorm3d, 5),
            (nniq.BNReLU2d, bn_relu.BNReLU2d, 4), (nniq.BNReLU3d, bn_relu.BNReLU3d, 5)]


@pytest.mark.parametrize("theirs_cls,ours_cls,ndim", BN_PAIRS,
                         ids=["BatchNorm2d", "BatchNorm3d", "BNReLU2d", "BNReLU3d"])
def test_batch_norm_bit_exact(theirs_cls, ours_cls, ndim):
    """8 channels run torch's scalar loop, 72 its 64-lane vectors plus a remainder."""
    for channels in (8, 72):
        for ties in (False, True):
            theirs_mod = fill_bn(theirs_cls(channels), channels, channels, ties)
            ours_mod = fill_bn(ours_cls(channels), channels, channels, ties)
            shape = (2, channels) + (3, 4, 5)[5 - ndim:]
            theirs, ours = make_pair(shape, 0.05, 101, seed=channels)
            assert_same(theirs_mod(theirs), ours_mod(ours))
    assert ours_mod._get_name() == theirs_mod._get_name()


def test_batch_norm_state_from_float_and_roundtrip():
    float_bn = fill_bn(torch.nn.BatchNorm2d(6), 6, 1)
    del float_bn.scale, float_bn.zero_point
    float_bn.eval()
    data = torch.randn(2, 6, 4, 4)
    float_bn.activation_post_process = MinMaxObserver()
    float_bn.activation_post_process(float_bn(data))
    theirs_mod = nnq.BatchNorm2d.from_float(float_bn)
    ours_mod = batchnorm.BatchNorm2d.from_float(float_bn)
    theirs, ours = make_pair((2, 6, 4, 4), 0.04, 128)
    assert_same(theirs_mod(theirs), ours_mod(ours))
    state = ours_mod.state_dict()
    assert list(state) == BN_KEYS == list(theirs_mod.state_dict())
    assert state["scale"].dtype == torch.float32 and state["scale"].dim() == 0
    assert state["zero_point"].dtype == torch.int64 and state["zero_point"].dim() == 0
    fresh = batchnorm.BatchNorm2d(6)
    fresh.load_state_dict(roundtrip(ours_mod))
    assert_same(theirs_mod(theirs), fresh(ours))

    fused = nni.BNReLU2d(float_bn, torch.nn.ReLU())
    fused.activation_post_process = float_bn.activation_post_process
    assert_same(nniq.BNReLU2d.from_float(fused)(theirs), bn_relu.BNReLU2d.from_float(fused)(ours))
    with pytest.raises(ValueError, match=r"Input shape must be `\(N, C, H, W\)`!"):
        bn_relu.BNReLU2d(6)(ours[0])
    with pytest.raises(ValueError, match=r"Input shape must be `\(N, C, D, H, W\)`!"):
        bn_relu.BNReLU3d(6)(ours)


def _affine(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    return (torch.nn.Parameter(torch.rand(shape, generator=gen) + 0.5),
            torch.nn.Parameter(torch.randn(shape, generator=gen)))


def _norm_pairs():
    w, b = _affine((5, 6), 0)
    yield "LayerNorm", nnq.LayerNorm([5, 6], w, b, 0.05, 100), \
        normalization.LayerNorm([5, 6], w, b, 0.05, 100), (3, 4, 5, 6)
    w, b = _affine(8, 1)
    yield "GroupNorm", nnq.GroupNorm(4, 8, w, b, 0.04, 90), \
        normalization.GroupNorm(4, 8, w, b, 0.04, 90), (3, 8, 5, 6)
    instance_norms = [(nnq.InstanceNorm1d, normalization.InstanceNorm1d),
                      (nnq.InstanceNorm2d, normalization.InstanceNorm2d),
                      (nnq.InstanceNorm3d, normalization.InstanceNorm3d)]
    for n, (theirs_cls, ours_cls) in enumerate(instance_norms):
        w, b = _affine(8, 2 + n)
        yield theirs_cls.__name__, theirs_cls(8, w, b, 0.04, 90, affine=True), \
            ours_cls(8, w, b, 0.04, 90, affine=True), (3, 8) + (5, 6, 4)[:n + 1]


NORMS = list(_norm_pairs())


@pytest.mark.parametrize("name,theirs_mod,ours_mod,shape", NORMS, ids=[n[0] for n in NORMS])
def test_norm_modules_within_one_step(name, theirs_mod, ours_mod, shape):
    assert ours_mod._get_name() == theirs_mod._get_name()
    for seed, (scale, zero_point) in enumerate([(0.05, 101), (0.1, 30), (0.02, 200)]):
        theirs, ours = make_pair(shape, scale, zero_point, seed)
        assert_within_one_step(theirs_mod(theirs), ours_mod(ours))
    state = ours_mod.state_dict()
    assert list(state) == ["weight", "bias", "scale", "zero_point"] == list(theirs_mod.state_dict())
    assert state["scale"].dtype == torch.float32 and state["zero_point"].dtype == torch.int64
    loaded = roundtrip(ours_mod)
    assert all(torch.equal(loaded[k], state[k]) for k in state)


def test_norm_from_float_and_parameter_check():
    float_ln = torch.nn.LayerNorm(6)
    float_ln.activation_post_process = MinMaxObserver()
    float_ln.activation_post_process(float_ln(torch.randn(4, 6)))
    theirs, ours = make_pair((4, 6), 0.03, 120)
    assert_within_one_step(nnq.LayerNorm.from_float(float_ln)(theirs),
                           normalization.LayerNorm.from_float(float_ln)(ours))
    float_gn = torch.nn.GroupNorm(2, 4)
    float_gn.activation_post_process = float_ln.activation_post_process
    theirs, ours = make_pair((2, 4, 3), 0.03, 120)
    assert_within_one_step(nnq.GroupNorm.from_float(float_gn)(theirs),
                           normalization.GroupNorm.from_float(float_gn)(ours))
    float_in = torch.nn.InstanceNorm1d(4, affine=True)
    float_in.activation_post_process = float_ln.activation_post_process
    assert_within_one_step(nnq.InstanceNorm1d.from_float(float_in)(theirs),
                           normalization.InstanceNorm1d.from_float(float_in)(ours))
    with pytest.raises(TypeError):
        normalization.LayerNorm(6, torch.ones(6), torch.zeros(6), 0.1, 0)
