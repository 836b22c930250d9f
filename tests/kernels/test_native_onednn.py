"""kernels.native.onednn: oneDNN's own library -- int8 conv primitives kept between calls, and the
exact int8 GEMM the native dynamic Linear takes its accumulator from.

Oracle: torch.ao's quantized conv (``torch.ops.quantized.conv2d`` / ``conv2d_relu``, x86
engine), bit for bit -- including where a requantized value lands on a half-integer within
float rounding, which the order of the scale products decides (torch rounds
``acc * x_scale`` before multiplying by the weight scale; a dedicated case below).  Runs where
the library loaded and its products are exact (:func:`onednn.available`).  The GEMM: exact
integer products, and the native dynamic Linear's numbers unchanged by it (fbgemm's own GEMM's,
which are torch.ao's)."""
import numpy as np
import pytest
import torch
import torch.ao.nn.intrinsic.quantized as ao_nniq
import torch.ao.nn.quantized as ao_nnq

import torchquant as tq
import torchquant.nn.intrinsic.quantized as tq_nniq
import torchquant.nn.quantized as tq_nnq
from torchquant.kernels import conv as kernels_conv
from torchquant.kernels.native import onednn
from conftest import run_python

needs_library = pytest.mark.skipif(not onednn.available(), reason=onednn.describe())

# in, out, kernel, size, stride, padding, dilation, groups
SHAPES = [(16, 32, 3, 10, 1, 1, 1, 1), (32, 48, 3, 9, 2, 1, 1, 1), (64, 64, 1, 8, 2, 0, 1, 1),
          (3, 16, 7, 20, 2, 3, 1, 1), (8, 16, 5, 11, 1, 2, 2, 1), (24, 24, 3, 10, 1, 1, 1, 24),
          (32, 32, 3, 9, 1, 1, 1, 4)]


def _qweight(cout, cin_per_group, k, gen):
    w = torch.randn(cout, cin_per_group, k, k, generator=gen) * 0.05
    scale = w.abs().amax((1, 2, 3)).double() / 127
    return w, scale


def _torch_ao_conv(w, scale, bias, shape, relu):
    cin, cout, k, _, stride, pad, dil, groups = shape
    qw = torch.quantize_per_channel(w, scale, torch.zeros(cout, dtype=torch.long), 0, torch.qint8)
    cls = ao_nniq.ConvReLU2d if relu else ao_nnq.Conv2d
    mod = cls(cin, cout, k, stride, pad, dil, groups)
    mod.set_weight_bias(qw, bias)
    return qw.int_repr(), mod


@needs_library
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_zp", [0, 77])
@pytest.mark.parametrize("relu", [False, True])
def test_plan_matches_torch_ao(shape, x_zp, relu):
    gen = torch.Generator().manual_seed(sum(shape) + x_zp + relu)
    cin, cout, k, size, stride, pad, dil, groups = shape
    w, scale = _qweight(cout, cin // groups, k, gen)
    for with_bias in (True, False):
        bias = torch.randn(cout, generator=gen) if with_bias else None
        w_int, ao_conv = _torch_ao_conv(w, scale, bias, shape, relu)
        for batch in (1, 2):
            x = torch.rand(batch, cin, size, size, generator=gen)
            qx = torch.quantize_per_tensor(x, 0.013, x_zp, torch.quint8)
            plan = onednn.conv_plan(w_int, scale.float(), bias, qx.shape, [stride] * 2,
                                    [pad] * 2, [dil] * 2, groups, "relu" if relu else "none",
                                    x_zero_point=x_zp)
            for out_scale, out_zp in ((0.05, 0), (0.11, 128)):
                want = torch.ops.quantized.conv2d_relu if relu else torch.ops.quantized.conv2d
                expected = want(qx, ao_conv._packed_params, out_scale, out_zp).int_repr()
                got = onednn.conv(qx.int_repr(), plan, 0.013, x_zp, out_scale, out_zp)
                assert got.is_contiguous(memory_format=torch.channels_last)
                assert torch.equal(got, expected)


def _orders(acc, w_scale):
    """round(((acc * 0.01) * w_scale) * (1 / 0.05)) (torch's order) and
    round((acc * (0.01 * w_scale)) * (1 / 0.05)) (oneDNN's own scales), in float32."""
    f = np.float32
    inv_out = f(f(1) / f(0.05))
    torch_order = f(f(f(f(acc) * f(0.01)) * f(w_scale)) * inv_out)
    fused = f(f(f(acc) * f(f(0.01) * f(w_scale))) * inv_out)
    return int(np.rint(torch_order)), int(np.rint(fused))


def _tie_case():
    """(acc, weight scale) whose requantized value lands on a half-integer within float32
    rounding, so that the two orders of :func:`_orders` give different codes: weight scales a
    few ulps around the one that puts acc exactly on a half."""
    for acc in range(20_000, 60_000, 7):
        half = (acc % 97) + 0.5
        base = np.float32(half * 0.05 / (acc * 0.01))
        for ulps in range(-4, 5):
            w_scale = float(np.nextafter(base, np.float32(np.inf) if ulps > 0 else np.float32(0),
                                         dtype=np.float32)) if ulps else float(base)
            for _ in range(abs(ulps) - 1):
                w_scale = float(np.nextafter(np.float32(w_scale),
                                             np.float32(np.inf if ulps > 0 else 0)))
            torch_order, fused = _orders(acc, w_scale)
            if torch_order != fused:
                return acc, w_scale
    raise AssertionError("no tie case found")


@needs_library
def test_scale_products_rounded_in_torch_order():
    acc, w_scale = _tie_case()
    # a 1x1 conv over 4 channels: codes (255, 255, 255, r) against weights (q0, q1, q2, 1)
    # make the accumulator exactly acc
    high = acc // 255
    codes, weights = [], []
    for _ in range(3):
        part = min(high, 127)
        codes.append(255)
        weights.append(part)
        high -= part
    codes.append(acc - 255 * sum(weights))
    weights.append(1)
    assert 0 <= codes[-1] <= 255 and high == 0
    x = torch.tensor(codes, dtype=torch.uint8).view(1, 4, 1, 1)
    w = torch.tensor(weights, dtype=torch.int8).view(1, 4, 1, 1)
    plan = onednn.conv_plan(w, torch.tensor([w_scale]), None, x.shape, [1, 1], [0, 0], [1, 1], 1,
                            "none", x_zero_point=0)
    got = onednn.conv(x, plan, 0.01, 0, 0.05, 0).item()
    qw = torch.quantize_per_channel(w.float() * w_scale, torch.tensor([w_scale], dtype=torch.double),
                                    torch.zeros(1, dtype=torch.long), 0, torch.qint8)
    ao_conv = ao_nnq.Conv2d(4, 1, 1, bias=False)
    ao_conv.set_weight_bias(qw, None)
    qx = torch.quantize_per_tensor(x.float() * 0.01, 0.01, 0, torch.quint8)
    assert torch.equal(qx.int_repr(), x) and torch.equal(qw.int_repr(), w)
    expected = torch.ops.quantized.conv2d(qx, ao_conv._packed_params, 0.05, 0).int_repr().item()
    assert got == expected == _orders(acc, w_scale)[0] != _orders(acc, w_scale)[1]


@needs_library
def test_float_output_is_the_scaled_accumulator():
    gen = torch.Generator().manual_seed(5)
    x = torch.randint(0, 256, (2, 16, 7, 7), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (8, 16, 3, 3), dtype=torch.int8, generator=gen)
    plan = onednn.conv_plan(w, torch.ones(8), None, x.shape, [1, 1], [1, 1], [1, 1], 1, "none",
                            torch.float32, x_zero_point=3)
    got = onednn.conv(x, plan, 1.0, 3, 1.0, 0)
    want = torch.nn.functional.conv2d(x.double() - 3, w.double(), None, 1, 1)
    assert torch.equal(got.double(), want)


@needs_library
def test_same_integers_at_one_and_two_threads():
    gen = torch.Generator().manual_seed(6)
    x = torch.randint(0, 256, (2, 32, 12, 12), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (64, 32, 3, 3), dtype=torch.int8, generator=gen)
    plan = onednn.conv_plan(w, torch.rand(64, generator=gen) * 1e-3 + 1e-4, torch.randn(64), x.shape,
                            [1, 1], [1, 1], [1, 1], 1, "relu", x_zero_point=9)
    threads = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2, 1):
            torch.set_num_threads(n)
            outs.append(onednn.conv(x, plan, 0.02, 9, 0.3, 5))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@needs_library
def test_bad_calls_name_the_problem():
    w = torch.zeros(8, 4, 3, 3, dtype=torch.int8)
    plan = onednn.conv_plan(w, torch.ones(8), None, (1, 4, 6, 6), [1, 1], [1, 1], [1, 1], 1,
                            "none", x_zero_point=0)
    x = torch.zeros(1, 4, 6, 6, dtype=torch.uint8)
    with pytest.raises(ValueError, match="input shape"):
        onednn.conv(torch.zeros(1, 4, 7, 7, dtype=torch.uint8), plan, 1.0, 0, 1.0, 0)
    with pytest.raises(ValueError, match="zero point 0"):
        onednn.conv(x, plan, 1.0, 5, 1.0, 0)
    with pytest.raises(TypeError, match="uint8"):
        onednn.conv(x.to(torch.int8), plan, 1.0, 0, 1.0, 0)
    with pytest.raises(TypeError, match="int8"):
        onednn.conv_plan(w.float(), torch.ones(8), None, (1, 4, 6, 6), [1, 1], [1, 1], [1, 1], 1,
                         "none")
    with pytest.raises(ValueError, match="groups"):
        onednn.conv_plan(w, torch.ones(8), None, (1, 6, 6, 6), [1, 1], [1, 1], [1, 1], 1, "none")
    with pytest.raises(ValueError, match="unary"):
        onednn.conv_plan(w, torch.ones(8), None, (1, 4, 6, 6), [1, 1], [1, 1], [1, 1], 1, "gelu")


@needs_library
def test_eager_conv_modules_keep_a_primitive_and_equal_torch_ao():
    """The eager ConvReLU2d at a ResNet-like size (oneDNN's, not the native conv's range) runs
    the kept primitive and gives torch.ao's integers."""
    gen = torch.Generator().manual_seed(7)
    w, scale = _qweight(64, 64, 3, gen)
    bias = torch.randn(64, generator=gen)
    qw = tq.quantize_per_channel(w, scale, torch.zeros(64, dtype=torch.long), 0, tq.qint8)
    ours = tq_nniq.ConvReLU2d(64, 64, 3, 1, 1)
    ours.set_weight_bias(qw, bias)
    ours.scale, ours.zero_point = 0.07, 0
    _, theirs = _torch_ao_conv(w, scale, bias, (64, 64, 3, 40, 1, 1, 1, 1), True)
    theirs.scale, theirs.zero_point = 0.07, 0
    x = torch.rand(1, 64, 40, 40, generator=gen)
    for _ in range(2):  # the first call builds the plan, the second reuses it
        got = ours(tq.quantize_per_tensor(x, 0.01, 0, tq.quint8))
    expected = theirs(torch.quantize_per_tensor(x, 0.01, 0, torch.quint8))
    assert torch.equal(got.int_repr(), expected.int_repr())
    plans = list(ours._packed_params.plans.values())
    assert plans and all(p.__qualname__.startswith("bound_conv") for p in plans)


@needs_library
@needs_library
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("x_zp", [0, 60])
def test_conv_add_modules_equal_torch_ao(relu, x_zp):
    """ConvAdd2d / ConvAddReLU2d (what FX's x86 backend config fuses a ResNet block's conv and
    add into): the kept primitive sums the addend's codes in place, torch.ao's integers."""
    gen = torch.Generator().manual_seed(9 + relu + x_zp)
    cin, cout = 32, 48
    w, scale = _qweight(cout, cin, 3, gen)
    bias = torch.randn(cout, generator=gen)
    qw_ao = torch.quantize_per_channel(w, scale, torch.zeros(cout, dtype=torch.long), 0,
                                       torch.qint8)
    qw = tq.quantize_per_channel(w, scale, torch.zeros(cout, dtype=torch.long), 0, tq.qint8)
    ao_cls = ao_nniq.ConvAddReLU2d if relu else ao_nniq.ConvAdd2d
    tq_cls = tq_nniq.ConvAddReLU2d if relu else tq_nniq.ConvAdd2d
    engine = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn"  # torch's conv-add runs on this engine only
    try:
        theirs = ao_cls(cin, cout, 3, 1, 1)
        theirs.set_weight_bias(qw_ao, bias)
    finally:
        torch.backends.quantized.engine = engine
    ours = tq_cls(cin, cout, 3, 1, 1)
    ours.set_weight_bias(qw, bias)
    for m in (theirs, ours):
        m.scale, m.zero_point = 0.09, 11
    for batch in (1, 3):
        x = torch.rand(batch, cin, 30, 30, generator=gen)
        other = torch.randn(batch, cout, 30, 30, generator=gen)
        q = lambda lib, t, s, z, dt: lib.quantize_per_tensor(t, s, z, dt)
        for _ in range(2):
            got = ours(q(tq, x, 0.01, x_zp, tq.quint8), q(tq, other, 0.05, 130, tq.quint8))
        torch.backends.quantized.engine = "onednn"
        try:
            expected = theirs(q(torch, x, 0.01, x_zp, torch.quint8),
                              q(torch, other, 0.05, 130, torch.quint8))
        finally:
            torch.backends.quantized.engine = engine
        assert torch.equal(got.int_repr(), expected.int_repr())
    assert any(p.__qualname__.startswith("bound_conv") for p in ours._packed_params.plans.values())


@needs_library
def test_a_primitive_oneDNN_refuses_leaves_the_conv_to_the_public_op(monkeypatch):
    def refuse(*args, **kwargs):
        raise RuntimeError("could not create a primitive descriptor")
    monkeypatch.setattr(onednn, "conv_plan", refuse)
    gen = torch.Generator().manual_seed(10)
    w, scale = _qweight(32, 32, 3, gen)
    qw = tq.quantize_per_channel(w, scale, torch.zeros(32, dtype=torch.long), 0, tq.qint8)
    conv = tq_nnq.Conv2d(32, 32, 3, 1, 1)
    conv.set_weight_bias(qw, None)
    _, theirs = _torch_ao_conv(w, scale, None, (32, 32, 3, 40, 1, 1, 1, 1), False)
    for m in (conv, theirs):
        m.scale, m.zero_point = 0.04, 3
    x = torch.rand(1, 32, 40, 40, generator=gen)
    got = conv(tq.quantize_per_tensor(x, 0.01, 0, tq.quint8))
    expected = theirs(torch.quantize_per_tensor(x, 0.01, 0, torch.quint8))
    assert torch.equal(got.int_repr(), expected.int_repr())
    assert not any(p.__qualname__.startswith("bound_conv")
                   for p in conv._packed_params.plans.values())


def test_disabled_library_leaves_the_eager_path(monkeypatch):
    monkeypatch.setattr(onednn, "available", lambda: False)
    gen = torch.Generator().manual_seed(8)
    w, scale = _qweight(32, 32, 3, gen)
    qw = tq.quantize_per_channel(w, scale, torch.zeros(32, dtype=torch.long), 0, tq.qint8)
    conv = tq_nnq.Conv2d(32, 32, 3, 1, 1)
    conv.set_weight_bias(qw, None)
    conv(tq.quantize_per_tensor(torch.rand(1, 32, 40, 40), 0.01, 0, tq.quint8))
    assert not any(p.__qualname__.startswith("bound_conv")
                   for p in conv._packed_params.plans.values())


def test_switched_off_the_eager_convs_run_without_it():
    """``TORCHQUANT_ONEDNN_LIBRARY=0``: the library is not loaded, says why, and an eager
    conv still runs (the public oneDNN op or the native conv)."""
    code = ("import torch, torchquant as tq, torchquant.nn.quantized as nnq\n"
            "from torchquant.kernels.native import onednn\n"
            "assert not onednn.available() and 'TORCHQUANT_ONEDNN_LIBRARY=0' in onednn.describe()\n"
            "c = nnq.Conv2d(32, 32, 3, 1, 1)\n"
            "x = tq.quantize_per_tensor(torch.rand(1, 32, 40, 40), 0.01, 0, tq.quint8)\n"
            "print(c(x).shape)\n"
            "assert not hasattr(torch.ops.torchquant_native, 'onednn_conv')\n")
    assert "torch.Size([1, 32, 40, 40])" in run_python(code, TORCHQUANT_ONEDNN_LIBRARY="0").stdout


# ---- the int8 GEMM the native fbgemm Linear takes its accumulator from ------------------------

@needs_library
@pytest.mark.parametrize("m, k, n", [(1, 96, 40), (37, 200, 72), (300, 64, 33), (513, 384, 160)])
def test_int8_matmul_is_exact(m, k, n):
    gen = torch.Generator().manual_seed(m + k + n)
    a = torch.randint(0, 256, (m, k), dtype=torch.uint8, generator=gen)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen)
    assert torch.equal(onednn.int8_matmul(a, w).long(), a.long() @ w.long().t())


@needs_library
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("weight_zp", [0, 5])
@pytest.mark.parametrize("relu", [False, True])
def test_dynamic_linear_numbers_with_and_without_the_onednn_gemm(per_channel, weight_zp, relu):
    """fbgemm's epilogue on oneDNN's accumulator (from 256 rows) gives the numbers of fbgemm's
    own GEMM -- torch.ao's (tests/kernels/test_native.py) -- bit for bit."""
    from torchquant.kernels import native
    if not (native.available() and native.exact_u8()):
        pytest.skip("fbgemm's full-range products are not exact here")
    gen = torch.Generator().manual_seed(11)
    n, k = 96, 160
    w = torch.randint(-100, 100, (n, k), dtype=torch.int8, generator=gen)
    scale = torch.rand(n if per_channel else 1, generator=gen) * 0.01 + 0.001
    zp = torch.full_like(scale, weight_zp, dtype=torch.long)
    pack = torch.ops.torchquant_native.fbgemm_pack_linear(w, scale, zp, torch.randn(n, generator=gen))
    address = onednn.int8_gemm_provider()
    set_provider = torch.ops.torchquant_native.set_int8_gemm_provider
    try:
        for m in (255, 256, 700):
            x = torch.randn(m, k, generator=gen) * 3
            set_provider(address)
            with_onednn = torch.ops.torchquant_native.fbgemm_linear_dynamic(x, pack, True, relu)
            set_provider(0)
            fbgemm_only = torch.ops.torchquant_native.fbgemm_linear_dynamic(x, pack, True, relu)
            assert torch.equal(with_onednn, fbgemm_only)
    finally:
        native._apply_int8_gemm_provider()


@needs_library
def test_dynamic_linear_module_equals_torch_ao_with_the_onednn_gemm():
    from torchquant.kernels import native
    if not (native.available() and native.exact_u8()):
        pytest.skip("fbgemm's full-range products are not exact here")
    import torch.ao.nn.quantized.dynamic as ao_nnqd
    import torchquant.nn.quantized.dynamic as tq_nnqd
    assert torch.ops.torchquant_native.int8_gemm_provider_set()
    gen = torch.Generator().manual_seed(12)
    w = torch.randn(128, 192, generator=gen) * 0.05
    scale = (w.abs().amax(1) / 127).double()
    zp = torch.zeros(128, dtype=torch.long)
    theirs = ao_nnqd.Linear(192, 128)
    theirs.set_weight_bias(torch.quantize_per_channel(w, scale, zp, 0, torch.qint8), None)
    ours = tq_nnqd.Linear(192, 128)
    ours.set_weight_bias(tq.quantize_per_channel(w, scale, zp, 0, tq.qint8), None)
    x = torch.randn(4, 100, 192, generator=gen)  # 400 rows
    assert torch.equal(ours(x), theirs(x))


@needs_library
def test_saturating_choices_turn_the_library_off():
    """Under a saturating CPU cap (TORCHQUANT_CPU_ISA=avx2) the kept convs and the Linear's
    oneDNN GEMM stand down, as every other exact-products path does; forcing fbgemm lower
    unsets the GEMM, 'auto' sets it again."""
    code = ("import torch\n"
            "from torchquant.kernels import native\n"
            "from torchquant.kernels.native import onednn\n"
            "assert native.available() and not onednn.available()\n"
            "assert not torch.ops.torchquant_native.int8_gemm_provider_set()\n"
            "print('ok')\n")
    assert "ok" in run_python(code, TORCHQUANT_CPU_ISA="avx2").stdout
    from torchquant.kernels import native
    assert native.available() and torch.ops.torchquant_native.int8_gemm_provider_set()
    try:
        native.force_isa("avx2")
        assert not torch.ops.torchquant_native.int8_gemm_provider_set()
    finally:
        native.force_isa("auto")
    assert torch.ops.torchquant_native.int8_gemm_provider_set()
