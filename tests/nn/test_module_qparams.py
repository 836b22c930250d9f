"""Output qparams of the quantized modules (``scale`` / ``zero_point``) against torch 2.13.

Every module class with output qparams is checked for: assignment of numbers (and 0-d /
1-element tensors) that the forward uses at once, with torch's read-back types (a float / int
where torch keeps numbers, the 0-d / 1-element buffers where torch keeps buffers); validation;
state dict keys, dtypes and shapes as torch writes them; state dicts loading across (torch ->
ours -> torch); the weights_only round trip; deepcopy / pickle; and ``torch.export`` of the
forward (which fails on a ``float(buffer)`` read).

Outputs are compared with a module that got the same qparams another way (its constructor, or a
state dict) bit for bit, and with torch's module given the same assignment within one step on
at most 1 % of the elements (torch's fbgemm requantizes with a differently rounded multiplier).
"""
import contextlib
import copy
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import torch
import torch.ao.nn.intrinsic.quantized as ao_nniq
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.dynamic as ao_nnqd

import torchquant as tq
import torchquant.nn.intrinsic.quantized as nniq
import torchquant.nn.quantized as nnq
import torchquant.nn.quantized.dynamic as nnqd

X_SCALE, X_ZP = 0.05, 128
# exact in float32 (what the state dict holds), so every way of setting them gives the same
SCALE, ZP = 3 / 64, 10
INIT_SCALE, INIT_ZP = 0.125, 2


# ---- cases --------------------------------------------------------------------------------------

@dataclass
class Case:
    """``make(scale, zero_point)`` -> (ours, torch's module) with equal weights, the qparams
    given to the constructor or through the state dict.  ``shapes``: the float inputs;
    ``call``: how to run the module on its quantized (or, for Quantize, float) inputs."""

    make: Callable[..., tuple[torch.nn.Module, torch.nn.Module]]
    shapes: tuple = ((2, 8),)
    call: Callable[..., Any] = lambda m, *xs: m(*xs)
    storage: str = "saved"          # OutputQParams._QPARAM_STORAGE of the class
    names: tuple = ("scale", "zero_point")
    float_input: bool = False       # Quantize
    forward: bool = True            # dynamic Linear: its qparams are placeholders
    torch_forward: bool = True      # torch's oneDNN ConvAdd segfaults on some CPUs (AMD AVX2)
    torch_engine: Optional[str] = None  # torch's LinearLeakyReLU / LinearTanh: onednn only
    buffer_shape: tuple = ()
    exportable: bool = True

    def pair(self, *qparams):
        """(ours, theirs); torch packs its weights for the engine current then."""
        with engine(self.torch_engine):
            return self.make(*qparams)

    def call_torch(self, mod, *xs):
        with engine(self.torch_engine):
            return self.call(mod, *xs)


@contextlib.contextmanager
def engine(name):
    old = torch.backends.quantized.engine
    if name is not None:
        torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def _weight(shape, seed):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=gen) * 0.1
    return tq.quantize_per_tensor(w, 0.01, 0, tq.qint8), torch.quantize_per_tensor(
        w, 0.01, 0, torch.qint8)


def _set_qparams(ours, theirs, scale, zero_point, names=("scale", "zero_point")):
    """Give both modules (scale, zero_point) through their state dicts."""
    for mod in (ours, theirs):
        state = mod.state_dict()
        state[names[0]] = torch.full_like(state[names[0]], scale)
        state[names[1]] = torch.full_like(state[names[1]], zero_point)
        mod.load_state_dict(state)


def _weighted(tq_cls, ao_cls, args, extra=()):
    def make(scale=INIT_SCALE, zero_point=INIT_ZP):
        ours, theirs = tq_cls(*args, *extra), ao_cls(*args, *extra)
        w_ours, w_theirs = _weight(tuple(ours.weight().shape), 1)
        bias = torch.randn(getattr(ours, "out_features", None) or ours.out_channels,
                           generator=torch.Generator().manual_seed(2)) * 0.1
        ours.set_weight_bias(w_ours, bias)
        theirs.set_weight_bias(w_theirs, bias)
        _set_qparams(ours, theirs, scale, zero_point)
        return ours, theirs
    return make


def _bn(tq_cls, ao_cls, n=4):
    def make(scale=INIT_SCALE, zero_point=INIT_ZP):
        ours, theirs = tq_cls(n), ao_cls(n)
        gen = torch.Generator().manual_seed(3)
        stats = {"weight": torch.rand(n, generator=gen) + 0.5,
                 "bias": torch.randn(n, generator=gen),
                 "running_mean": torch.randn(n, generator=gen) * 0.2,
                 "running_var": torch.rand(n, generator=gen) + 0.5}
        for mod in (ours, theirs):
            mod.load_state_dict({**mod.state_dict(), **stats})
        _set_qparams(ours, theirs, scale, zero_point)
        return ours, theirs
    return make


def _ctor(tq_factory, ao_factory):
    def make(scale=INIT_SCALE, zero_point=INIT_ZP):
        return tq_factory(scale, zero_point), ao_factory(scale, zero_point)
    return make


def _prelu(scale=INIT_SCALE, zero_point=INIT_ZP):
    ours, theirs = nnq.PReLU(scale, zero_point, 4), ao_nnq.PReLU(scale, zero_point, 4)
    w = torch.rand(4, generator=torch.Generator().manual_seed(4)) * 0.5
    ours.set_weight(tq.quantize_per_tensor(w, 1 / 256, 0, tq.quint8))
    theirs.set_weight(torch.quantize_per_tensor(w, 1 / 256, 0, torch.quint8))
    return ours, theirs


def _affine(n):
    gen = torch.Generator().manual_seed(5)
    return (torch.nn.Parameter(torch.rand(n, generator=gen) + 0.5),
            torch.nn.Parameter(torch.randn(n, generator=gen) * 0.1))


def _norm(tq_cls, ao_cls, head, n, tail=()):
    def make(scale=INIT_SCALE, zero_point=INIT_ZP):
        w, b = _affine(n)
        return (tq_cls(*head, w, b, scale, zero_point, *tail),
                ao_cls(*head, copy.deepcopy(w), copy.deepcopy(b), scale, zero_point, *tail))
    return make


def _qfunctional(scale=INIT_SCALE, zero_point=INIT_ZP):
    ours, theirs = nnq.QFunctional(), ao_nnq.QFunctional()
    _set_qparams(ours, theirs, scale, zero_point)
    return ours, theirs


def _dynamic_linear(scale=INIT_SCALE, zero_point=INIT_ZP):
    ours, theirs = nnqd.Linear(8, 4), ao_nnqd.Linear(8, 4)
    _set_qparams(ours, theirs, scale, zero_point)
    return ours, theirs


IMG1, IMG2, IMG3 = (2, 4, 9), (2, 4, 6, 6), (1, 4, 4, 5, 5)
CASES = {
    "Linear": Case(_weighted(nnq.Linear, ao_nnq.Linear, (8, 4))),
    "LinearReLU": Case(_weighted(nniq.LinearReLU, ao_nniq.LinearReLU, (8, 4))),
    "LinearLeakyReLU": Case(_weighted(nniq.LinearLeakyReLU, ao_nniq.LinearLeakyReLU, (8, 4, 0.2)),
                            torch_engine="onednn"),
    "LinearTanh": Case(_weighted(nniq.LinearTanh, ao_nniq.LinearTanh, (8, 4)),
                       torch_engine="onednn"),
    "DynamicLinear": Case(_dynamic_linear, forward=False),
    "Conv1d": Case(_weighted(nnq.Conv1d, ao_nnq.Conv1d, (4, 4, 3)), (IMG1,)),
    "Conv2d": Case(_weighted(nnq.Conv2d, ao_nnq.Conv2d, (4, 4, 3)), (IMG2,)),
    "Conv3d": Case(_weighted(nnq.Conv3d, ao_nnq.Conv3d, (4, 4, 3)), (IMG3,)),
    "ConvTranspose1d": Case(_weighted(nnq.ConvTranspose1d, ao_nnq.ConvTranspose1d, (4, 4, 3)),
                            (IMG1,)),
    "ConvTranspose2d": Case(_weighted(nnq.ConvTranspose2d, ao_nnq.ConvTranspose2d, (4, 4, 3)),
                            (IMG2,)),
    "ConvTranspose3d": Case(_weighted(nnq.ConvTranspose3d, ao_nnq.ConvTranspose3d, (4, 4, 3)),
                            (IMG3,)),
    "ConvReLU1d": Case(_weighted(nniq.ConvReLU1d, ao_nniq.ConvReLU1d, (4, 4, 3)), (IMG1,)),
    "ConvReLU2d": Case(_weighted(nniq.ConvReLU2d, ao_nniq.ConvReLU2d, (4, 4, 3)), (IMG2,)),
    "ConvReLU3d": Case(_weighted(nniq.ConvReLU3d, ao_nniq.ConvReLU3d, (4, 4, 3)), (IMG3,)),
    "ConvAdd2d": Case(_weighted(nniq.ConvAdd2d, ao_nniq.ConvAdd2d, (4, 4, 3)),
                      (IMG2, (2, 4, 4, 4)), torch_forward=False),
    "ConvAddReLU2d": Case(_weighted(nniq.ConvAddReLU2d, ao_nniq.ConvAddReLU2d, (4, 4, 3)),
                          (IMG2, (2, 4, 4, 4)), torch_forward=False),
    "BatchNorm2d": Case(_bn(nnq.BatchNorm2d, ao_nnq.BatchNorm2d), ((2, 4, 3, 3),),
                        storage="buffer"),
    "BatchNorm3d": Case(_bn(nnq.BatchNorm3d, ao_nnq.BatchNorm3d), ((1, 4, 2, 3, 3),),
                        storage="buffer"),
    "BNReLU2d": Case(_bn(nniq.BNReLU2d, ao_nniq.BNReLU2d), ((2, 4, 3, 3),), storage="buffer"),
    "BNReLU3d": Case(_bn(nniq.BNReLU3d, ao_nniq.BNReLU3d), ((1, 4, 2, 3, 3),), storage="buffer"),
    "Hardswish": Case(_ctor(nnq.Hardswish, ao_nnq.Hardswish), storage="buffer"),
    "LeakyReLU": Case(_ctor(lambda s, z: nnq.LeakyReLU(s, z, 0.2),
                            lambda s, z: ao_nnq.LeakyReLU(s, z, 0.2)),
                      storage="buffer"),
    "ELU": Case(_ctor(lambda s, z: nnq.ELU(s, z, 0.5), lambda s, z: ao_nnq.ELU(s, z, 0.5)),
                storage="plain"),
    "Sigmoid": Case(_ctor(nnq.Sigmoid, ao_nnq.Sigmoid), storage="plain",
                    names=("output_scale", "output_zero_point")),
    "Softmax": Case(_ctor(lambda s, z: nnq.Softmax(1, s, z), lambda s, z: ao_nnq.Softmax(1, s, z)),
                    storage="plain"),
    "PReLU": Case(_prelu, ((2, 4, 5),), storage="plain"),
    "LayerNorm": Case(_norm(nnq.LayerNorm, ao_nnq.LayerNorm, ([8],), 8), storage="buffer"),
    "GroupNorm": Case(_norm(nnq.GroupNorm, ao_nnq.GroupNorm, (2, 4), 4), ((2, 4, 3, 3),),
                      storage="buffer"),
    "InstanceNorm1d": Case(_norm(nnq.InstanceNorm1d, ao_nnq.InstanceNorm1d, (4,), 4,
                                 (1e-5, 0.1, True)), ((2, 4, 7),),
                           storage="buffer"),
    "InstanceNorm2d": Case(_norm(nnq.InstanceNorm2d, ao_nnq.InstanceNorm2d, (4,), 4,
                                 (1e-5, 0.1, True)), ((2, 4, 3, 3),),
                           storage="buffer"),
    "InstanceNorm3d": Case(_norm(nnq.InstanceNorm3d, ao_nnq.InstanceNorm3d, (4,), 4,
                                 (1e-5, 0.1, True)), ((1, 4, 2, 3, 3),),
                           storage="buffer"),
    "Quantize": Case(_ctor(lambda s, z: nnq.Quantize(s, z, tq.quint8),
                           lambda s, z: ao_nnq.Quantize(s, z, torch.quint8)),
                     storage="buffer", float_input=True, buffer_shape=(1,)),
    # (not exported: the quantized add caches tensors made under export's fake mode, which
    # later eager adds with the same qparams would then get)
    "QFunctional.add": Case(_qfunctional, ((2, 8), (2, 8)), call=lambda m, a, b: m.add(a, b),
                            exportable=False),
    "QFunctional.cat": Case(_qfunctional, ((2, 8), (2, 8)), call=lambda m, a, b: m.cat([a, b])),
}
FORWARD_CASES = [name for name, case in CASES.items() if case.forward]


def inputs(case, seed=0):
    """(ours, torch's) inputs of ``case``: quint8 per-tensor (float for Quantize)."""
    gen = torch.Generator().manual_seed(seed)
    xs = [torch.randn(shape, generator=gen) * 2 for shape in case.shapes]
    if case.float_input:
        return xs, [x.clone() for x in xs]
    return ([tq.quantize_per_tensor(x, X_SCALE, X_ZP, tq.quint8) for x in xs],
            [torch.quantize_per_tensor(x, X_SCALE, X_ZP, torch.quint8) for x in xs])


def assign(mod, case, scale, zero_point, as_tensors=False):
    if as_tensors:
        scale, zero_point = torch.tensor(scale), torch.tensor(zero_point)
    setattr(mod, case.names[0], scale)
    setattr(mod, case.names[1], zero_point)


def assign_torch(mod, case, scale, zero_point):
    """The same assignment on torch's module: its buffers only take tensors."""
    shape = case.buffer_shape
    if case.storage == "buffer":
        scale = torch.full(shape, scale, dtype=torch.float32)
        zero_point = torch.full(shape, zero_point, dtype=torch.int64)
    assign(mod, case, scale, zero_point)


def stored_scale(case, scale):
    """What a module keeps of an assigned scale: the number, or its float32 buffer value."""
    return float(torch.tensor(scale, dtype=torch.float32)) if case.storage == "buffer" else scale


def qparam_values(mod, case):
    scale, zero_point = (getattr(mod, n) for n in case.names)
    return float(scale), int(zero_point)


def assert_close_int(theirs, ours, max_frac=0.01):
    assert ours.q_scale() == pytest.approx(theirs.q_scale(), rel=1e-7)
    assert ours.q_zero_point() == theirs.q_zero_point()
    diff = (theirs.int_repr().long() - ours.int_repr().long()).abs()
    assert int(diff.max()) <= 1
    assert float((diff > 0).float().mean()) <= max_frac


# ---- assignment ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_read_back_types_as_torch(name):
    case = CASES[name]
    ours, theirs = case.pair()
    for value_as_tensor in (False, True):
        assign(ours, case, SCALE, ZP, as_tensors=value_as_tensor)
        scale, zero_point = (getattr(ours, n) for n in case.names)
        if case.storage == "buffer":  # torch's buffers: read back as the tensors
            assert isinstance(scale, torch.Tensor) and isinstance(zero_point, torch.Tensor)
            assert scale.dtype == torch.float32 and zero_point.dtype == torch.int64
            assert tuple(scale.shape) == tuple(zero_point.shape) == case.buffer_shape
            assert dict(ours.named_buffers())[case.names[0]] is scale
        else:
            assert type(scale) is float and type(zero_point) is int
        assert qparam_values(ours, case) == (SCALE, ZP)
    assert type(getattr(theirs, case.names[0])) is type(getattr(ours, case.names[0]))
    assert type(getattr(theirs, case.names[1])) is type(getattr(ours, case.names[1]))


@pytest.mark.parametrize("name", FORWARD_CASES)
def test_assignment_changes_the_output(name):
    case = CASES[name]
    ours, theirs = case.pair()
    xs, txs = inputs(case)
    before = case.call(ours, *xs)
    assert (before.q_scale(), before.q_zero_point()) == (stored_scale(case, INIT_SCALE), INIT_ZP)
    assign(ours, case, SCALE, ZP)
    out = case.call(ours, *xs)
    assert (out.q_scale(), out.q_zero_point()) == (SCALE, ZP)
    # a module that got the qparams at construction / from a state dict gives the same integers
    built, _ = case.pair(SCALE, ZP)
    assert torch.equal(case.call(built, *xs).int_repr(), out.int_repr())
    # 1-element tensors assign the same values
    assign(ours, case, torch.tensor([0.25]), torch.tensor([3]))
    assign(ours, case, torch.tensor(SCALE), torch.tensor(ZP))
    assert torch.equal(case.call(ours, *xs).int_repr(), out.int_repr())
    if case.torch_forward:
        assign_torch(theirs, case, SCALE, ZP)
        assert_close_int(case.call_torch(theirs, *txs), out)


@pytest.mark.parametrize("name", [n for n in FORWARD_CASES if CASES[n].torch_forward])
def test_assigned_non_float32_scale_as_torch(name):
    """0.05 is not a float32: where torch keeps numbers both use (and read back) 0.05 itself;
    where it keeps float32 buffers both hold the float32 nearest."""
    case = CASES[name]
    ours, theirs = case.pair()
    xs, txs = inputs(case)
    assign(ours, case, 0.05, 7)
    assign_torch(theirs, case, 0.05, 7)
    assert qparam_values(ours, case) == qparam_values(theirs, case)
    assert qparam_values(ours, case)[0] == stored_scale(case, 0.05)
    theirs_out, ours_out = case.call_torch(theirs, *txs), case.call(ours, *xs)
    assert ours_out.q_scale() == theirs_out.q_scale() == stored_scale(case, 0.05)
    assert_close_int(theirs_out, ours_out)


def _bad_values(mod, case):
    qdtypes = mod._output_qdtypes()
    lo, hi = min(d.qmin for d in qdtypes), max(d.qmax for d in qdtypes)
    scale = [(0.0, ValueError), (-0.1, ValueError), (float("inf"), ValueError),
             (float("nan"), ValueError), (1e-50, ValueError), (1e39, ValueError),
             (torch.tensor([0.1, 0.2]), ValueError), (torch.tensor(-1.0), ValueError),
             ("0.1", TypeError), (None, TypeError), ([0.1], TypeError), (True, TypeError),
             (1 + 0j, TypeError), (torch.tensor(True), TypeError),
             (tq.quantize_per_tensor(torch.ones(1), 0.1, 0, tq.quint8), TypeError)]
    zero_point = [(lo - 1, ValueError), (hi + 1, ValueError), (1.5, ValueError),
                  (float("nan"), ValueError), (torch.tensor(2.5), ValueError),
                  (torch.tensor([1, 2]), ValueError), ("3", TypeError), (None, TypeError),
                  (False, TypeError)]
    return scale, zero_point


@pytest.mark.parametrize("name", list(CASES))
def test_bad_values_raise_and_keep_the_old_ones(name):
    case = CASES[name]
    ours, _ = case.pair()
    assign(ours, case, SCALE, ZP)
    bad_scales, bad_zero_points = _bad_values(ours, case)
    for attr, bad_values in zip(case.names, (bad_scales, bad_zero_points)):
        for value, error in bad_values:
            with pytest.raises(error, match=attr):
                setattr(ours, attr, value)
            assert qparam_values(ours, case) == (SCALE, ZP)
    # integral floats are integers
    setattr(ours, case.names[1], 12.0)
    assert qparam_values(ours, case) == (SCALE, 12)
    if case.forward:
        xs, _ = inputs(case)
        assert case.call(ours, *xs).q_zero_point() == 12


def test_zero_point_range_follows_the_output_dtype():
    conv = nnq.Conv2d(2, 2, 1)  # quint8 output only
    with pytest.raises(ValueError, match=r"zero_point must lie in \[0, 255\]"):
        conv.zero_point = -1
    linear = nnq.Linear(2, 2)  # the input's quint8 or qint8
    linear.zero_point = -128
    with pytest.raises(ValueError, match=r"\[-128, 255\]"):
        linear.zero_point = -129
    quantize = nnq.Quantize(0.1, 0, tq.qint8)  # its own dtype
    with pytest.raises(ValueError, match=r"\[-128, 127\]"):
        quantize.zero_point = 128
    with pytest.raises(ValueError, match="zero_point"):
        nnq.Quantize(0.1, 300, tq.quint8)
    assert nnq.Quantize(0.1, 2**20, tq.qint32).zero_point.item() == 2**20


# ---- state dict ---------------------------------------------------------------------------------

def _described(state):
    return [(k, type(v).__name__, getattr(v, "dtype", None), tuple(getattr(v, "shape", ())))
            for k, v in state.items() if k.rsplit(".", 1)[-1] in ("scale", "zero_point")]


@pytest.mark.parametrize("name", list(CASES))
def test_state_dict_as_torch(name):
    case = CASES[name]
    ours, theirs = case.pair()
    assign(ours, case, 0.05, 7)
    assign_torch(theirs, case, 0.05, 7)
    state, theirs_state = ours.state_dict(), theirs.state_dict()
    if name == "PReLU":  # torchquant saves the weight, torch does not
        assert list(state) == ["weight"] and list(theirs_state) == []
    else:
        assert list(state) == list(theirs_state)
    assert _described(state) == _described(theirs_state)
    if case.storage == "plain":
        assert not any(k in state for k in case.names)
    else:
        for key in case.names:
            assert torch.equal(state[key], theirs_state[key])


def _with_qparams_of(target, source, case):
    state = target.state_dict()
    source_state = source.state_dict()
    for key in case.names:
        state[key] = source_state[key]
    return state


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.storage != "plain"])
def test_state_dicts_load_across(name):
    case = CASES[name]
    ours, theirs = case.pair()
    assign_torch(theirs, case, SCALE, ZP)
    ours.load_state_dict(_with_qparams_of(ours, theirs, case))  # torch's -> ours
    assert qparam_values(ours, case) == (SCALE, ZP)
    assign(ours, case, 0.25, 4)
    with engine(case.torch_engine):  # (torch repacks its weight on load)
        theirs.load_state_dict(_with_qparams_of(theirs, ours, case))  # ours -> torch's
    assert qparam_values(theirs, case) == (0.25, 4)
    if case.forward and case.torch_forward:
        xs, txs = inputs(case)
        assert_close_int(case.call_torch(theirs, *txs), case.call(ours, *xs))


@pytest.mark.parametrize("name", ["BatchNorm2d", "LayerNorm", "Hardswish", "LeakyReLU",
                                  "Quantize", "QFunctional.add"])
def test_whole_state_dicts_load_across(name):
    """Modules whose state holds no quantized tensor: torch's whole state dict loads into
    ours (strict) and ours into torch's."""
    case = CASES[name]
    ours, theirs = case.pair()
    assign_torch(theirs, case, SCALE, ZP)
    fresh, _ = case.pair()
    fresh.load_state_dict(theirs.state_dict())
    assert qparam_values(fresh, case) == (SCALE, ZP)
    fresh_theirs = case.pair()[1]
    fresh_theirs.load_state_dict(fresh.state_dict())
    assert qparam_values(fresh_theirs, case) == (SCALE, ZP)


@pytest.mark.parametrize("name", ["Linear", "Conv2d", "QFunctional.add", "BatchNorm2d",
                                  "Quantize"])
@pytest.mark.parametrize("shape", [(), (1,)], ids=["0-d", "1-element"])
def test_load_accepts_0d_and_1_element(name, shape):
    case = CASES[name]
    ours, _ = case.pair()
    state = ours.state_dict()
    state["scale"] = torch.full(shape, SCALE, dtype=torch.float64)
    state["zero_point"] = torch.full(shape, ZP, dtype=torch.int32)
    ours.load_state_dict(state)
    assert qparam_values(ours, case) == (SCALE, ZP)
    saved = ours.state_dict()  # saved back in torch's dtypes and shape
    assert saved["scale"].dtype == torch.float32 and saved["zero_point"].dtype == torch.int64
    assert tuple(saved["scale"].shape) == case.buffer_shape


@pytest.mark.parametrize("name", ["Linear", "Conv2d", "QFunctional.add", "BatchNorm2d",
                                  "Quantize"])
def test_load_reports_bad_or_missing_qparams(name):
    case = CASES[name]
    ours, _ = case.pair()
    assign(ours, case, SCALE, ZP)
    state = ours.state_dict()
    state["scale"] = torch.tensor(-1.0)
    with pytest.raises(RuntimeError, match="scale must be positive"):
        ours.load_state_dict(state)
    del state["scale"]
    with pytest.raises(RuntimeError, match='Missing key\\(s\\) in state_dict: "scale"'):
        ours.load_state_dict(state)
    result = ours.load_state_dict(state, strict=False)
    assert result.missing_keys == ["scale"] and result.unexpected_keys == []
    assert qparam_values(ours, case) == (SCALE, ZP)


@pytest.mark.parametrize("name", list(CASES))
def test_weights_only_round_trip(name, weights_only_roundtrip):
    case = CASES[name]
    ours, theirs = case.pair()
    assign(ours, case, SCALE, ZP)
    fresh, _ = case.pair(0.5, 1)
    if case.storage == "plain":  # not in the state dict, as torch
        fresh.load_state_dict(weights_only_roundtrip(ours.state_dict()))
        assert qparam_values(fresh, case) == (0.5, 1)
        return
    fresh.load_state_dict(weights_only_roundtrip(ours.state_dict()))
    assert qparam_values(fresh, case) == (SCALE, ZP)
    if case.forward:
        xs, _ = inputs(case)
        a, b = case.call(ours, *xs), case.call(fresh, *xs)
        assert (a.q_scale(), a.q_zero_point()) == (b.q_scale(), b.q_zero_point())
        assert torch.equal(a.int_repr(), b.int_repr())
    # a scale float32 cannot hold comes back rounded, as from torch's state dict
    assign(ours, case, 0.05, ZP)
    fresh.load_state_dict(weights_only_roundtrip(ours.state_dict()))
    assign_torch(theirs, case, 0.05, ZP)
    theirs.load_state_dict(weights_only_roundtrip(theirs.state_dict()))
    assert qparam_values(fresh, case) == qparam_values(theirs, case)


# ---- copies, caches, tracing --------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_deepcopy_and_pickle_keep_the_values(name):
    case = CASES[name]
    ours, _ = case.pair()
    assign(ours, case, SCALE, ZP)
    for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
        assert qparam_values(clone, case) == (SCALE, ZP)
        assert repr(clone) == repr(ours)
        assign(clone, case, 0.5, 1)  # the copy is independent
        assert qparam_values(ours, case) == (SCALE, ZP)
        if case.forward:
            xs, _ = inputs(case)
            out = case.call(clone, *xs)
            assert (out.q_scale(), out.q_zero_point()) == (0.5, 1)


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c.storage == "buffer"])
def test_buffer_cache_follows_the_buffers(name):
    """Forwards read cached numbers; outside tracing the cache follows the buffers however
    they change: assignment, load_state_dict (copy or assign), in-place writes, ``.to()``."""
    case = CASES[name]
    ours, _ = case.pair()
    xs, _ = inputs(case)

    def out_qparams():
        out = case.call(ours, *xs)
        return out.q_scale(), out.q_zero_point()

    assign(ours, case, SCALE, ZP)
    assert out_qparams() == (SCALE, ZP)
    state = ours.state_dict()
    state["scale"], state["zero_point"] = torch.full_like(state["scale"], 0.25), \
        torch.full_like(state["zero_point"], 5)
    buffer = ours.scale
    ours.load_state_dict(state)
    assert ours.scale is buffer and out_qparams() == (0.25, 5)  # copied in place, as torch
    state["scale"] = torch.full_like(state["scale"], 0.125)
    ours.load_state_dict(state, assign=True)
    assert out_qparams() == (0.125, 5)
    with torch.no_grad():
        ours.scale.fill_(0.5)
        ours.zero_point.copy_(torch.full_like(ours.zero_point, 6))
    assert out_qparams() == (0.5, 6)
    ours.to(torch.device("cpu"))
    ours.scale = SCALE
    assert out_qparams() == (SCALE, 6)


class _Traced(torch.nn.Module):
    """Float in, the module's integers out (QTensors cannot leave an exported graph)."""

    def __init__(self, case, module):
        super().__init__()
        self.case, self.module = case, module
        self.quant = torch.nn.ModuleList(
            [] if case.float_input else [nnq.Quantize(X_SCALE, X_ZP, tq.quint8)
                                         for _ in case.shapes])

    def forward(self, *xs):
        if not self.case.float_input:
            xs = [q(x) for q, x in zip(self.quant, xs)]
        return self.case.call(self.module, *xs).int_repr()


@pytest.mark.parametrize("name", [n for n in FORWARD_CASES if CASES[n].exportable])
def test_export_sees_python_numbers(name):
    """``torch.export`` fails on a forward that reads ``float(buffer)`` (a data-dependent
    guard); the exported program holds the qparams assigned before export as constants."""
    case = CASES[name]
    ours, _ = case.pair()
    assign(ours, case, SCALE, ZP)
    gen = torch.Generator().manual_seed(0)
    xs = tuple(torch.randn(shape, generator=gen) * 2 for shape in case.shapes)
    model = _Traced(case, ours).eval()
    expected = model(*xs)
    exported = torch.export.export(model, xs)
    assert torch.equal(exported.module()(*xs), expected)

