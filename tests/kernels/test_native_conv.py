"""kernels.native: the int8 2-d conv (``torchquant_native::qconv2d``, csrc/conv.cpp).

Oracles: oneDNN's ``qconv_pointwise`` / ``qconv2d_pointwise.binary`` on the same integers (what
the compiled graph called before; the eager modules' kernel), and the exact integer
accumulation (float64 conv of small integers is exact) scaled in float32 the way both kernels
scale it.  The uint8 outputs may differ from oneDNN's by one step where a requantized value
lands within float rounding of a half-integer (oneDNN's JIT and this kernel round the same
formula through different instruction sequences): bounded below."""
import itertools

import pytest
import torch
import torch.nn.functional as F

from torchquant.kernels import native

pytestmark = pytest.mark.skipif(not (native.available() and native.exact_u8()),
                                reason="the native conv runs where fbgemm's u8 x s8 is exact")

qconv2d = torch.ops.torchquant_native.qconv2d

# in, out, kernel, size, stride, padding, dilation, groups
SHAPES = [(16, 32, 3, 10, 1, 1, 1, 1), (32, 48, 3, 9, 2, 1, 1, 1), (64, 64, 1, 8, 1, 0, 1, 1),
          (32, 64, 1, 8, 2, 0, 1, 1), (3, 16, 3, 16, 1, 1, 1, 1), (8, 16, 5, 11, 1, 2, 2, 1),
          (24, 24, 3, 10, 1, 1, 1, 24), (48, 48, 3, 11, 2, 1, 1, 48), (16, 16, 3, 9, 1, 2, 2, 16),
          (20, 20, 5, 9, 2, 2, 1, 20)]   # depthwise: 20 channels (8-wide blocks and a tail)


def _case(cin, cout, k, size, stride, pad, dil, groups, batch, per_channel, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (batch, cin, size, size), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (cout, cin // groups, k, k), dtype=torch.int8, generator=gen)
    w_scale = ((torch.rand(cout, generator=gen) * 0.01 + 0.001) if per_channel
               else torch.full((cout,), 0.004))
    bias = torch.randn(cout, generator=gen) * 3
    geometry = ([stride] * 2, [pad] * 2, [dil] * 2, groups)
    return x.contiguous(memory_format=torch.channels_last), w, w_scale, bias, geometry


def _onednn(x, x_scale, x_zp, w, w_scale, bias, geometry, other, unary, scalars, out):
    packed = torch.ops.onednn.qconv_prepack(w, w_scale, x_scale, x_zp, *geometry, None)
    w_zp = torch.zeros(w.size(0), dtype=torch.int64)
    if other is None:
        return torch.ops.onednn.qconv_pointwise(x, x_scale, x_zp, packed, w_scale, w_zp, bias,
                                                *geometry, *out, unary, scalars, "")
    q_other, o_scale, o_zp = other
    return torch.ops.onednn.qconv2d_pointwise.binary(
        x, x_scale, x_zp, packed, w_scale, w_zp, q_other.clone(), bias, *geometry, *out, o_scale,
        o_zp, "sum", 1.0, unary, scalars, "")


def _native(x, x_scale, x_zp, w, w_scale, bias, geometry, other, unary, scalars, out):
    addend = (None, 1.0, 0) if other is None else other
    return qconv2d(x, x_scale, x_zp, w, w_scale, bias, *geometry, *addend, unary, scalars, *out)


def _post_op_case(shape, batch, post):
    """A conv case with post-op ``post`` ("none", "relu", "hardtanh" or "add_relu"): the case's
    tensors, the addend (uint8 channels-last, its scale and zero point) or None, the unary
    post-op and its scalars."""
    x, w, w_scale, bias, geometry = _case(*shape, batch, True, seed=batch)
    unary = "relu" if post == "add_relu" else post
    scalars = [-1.5, 2.0] if unary == "hardtanh" else []
    other = None
    if post == "add_relu":
        out_shape = _native(x, 0.0123, 7, w, w_scale, None, geometry, None, "none", [],
                            (1.0, 0, torch.float32)).shape
        q_other = torch.randint(0, 256, out_shape, dtype=torch.uint8,
                                generator=torch.Generator().manual_seed(2))
        other = (q_other.contiguous(memory_format=torch.channels_last), 0.21, 100)
    return x, w, w_scale, bias, geometry, other, unary, scalars

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_uint8_outputs_match_onednn(shape):
    checked = differing = 0
    for batch, per_channel, post in itertools.product((1, 3), (False, True),
                                                      ("none", "relu", "hardtanh", "add",
                                                       "add_relu")):
        x, w, w_scale, bias, geometry = _case(*shape, batch, per_channel, seed=batch)
        if post.startswith("add") and geometry[3] != 1:
            continue                       # oneDNN fuses the sum for plain convs only
        other = None
        if post.startswith("add"):
            out_shape = _native(x, 0.0123, 7, w, w_scale, None, geometry, None, "none", [],
                                (1.0, 0, torch.float32)).shape
            q_other = torch.randint(0, 256, out_shape, dtype=torch.uint8,
                                    generator=torch.Generator().manual_seed(1))
            other = (q_other.contiguous(memory_format=torch.channels_last), 0.21, 100)
        unary = {"add": "none", "add_relu": "relu"}.get(post, post)
        scalars = [-1.5, 2.0] if unary == "hardtanh" else []
        args = (x, 0.0123, 131, w, w_scale, bias, geometry, other, unary, scalars,
                (0.73, 60, torch.uint8))
        got, want = _native(*args), _onednn(*args)
        assert got.dtype == want.dtype == torch.uint8 and got.shape == want.shape
        assert got.is_contiguous(memory_format=torch.channels_last)
        steps = (got.int() - want.int()).abs()
        assert steps.max() <= 1, post
        checked += got.numel()
        differing += int(steps.gt(0).sum())
    assert differing <= max(1, checked // 10_000)


def test_scratch_buffers_kept_between_calls_of_other_sizes():
    """The accumulators and fbgemm's packed activations live in per-thread buffers kept between
    calls: a conv run after a larger and a smaller one, with one or two threads, gives the
    integers it gave first; a conv above the kept size (1 M accumulators) works too."""
    small = _case(16, 32, 3, 10, 1, 1, 1, 1, 1, True)
    large = _case(32, 48, 3, 20, 1, 1, 1, 1, 4, True)
    pointwise = _case(64, 64, 1, 8, 1, 0, 1, 1, 3, True)
    huge = _case(8, 512, 1, 48, 1, 0, 1, 1, 1, True)       # 2304 x 512 accumulators

    def run(case):
        x, w, w_scale, bias, geometry = case
        return _native(x, 0.0123, 131, w, w_scale, bias, geometry, None, "relu", [],
                       (0.73, 60, torch.uint8))

    cases = {"small": small, "large": large, "pointwise": pointwise}
    first = {name: run(case) for name, case in cases.items()}
    threads = torch.get_num_threads()
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            for name in ("large", "small", "pointwise", "small", "large"):
                assert torch.equal(run(cases[name]), first[name]), (n, name)
    finally:
        torch.set_num_threads(threads)
    x, w, w_scale, bias, geometry = huge
    args = (x, 0.0123, 131, w, w_scale, bias, geometry, None, "none", [], (0.73, 60, torch.uint8))
    assert (_native(*args).int() - _onednn(*args).int()).abs().max() <= 1


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_integer_accumulation_is_exact(shape):
    """Float output, no bias: ``float(sum((x - x_zp) * w)) * (x_scale * w_scale)``, bit for bit,
    with uint8 values above 128 everywhere (where AVX2's pairwise products would saturate)."""
    for batch in (1, 2):
        x, w, w_scale, _, (stride, padding, dilation, groups) = _case(*shape, batch, True)
        x_scale, x_zp = 0.02, 3
        acc = F.conv2d(x.double() - x_zp, w.double(), None, stride, padding, dilation, groups)
        want = (acc.float() * (torch.tensor(x_scale) * w_scale).view(1, -1, 1, 1))
        got = _native(x, x_scale, x_zp, w, w_scale, None, (stride, padding, dilation, groups),
                      None, "none", [], (1.0, 0, torch.float32))
        depthwise = groups > 1
        if depthwise:   # the depthwise loop scales by x_scale, then by w_scale (oneDNN's order)
            want = (acc.float() * x_scale) * w_scale.view(1, -1, 1, 1)
        assert got.dtype == torch.float32
        assert torch.equal(got, want)


def test_float_output_matches_onednn_within_rounding():
    """oneDNN scales 1x1 convs at batch 1 in two steps, elsewhere in one: the float outputs agree
    to float32 rounding of the scale product (a few ulps), not bit for bit."""
    for shape in SHAPES:
        x, w, w_scale, bias, geometry = _case(*shape, 2, True)
        args = (x, 0.0123, 131, w, w_scale, bias, geometry, None, "relu", [],
                (1.0, 0, torch.float32))
        torch.testing.assert_close(_native(*args), _onednn(*args), rtol=1e-5, atol=1e-5)


def test_noncontiguous_input_and_addend_are_read_as_they_are():
    x, w, w_scale, bias, geometry = _case(16, 32, 3, 10, 1, 1, 1, 1, 2, True)
    out = (0.5, 10, torch.uint8)
    channels_last = _native(x, 0.0123, 131, w, w_scale, bias, geometry, None, "none", [], out)
    nchw = _native(x.contiguous(), 0.0123, 131, w, w_scale, bias, geometry, None, "none", [], out)
    assert torch.equal(channels_last, nchw)
    other = torch.randint(0, 256, nchw.shape, dtype=torch.uint8)
    before = other.clone()
    a = _native(x, 0.0123, 131, w, w_scale, bias, geometry, (other, 0.2, 9), "none", [], out)
    b = _native(x, 0.0123, 131, w, w_scale, bias, geometry,
                (other.contiguous(memory_format=torch.channels_last), 0.2, 9), "none", [], out)
    assert torch.equal(a, b)
    assert torch.equal(other, before)   # the addend is read, not summed into


def test_weight_changed_in_place_is_repacked():
    """The packed weight is cached by the weight tensor; an in-place change bumps its version and
    the next call packs again (never a stale result)."""
    x, w, w_scale, bias, geometry = _case(16, 32, 3, 10, 1, 1, 1, 1, 1, True)
    out = (1.0, 0, torch.float32)
    before = _native(x, 0.0123, 131, w, w_scale, None, geometry, None, "none", [], out)
    w.neg_()
    w[w == -128] = 127            # -(-128) wraps: keep the negation exact
    after = _native(x, 0.0123, 131, w, w_scale, None, geometry, None, "none", [], out)
    fresh = _native(x, 0.0123, 131, w.clone(), w_scale, None, geometry, None, "none", [], out)
    assert torch.equal(after, fresh) and not torch.equal(after, before)


def test_bad_arguments_name_the_problem():
    x, w, w_scale, bias, geometry = _case(16, 32, 3, 10, 1, 1, 1, 1, 1, True)
    out = (1.0, 0, torch.float32)
    with pytest.raises(TypeError, match="qconv2d"):
        _native(x.float(), 0.1, 0, w, w_scale, bias, geometry, None, "none", [], out)
    with pytest.raises(ValueError, match="qconv2d"):
        _native(x, 0.1, 0, w[:, :8].contiguous(), w_scale, bias, ([1, 1], [1, 1], [1, 1], 2),
                None, "none", [], out)         # grouped, not depthwise
    with pytest.raises(ValueError, match="qconv2d"):
        _native(x, 0.1, 0, w, w_scale, bias, geometry, None, "gelu", [], out)
    with pytest.raises(ValueError, match="qconv2d"):
        _native(x, 0.1, 0, w, w_scale, bias, geometry, None, "none", [], (1.0, 0, torch.int32))
    # the per-batch choice hands an input that is not a 4-d image to the native conv's checks
    with pytest.raises(TypeError, match="4-d uint8 activation"):
        torch.ops.torchquant_native.qconv2d_or_onednn(
            x[0], 0.1, 0, w, w_scale, bias, *geometry, None, 1.0, 0, "none", [], *out, 0, w,
            torch.zeros(w.size(0), dtype=torch.int64))


def test_conv_preferred_where_the_set_up_dominates():
    assert native.conv_preferred((1, 64, 8, 8), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert native.conv_preferred((1, 96, 16, 16), (96, 1, 3, 3), (1, 1), (1, 1), (1, 1), 96)
    assert not native.conv_preferred((64, 64, 32, 32), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert not native.conv_preferred((1, 64, 8, 8), (64, 32, 3, 3), (1, 1), (1, 1), (1, 1), 2)
    assert not native.conv_preferred((1, 64, 8, 8, 8), (64, 64, 3, 3, 3), (1,) * 3, (1,) * 3,
                                     (1,) * 3, 1)


def test_conv_preferred_without_amx_weighs_the_input_zero_point():
    """Without AMX (fbgemm's GEMM) oneDNN's kernel runs ~1.4x faster at input zero point 0 (no
    compensation): a 32x32 conv at batch 1 goes to oneDNN there and stays native at another (or
    an unknown) zero point; 1x1 convs over 64+ channels stay native up to 2048 output rows,
    depthwise ones up to 1024 rows (rows x channels halved at zero point 0)."""
    from torchquant.kernels import cpu_isa
    conv = ((1, 32, 32, 32), (32, 32, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    pointwise = ((32, 96, 8, 8), (32, 96, 1, 1), (1, 1), (0, 0), (1, 1), 1)
    depthwise = ((16, 192, 8, 8), (192, 1, 3, 3), (1, 1), (1, 1), (1, 1), 192)
    with cpu_isa.forced_cpu_isa("avx512_vnni"):
        assert not native.amx()
        assert native.conv_preferred(*conv, x_zero_point=64)
        assert native.conv_preferred(*conv)
        assert not native.conv_preferred(*conv, x_zero_point=0)
        assert not native.conv_preferred((2, 32, 32, 32), *conv[1:], x_zero_point=64)
        assert native.conv_preferred(*pointwise, x_zero_point=0)
        assert not native.conv_preferred((64, 96, 8, 8), *pointwise[1:], x_zero_point=0)
        assert native.conv_preferred(*depthwise, x_zero_point=64)
        assert not native.conv_preferred(*depthwise, x_zero_point=0)
        assert not native.conv_preferred((32, 192, 8, 8), *depthwise[1:], x_zero_point=64)


def test_where_fbgemm_would_saturate():
    """fbgemm forced to AVX2 saturates u8 x s8 pairs.  The conv is not preferred there for the
    eager kernels; it still computes the exact integers by the high-bit split (the GEMM on
    ``x & 127``, codes of 128 and above added to the accumulators from the weight: scattered
    where they are few, by a second GEMM of the high bits where many or where the padding's code,
    the zero point, is one), every geometry and post-op, the same outputs as on VNNI bit for
    bit.  The depthwise loop is torchquant's own and exact on AVX2."""
    cases = []
    for shape in SHAPES:
        for post in ("none", "relu", "add_relu"):
            if post == "add_relu" and shape[-1] != 1:
                continue
            x, w, w_scale, bias, geometry, other, unary, scalars = _post_op_case(shape, 2, post)
            for x_zp, high in ((37, 0.01), (37, 0.5), (131, 0.5), (200, 0.0)):
                # a few or many codes of 128 and above (scattered or a second GEMM), a padding
                # code of 128 and above
                g = torch.Generator().manual_seed(len(cases))
                xs = torch.where(torch.rand(x.shape, generator=g) < high, x | 128, x & 127)
                xs = xs.contiguous(memory_format=torch.channels_last)
                args = (xs, 0.0123, x_zp, w, w_scale, bias, geometry, other, unary, scalars)
                exact = [_native(*args, out) for out in ((0.73, 60, torch.uint8),
                                                         (1.0, 0, torch.float32))]
                cases.append((args, exact))
    native.force_isa("avx2")
    try:
        assert not native.exact_u8()
        assert not native.conv_preferred((1, 64, 8, 8), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
        assert native.split_conv_applies((64, 64, 3, 3), 1)
        assert native.split_conv_applies((64, 1, 3, 3), 64)
        assert not native.split_conv_applies((64, 32, 3, 3), 2)
        assert not native.split_conv_applies((32, 3, 3, 3), 1)  # an image's first conv
        for args, exact in cases:
            got = [_native(*args, out) for out in ((0.73, 60, torch.uint8),
                                                   (1.0, 0, torch.float32))]
            assert torch.equal(got[0], exact[0]) and torch.equal(got[1], exact[1]), args[6]
    finally:
        native.force_isa("auto")
    assert native.conv_preferred((1, 64, 8, 8), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)


def test_eager_conv_plans_bind_the_native_conv(monkeypatch):
    """kernels.conv.quantized_conv (what the eager modules call) takes the native conv for a
    small conv, with the post-op and the add fused; with it turned off, oneDNN's call gives the
    same integers up to its one-step rounding differences."""
    from torchquant.kernels import conv as kconv
    from torchquant.kernels.post_ops import PostOp
    x, w, w_scale, bias, (stride, padding, dilation, groups) = _case(16, 32, 3, 10, 1, 1, 1, 1, 1,
                                                                     True)
    packed = kconv.pack_conv_weight(w, w_scale.double(), torch.zeros(32, dtype=torch.long), 0,
                                    bias, stride, padding, dilation, groups)
    other = torch.randint(0, 256, (1, 32, 10, 10), dtype=torch.uint8)
    assert kconv._native_plan(x, 0.0123, 131, packed, 0.5, 10, PostOp("relu"), None) is not None

    def run():
        plain = kconv.quantized_conv(x, 0.0123, 131, packed, stride, padding, dilation, groups,
                                     0.5, 10, "relu")
        added = kconv.quantized_conv(x, 0.0123, 131, packed, stride, padding, dilation, groups,
                                     0.5, 10, "add_relu", other=other, other_scale=0.2,
                                     other_zero_point=9)
        return plain, added

    native_out = run()
    geometry = ([1, 1], [1, 1], [1, 1], 1)
    direct = _native(x, 0.0123, 131, w, w_scale, bias, geometry, None, "relu", [],
                     (0.5, 10, torch.uint8))
    assert torch.equal(native_out[0], direct)
    monkeypatch.setattr(native, "conv_preferred", lambda *args: False)
    packed.plans.clear()
    onednn_out = run()
    for a, b in zip(native_out, onednn_out):
        assert (a.int() - b.int()).abs().max() <= 1
        assert (a != b).float().mean() < 1e-3


# AMX-specific geometry: an unpadded 1x1 stride-1 conv read in place (rows not a multiple of the
# 32-row block, channels not a multiple of 4), kernel rows wider than one 64-byte tile step,
# output channels not a multiple of 32, a 7x7 stride-2 stem, 1x1 and 2x2 images (SHAPES adds a
# dilated conv).
AMX_SHAPES = [(5, 40, 1, 7, 1, 0, 1, 1), (96, 24, 1, 9, 1, 0, 1, 1), (48, 72, 3, 6, 1, 1, 1, 1),
              (3, 16, 7, 19, 2, 3, 1, 1), (40, 8, 3, 5, 1, 0, 1, 1), (64, 32, 3, 1, 1, 1, 1, 1),
              (32, 48, 3, 2, 1, 1, 1, 1)]   # the last two: im2col, the flat rows mostly padding


@pytest.mark.skipif(not native.amx(), reason="needs AMX-INT8")
@pytest.mark.parametrize("shape", [s for s in SHAPES if s[-1] == 1] + AMX_SHAPES,
                         ids=lambda s: "x".join(map(str, s)))
def test_amx_conv_equals_the_fbgemm_conv_bit_for_bit(shape):
    """The AMX tile GEMM and fbgemm's VNNI GEMM accumulate the same integers exactly and share
    the requantization order: every output equal, uint8 and float, every post-op, whichever way
    the AMX conv lays out its tiles (each layout forced where it applies)."""
    from torchquant.kernels import cpu_isa
    force_layout = torch.ops.torchquant_native.amx_conv_force_layout
    for batch, post in itertools.product((1, 3), ("none", "relu", "hardtanh", "add_relu")):
        x, w, w_scale, bias, geometry, other, unary, scalars = _post_op_case(shape, batch, post)

        def run():
            return [_native(x, 0.0123, 131, w, w_scale, bias, geometry, other, unary, scalars,
                            out) for out in ((0.73, 60, torch.uint8), (1.0, 0, torch.float32))]

        with cpu_isa.forced_cpu_isa("avx512_vnni"):
            assert not native.amx()
            want = run()
        for layout in ("", "flat", "halves", "im2col"):
            force_layout(layout)
            try:
                got = run()
            finally:
                force_layout("")
            for g, wnt in zip(got, want):
                assert torch.equal(g, wnt), (post, layout)


def _assert_every_amx_layout_equals_fbgemm(x, w, w_scale, bias, geometry):
    """The AMX conv (its own layout choice, then each layout forced) gives the fbgemm path's
    integers (ReLU, uint8 out)."""
    from torchquant.kernels import cpu_isa
    force_layout = torch.ops.torchquant_native.amx_conv_force_layout
    args = (x, 0.0123, 131, w, w_scale, bias, geometry, None, "relu", [], (0.73, 60, torch.uint8))
    with cpu_isa.forced_cpu_isa("avx512_vnni"):
        want = _native(*args)
    for layout in ("", "flat", "halves", "im2col"):
        force_layout(layout)
        try:
            assert torch.equal(_native(*args), want), (geometry, layout)
        finally:
            force_layout("")


@pytest.mark.skipif(not native.amx(), reason="needs AMX-INT8")
@pytest.mark.parametrize("threads", [2, 3])
def test_amx_conv_splits_a_large_weight_by_columns(threads):
    """Few row blocks against a packed weight of 512 KB or more: each thread takes a share of
    the columns for every row block (the tasks ordered column-major).  The same integers as the
    fbgemm path, with the threads that split the columns."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for batch in (1, 2):
            # K = 1152, N = 512: a 576 KB packed weight; 25 or 50 output pixels
            x, w, w_scale, bias, geometry = _case(128, 512, 3, 5, 1, 1, 1, 1, batch, True,
                                                  seed=batch)
            _assert_every_amx_layout_equals_fbgemm(x, w, w_scale, bias, geometry)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.skipif(not native.amx(), reason="needs AMX-INT8")
def test_amx_layout_names_are_checked():
    with pytest.raises(ValueError, match="unknown layout"):
        torch.ops.torchquant_native.amx_conv_force_layout("diagonal")


@pytest.mark.skipif(not native.amx(), reason="needs AMX-INT8")
def test_amx_conv_unequal_strides_and_paddings():
    x, w, w_scale, bias, _ = _case(24, 40, 3, 13, 1, 1, 1, 1, 2, True)
    for geometry in (([2, 1], [1, 0], [1, 1], 1), ([1, 2], [0, 2], [1, 1], 1),
                     ([1, 1], [2, 1], [1, 2], 1)):
        _assert_every_amx_layout_equals_fbgemm(x, w, w_scale, bias, geometry)


def test_conv_preferred_any_batch_only_on_amx():
    """A symbolic batch takes the native conv only where its AMX GEMM runs (it keeps up with
    oneDNN's kernel at large batches); plain convs only (the depthwise loop loses from a few
    images on)."""
    from torchquant.kernels import cpu_isa
    plain = ((64, 8, 8), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    depthwise = ((64, 8, 8), (64, 1, 3, 3), (1, 1), (1, 1), (1, 1), 64)
    assert native.conv_preferred_any_batch(*plain) == native.amx()
    assert not native.conv_preferred_any_batch(*depthwise)
    with cpu_isa.forced_cpu_isa("avx512_vnni"):
        assert not native.amx() and not native.conv_preferred_any_batch(*plain)


def _outputs_per_isa(isas, x, w, w_scale, bias, geometry, other, unary, scalars):
    """One conv's uint8 and float outputs with fbgemm forced to each of ``isas`` in turn."""
    per_isa = []
    for isa in isas:
        native.force_isa(isa)
        try:
            per_isa.append([_native(x, 0.0123, 131, w, w_scale, bias, geometry, other, unary,
                                    scalars, out)
                            for out in ((0.73, 60, torch.uint8), (1.0, 0, torch.float32))])
        finally:
            native.force_isa("auto")
    return per_isa

def test_depthwise_avx512_loops_equal_the_avx2_loops():
    """The depthwise loop and its epilogue run AVX-512 where fbgemm does; forced to AVX2 they run
    the AVX2 loops: the same outputs bit for bit (uint8 and float, every post-op)."""
    if native.isa().split("+")[0] not in ("avx512", "avx512_vnni"):
        pytest.skip("needs AVX-512")
    for shape in [s for s in SHAPES if s[-1] > 1] + [(72, 72, 3, 7, 1, 1, 1, 72)]:
        for batch, unary in itertools.product((1, 2), ("none", "relu", "hardtanh")):
            x, w, w_scale, bias, geometry = _case(*shape, batch, True, seed=batch)
            scalars = [-1.5, 2.0] if unary == "hardtanh" else []
            wide, narrow = _outputs_per_isa(("auto", "avx2"), x, w, w_scale, bias, geometry,
                                            None, unary, scalars)
            for a, b in zip(wide, narrow):
                assert torch.equal(a, b), (shape, unary)


def test_gemm_conv_avx512_epilogue_equals_the_avx2_epilogue():
    """fbgemm's GEMM conv requantizes with the AVX-512 epilogue where fbgemm runs 512-bit
    kernels (avx512_vnni) and with the AVX2 one under avx512_vnni_ymm: the same outputs bit for
    bit (uint8 and float, every post-op, the add included, a channel tail of 8)."""
    if not native.isa().startswith("avx512_vnni"):
        pytest.skip("needs AVX-512 VNNI")
    for shape in [s for s in SHAPES if s[-1] == 1] + [(16, 40, 3, 6, 1, 1, 1, 1)]:
        for batch, post in itertools.product((1, 2), ("none", "relu", "hardtanh", "add_relu")):
            x, w, w_scale, bias, geometry, other, unary, scalars = _post_op_case(shape, batch,
                                                                                 post)
            wide, narrow = _outputs_per_isa(("avx512_vnni", "avx512_vnni_ymm"), x, w, w_scale,
                                            bias, geometry, other, unary, scalars)
            for a, b in zip(wide, narrow):
                assert torch.equal(a, b), (shape, post)


@pytest.mark.skipif(not native.amx(), reason="needs AMX-INT8")
def test_conv_preferred_leaves_large_zero_point_free_convs_to_onednn():
    """An input zero point of 0 spares oneDNN its compensation: from 2048 output rows and 50 M
    MACs its AMX kernel wins (ResNet-18's 56x56 convs at batch 1); with another zero point, or
    an unknown one, or a smaller conv, the native conv keeps them."""
    big = ((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    small = ((1, 64, 16, 16), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1)
    assert not native.conv_preferred(*big, x_zero_point=0)
    assert native.conv_preferred(*big, x_zero_point=64)
    assert native.conv_preferred(*big)
    assert native.conv_preferred(*small, x_zero_point=0)
    # a symbolic batch is judged at batch 16: 4096 rows, 151 M MACs
    assert not native.conv_preferred_any_batch((64, 16, 16), *small[1:], x_zero_point=0)
    assert native.conv_preferred_any_batch((64, 16, 16), *small[1:], x_zero_point=64)
