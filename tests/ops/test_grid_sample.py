"""``torch.ops.torchquant.grid_sample_bilinear2d``: torch's quantized grid sampler on uint8
integers (bilinear), bit for bit against torch, and ``opcheck`` of its schema and fake kernel."""
import pytest
import torch
import torch.nn.functional as F

from torchquant.ops import pooling


def _case(seed, n=2, c=3, h=6, w=9, out=(5, 7)):
    gen = torch.Generator().manual_seed(seed)
    values = torch.randint(0, 256, (n, c, h, w), generator=gen, dtype=torch.uint8)
    grid = torch.rand(n, *out, 2, generator=gen) * 2.8 - 1.4
    return values, grid


@pytest.mark.parametrize("padding_mode", pooling.GRID_PADDING_MODES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_matches_torch_quantized_grid_sampler(padding_mode, align_corners):
    for seed in range(4):
        values, grid = _case(seed)
        zero_point = 17 * seed
        q = torch._make_per_tensor_quantized_tensor(values, 0.1, zero_point)
        want = F.grid_sample(q, grid, padding_mode=padding_mode,
                             align_corners=align_corners).int_repr()
        got = pooling.grid_sample_bilinear(values, zero_point, grid, padding_mode, align_corners)
        assert torch.equal(got, want)
        op = torch.ops.torchquant.grid_sample_bilinear2d(values, zero_point, grid, padding_mode,
                                                         align_corners)
        assert torch.equal(op, want)


def test_non_finite_grid_points_read_the_zero_point_as_torch():
    values, grid = _case(7)
    grid[0, 0, 0] = torch.tensor([float("nan"), 0.0])
    grid[1, 2, 3] = torch.tensor([float("inf"), -float("inf")])
    q = torch._make_per_tensor_quantized_tensor(values, 0.1, 40)
    for padding_mode in pooling.GRID_PADDING_MODES:
        want = F.grid_sample(q, grid, padding_mode=padding_mode, align_corners=False).int_repr()
        got = pooling.grid_sample_bilinear(values, 40, grid, padding_mode, False)
        assert torch.equal(got, want)


def test_opcheck():
    values, grid = _case(1)
    for padding_mode in pooling.GRID_PADDING_MODES:
        torch.library.opcheck(torch.ops.torchquant.grid_sample_bilinear2d,
                              (values, 3, grid, padding_mode, True))
