"""kernels.linear_small_m: the dynamic int8 Linear of a few rows as an exact float32 GEMM.

The float32 GEMM must return the exact integer accumulator (checked against an int64 matmul,
bit for bit: the argument is that every partial sum is an integer below 2^24), the epilogue is
fbgemm's (torch.ao's dynamic Linear is the oracle, bit for bit), and the bound that makes it
exact is enforced."""
import pytest
import torch

from torchquant.kernels import linear_small_m as S
from torchquant.kernels.onednn_exactness import onednn_u8s8_exact
from torchquant.kernels.packed_linear import pack_linear_weight
from torchquant.kernels.registry import reference_only


def _packed(n, k, per_channel, bias=True, seed=0, extreme=False):
    gen = torch.Generator().manual_seed(seed)
    w = (torch.full((n, k), 127, dtype=torch.int8) if extreme
         else torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=gen))
    if per_channel:
        scale, zp, axis = torch.rand(n, generator=gen, dtype=torch.float64) * 0.01 + 1e-3, \
            torch.zeros(n, dtype=torch.int64), 0
    else:
        scale, zp, axis = torch.tensor(0.0123, dtype=torch.float64), torch.tensor(0), None
    b = torch.randn(n, generator=gen) if bias else None
    return pack_linear_weight(w, scale, zp, axis, b)


@pytest.mark.parametrize("rows", [1, 3, 8, 16])
@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("zero_point", [0, 64, 255])
def test_float_gemm_equals_integer_reference(rows, per_channel, bias, zero_point):
    packed = _packed(96, 200, per_channel, bias, seed=rows)
    gen = torch.Generator().manual_seed(rows + 100)
    codes = (torch.randint(0, 256, (rows, 200), generator=gen) - zero_point).to(torch.float32)
    got = S.dynamic_linear_codes(codes, 0.037, packed)
    want = S.dynamic_linear_codes_reference(codes, 0.037, packed)
    assert torch.equal(got, want)


def test_worst_case_weights_within_the_bound_stay_exact():
    # 255 * 127 * 500 = 16_192_500 < 2^24: the largest accumulators the bound admits
    packed = _packed(16, 500, False, extreme=True)
    assert S._entry(packed)["exact"]
    for rows in (1, 4):
        codes = torch.full((rows, 500), 255.0)
        codes[0, ::7] = -255.0
        assert torch.equal(S.dynamic_linear_codes(codes, 0.5, packed),
                           S.dynamic_linear_codes_reference(codes, 0.5, packed))


def test_weights_beyond_the_bound_are_refused():
    packed = _packed(16, 600, False, extreme=True)  # 255 * 127 * 600 > 2^24
    assert not S._entry(packed)["exact"]
    assert not S.exact_float_gemm_applies(torch.randn(2, 600), packed)


def test_applies_only_to_few_rows_in_auto_mode():
    packed = _packed(32, 24, False)
    few, many = torch.randn(4, 24), torch.randn(S.SMALL_M_MAX_ROWS + 1, 24)
    assert not S.exact_float_gemm_applies(many, packed)
    assert S.exact_float_gemm_applies(few, packed) == (not onednn_u8s8_exact())
    with reference_only():
        assert not S.exact_float_gemm_applies(few, packed)


@pytest.mark.parametrize("rows", [1, 8, 40])
@pytest.mark.parametrize("zero_point", [0, 3, 128])
def test_fused_epilogue_equals_integer_reference(rows, zero_point):
    packed = _packed(64, 48, True, seed=3)
    gen = torch.Generator().manual_seed(rows)
    x_q = torch.randint(0, 129, (rows, 48), dtype=torch.uint8, generator=gen)
    got = S.dynamic_linear_fused_epilogue(x_q, 0.02, zero_point, packed)
    want = S.dynamic_linear_codes_reference(x_q.float() - zero_point, 0.02, packed)
    assert got is not None and torch.equal(got, want)
