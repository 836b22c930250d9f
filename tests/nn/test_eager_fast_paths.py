"""The plain-eager fast paths of converted static models pin the general path's results.

Quantized Conv / Linear modules keep, per packed weight, the checked and bound kernel call of
each distinct call signature (input layout and qparams, output qparams, kernel mode); the
quantize stub keeps its quantize operands; QTensor's layout functions (flatten, reshape, ...)
act on the integers directly; max pooling and small residual adds rerun a per-signature plan.
Every test here checks that such a repeated call gives exactly the integers, qparams, dtype
and shape of the general path -- and that subclasses, new qparams, new weights and the
reference kernel mode do not reuse a stale entry.
"""
import cProfile
import copy
import pickle
import pstats

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import torchquant as tq
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.nn.quantized as nnq
from torchquant import kernels
from torchquant.examples import digits
from torchquant.ops import binary as ops_binary
from torchquant.ops import pooling
from torchquant.tensor import QTensor


class SubQTensor(QTensor):
    """A QTensor subclass: never taken by the fast paths."""


def _q(x, scale=0.05, zero_point=3, dtype=tq.quint8):
    return tq.quantize_per_tensor(x, scale, zero_point, dtype)


def _general_conv(mod, q):
    return mod._conv(mod._quantized_input(q))


def _same(a, b):
    assert type(a) is type(b) is QTensor
    assert a.qdtype is b.qdtype and a.dtype == b.dtype
    assert a.shape == b.shape and a.stride() == b.stride()
    assert a.q_scale() == b.q_scale() and a.q_zero_point() == b.q_zero_point()
    assert torch.equal(a.int_repr(), b.int_repr())


def _conv_module(cls, spatial, cin=4, cout=6, **kw):
    mod = cls(cin, cout, 3, padding=1, **kw)
    w = torch.randn(cout, cin, *(3,) * spatial) * 0.2
    mod.set_weight_bias(tq.quantize_per_channel(w, torch.rand(cout).double() * 0.01 + 0.002,
                                                torch.zeros(cout, dtype=torch.long), 0,
                                                tq.qint8), torch.randn(cout))
    mod.scale, mod.zero_point = 0.07, 60
    return mod


@pytest.mark.parametrize("cls,spatial", [(nnq.Conv1d, 1), (nnq.Conv2d, 2), (nnq.Conv3d, 3),
                                         (nniq.ConvReLU1d, 1), (nniq.ConvReLU2d, 2),
                                         (nniq.ConvReLU3d, 3)])
@pytest.mark.parametrize("high", [1.0, 12.0])  # 12: integers above 128 (the split kernels)
def test_conv_repeated_call_matches_general_path(cls, spatial, high):
    mod = _conv_module(cls, spatial)
    x = torch.rand(2, 4, *(5,) * spatial) * high
    q = _q(x, 0.05, 3)
    first = mod(q)
    assert len(mod._eager_calls) == (1 if kernels.mode() == "auto" else 0)
    again = mod(q)
    _same(again, first)
    _same(again, _general_conv(mod, q))
    _same(mod(_q(x, 0.05, 3)), first)  # a new input tensor with the same signature
    assert again.q_scale() == 0.07 and again.q_zero_point() == 60


def test_conv_cache_follows_qparams_weight_mode_and_subclasses():
    mod = _conv_module(nnq.Conv2d, 2)
    q = _q(torch.rand(1, 4, 6, 6) * 3)
    mod(q)
    mod.scale, mod.zero_point = 0.11, 10  # new output qparams: a new entry
    out = mod(q)
    assert out.q_scale() == 0.11 and out.q_zero_point() == 10
    _same(out, _general_conv(mod, q))
    other_in = _q(torch.rand(1, 4, 6, 6) * 3, 0.02, 7)  # new input qparams
    _same(mod(other_in), _general_conv(mod, other_in))
    old_packed = mod._packed_params
    fresh = _conv_module(nnq.Conv2d, 2)
    mod.set_weight_bias(fresh.weight(), fresh.bias())  # new weight: a new pack, empty cache
    assert mod._packed_params is not old_packed and not mod._eager_calls
    _same(mod(q), _general_conv(mod, q))
    with kernels.reference_only():
        ref = mod(q)
        _same(ref, _general_conv(mod, q))
    sub = SubQTensor(q.int_data, q.scale, q.zero_point, q.qdtype)
    entries = len(mod._eager_calls)
    out_sub = mod(sub)
    assert len(mod._eager_calls) == entries  # the general path, no new entry
    assert torch.equal(out_sub.int_repr(), mod(q).int_repr())


def test_conv_channels_last_and_strided_inputs_get_their_own_entries():
    mod = _conv_module(nnq.Conv2d, 2)
    x = torch.rand(2, 4, 7, 7) * 3
    q = _q(x)
    q_cl = _q(x.contiguous(memory_format=torch.channels_last))
    _same(mod(q), _general_conv(mod, q))
    _same(mod(q_cl), _general_conv(mod, q_cl))
    _same(mod(q_cl), mod(q_cl))
    assert len(mod._eager_calls) == 2


def test_reflect_padding_conv_is_not_cached_and_stays_right():
    mod = _conv_module(nnq.Conv2d, 2, padding_mode="reflect")
    q = _q(torch.rand(1, 4, 6, 6) * 3)
    first = mod(q)
    _same(mod(q), first)
    assert not mod._eager_calls


def _linear_module(cls, fin=12, fout=5, **kw):
    mod = cls(fin, fout, **kw)
    w = torch.randn(fout, fin) * 0.3
    mod.set_weight_bias(tq.quantize_per_tensor(w, 0.01, 0, tq.qint8), torch.randn(fout))
    mod.scale, mod.zero_point = 0.09, 64
    return mod


@pytest.mark.parametrize("make", [lambda: _linear_module(nnq.Linear),
                                  lambda: _linear_module(nniq.LinearReLU),
                                  lambda: _linear_module(nniq.LinearLeakyReLU,
                                                         negative_slope=0.1),
                                  lambda: _linear_module(nniq.LinearTanh)])
@pytest.mark.parametrize("shape", [(3, 12), (2, 3, 12), (1, 12)])
@pytest.mark.parametrize("high", [2.0, 12.0])
def test_linear_repeated_call_matches_general_path(make, shape, high):
    mod = make()
    q = _q(torch.rand(*shape) * high)
    first = mod(q)
    again = mod(q)
    _same(again, first)
    _same(again, mod._linear(q))
    assert again.shape == (*shape[:-1], 5)


def test_linear_cache_follows_slope_qparams_dtype_and_subclasses():
    mod = _linear_module(nniq.LinearLeakyReLU, negative_slope=0.1)
    q = _q(torch.randn(4, 12))
    mod(q)
    mod.negative_slope = 0.3  # a mutable attribute of the post-op: part of the key
    _same(mod(q), mod._linear(q))
    mod.scale = 0.5
    out = mod(q)
    assert out.q_scale() == 0.5
    _same(out, mod._linear(q))
    plain = _linear_module(nnq.Linear)
    q8 = _q(torch.randn(4, 12), 0.05, 0, tq.qint8)  # a qint8 input gives a qint8 output
    _same(plain(q8), plain._linear(q8))
    _same(plain(q8), plain._linear(q8))
    assert plain(q8).qdtype is tq.qint8
    sub = SubQTensor(q.int_data, q.scale, q.zero_point, q.qdtype)
    before = len(plain._packed_params._eager_calls)
    plain(sub)
    assert len(plain._packed_params._eager_calls) == before



@pytest.mark.parametrize("make", [lambda: _conv_module(nnq.Conv2d, 2),
                                  lambda: _linear_module(nnq.Linear)])
@pytest.mark.parametrize("copy_fn", [copy.deepcopy,
                                     lambda m: pickle.loads(pickle.dumps(m))],
                         ids=["deepcopy", "pickle"])
def test_call_cache_is_the_modules_and_copies_start_empty(make, copy_fn):
    """The per-call cache belongs to the nn module (the kernels' packed weights hold none); a
    copy or a pickled module starts with an empty one and computes the same integers."""
    mod = make()
    q = _q(torch.rand(2, 4, 6, 6) * 3) if isinstance(mod, nnq.Conv2d) else _q(torch.rand(3, 12))
    first = mod(q)
    owner = mod if isinstance(mod, nnq.Conv2d) else mod._packed_params
    packed = mod._packed_params if owner is mod else mod._packed_params.packed
    assert not hasattr(packed, "eager_calls")
    if kernels.mode() == "auto":
        assert len(owner._eager_calls) == 1
    twin = copy_fn(mod)
    twin_owner = twin if owner is mod else twin._packed_params
    assert twin_owner._eager_calls == {}
    _same(twin(q), first)
    _same(twin(q), first)

def test_quantize_stub_fast_path_matches_quantize_per_tensor():
    stub = nnq.Quantize(0.1, 7, tq.quint8)
    x = torch.tensor([[-1.0, 0.05, 0.15, 0.25, 25.5, 26.0, float("nan"), float("inf")]])
    scale = float(torch.tensor(0.1))  # (the stub's scale is a float32 buffer, as torch's)
    for _ in range(2):
        _same(stub(x), tq.quantize_per_tensor(x, scale, 7, tq.quint8))
    with torch.no_grad():
        stub.scale.fill_(0.2)  # the buffer changed in place: new qparams
    _same(stub(x), tq.quantize_per_tensor(x, float(torch.tensor(0.2)), 7, tq.quint8))
    stub8 = nnq.Quantize(0.05, -3, tq.qint8)
    scale8 = float(torch.tensor(0.05))
    _same(stub8(x), tq.quantize_per_tensor(x, scale8, -3, tq.qint8))
    with pytest.raises(RuntimeError, match="got Double"):  # float64 is refused, as by torch
        stub8(x.double())


def test_dequantize_stub_fast_path():
    q = _q(torch.randn(3, 4))
    assert torch.equal(nnq.DeQuantize()(q), q.dequantize())
    assert torch.equal(q.dequantize(), (q.int_repr().float() - 3) * torch.tensor(0.05))
    qc = tq.quantize_per_channel(torch.randn(3, 4), torch.tensor([0.1, 0.2, 0.3]).double(),
                                 torch.tensor([0, 1, 2]), 0, tq.quint8)
    expect = (qc.int_repr().float() - torch.tensor([[0.], [1.], [2.]])) \
        * torch.tensor([[0.1], [0.2], [0.3]]).double()
    assert torch.allclose(nnq.DeQuantize()(qc), expect.float())


_VIEWS = [
    lambda t: torch.flatten(t, 1), lambda t: t.flatten(), lambda t: t.reshape(2, -1),
    lambda t: torch.reshape(t, (-1,)), lambda t: t.view(2, 3, 20), lambda t: t.contiguous(),
    lambda t: t.unsqueeze(0), lambda t: torch.unsqueeze(t, 2), lambda t: t.squeeze(),
    lambda t: t.permute(0, 2, 3, 1), lambda t: torch.transpose(t, 1, 3),
    lambda t: t.transpose(1, 2).contiguous(),
]


@pytest.mark.parametrize("fn", _VIEWS)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("inference", [False, True])
def test_layout_functions_act_on_the_integers(fn, channels_last, inference):
    x = torch.rand(2, 3, 4, 5) * 3
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    if fn is _VIEWS[4] and channels_last:
        pytest.skip("view needs a compatible layout")
    q = _q(x)
    ctx = torch.inference_mode() if inference else torch.no_grad()
    with ctx:
        out = fn(q)
        ints = fn(q.int_data)
    assert type(out) is QTensor and out.qdtype is tq.quint8
    assert out.shape == ints.shape and out.stride() == ints.stride()
    assert torch.equal(out.int_repr(), ints)
    assert out.q_scale() == 0.05 and out.q_zero_point() == 3
    assert out.is_inference() == ints.is_inference()  # (views of normal tensors stay normal)


def test_layout_fast_path_identity_and_fallbacks():
    q = _q(torch.rand(2, 3))
    assert q.contiguous() is q  # a no-op returns the input itself, as torch
    with pytest.raises(Exception):
        q.view(torch.int8)  # not a same-dtype view: the general path decides (refuses)
    qc = tq.quantize_per_channel(torch.rand(2, 3, 4), torch.tensor([0.1, 0.2, 0.3]).double(),
                                 torch.tensor([0, 1, 2]), 1, tq.quint8)
    with pytest.raises(RuntimeError, match="Setting strides"):  # per-channel: the general
        qc.permute(0, 2, 1)                                      # path refuses, as torch
    sub = SubQTensor(q.int_data, q.scale, q.zero_point, q.qdtype)
    assert torch.equal(sub.flatten().int_repr(), q.int_data.flatten())


@pytest.mark.parametrize("shape", [(2, 5, 9, 8), (1, 16, 20, 21)])  # small: the float trip
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("args", [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                                  dict(kernel_size=3, stride=1, padding=1, dilation=2),
                                  dict(kernel_size=(3, 2), stride=(2, 1), ceil_mode=True),
                                  dict(kernel_size=[2, 2], stride=[2, 2])])
def test_max_pool_plan_matches_float_reference(shape, channels_last, args):
    x = torch.randint(0, 256, shape, dtype=torch.uint8)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    q = QTensor.from_int(x, 0.1, 4, tq.quint8)
    expect = F.max_pool2d(x.float(), **args).to(torch.uint8)
    for _ in range(2):  # the second call reruns the plan
        out = F.max_pool2d(q, **args)
        assert type(out) is QTensor and out.q_scale() == 0.1 and out.q_zero_point() == 4
        assert torch.equal(out.int_repr(), expect)
        assert out.is_contiguous(memory_format=torch.channels_last) == channels_last
        assert out.stride() == pooling._max_pool(x, 2, *_pool_args(args)).stride()
    ints = pooling.max_pool(x, 2, args["kernel_size"], args.get("stride"), args.get("padding", 0),
                            args.get("dilation", 1), args.get("ceil_mode", False))
    assert torch.equal(ints, expect)


def _pool_args(args):
    def pair(v):
        return tuple(v) if isinstance(v, (list, tuple)) else (v, v)
    kernel = pair(args["kernel_size"])
    return (kernel, pair(args.get("stride", kernel)), pair(args.get("padding", 0)),
            pair(args.get("dilation", 1)), args.get("ceil_mode", False))


def test_max_pool_plan_is_checked_once_and_still_raises():
    q = QTensor.from_int(torch.zeros(1, 2, 4, 4, dtype=torch.uint8), 0.1, 0, tq.quint8)
    with pytest.raises(RuntimeError, match="padding"):
        F.max_pool2d(q, 2, 2, padding=2)
    with pytest.raises(RuntimeError, match="padding"):  # no plan was kept for the bad call
        F.max_pool2d(q, 2, 2, padding=2)
    q_cl = QTensor.from_int(torch.zeros(1, 2, 4, 4, dtype=torch.uint8).contiguous(
        memory_format=torch.channels_last), 0.1, 0, tq.quint8)
    for _ in range(2):  # (the small channels-last route checks as the quantized kernel)
        with pytest.raises(RuntimeError, match="padding"):
            F.max_pool2d(q_cl, 2, 2, padding=2)


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("channels_last", [False, True])
def test_small_add_plan_matches_the_lane_walk(relu, channels_last):
    torch.manual_seed(1)
    a = torch.rand(1, 8, 4, 4) * 4 - 1
    b = torch.rand(1, 8, 4, 4) * 4 - 1
    if channels_last:
        a, b = (t.contiguous(memory_format=torch.channels_last) for t in (a, b))
    qa, qb = _q(a, 0.03, 40), _q(b, 0.05, 20)
    fn = nnq.QFunctional()
    fn.scale, fn.zero_point = 0.06, 30
    run = fn.add_relu if relu else fn.add
    ops_binary._ADD_PLANS.clear()
    first = run(qa, qb)  # the general lane walk; keeps a plan
    assert ops_binary._ADD_PLANS
    _same(run(qa, qb), first)
    ops_binary._ADD_PLANS.clear()
    with kernels.reference_only():
        ref = run(qa, qb)
    assert torch.equal(ref.int_repr(), first.int_repr())


def _digits_models():
    torch.manual_seed(0)
    model = digits.DigitsCNN().eval()
    return digits.static_ptq(model, torch.rand(64, 1, 8, 8)), torch.rand(1, 1, 8, 8)


def test_digits_fast_and_general_paths_agree():
    q, x = _digits_models()
    general = copy.deepcopy(q)
    with torch.inference_mode():
        first = q(x)
        for _ in range(3):
            assert torch.equal(q(x), first)
    # the general path everywhere: a traced-like call through each module's uncached route
    h = general.quant(x)
    h = general.conv1._conv(general.conv1._quantized_input(h))
    h = general.conv2._conv(general.conv2._quantized_input(h))
    h = F.max_pool2d(h, 2)
    h = torch.flatten(h, 1)
    h = general.fc2._linear(general.fc1._linear(h))
    assert torch.equal(h.dequantize(), first)


def test_digits_forward_python_calls_stay_few():
    """Deterministic count (cProfile ncalls per forward, not time): ~730 before the fast
    paths, ~240 with them; the bound leaves room for small changes elsewhere."""
    q, x = _digits_models()
    with torch.inference_mode():
        for _ in range(3):
            q(x)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(5):
            q(x)
        prof.disable()
    calls = pstats.Stats(prof).total_calls / 5
    assert calls < 400, calls


def test_activation_tables_and_clamp_bounds_are_reused_exactly():
    import torch.ao.nn.quantized as ao_nnq
    from torchquant.ops import activation as ops_activation
    x = torch.randn(2, 8, 5, 5) * 3
    q = _q(x, 0.05, 100)
    theirs = torch.quantize_per_tensor(x, 0.05, 100, torch.quint8)
    hardswish = nnq.Hardswish(0.04, 90)
    ops_activation._VALUE_TABLES.clear()
    first = hardswish(q)
    assert ops_activation._VALUE_TABLES  # kept
    _same(hardswish(q), first)
    expect = ao_nnq.Hardswish(0.04, 90)(theirs)
    assert torch.equal(first.int_repr(), expect.int_repr())
    relu6 = nnq.ReLU6()
    for _ in range(2):
        out = relu6(q)
        assert torch.equal(out.int_repr(), ao_nnq.ReLU6()(theirs).int_repr())
        assert out.q_scale() == 0.05 and out.q_zero_point() == 100
    clamped = torch.clamp(q, -0.5, 1.0)
    assert torch.equal(clamped.int_repr(), torch.clamp(theirs, -0.5, 1.0).int_repr())


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
def test_dequantize_8bit_eager_matches_the_formula(qdtype):
    from torchquant import affine
    from torchquant.ops import quantize as ops_quantize
    values = torch.arange(qdtype.qmin, qdtype.qmax + 1).to(qdtype.storage_dtype)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        scale = float(torch.rand((), generator=gen)) * 10 ** float(torch.randint(-6, 3, (),
                                                                                 generator=gen))
        zero_point = int(torch.randint(qdtype.qmin, qdtype.qmax + 1, (), generator=gen))
        expect = affine.dequantize_formula(values, torch.tensor(scale, dtype=torch.float64),
                                           torch.tensor(zero_point), False)
        ours = ops_quantize.dequantize_8bit_eager(values, scale, zero_point)
        assert ours.dtype == torch.float32 and torch.equal(ours, expect)
        q = QTensor.from_int_per_tensor(values, scale, zero_point, qdtype)
        assert torch.equal(q.dequantize(), expect)


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8])
def test_quantize_8bit_fma_eager_matches_the_formula(qdtype):
    from torchquant import affine
    from torchquant.ops import quantize as ops_quantize
    gen = torch.Generator().manual_seed(0)
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e-45,
                            -1e-45, 3e38, -3e38, 0.5, -0.5, 1.5, 2.5, -2.5])
    for _ in range(20):
        scale = float(torch.rand((), generator=gen)) * 10 ** float(torch.randint(-4, 2, (),
                                                                                 generator=gen))
        zero_point = int(torch.randint(qdtype.qmin, qdtype.qmax + 1, (), generator=gen))
        x = torch.cat([special, special * scale, (torch.arange(-300, 300) + 0.5) * scale,
                       torch.randn(500, generator=gen) * 200 * scale])
        scale_t, zp_t = affine.per_tensor_qparams(scale, zero_point, x.device)
        _, inv, zp, mode = affine.quantize_operands(x, scale_t, zp_t, None, affine.FMA)
        expect = affine.quantize_formula(x, inv, zp, qdtype.qmin, qdtype.qmax,
                                         qdtype.storage_dtype, mode)
        ours = ops_quantize.quantize_8bit_fma_eager(x, inv, zp, zero_point, qdtype.qmin,
                                                    qdtype.qmax, qdtype.storage_dtype)
        assert ours.dtype == qdtype.storage_dtype and torch.equal(ours, expect)
        stub = nnq.Quantize(scale, zero_point, qdtype)
        stub_scale = float(stub.scale)
        _same(stub(x), tq.quantize_per_tensor(x, stub_scale, zero_point, qdtype))
