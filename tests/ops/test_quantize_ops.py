"""The quantize family of ``torch.ops.torchquant`` ops: fake-quantize per tensor / channel (with
autograd), quantize / dequantize per block, dynamic quantize per tensor / token.

Each op: ``opcheck`` of its schema and fake kernel, its results bit-exact against torch's or
torchao's own op (the oracle named in each test), and a ``torch.export`` of a tiny module
holding the ``torchquant`` node.
"""
import ast
from pathlib import Path

import pytest
import torch

import torchquant
from torchquant import affine
from torchquant.ops import fake_quantize as ops_fq
from torchquant.ops import quantize as ops_quantize
from torchquant.ops import quantize_block as ops_block
from torchquant.ops import quantize_dynamic as ops_dynamic

quant_primitives = pytest.importorskip("torchao.quantization.quant_primitives")
MappingType = quant_primitives.MappingType


def _opcheck(op, args, autograd=False):
    tests = ("test_schema", "test_faketensor", "test_aot_dispatch_static")
    if autograd:
        tests += ("test_autograd_registration", "test_aot_dispatch_dynamic")
    torch.library.opcheck(op, args, test_utils=tests)


def _targets(ep) -> set[str]:
    return {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}


def _with_ties(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x`` with a quarter of its values on exact rounding ties (k + 0.5) * scale."""
    flat = x.reshape(-1).clone()
    n = flat.numel() // 4
    flat[:n] = (torch.randint(-300, 300, (n,)).float() + 0.5) * scale
    return flat.reshape(x.shape)


# --------------------------------------------------------------------------------------------
# Fake-quantize
# --------------------------------------------------------------------------------------------

QRANGES = [(0, 255), (-128, 127), (0, 15), (-8, 7)]


@pytest.mark.parametrize("qmin,qmax", QRANGES)
def test_fake_quantize_per_tensor_matches_torch(qmin, qmax):
    """Forward and straight-through gradient bit-exact with torch.fake_quantize_per_tensor_affine."""
    scale, zp = torch.tensor([0.037]), torch.tensor([3 if qmin == 0 else -2], dtype=torch.int32)
    x = _with_ties(torch.randn(6, 50) * 4, 0.037)
    ours_x = x.clone().requires_grad_()
    torch_x = x.clone().requires_grad_()
    grad = torch.randn_like(x)
    ours = ops_fq.fake_quantize(ours_x, scale, zp, qmin, qmax)
    want = torch.fake_quantize_per_tensor_affine(torch_x, scale, zp, qmin, qmax)
    assert torch.equal(ours, want)
    ours.backward(grad)
    want.backward(grad)
    assert torch.equal(ours_x.grad, torch_x.grad)
    op_x = x.clone().requires_grad_()
    op_out = torch.ops.torchquant.fake_quantize_per_tensor(op_x, scale, zp, qmin, qmax)
    op_out.backward(grad)
    assert torch.equal(op_out, want) and torch.equal(op_x.grad, torch_x.grad)


@pytest.mark.parametrize("axis", [0, 1])
def test_fake_quantize_per_channel_matches_torch(axis):
    x = _with_ties(torch.randn(4, 6, 5) * 3, 0.05)
    channels = x.size(axis)
    scale = torch.rand(channels) * 0.05 + 0.01
    zp = torch.randint(0, 20, (channels,), dtype=torch.int32)
    grad = torch.randn_like(x)
    ours_x, torch_x, op_x = (x.clone().requires_grad_() for _ in range(3))
    want = torch.fake_quantize_per_channel_affine(torch_x, scale, zp, axis, 0, 255)
    ours = ops_fq.fake_quantize(ours_x, scale, zp, 0, 255, axis)
    op_out = torch.ops.torchquant.fake_quantize_per_channel(op_x, scale, zp, axis, 0, 255)
    assert torch.equal(ours, want) and torch.equal(op_out, want)
    for out, leaf in ((want, torch_x), (ours, ours_x), (op_out, op_x)):
        out.backward(grad)
    assert torch.equal(ours_x.grad, torch_x.grad) and torch.equal(op_x.grad, torch_x.grad)


def test_fake_quantize_ops_opcheck():
    x = torch.randn(3, 8, requires_grad=True)
    _opcheck(torch.ops.torchquant.fake_quantize_per_tensor.default,
             (x, torch.tensor(0.05), torch.tensor(10, dtype=torch.int32), 0, 255), autograd=True)
    _opcheck(torch.ops.torchquant.fake_quantize_per_channel.default,
             (x, torch.rand(8) * 0.1 + 0.01, torch.zeros(8, dtype=torch.int32), 1, -128, 127),
             autograd=True)


def test_fake_quantize_large_input_uses_fast_kernel_bit_exact():
    """Above the compiled kernel's size threshold (hot after two calls) the eager function runs
    the compiled fake-quantize: same values and gradient as torch."""
    x = torch.randn(64, 1024) * 3
    scale, zp = torch.tensor([0.02]), torch.tensor([128], dtype=torch.int32)
    want = torch.fake_quantize_per_tensor_affine(x, scale, zp, 0, 255)
    for _ in range(3):
        assert torch.equal(ops_fq.fake_quantize(x, scale, zp, 0, 255), want)


class _FakeQuantModule(torch.nn.Module):
    def __init__(self, per_channel: bool):
        super().__init__()
        self.per_channel = per_channel
        n = 8 if per_channel else 1
        self.register_buffer("scale", torch.rand(n) * 0.1 + 0.01)
        self.register_buffer("zero_point", torch.randint(0, 10, (n,), dtype=torch.int32))

    def forward(self, x):
        axis = 1 if self.per_channel else None
        return ops_fq.fake_quantize(x, self.scale, self.zero_point, 0, 255, axis) * 2


@pytest.mark.parametrize("per_channel", [False, True])
def test_export_fake_quantize(per_channel):
    m = _FakeQuantModule(per_channel)
    x = torch.randn(4, 8)
    ep = torch.export.export(m, (x,))
    name = "per_channel" if per_channel else "per_tensor"
    assert f"torchquant.fake_quantize_{name}.default" in _targets(ep)
    assert torch.equal(ep.module()(x), m(x))


def test_fake_quantize_module_calls_the_op_function(monkeypatch):
    """The FakeQuantize modules go through ops.fake_quantize (so traced graphs get the op)."""
    import torchquant.quantization as tq
    calls = []
    original = ops_fq.fake_quantize

    def spy(*args, **kwargs):
        calls.append(args[3:5])
        return original(*args, **kwargs)

    monkeypatch.setattr(ops_fq, "fake_quantize", spy)
    fq = tq.FakeQuantize()
    x = torch.randn(4, 8)
    out = fq(x)
    assert calls == [(0, 255)]
    assert torch.equal(out, torch.fake_quantize_per_tensor_affine(
        x, fq.scale, fq.zero_point.to(torch.int32), 0, 255))


@pytest.mark.parametrize("backend", ["x86", "fbgemm", "qnnpack"])
def test_export_qat_prepared_model_holds_fake_quantize_ops(backend):
    """A QAT-prepared model (FakeQuantize / FusedMovingAvgObsFakeQuantize, per-tensor
    activations, per-channel weights for x86) exports, once its observers are off, with
    torchquant's fake-quantize nodes and the eager outputs.  (With observers on, the observers'
    running statistics branch on data, as torch's do.)"""
    import torchquant.quantization as tq
    m = torch.nn.Sequential(tq.QuantStub(), torch.nn.Linear(8, 6), torch.nn.ReLU(),
                            tq.DeQuantStub())
    m.qconfig = tq.get_default_qat_qconfig(backend)
    tq.prepare_qat(m.train(), inplace=True)
    for _ in range(3):
        m(torch.randn(16, 8))
    m.eval().apply(tq.disable_observer)
    x = torch.randn(4, 8)
    ep = torch.export.export(m, (x,))
    assert "torchquant.fake_quantize_per_tensor.default" in _targets(ep)
    assert torch.equal(ep.module()(x), m(x))


# --------------------------------------------------------------------------------------------
# Per block / group
# --------------------------------------------------------------------------------------------

BLOCK_CASES = [
    # (shape, block_size, dtype, qmin, qmax, mapping)
    ((8, 64), (1, 32), torch.int8, -128, 127, MappingType.ASYMMETRIC),
    ((8, 64), (1, 32), torch.int8, -127, 127, MappingType.SYMMETRIC),
    ((8, 64), (1, 16), torch.int8, -8, 7, MappingType.ASYMMETRIC),   # int4 in int8 storage
    ((8, 64), (1, 64), torch.int8, -8, 7, MappingType.SYMMETRIC),
    ((4, 6, 32), (2, 3, 8), torch.int8, -128, 127, MappingType.ASYMMETRIC),
    ((16, 32), (16, 32), torch.uint8, 0, 255, MappingType.ASYMMETRIC),
]


@pytest.mark.parametrize("shape,block_size,dtype,qmin,qmax,mapping", BLOCK_CASES)
def test_block_ops_match_torchao(shape, block_size, dtype, qmin, qmax, mapping):
    """torchao's choose_qparams_affine gives the qparams; our quantize / dequantize per block
    equal its quantize_affine / dequantize_affine bit for bit."""
    x = torch.randn(shape) * 2
    scale, zp = quant_primitives.choose_qparams_affine(
        x, mapping, block_size, dtype, quant_min=qmin, quant_max=qmax,
        zero_point_dtype=torch.int32)
    want_q = quant_primitives.quantize_affine(x, block_size, scale, zp, dtype, qmin, qmax)
    q = ops_block.quantize_per_block(x, scale, zp, qmin, qmax, dtype, block_size=block_size)
    assert q.dtype == want_q.dtype and torch.equal(q, want_q)
    want_x = quant_primitives.dequantize_affine(want_q, block_size, scale, zp, dtype, qmin, qmax)
    got_x = ops_block.dequantize_per_block(q, scale, zp, block_size=block_size)
    assert torch.equal(got_x, want_x)
    assert torch.equal(affine.quantize_block(x, block_size, scale, zp, qmin, qmax, dtype), want_q)
    op_q = torch.ops.torchquant.quantize_per_block(x, list(block_size), scale, zp, qmin, qmax,
                                                   dtype)
    assert torch.equal(op_q, want_q)
    assert torch.equal(torch.ops.torchquant.dequantize_per_block(q, list(block_size), scale, zp),
                       want_x)


def test_group_size_is_the_last_dim_block():
    x = torch.randn(4, 64)
    scale = torch.rand(4, 2) * 0.1 + 0.01
    zp = torch.randint(-3, 3, (4, 2), dtype=torch.int32)
    by_group = ops_block.quantize_per_block(x, scale, zp, -8, 7, group_size=32)
    assert torch.equal(by_group, ops_block.quantize_per_block(x, scale, zp, -8, 7,
                                                              block_size=(1, 32)))
    with pytest.raises(ValueError, match="exactly one"):
        ops_block.quantize_per_block(x, scale, zp, -8, 7)
    with pytest.raises(ValueError, match="not divisible"):
        ops_block.quantize_per_block(x, scale, zp, -8, 7, group_size=24)
    with pytest.raises(ValueError, match="elements"):
        ops_block.quantize_per_block(x, scale[:, :1], zp[:, :1], -8, 7, group_size=32)


def test_block_ops_opcheck():
    x = torch.randn(4, 64)
    scale, zp = torch.rand(4, 2) * 0.1 + 0.01, torch.randint(-3, 3, (4, 2), dtype=torch.int32)
    _opcheck(torch.ops.torchquant.quantize_per_block.default,
             (x, [1, 32], scale, zp, -8, 7, torch.int8))
    q = torch.randint(-8, 8, (4, 64), dtype=torch.int8)
    _opcheck(torch.ops.torchquant.dequantize_per_block.default, (q, [1, 32], scale, zp))


class _GroupWiseWeight(torch.nn.Module):
    """A linear layer with an int4 group-wise weight, dequantized in the graph."""

    def __init__(self):
        super().__init__()
        w = torch.randn(6, 64)
        scale, zp = quant_primitives.choose_qparams_affine(
            w, MappingType.ASYMMETRIC, (1, 32), torch.int8, quant_min=-8, quant_max=7,
            zero_point_dtype=torch.int32)
        self.register_buffer("scale", scale)
        self.register_buffer("zero_point", zp)
        self.register_buffer("weight", ops_block.quantize_per_block(w, scale, zp, -8, 7,
                                                                    group_size=32))

    def forward(self, x):
        w = ops_block.dequantize_per_block(self.weight, self.scale, self.zero_point,
                                           group_size=32)
        q = ops_block.quantize_per_block(x, self.scale[:2, :], self.zero_point[:2, :], -128, 127,
                                         group_size=32)
        return torch.nn.functional.linear(q.float(), w)


def test_export_block_ops():
    m = _GroupWiseWeight()
    x = torch.randn(2, 64)
    ep = torch.export.export(m, (x,))
    targets = _targets(ep)
    assert "torchquant.dequantize_per_block.default" in targets
    assert "torchquant.quantize_per_block.default" in targets
    assert torch.equal(ep.module()(x), m(x))


# --------------------------------------------------------------------------------------------
# Dynamic
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("reduce_range", [False, True])
@pytest.mark.parametrize("qdtype,torch_dtype", [("quint8", torch.quint8), ("qint8", torch.qint8)])
def test_dynamic_per_tensor_matches_torch(reduce_range, qdtype, torch_dtype):
    """qparams equal torch._choose_qparams_per_tensor (quint8) and the codes equal
    torch.quantize_per_tensor_dynamic's integers (the ATen dynamic-quantization rule)."""
    for x in (torch.randn(5, 40) * 3, torch.rand(3, 7) + 0.5, -torch.rand(3, 7), torch.zeros(4),
              torch.randn(2, 3) * 1e-6):
        q, scale, zp = ops_dynamic.quantize_dynamic_per_tensor(x, qdtype, reduce_range)
        want = torch.quantize_per_tensor_dynamic(x, torch_dtype, reduce_range)
        assert scale.dtype == torch.float64 and zp.dtype == torch.int64
        assert scale.item() == want.q_scale() and zp.item() == want.q_zero_point()
        assert torch.equal(q, want.int_repr())
        if qdtype == "quint8":
            assert (scale.item(), zp.item()) == torch._choose_qparams_per_tensor(x, reduce_range)
        op_q, op_scale, op_zp = torch.ops.torchquant.quantize_dynamic_per_tensor(
            x, qdtype, reduce_range)
        assert torch.equal(op_q, q) and torch.equal(op_scale, scale) and torch.equal(op_zp, zp)


def test_dynamic_per_tensor_rejects_non_finite():
    with pytest.raises(ValueError, match="finite"):
        ops_dynamic.quantize_dynamic_per_tensor(torch.tensor([1.0, float("nan")]))


def test_dynamic_per_token_matches_torchao():
    """torchao's per-token int8 rule (symmetric, -127..127, eps 1e-5, one scale per row)."""
    x = torch.randn(3, 5, 32) * 2
    x[0, 0] = 0.0  # an all-zero row: the eps floor
    q, scale, zp = ops_dynamic.quantize_dynamic_per_token(x)
    block = (1, 1, 32)
    want_scale, want_zp = quant_primitives.choose_qparams_affine(
        x, MappingType.SYMMETRIC, block, torch.int8, quant_min=-127, quant_max=127, eps=1e-5,
        scale_dtype=torch.float32, zero_point_dtype=torch.int32)
    want_q = quant_primitives.quantize_affine(x, block, want_scale, want_zp, torch.int8,
                                              -127, 127)
    assert torch.equal(scale, want_scale.reshape(3, 5)) and torch.equal(q, want_q)
    assert torch.equal(zp, torch.zeros(3, 5, dtype=torch.int32))
    op = torch.ops.torchquant.quantize_dynamic_per_token(x)
    assert all(torch.equal(a, b) for a, b in zip(op, (q, scale, zp)))


def test_dynamic_ops_opcheck():
    x = torch.randn(4, 16)
    _opcheck(torch.ops.torchquant.quantize_dynamic_per_tensor.default, (x, "quint8", True))
    _opcheck(torch.ops.torchquant.quantize_dynamic_per_token.default, (x,))


class _DynamicQuant(torch.nn.Module):
    def forward(self, x):
        q, scale, zp = ops_dynamic.quantize_dynamic_per_tensor(x, "quint8", True)
        t, t_scale, _ = ops_dynamic.quantize_dynamic_per_token(x)
        return (q.float() - zp) * scale + t.float() * t_scale.unsqueeze(-1)


def test_export_dynamic_ops():
    m = _DynamicQuant()
    x = torch.randn(3, 16)
    ep = torch.export.export(m, (x,))
    targets = _targets(ep)
    assert "torchquant.quantize_dynamic_per_tensor.default" in targets
    assert "torchquant.quantize_dynamic_per_token.default" in targets
    assert torch.equal(ep.module()(x), m(x))


# --------------------------------------------------------------------------------------------
# The fast forms equal affine's plain math; affine imports nothing above it
# --------------------------------------------------------------------------------------------

def test_fast_forms_equal_plain_math():
    """ops.quantize's functions (compiled kernels once a large shape is hot) give affine's
    integers and floats exactly."""
    x = torch.randn(64, 1024) * 4
    x.view(-1)[:4096] = (torch.randint(-300, 300, (4096,)).float() + 0.5) * 0.03
    for _ in range(3):
        assert torch.equal(ops_quantize.quantize_finite_per_tensor(x, 0.03, 7, 0, 255, torch.uint8),
                           affine.quantize_finite_per_tensor(x, 0.03, 7, 0, 255, torch.uint8))
        assert torch.equal(ops_quantize.quantize_per_tensor_int(x, 0.03, 7, torchquant.quint8),
                           affine.quantize_per_tensor_int(x, 0.03, 7, torchquant.quint8))
        assert torch.equal(ops_quantize.quantize_with_multiplier(x, 33.0, 3, -128, 127, torch.int8),
                           affine.quantize_with_multiplier(x, 33.0, 3, -128, 127, torch.int8))
        q = affine.quantize_per_tensor_int(x, 0.03, 7, torchquant.quint8)
        assert torch.equal(ops_quantize.dequantize_per_tensor_int(q, 0.03, 7),
                           affine.dequantize_per_tensor_int(q, 0.03, 7))


def test_affine_imports_only_dtypes():
    tree = ast.parse(Path(affine.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            imported.update(a.name for a in node.names) if node.module is None \
                else imported.add(node.module)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names if a.name.startswith("torchquant"))
    assert imported <= {"dtypes"}, imported


def test_decomposed_rounding_is_torchaos_pt2e_quantize():
    """``rounding="decomposed"`` is the rounding of the quantize op torchao's PT2E graphs hold
    (torch's ``quantized_decomposed.quantize_per_tensor``, the oracle here): the product is
    rounded before the zero point is added, so ties of the product round half to even on their
    own (torch's ``quantize_per_tensor`` adds the zero point first, in one fused multiply-add,
    and differs there); NaN gives 0.  Tie-heavy inputs: exact means of codes."""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the oracle op)
    scale = 0.021436095237731934
    x = (torch.arange(-4096, 4096) / 16.0) * scale
    x = torch.cat([x, torch.randn(4096) * 3, torch.tensor([float("nan"), float("inf"),
                                                           float("-inf"), 1e9, -1e9])])
    for zero_point, qdtype, qmin, qmax, dtype in ((140, "quint8", 0, 255, torch.uint8),
                                                  (-5, "qint8", -128, 127, torch.int8)):
        ours = torch.ops.torchquant.quantize_per_tensor(x, scale, zero_point, qdtype,
                                                        "decomposed")
        theirs = torch.ops.quantized_decomposed.quantize_per_tensor(x, scale, zero_point, qmin,
                                                                    qmax, dtype)
        assert torch.equal(ours, theirs)
        eager = torch.ops.torchquant.quantize_per_tensor(x, scale, zero_point, qdtype)
        assert not torch.equal(eager, theirs)  # the two roundings do differ on these inputs
    with pytest.raises(ValueError, match="rounding"):
        torch.ops.torchquant.quantize_per_tensor(x, scale, 0, "quint8", "half_up")


@pytest.mark.parametrize("qdtype,qmin,qmax,dtype", [("quint8", 0, 255, torch.uint8),
                                                     ("quint8", 0, 127, torch.uint8),
                                                     ("qint8", -128, 127, torch.int8)])
def test_dynamic_quantize_with_eps_is_torchaos_pt2e_rule(qdtype, qmin, qmax, dtype):
    """With ``eps`` (what convert_pt2e emits) the dynamic quantize op is torchao's PT2E pair
    ``choose_qparams.tensor`` + ``quantize_per_tensor.tensor`` (torch's quantized_decomposed
    ops, the oracle), bit for bit: codes, float32-valued scale and zero point; eager and
    inductor's decomposition alike.  (Without ``eps`` it stays torch's dynamic rule, whose scale
    is a float64 quotient.)"""
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (registers the oracle ops)
    eps = torch.finfo(torch.float32).eps
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(16, 64, generator=gen) * s + o
              for s, o in ((1, 0), (3, 2), (0.01, 0), (5, -7), (1e-8, 0))] + [torch.zeros(4, 4)]
    compiled = torch.compile(
        lambda t: torch.ops.torchquant.quantize_dynamic_per_tensor(t, qdtype, False, qmin, qmax,
                                                                   eps), fullgraph=True)
    for x in inputs:
        scale, zp = torch.ops.quantized_decomposed.choose_qparams.tensor(x, qmin, qmax, eps,
                                                                         dtype)
        codes = torch.ops.quantized_decomposed.quantize_per_tensor.tensor(x, scale, zp, qmin,
                                                                          qmax, dtype)
        for got in (torch.ops.torchquant.quantize_dynamic_per_tensor(x, qdtype, False, qmin,
                                                                     qmax, eps), compiled(x)):
            assert torch.equal(got[0], codes)
            assert float(got[1]) == float(scale) and int(got[2]) == int(zp)
    with pytest.raises(ValueError, match="NaN or Inf"):
        torch.ops.torchquant.quantize_dynamic_per_tensor(torch.tensor([float("nan")]), qdtype,
                                                         False, qmin, qmax, eps)
