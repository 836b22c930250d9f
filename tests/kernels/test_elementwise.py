"""The compiled elementwise kernels agree bit for bit with the plain-torch reference."""
import pytest
import torch

import torchquant as tq
from torchquant import affine, kernels


@pytest.fixture(autouse=True)
def compile_on_first_call(monkeypatch):
    """Kernels normally compile on a signature's second call; here the first call compiles,
    so each comparison below runs the compiled kernel."""
    from torchquant.kernels import cpu_compiled
    monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 1)


@pytest.fixture(scope="module")
def big():
    torch.manual_seed(1)
    n = 1 << 18  # above every compiled kernel's size threshold
    k = torch.randint(-200, 200, (n,)).float()
    x = torch.nextafter((k + 0.5) * 0.02, torch.tensor(float("inf")))
    x[::3] = (k[::3] + 0.5) * 0.02  # exact ties too
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1e30])
    return x


def _both(fn):
    fast = fn()
    with kernels.reference_only():
        ref = fn()
    return fast, ref


def test_registry_lists_both():
    for op in ("quantize", "dequantize", "fake_quantize"):
        assert {"reference", "cpu_compiled"} <= set(kernels.implementations(op))
    assert kernels.get("quantize", torch.zeros(3)) is kernels.implementations("quantize")["reference"].fn


@pytest.mark.parametrize("dtype", [tq.quint8, tq.qint8, tq.qint32])
def test_compiled_quantize_matches_reference(big, dtype):
    assert kernels.get("quantize", big) is kernels.implementations("quantize")["cpu_compiled"].fn
    zp = 10 if dtype is not tq.qint8 else -3
    fast, ref = _both(lambda: tq.quantize_per_tensor(big, 0.02, zp, dtype))
    assert torch.equal(fast.int_repr(), ref.int_repr())
    f2, r2 = _both(lambda: fast.dequantize())
    assert torch.equal(f2, r2)


def test_compiled_per_channel_matches_reference(big):
    x = big.reshape(64, -1)
    s = torch.rand(64, dtype=torch.float64) * 0.05 + 0.005
    z = torch.randint(-10, 10, (64,))
    fast, ref = _both(lambda: tq.quantize_per_channel(x, s, z, 0, tq.qint8))
    assert torch.equal(fast.int_repr(), ref.int_repr())
    f2, r2 = _both(lambda: fast.dequantize())
    assert torch.equal(f2, r2)


def test_compiled_fake_quantize_matches_reference(big):
    x = big.clone()
    x[:4] = 0.0
    x.requires_grad_(True)
    fast, ref = _both(lambda: tq.fake_quantize_per_tensor_affine(x, 0.02, 100, 0, 255))
    assert torch.equal(fast, ref)
    g1, = torch.autograd.grad(fast.sum(), x)
    g2, = torch.autograd.grad(ref.sum(), x)
    assert torch.equal(g1, g2)


def test_mode_switch_validates():
    with pytest.raises(ValueError, match="auto"):
        kernels.set_mode("fast")
    assert kernels.mode() in ("auto", "reference")


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("relu", [False, True])
def test_large_quantized_add_matches_torch_and_reference(channels_last, relu):
    """Tensors this large take the compiled fused add; it must equal torch's quantized add
    and the eager reference bit for bit."""
    import torchquant as tq
    from torchquant import kernels
    from torchquant.nn.quantized import _binary
    from torchquant.ops import binary as ops_binary
    gen = torch.Generator().manual_seed(7)
    a_f, b_f = torch.randn(2, 64, 24, 24, generator=gen), torch.randn(2, 64, 24, 24, generator=gen)
    if channels_last:
        a_f, b_f = (t.contiguous(memory_format=torch.channels_last) for t in (a_f, b_f))
    ta = torch.quantize_per_tensor(a_f, 0.05, 120, torch.quint8)
    tb = torch.quantize_per_tensor(b_f, 0.04, 130, torch.quint8)
    qa = tq.quantize_per_tensor(a_f, 0.05, 120, tq.quint8)
    qb = tq.quantize_per_tensor(b_f, 0.04, 130, tq.quint8)
    op = torch.ops.quantized.add_relu if relu else torch.ops.quantized.add
    theirs = op(ta, tb, 0.07, 125)
    ours = _binary.add(qa, qb, 0.07, 125, relu=relu)
    assert torch.equal(ours.int_repr(), theirs.int_repr())
    with kernels.reference_only():
        ref = _binary.add(qa, qb, 0.07, 125, relu=relu)
    assert torch.equal(ref.int_repr(), ours.int_repr())


def test_hot_signature_compiles_once_and_is_called_directly(big, monkeypatch):
    """A signature runs eager until its HOT_CALLS-th call, then through one static kernel."""
    from torchquant.kernels import cpu_compiled
    monkeypatch.setattr(cpu_compiled, "HOT_CALLS", 3)
    # direct calls, outside any converted model's call (earlier tests may have counted some)
    monkeypatch.setattr(cpu_compiled, "_model_calls", 0)
    x = big[:40000].clone()
    fn = kernels.implementations("quantize")["cpu_compiled"].fn
    args = (x, torch.tensor(50.0), torch.tensor(7.0), -128, 127, torch.int8, affine.FMA)
    key = cpu_compiled._signature("quantize", args)
    cpu_compiled._kernels.pop(key, None)
    cpu_compiled._calls.pop(key, None)
    cpu_compiled._first_seen_in.pop(key, None)
    with kernels.reference_only():
        ref = tq.quantize_per_tensor(x, 0.02, 7, tq.qint8).int_repr()
    outs = [fn(*args) for _ in range(4)]
    assert key in cpu_compiled._kernels and cpu_compiled._calls[key] == 3
    for out in outs:
        assert torch.equal(out, ref)


def test_repeated_add_runs_a_bound_plan_and_stays_exact():
    """From a signature's compilation on, a residual add repeats as one bound kernel call
    (no checks, no lane walk); its integers stay torch's."""
    from torchquant.nn.quantized import _binary
    from torchquant.ops import binary as ops_binary
    gen = torch.Generator().manual_seed(11)
    a_f = torch.randn(1, 64, 16, 16, generator=gen).contiguous(memory_format=torch.channels_last)
    b_f = torch.randn(1, 64, 16, 16, generator=gen).contiguous(memory_format=torch.channels_last)
    qa = tq.quantize_per_tensor(a_f, 0.05, 120, tq.quint8)
    qb = tq.quantize_per_tensor(b_f, 0.04, 130, tq.quint8)
    qa = qa._with(qa.int_data.contiguous(memory_format=torch.channels_last))
    qb = qb._with(qb.int_data.contiguous(memory_format=torch.channels_last))
    theirs = torch.ops.quantized.add_relu(
        torch.quantize_per_tensor(a_f, 0.05, 120, torch.quint8),
        torch.quantize_per_tensor(b_f, 0.04, 130, torch.quint8), 0.07, 125)
    key = ops_binary._plan_key(qa.int_data, 0.05, 120, qb.int_data, 0.04, 130, 0.07, 125,
                               tq.quint8, True)
    ops_binary._ADD_PLANS.pop(key, None)
    for _ in range(4):
        ours = _binary.add(qa, qb, 0.07, 125, relu=True)
        assert torch.equal(ours.int_repr(), theirs.int_repr())
        assert ours.int_data.is_contiguous(memory_format=torch.channels_last)
    assert key in ops_binary._ADD_PLANS
