"""``fake_quantize_per_channel_affine`` rejects the qparams torch 2.13 rejects, with torch's
error type and message: integer zero points outside [quant_min, quant_max], zero points that
are not int32 / float32 / float16, scales that are not float32 / bfloat16."""
import pytest
import torch

import torchquant as tq

ZP = torch.tensor([0, 5, 3], dtype=torch.int32)
CASES = {
    "zp-above": (torch.ones(3), torch.tensor([0, 5, 300], dtype=torch.int32), 0, 255),
    "zp-below": (torch.ones(3), torch.tensor([0, -1, 3], dtype=torch.int32), 0, 255),
    "zp-signed-ok": (torch.ones(3), torch.tensor([0, -1, 3], dtype=torch.int32), -128, 127),
    "zp-signed-above": (torch.ones(3), torch.tensor([0, -1, 300], dtype=torch.int32), -128, 127),
    "zp-float-out-of-range-ok": (torch.ones(3), torch.tensor([0., 5., 300.]), 0, 255),
    "zp-half": (torch.ones(3), torch.tensor([0., 1., 3.]).half(), 0, 255),
    "zp-long": (torch.ones(3), ZP.long(), 0, 255),
    "zp-short": (torch.ones(3), ZP.short(), 0, 255),
    "zp-double": (torch.ones(3), ZP.double(), 0, 255),
    "scale-double": (torch.ones(3).double(), ZP, 0, 255),
    "scale-half": (torch.ones(3).half(), ZP, 0, 255),
    "ok": (torch.full((3,), 0.1), ZP, 0, 255),
}


def _outcome(fn, case):
    scale, zp, qmin, qmax = CASES[case]
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    try:
        return "ok", fn(x, scale, zp, 1, qmin, qmax)
    except RuntimeError as exc:
        return "RuntimeError", str(exc)


@pytest.mark.parametrize("case", list(CASES))
def test_per_channel_qparams_checked_as_torch(case):
    ours = _outcome(tq.fake_quantize_per_channel_affine, case)
    theirs = _outcome(torch.fake_quantize_per_channel_affine, case)
    assert ours[0] == theirs[0]
    if ours[0] == "ok":
        assert torch.equal(ours[1], theirs[1])
    else:
        assert ours[1] == theirs[1]


def test_bfloat16_scale_works_where_torch_asserts():
    """torch accepts a bfloat16 scale in its check, then fails an INTERNAL ASSERT on CPU
    (needs_dynamic_casting); ours computes with the scale's float32 value."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 4)
    scale = torch.tensor([0.5, 0.0625, 0.125]).bfloat16()
    with pytest.raises(RuntimeError, match="INTERNAL ASSERT"):
        torch.fake_quantize_per_channel_affine(x, scale, ZP, 1, 0, 255)
    assert torch.equal(tq.fake_quantize_per_channel_affine(x, scale, ZP, 1, 0, 255),
                       torch.fake_quantize_per_channel_affine(x, scale.float(), ZP, 1, 0, 255))
