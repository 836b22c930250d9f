"""Inductor lowers torchquant's quantize / dequantize ops to fused C++ with eager mode's
integers, bit for bit, and calls no Python-implemented torchquant op.
(ops/inductor/elementwise.py)"""
import torch
from torch._inductor.utils import run_and_get_code

import torchquant  # noqa: F401  (registers the ops and their lowerings)

tq = torch.ops.torchquant


def _chain(x, w_int, w_scale, w_zp):
    q = tq.quantize_per_tensor(x, 0.0371, 131, "quint8")
    s = tq.quantize_per_tensor(x * 3.0, 0.0213, -5, "qint8")
    back = tq.dequantize_per_tensor(q, 0.0371, 131) + tq.dequantize_per_tensor(s, 0.0213, -5)
    w = tq.dequantize_per_channel(w_int, w_scale, w_zp, 0)
    return q, s, back, w


def test_quantize_dequantize_lowered_bit_exact_and_without_python_ops():
    torch.manual_seed(0)
    x = torch.randn(4, 3, 17, 5) * 4
    # ties of the rounding, the clamp ends, NaN (to the zero point) and the infinities
    x.view(-1)[:8] = torch.tensor([0.5 * 0.0371, 1.5 * 0.0371, -2.5 * 0.0371, 1e9, -1e9,
                                   float("nan"), float("inf"), float("-inf")])
    w_int = torch.randint(-128, 128, (4, 3, 17, 5), dtype=torch.int8)
    w_scale = torch.rand(4, dtype=torch.float64) * 0.01 + 1e-4
    w_zp = torch.randint(-3, 4, (4,), dtype=torch.int64)
    expected = _chain(x, w_int, w_scale, w_zp)
    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(_chain, fullgraph=True), x, w_int, w_scale, w_zp)
    for e, g in zip(expected, got):
        assert e.dtype == g.dtype
        assert torch.equal(e, g) or torch.equal(torch.nan_to_num(e), torch.nan_to_num(g))
    assert "torch.ops.torchquant" not in "".join(code)


def _decomposed_chain(x):
    return (tq.quantize_per_tensor(x, 0.021436095237731934, 140, "quint8", "decomposed"),
            tq.quantize_per_tensor(x, 0.0371, -5, "qint8", "decomposed"))


def test_decomposed_rounding_lowered_bit_exact():
    """PT2E graphs quantize with torchao's rounding (round the product, then add the zero
    point; NaN to 0); inductor's lowering of it gives the eager op's integers."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 17, 5) * 3
    # exact means of codes (an average pool's outputs) sit on .5 ties, and NaN / infinities
    x.view(-1)[:64] = (torch.arange(64) / 16.0 - 2) * 0.021436095237731934
    x.view(-1)[64:67] = torch.tensor([float("nan"), float("inf"), float("-inf")])
    expected = _decomposed_chain(x)
    torch._dynamo.reset()
    got, code = run_and_get_code(torch.compile(_decomposed_chain, fullgraph=True), x)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    assert "torch.ops.torchquant" not in "".join(code)
