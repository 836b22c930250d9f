"""The elementwise activation ops (``torch.ops.torchquant.{sigmoid, tanh, hardsigmoid, hardswish,
elu, celu, leaky_relu, threshold, clamp}``): schema and fake kernels (``opcheck``), and the
registered op == the eager function == torch's quantized kernel, bit for bit, over every value
of quint8 and qint8.

torch's SIMD body and scalar tail round differently (torchquant/ops/_lanes.py), so each value
is run through both: a dense 256-element tensor takes the SIMD body everywhere (4 steps of 64),
a strided view of it the scalar tail everywhere, and a 2-D tensor with ragged rows mixes them.
"""
import pytest
import torch
import torch.ao.nn.quantized as ao_nnq
import torch.ao.nn.quantized.functional as ao_F
import torch.nn.functional as F

import torchquant as tq
from torchquant.ops import activation

TORCH_DTYPE = {tq.quint8: torch.quint8, tq.qint8: torch.qint8}


def _opcheck(op, args):
    # the dispatcher-level checks; autograd ones do not apply to integer outputs
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor",
                                                "test_aot_dispatch_static"))


def _all_values(qdtype, layout):
    """Every integer of ``qdtype``: dense (SIMD body), strided (scalar tail) or in a (5, 60)
    tensor whose flat length leaves a 44-element tail."""
    values = torch.arange(qdtype.qmin, qdtype.qmax + 1).to(qdtype.storage_dtype)
    if layout == "dense":
        return values
    if layout == "strided":
        return values.repeat_interleave(2)[::2]
    extra = torch.randint(qdtype.qmin, qdtype.qmax + 1, (44,)).to(qdtype.storage_dtype)
    return torch.cat([values[torch.randperm(256)], extra]).reshape(5, 60)


def _torch_q(ints, scale, zero_point):
    """The same integers as one of torch's quantized tensors, in the same layout."""
    base = ints._base if ints._base is not None else ints
    quantized = torch._make_per_tensor_quantized_tensor(base, scale, zero_point)
    return quantized.as_strided(ints.shape, ints.stride(), ints.storage_offset())


# (scale, zero point) of quint8 inputs (qint8 takes zero point - 128): values on simple grids,
# many results on rounding ties
GRIDS = [(0.05, 101), (0.1, 30), (0.025, 200)]
LAYOUTS = ["dense", "strided", "mixed"]


def _grid(qdtype, k):
    scale, zero_point = GRIDS[k]
    return scale, zero_point - 128 if qdtype is tq.qint8 else zero_point


def _out_qparams(qdtype):
    return (0.05, 97) if qdtype is tq.quint8 else (0.05, -31)


# name -> (op, args after (x, scale, zero_point) as a function of qdtype, the eager function's
# call, torch's call on a quantized tensor)
def _cases():
    def out(qd):
        return _out_qparams(qd)

    return {
        "sigmoid_fixed": (
            torch.ops.torchquant.sigmoid,
            lambda qd: (*activation.fixed_qparams("sigmoid", qd), qd.name),
            lambda x, s, z, qd: activation.sigmoid(x, s, z, *activation.fixed_qparams(
                "sigmoid", qd), qd),
            lambda t, qd: torch.sigmoid(t)),
        "sigmoid": (
            torch.ops.torchquant.sigmoid, lambda qd: (*out(qd), qd.name),
            lambda x, s, z, qd: activation.sigmoid(x, s, z, *out(qd), qd),
            lambda t, qd: ao_nnq.Sigmoid(*out(qd))(t)),
        "tanh": (
            torch.ops.torchquant.tanh,
            lambda qd: (*activation.fixed_qparams("tanh", qd), qd.name),
            lambda x, s, z, qd: activation.tanh(x, s, z, *activation.fixed_qparams("tanh", qd),
                                                qd),
            lambda t, qd: torch.tanh(t)),
        "hardsigmoid": (
            torch.ops.torchquant.hardsigmoid,
            lambda qd: (*activation.fixed_qparams("hardsigmoid", qd), qd.name),
            lambda x, s, z, qd: activation.hardsigmoid(
                x, s, z, *activation.fixed_qparams("hardsigmoid", qd), qd),
            lambda t, qd: ao_F.hardsigmoid(t)),
        "hardswish": (
            torch.ops.torchquant.hardswish, lambda qd: (*out(qd), qd.name),
            lambda x, s, z, qd: activation.hardswish(x, s, z, *out(qd), qd),
            lambda t, qd: ao_F.hardswish(t, *out(qd))),
        "elu": (
            torch.ops.torchquant.elu, lambda qd: (0.5, *out(qd), qd.name),
            lambda x, s, z, qd: activation.elu(x, s, z, 0.5, *out(qd), qd),
            lambda t, qd: ao_F.elu(t, *out(qd), 0.5)),
        "celu": (
            torch.ops.torchquant.celu, lambda qd: (0.5, *out(qd), qd.name),
            lambda x, s, z, qd: activation.celu(x, s, z, 0.5, *out(qd), qd),
            lambda t, qd: ao_F.celu(t, *out(qd), 0.5)),
        "leaky_relu_same_qparams": (
            torch.ops.torchquant.leaky_relu, None,  # args built from the input's qparams
            lambda x, s, z, qd: activation.leaky_relu(x, s, z, 0.25, s, z, qd, "dense_input"),
            lambda t, qd: F.leaky_relu(t, 0.25)),
        "leaky_relu_rescaled": (
            torch.ops.torchquant.leaky_relu, lambda qd: (0.25, *out(qd), qd.name, "contiguous"),
            lambda x, s, z, qd: activation.leaky_relu(x, s, z, 0.25, *out(qd), qd, "contiguous"),
            lambda t, qd: ao_F.leaky_relu(t, 0.25, scale=out(qd)[0], zero_point=out(qd)[1])),
        "leaky_relu_module": (
            torch.ops.torchquant.leaky_relu, lambda qd: (0.25, *out(qd), qd.name, "dense_input"),
            lambda x, s, z, qd: activation.leaky_relu(x, s, z, 0.25, *out(qd), qd, "dense_input"),
            lambda t, qd: ao_nnq.LeakyReLU(*out(qd), 0.25)(t)),
        "leaky_relu_suggested": (  # the layout of the other ops (no torch caller of its own)
            torch.ops.torchquant.leaky_relu, lambda qd: (0.25, *out(qd), qd.name, "suggested"),
            lambda x, s, z, qd: activation.leaky_relu(x, s, z, 0.25, *out(qd), qd, "suggested"),
            None),
        "threshold": (
            torch.ops.torchquant.threshold, lambda qd: (0.3, -0.5, qd.name),
            lambda x, s, z, qd: activation.threshold(x, s, z, 0.3, -0.5, qd),
            lambda t, qd: ao_F.threshold(t, 0.3, -0.5)),
        "clamp": (
            torch.ops.torchquant.clamp, lambda qd: (-0.75, 0.85, qd.name),
            lambda x, s, z, qd: activation.clamp(x, s, z, -0.75, 0.85, qd),
            lambda t, qd: ao_F.clamp(t, -0.75, 0.85)),
        "clamp_min_only": (
            torch.ops.torchquant.clamp, lambda qd: (-0.125, None, qd.name),
            lambda x, s, z, qd: activation.clamp(x, s, z, -0.125, None, qd),
            lambda t, qd: torch.clamp(t, min=-0.125)),
        "relu6": (
            torch.ops.torchquant.clamp, lambda qd: (0.0, 6.0, qd.name),
            lambda x, s, z, qd: activation.clamp(x, s, z, 0.0, 6.0, qd),
            lambda t, qd: F.relu6(t)),
    }


CASES = _cases()


def _op_args(name, qd, scale, zero_point):
    op, rest, _, _ = CASES[name]
    if rest is None:  # leaky_relu keeping the input's qparams
        return (scale, zero_point, 0.25, scale, zero_point, qd.name, "dense_input")
    return (scale, zero_point, *rest(qd))


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8], ids=str)
@pytest.mark.parametrize("name", list(CASES))
def test_op_equals_eager_equals_torch_on_every_value(name, qdtype):
    op, _, eager_fn, torch_fn = CASES[name]
    for k in range(len(GRIDS)):
        scale, zero_point = _grid(qdtype, k)
        for layout in LAYOUTS:
            ints = _all_values(qdtype, layout)
            args = _op_args(name, qdtype, scale, zero_point)
            got = op(ints, *args)
            eager = eager_fn(ints, scale, zero_point, qdtype)
            assert torch.equal(got, eager) and got.stride() == eager.stride(), (layout, k)
            if torch_fn is None:
                continue
            theirs = torch_fn(_torch_q(ints, scale, zero_point), qdtype)
            mismatch = (got.to(torch.int32) != theirs.int_repr().to(torch.int32)).sum().item()
            assert mismatch == 0, f"{layout}, grid {k}: {mismatch} of {got.numel()} differ"
            assert got.stride() == theirs.stride(), (layout, k)


_OPCHECK_LAYOUTS = {
    "contiguous": lambda t: t,
    "channels_last": lambda t: t.contiguous(memory_format=torch.channels_last),
    "transposed": lambda t: t.transpose(-1, -2),
    "strided": lambda t: t[..., ::2],
}


@pytest.mark.parametrize("qdtype", [tq.quint8, tq.qint8, tq.qint32], ids=str)
@pytest.mark.parametrize("layout", list(_OPCHECK_LAYOUTS))
@pytest.mark.parametrize("name", list(CASES))
def test_opcheck(name, layout, qdtype):
    if qdtype is tq.qint32 and name in ("hardswish", "elu", "celu", "leaky_relu_rescaled",
                                        "leaky_relu_module", "leaky_relu_suggested",
                                        "sigmoid"):
        pytest.skip("8-bit output qparams")
    op = CASES[name][0]
    zero_point = {tq.quint8: 120, tq.qint8: -5, tq.qint32: 17}[qdtype]
    ints = torch.randint(max(qdtype.qmin, -10**6), min(qdtype.qmax, 10**6) + 1,
                         (2, 5, 6, 70)).to(qdtype.storage_dtype)
    x = _OPCHECK_LAYOUTS[layout](ints)
    args = (x, *_op_args(name, qdtype, 0.05, zero_point))
    _opcheck(op.default, args)
    eager = CASES[name][2](x, 0.05, zero_point, qdtype)
    got = op(*args)
    assert torch.equal(got, eager) and got.stride() == eager.stride()
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        fake = op(mode.from_tensor(x), *args[1:])
    assert fake.shape == got.shape and fake.stride() == got.stride() and fake.dtype == got.dtype


def test_qint32_follows_the_two_rounding_paths():
    """32-bit inputs have too many values for tables: both paths are evaluated directly
    (same formulas as the 8-bit tables, checked here against the 8-bit result)."""
    for layout in ("dense", "strided"):
        x8 = _all_values(tq.quint8, layout)
        x32 = x8.to(torch.int32) if layout == "dense" else \
            x8._base.to(torch.int32).as_strided(x8.shape, x8.stride())
        assert x32.stride() == x8.stride()
        for lay in activation.LAYOUTS:
            out32 = activation.leaky_relu(x32, 0.05, 101, 0.25, 0.05, 101, tq.qint32, lay)
            out8 = activation.leaky_relu(x8, 0.05, 101, 0.25, 0.05, 101, tq.quint8, lay)
            assert torch.equal(out32, out8.to(torch.int32)), (layout, lay)


def test_clamp_bounds_and_empty_range():
    x = torch.arange(0, 256, dtype=torch.uint8)
    # min > max gives max everywhere, as torch
    out = activation.clamp(x, 0.05, 100, 0.5, -0.25, tq.quint8)
    assert torch.equal(out, torch.full_like(x, 95))
    with pytest.raises(RuntimeError):
        activation.clamp(x, 0.05, 100, None, None, tq.quint8)


def test_bad_layout_is_refused():
    x = torch.arange(0, 256, dtype=torch.uint8)
    with pytest.raises(ValueError, match="layout"):
        activation.leaky_relu(x, 0.05, 100, 0.1, 0.05, 100, tq.quint8, "channels_last")
