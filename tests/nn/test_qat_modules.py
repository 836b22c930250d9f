"""QAT modules (torchquant.nn.qat, .qat.dynamic, .intrinsic.qat) against torch.ao 2.13.

Every pair is built from the same float weights and driven identically; forward outputs,
gradients, BN running statistics, fake-quant state and ``to_float()`` results must be equal
bit for bit: both sides run the same float conv/linear/BN kernels and our fake-quantize is
bit-exact with torch's.  ``torch.equal`` is used throughout; no tolerance is needed.
"""
import copy
import io

import pytest
import torch
import torch.ao.nn.intrinsic as tnni
import torch.ao.nn.intrinsic.qat as tnniqat
import torch.ao.nn.qat as tnnqat
import torch.ao.nn.qat.dynamic as tnnqatd
import torch.ao.quantization as tq
from torch import nn
from torch.nn.utils import fusion as tfusion

import torchquant.nn.intrinsic as nni
import torchquant.nn.intrinsic.qat as nniqat
import torchquant.nn.qat as nnqat
import torchquant.nn.qat.dynamic as nnqatd
import torchquant.quantization as ours_q
from torchquant.nn.utils import fusion

from conftest import oracle_input

QC = ours_q.get_default_qat_qconfig("x86")
TQC = tq.get_default_qat_qconfig("x86")
CONV = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
BN = {1: nn.BatchNorm1d, 2: nn.BatchNorm2d, 3: nn.BatchNorm3d}
SPATIAL = {1: (9,), 2: (7, 6), 3: (5, 4, 4)}


def _bn(n, c):
    bn = BN[n](c)
    with torch.no_grad():  # non-trivial affine params and running stats
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
        bn.running_mean.uniform_(-0.2, 0.2)
        bn.running_var.uniform_(0.5, 2.0)
    return bn


def _conv(n, bias=True):
    return CONV[n](3, 4, 3, padding=1, stride=1 if n == 3 else 2, bias=bias)


# name -> (builder of (float module for torch, float module for us), input shape)
def _case(name):
    if name == "Linear":
        m = nn.Linear(5, 4)
        return (m, copy.deepcopy(m)), (6, 5)
    if name == "LinearReLU":
        lin, relu = nn.Linear(5, 4), nn.ReLU()
        return (tnni.LinearReLU(lin, relu), nni.LinearReLU(copy.deepcopy(lin), nn.ReLU())), (6, 5)
    if name == "LinearBn1d":
        lin, bn = nn.Linear(5, 4), _bn(1, 4)
        return (tnni.LinearBn1d(lin, bn),
                nni.LinearBn1d(copy.deepcopy(lin), copy.deepcopy(bn))), (8, 5)
    kind, n = name[:-2], int(name[-2])
    shape = (2, 3) + SPATIAL[n]
    if kind == "Conv":
        m = _conv(n)
        return (m, copy.deepcopy(m)), shape
    if kind == "ConvReLU":
        conv = _conv(n)
        return (getattr(tnni, name)(conv, nn.ReLU()),
                getattr(nni, name)(copy.deepcopy(conv), nn.ReLU())), shape
    bias = n != 2  # ConvBn with and without conv bias
    conv, bn = _conv(n, bias), _bn(n, 4)
    children = [conv, bn] + ([nn.ReLU()] if kind == "ConvBnReLU" else [])
    return (getattr(tnni, name)(*children),
            getattr(nni, name)(*[copy.deepcopy(c) for c in children])), shape


def _classes(name):
    if name in ("Linear", "Conv1d", "Conv2d", "Conv3d"):
        return tnnqat, nnqat
    return tnniqat, nniqat


def make_pair(name):
    (theirs_f, ours_f), shape = _case(name)
    for m in theirs_f.modules():  # as propagate_qconfig_ does (torch reads the child's)
        m.qconfig = TQC
    for m in ours_f.modules():
        m.qconfig = QC
    t_mod, o_mod = _classes(name)
    return (getattr(t_mod, name).from_float(theirs_f), getattr(o_mod, name).from_float(ours_f),
            shape)


ALL = ["Linear", "LinearReLU", "LinearBn1d", "Conv1d", "Conv2d", "Conv3d",
       "ConvReLU1d", "ConvReLU2d", "ConvReLU3d", "ConvBn1d", "ConvBn2d", "ConvBn3d",
       "ConvBnReLU1d", "ConvBnReLU2d", "ConvBnReLU3d"]
BN_NAMES = [n for n in ALL if "Bn" in n]
CONV_BN_NAMES = [n for n in BN_NAMES if n.startswith("Conv")]


def assert_state_equal(theirs, ours):
    ts, os_ = theirs.state_dict(), ours.state_dict()
    assert list(ts) == list(os_)
    for key in ts:
        assert torch.equal(ts[key], os_[key]), key


def step_both(theirs, ours, opts, shape, seed):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed))
    xt, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    yt, yo = theirs(xt), ours(xo)
    assert torch.equal(yt, yo)
    target = torch.randn(yt.shape, generator=torch.Generator().manual_seed(seed + 100))
    for y, opt in zip((yt, yo), opts):
        opt.zero_grad()
        ((y - target) ** 2).mean().backward()
    assert torch.equal(xt.grad, xo.grad)
    tp, op = dict(theirs.named_parameters()), dict(ours.named_parameters())
    assert list(tp) == list(op)
    for key in tp:
        assert torch.equal(tp[key].grad, op[key].grad), key
    for opt in opts:
        opt.step()


def sgd(*mods):
    return [torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9) for m in mods]


@pytest.mark.parametrize("name", ALL)
def test_train_steps_eval_and_to_float_match_torch(name):
    theirs, ours, shape = make_pair(name)
    assert type(ours).__name__ == type(theirs).__name__
    assert_state_equal(theirs, ours)
    opts = sgd(theirs, ours)
    for i in range(3):
        step_both(theirs, ours, opts, shape, seed=i)
        assert_state_equal(theirs, ours)  # weights, BN running stats, fake-quant qparams
    theirs.eval(), ours.eval()
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(theirs(x), ours(x))
    assert_state_equal(theirs, ours)

    tf, of = theirs.to_float(), ours.to_float()
    assert type(of).__name__ == type(tf).__name__
    assert of.training == tf.training
    assert_state_equal(tf, of)
    with torch.no_grad():
        assert torch.equal(tf(x), of(x))


@pytest.mark.parametrize("name", BN_NAMES)
def test_freeze_and_update_bn_stats(name):
    theirs, ours, shape = make_pair(name)
    opts = sgd(theirs, ours)
    step_both(theirs, ours, opts, shape, seed=0)
    if name.startswith("Conv"):  # model.apply helpers (they skip LinearBn1d, as torch's do)
        tq_mod = nn.Sequential(theirs).apply(tnniqat.freeze_bn_stats)
        nn.Sequential(ours).apply(nniqat.freeze_bn_stats)
    else:
        theirs.freeze_bn_stats(), ours.freeze_bn_stats()
    assert ours.freeze_bn and not ours.bn.training
    ours.train(), theirs.train()  # train() must not unfreeze BN
    assert not ours.bn.training and ours.training
    stats = ours.bn.running_mean.clone()
    for i in range(1, 3):
        step_both(theirs, ours, opts, shape, seed=i)
        assert_state_equal(theirs, ours)
    assert torch.equal(ours.bn.running_mean, stats)  # frozen: running stats untouched
    if name.startswith("Conv"):
        tq_mod.apply(tnniqat.update_bn_stats)
        nn.Sequential(ours).apply(nniqat.update_bn_stats)
    else:
        theirs.update_bn_stats(), ours.update_bn_stats()
    assert not ours.freeze_bn and ours.bn.training
    step_both(theirs, ours, opts, shape, seed=5)
    assert_state_equal(theirs, ours)
    assert not torch.equal(ours.bn.running_mean, stats)


def test_bn_helpers_ignore_other_modules():
    lin = nniqat.LinearBn1d(3, 4, qconfig=QC)
    nniqat.freeze_bn_stats(lin)
    assert not lin.freeze_bn  # LinearBn1d is not in the type set, as in torch


@pytest.mark.parametrize("name", CONV_BN_NAMES)
def test_slow_path_matches_torch(name):
    theirs, ours, shape = make_pair(name)
    theirs._enable_slow_path_for_better_numerical_stability = True
    ours._enable_slow_path_for_better_numerical_stability = True
    opts = sgd(theirs, ours)
    for i in range(2):
        step_both(theirs, ours, opts, shape, seed=i)
        assert_state_equal(theirs, ours)
    theirs.eval(), ours.eval()
    x = torch.randn(shape)
    with torch.no_grad():
        assert torch.equal(theirs(x), ours(x))


@pytest.mark.parametrize("cls_name,args,kwargs", [
    ("ConvBn2d", (3, 4, 3), {}), ("ConvBn2d", (3, 4, 3), {"bias": True}),
    ("ConvBnReLU1d", (3, 4, 3), {"freeze_bn": True}), ("ConvBn3d", (2, 4, 2), {}),
    ("ConvReLU2d", (3, 4, 3), {"bias": False}), ("LinearBn1d", (3, 4), {}),
    ("LinearReLU", (3, 4), {"bias": False}),
])
def test_fresh_module_state_matches_torch(cls_name, args, kwargs):
    torch.manual_seed(1)
    theirs = getattr(tnniqat, cls_name)(*args, qconfig=TQC, **kwargs)
    torch.manual_seed(1)
    ours = getattr(nniqat, cls_name)(*args, qconfig=QC, **kwargs)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for key, value in theirs.state_dict().items():
        if cls_name == "LinearBn1d" and key == "bias":
            continue  # torch leaves a fresh LinearBn1d's bias uninitialised
        assert torch.equal(value, ours.state_dict()[key]), key
    assert getattr(ours, "freeze_bn", None) == getattr(theirs, "freeze_bn", None)
    assert repr(ours).replace("torchquant", "torch") == repr(theirs)


@pytest.mark.parametrize("name", ALL)
def test_state_dict_roundtrip(name):
    _, ours, shape = make_pair(name)
    ours(torch.randn(shape))  # fills the per-channel fake-quant buffers
    buffer = io.BytesIO()
    torch.save(ours.state_dict(), buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    fresh = make_pair(name)[1]
    fresh.load_state_dict(loaded)
    for key, value in ours.state_dict().items():
        assert torch.equal(value, fresh.state_dict()[key]), key
    ours.eval(), fresh.eval()
    x = torch.randn(shape)
    assert torch.equal(ours(x), fresh(x))


def test_conv_bn_loads_version_1_checkpoint():
    ours = nniqat.ConvBn2d(3, 4, 3, qconfig=QC)
    state = ours.state_dict()
    for new, old in [("bn.weight", "gamma"), ("bn.bias", "beta"),
                     ("bn.running_mean", "running_mean"), ("bn.running_var", "running_var"),
                     ("bn.num_batches_tracked", "num_batches_tracked")]:
        state[old] = torch.full_like(state.pop(new), 3)
    state._metadata = {"": {"version": 1}}
    fresh = nniqat.ConvBn2d(3, 4, 3, qconfig=QC)
    fresh.load_state_dict(state)
    assert torch.equal(fresh.bn.running_var, torch.full((4,), 3.0))


@pytest.mark.parametrize("cls", [nnqat.Linear, nnqat.Conv2d, nnqat.Conv1d, nnqat.Conv3d,
                                 nnqatd.Linear, nniqat.LinearReLU, nniqat.LinearBn1d,
                                 nniqat.ConvBn2d, nniqat.ConvBnReLU3d, nniqat.ConvReLU1d,
                                 nnqat.Embedding, nnqat.EmbeddingBag])
def test_qconfig_required(cls):
    args = (4, 3) if "Linear" in cls.__name__ or "Embedding" in cls.__name__ else (3, 4, 3)
    with pytest.raises(AssertionError, match="qconfig must be provided for QAT module"):
        cls(*args)


def test_from_float_type_and_qconfig_checks():
    with pytest.raises(AssertionError, match="only works for Linear"):
        nnqat.Linear.from_float(nn.Conv2d(1, 1, 1))
    with pytest.raises(AssertionError, match="must have qconfig defined"):
        nnqat.Conv2d.from_float(nn.Conv2d(1, 1, 1))
    conv = nn.Conv2d(1, 1, 1)
    conv.qconfig = None
    with pytest.raises(AssertionError, match="valid qconfig"):
        nnqat.Conv2d.from_float(conv)
    fused = tnni.ConvBn2d(nn.Conv2d(1, 1, 1), nn.BatchNorm2d(1))  # torch's container, not ours
    fused.qconfig = QC
    with pytest.raises(AssertionError, match="only works for ConvBn2d"):
        nniqat.ConvBn2d.from_float(fused)
    relu = nni.ConvReLU2d(nn.Conv2d(1, 1, 1), nn.ReLU())
    relu.qconfig = QC
    with pytest.raises(AssertionError):  # exact type: a fused module for the plain class
        nnqat.Conv2d.from_float(relu)


def test_from_float_shares_parameters():
    conv, bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)
    fused = nni.ConvBn2d(conv, bn)
    fused.qconfig = QC
    qat = nniqat.ConvBn2d.from_float(fused)
    assert qat.weight is conv.weight and qat.bias is conv.bias
    assert qat.bn.weight is bn.weight and qat.bn.running_mean is bn.running_mean
    assert qat.qconfig is QC and qat.training and not qat.freeze_bn


def test_linear_from_float_keeps_parametrizations():
    import torch.nn.utils.parametrize as P

    class Double(nn.Module):
        def forward(self, w):
            return 2 * w

    lin = nn.Linear(4, 3)
    P.register_parametrization(lin, "weight", Double())
    lin.qconfig = QC
    qat = nnqat.Linear.from_float(lin)
    assert P.is_parametrized(qat, "weight")
    assert torch.equal(qat.weight, lin.weight)


def _embedding_pair(bag):
    float_mod = nn.EmbeddingBag(10, 6, mode="sum") if bag else nn.Embedding(10, 6, padding_idx=0)
    theirs_f, ours_f = float_mod, copy.deepcopy(float_mod)
    theirs_f.qconfig = tq.default_embedding_qat_qconfig
    ours_f.qconfig = ours_q.default_embedding_qat_qconfig
    t_cls = tnnqat.EmbeddingBag if bag else tnnqat.Embedding
    o_cls = nnqat.EmbeddingBag if bag else nnqat.Embedding
    return t_cls.from_float(theirs_f), o_cls.from_float(ours_f)


@pytest.mark.parametrize("bag", [False, True])
def test_embedding_matches_torch(bag):
    theirs, ours = _embedding_pair(bag)
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (theirs, ours)]
    idx = torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]])
    for _ in range(3):
        outs = []
        for m, opt in zip((theirs, ours), opts):
            opt.zero_grad()
            y = m(idx)
            (y ** 2).sum().backward()
            outs.append(y)
            opt.step()
        assert torch.equal(*outs)
        assert torch.equal(theirs.weight, ours.weight)
    assert_state_equal(theirs, ours)
    tf, of = theirs.to_float(), ours.to_float()
    assert type(of) is type(tf)
    assert_state_equal(tf, of)


def test_embedding_requires_float_qparams_weight():
    with pytest.raises(AssertionError, match="per_channel_affine_float_qparams"):
        nnqat.Embedding(10, 4, qconfig=QC)
    with pytest.raises(AssertionError, match="per_channel_affine_float_qparams"):
        nnqat.EmbeddingBag(10, 4, qconfig=QC)


def test_dynamic_linear():
    lin = nn.Linear(5, 3)
    theirs_f, ours_f = lin, copy.deepcopy(lin)
    theirs_f.qconfig = tq.default_dynamic_qat_qconfig
    ours_f.qconfig = ours_q.default_dynamic_qat_qconfig
    theirs, ours = tnnqatd.Linear.from_float(theirs_f), nnqatd.Linear.from_float(ours_f)
    assert isinstance(ours, nnqat.Linear)
    opts = sgd(theirs, ours)
    for i in range(2):
        step_both(theirs, ours, opts, (4, 5), seed=i)
    assert_state_equal(theirs, ours)
    with pytest.raises(ValueError, match="memoryless"):
        nnqatd.Linear(5, 3, qconfig=QC)


def test_device_dtype_factory_kwargs():
    m = nnqat.Linear(4, 3, qconfig=QC, dtype=torch.float64)
    assert m.weight.dtype == torch.float64
    assert m.weight_fake_quant.activation_post_process.eps.dtype == torch.float64


@pytest.mark.parametrize("n", [1, 2, 3])
def test_fuse_conv_bn_weights_matches_torch(n):
    conv, bn = _conv(n, bias=n != 2), _bn(n, 4)
    for ours_fn, theirs_fn in [(fusion.fuse_conv_bn_weights, tfusion.fuse_conv_bn_weights)]:
        args = (conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.eps, bn.weight,
                bn.bias)
        for a, b in zip(ours_fn(*args), theirs_fn(*args)):
            assert isinstance(a, nn.Parameter) and torch.equal(a, b)
    convt, bnt = nn.ConvTranspose2d(3, 4, 3), _bn(2, 4)
    args = (convt.weight, None, bnt.running_mean, bnt.running_var, bnt.eps, None, None, True)
    for a, b in zip(fusion.fuse_conv_bn_weights(*args), tfusion.fuse_conv_bn_weights(*args)):
        assert torch.equal(a, b)
    conv.eval(), bn.eval()
    assert_state_equal(tfusion.fuse_conv_bn_eval(conv, bn), fusion.fuse_conv_bn_eval(conv, bn))
    with pytest.raises(AssertionError, match="only for eval"):
        fusion.fuse_conv_bn_eval(conv.train(), bn)


def test_fuse_linear_bn_matches_torch():
    lin, bn = nn.Linear(5, 4).eval(), _bn(1, 4).eval()
    assert_state_equal(tfusion.fuse_linear_bn_eval(lin, bn), fusion.fuse_linear_bn_eval(lin, bn))
    lin_nb = nn.Linear(5, 4, bias=False)
    args = (lin_nb.weight, None, bn.running_mean, bn.running_var, bn.eps, bn.weight, bn.bias)
    for a, b in zip(fusion.fuse_linear_bn_weights(*args), tfusion.fuse_linear_bn_weights(*args)):
        assert torch.equal(a, b)


def test_linear_bn_fold_hook_matches_torch():
    """``nnq.Linear.from_float`` folds a QAT LinearBn1d through this hook; torch folds with
    ``fuse_linear_bn_weights`` at the same point."""
    theirs, ours, shape = make_pair("LinearBn1d")
    opts = sgd(theirs, ours)
    step_both(theirs, ours, opts, shape, seed=0)
    w, b = tfusion.fuse_linear_bn_weights(theirs.weight, theirs.bias, theirs.bn.running_mean,
                                          theirs.bn.running_var, theirs.bn.eps,
                                          theirs.bn.weight, theirs.bn.bias)
    ours._fold_bn_into_linear()
    assert torch.equal(ours.weight, w) and torch.equal(ours.bias, b)


@pytest.mark.parametrize("name,quantized", [
    ("Conv2d", "nnq.Conv2d"), ("ConvBn2d", "nnq.Conv2d"), ("ConvBnReLU2d", "nniq.ConvReLU2d"),
    ("LinearBn1d", "nnq.Linear"), ("LinearReLU", "nniq.LinearReLU")])
def test_convert_to_quantized_matches_torch(name, quantized, torch_oracle_exact_u8):
    """After QAT, the quantized modules built from ours and from torch's agree exactly (BN
    folded on conversion, weights quantized with the trained fake-quant qparams).

    The input is quantized with zero point 128 (values up to 255) where torch's x86 kernels
    are exact on the full range; on CPUs where they saturate int16 pairs of u8 x s8 products
    (no VNNI, see tests/conftest.py) with zero point 64, clamped to what quantizes to 0..127,
    which torch computes exactly there."""
    import torch.ao.nn.intrinsic.quantized as tnniq
    import torch.ao.nn.quantized as tnnq

    import torchquant as tqz
    import torchquant.nn.intrinsic.quantized as nniq
    import torchquant.nn.quantized as nnq

    pkg, cls = quantized.split(".")
    t_cls = getattr({"nnq": tnnq, "nniq": tnniq}[pkg], cls)
    o_cls = getattr({"nnq": nnq, "nniq": nniq}[pkg], cls)
    theirs, ours, shape = make_pair(name)
    theirs.activation_post_process = TQC.activation()
    ours.activation_post_process = QC.activation()
    x = torch.randn(shape)
    for _ in range(2):
        theirs.activation_post_process(theirs(x))
        ours.activation_post_process(ours(x))
    theirs.eval(), ours.eval()
    qt, qo = t_cls.from_float(theirs), o_cls.from_float(ours)
    zero_point = 128 if torch_oracle_exact_u8 else 64
    x = oracle_input(x, 0.05, zero_point)
    yt = qt(torch.quantize_per_tensor(x, 0.05, zero_point, torch.quint8))
    yo = qo(tqz.quantize_per_tensor(x, 0.05, zero_point, tqz.quint8))
    assert yo.q_scale() == yt.q_scale() and yo.q_zero_point() == yt.q_zero_point()
    assert torch.equal(yo.int_repr(), yt.int_repr())


def test_small_qat_model_learns():
    """ConvBnReLU2d -> ConvReLU2d -> LinearReLU -> Linear, trained on a fixed batch."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 1, 8, 8, generator=gen)
    y = torch.randint(0, 3, (16,), generator=gen)

    def qat(cls, float_mod):
        float_mod.qconfig = QC
        return cls.from_float(float_mod)

    model = nn.Sequential(
        qat(nniqat.ConvBnReLU2d, nni.ConvBnReLU2d(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4),
                                                  nn.ReLU())),
        qat(nniqat.ConvReLU2d, nni.ConvReLU2d(nn.Conv2d(4, 4, 3), nn.ReLU())),
        nn.Flatten(),
        qat(nniqat.LinearReLU, nni.LinearReLU(nn.Linear(64, 16), nn.ReLU())),
        qat(nnqat.Linear, nn.Linear(16, 3)))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    for i in range(30):
        if i == 20:
            model.apply(nniqat.freeze_bn_stats)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    model.eval()
    float_model = nn.Sequential(*[m.to_float() if hasattr(m, "to_float") else m
                                  for m in model]).eval()
    # Without weight fake-quant the QAT forward is the float computation with BN folded on
    # the fly; to_float() folds it into the weights instead.  The two differ only by float
    # reassociation (conv(x, w*s)/s vs conv(x, w*s)), hence a tolerance.  (With fake-quant
    # on they differ much more here: Adam moves the weights faster than the moving-average
    # weight observer follows, so the stale ranges clip -- the same in torch.)
    model.apply(ours_q.disable_fake_quant)
    with torch.no_grad():
        torch.testing.assert_close(float_model(x), model(x), atol=1e-5, rtol=1e-5)
