"""The attention rewrite (torchquant/ops/inductor/attention.py): in torchquant.compile's graphs,
ahead of time and through torch.compile, ATen's CPU flash attention of a quantized encoder
becomes torchquant_native::attention (its C shim in the AOT code) with the same answers on both
paths; plain torch.compile keeps ATen's, so a user's own compile is untouched.

Tolerance (against plain torch.compile): the two attentions differ by float32 rounding, and the
dynamically quantized output projection after them can round a code one step apart where a
value sits at a tie; the encoder's LayerNorm output then moves by about that step's effect."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch._inductor.utils import run_and_get_code

import torchquant
from torchquant._package import generated_code
from torchquant.kernels import native
from torchquant.ops import linear as ops_linear
from torchquant.quantization.quantize_pt2e import convert_pt2e, prepare_pt2e
from torchquant.quantization.quantizer.x86_inductor_quantizer import (
    X86InductorQuantizer, get_default_x86_inductor_quantization_config)

pytestmark = pytest.mark.skipif(
    not (native.available() and ops_linear.onednn_u8s8_exact()),
    reason="the rewrite is part of the freezing pass (oneDNN exact) and needs the native kernels")

HIDDEN, HEADS, TOKENS = 64, 4, 16


class SdpaEncoderLayer(nn.Module):
    """An encoder layer whose attention is ``scaled_dot_product_attention`` with an additive
    padding mask, as Hugging Face's BERT models call it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.out = nn.Linear(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (y.view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)
                   for y in self.qkv(x).chunk(3, dim=-1))
        a = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.norm(x + self.out(a.transpose(1, 2).reshape(b, t, HIDDEN)))


def _inputs(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(batch)
    mask = torch.zeros(batch, 1, 1, TOKENS)
    mask[0, ..., TOKENS - 3:] = torch.finfo(torch.float32).min  # a padded sentence
    return torch.randn(batch, TOKENS, HIDDEN, generator=g), mask


@pytest.fixture(scope="module")
def converted() -> torch.fx.GraphModule:
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", max=64)
    gm = torch.export.export(SdpaEncoderLayer().eval(), _inputs(2),
                             dynamic_shapes=({0: batch}, {0: batch})).module()
    prepared = prepare_pt2e(gm, X86InductorQuantizer().set_global(
        get_default_x86_inductor_quantization_config(is_dynamic=True)))
    prepared(*_inputs(4))
    return convert_pt2e(prepared)


def test_torchquant_compile_calls_the_native_attention(converted):
    ours = torchquant.compile(copy.deepcopy(converted), aot=True)
    through_torch_compile = torchquant.compile(copy.deepcopy(converted), aot=False)
    x = _inputs(3)
    with torch.no_grad():
        out = ours(*x)
        again, codes = run_and_get_code(through_torch_compile, *x)
    (path,) = list(Path(ours._folder.name).glob("*.pt2"))
    text = "".join(generated_code(str(path)).values())
    assert "aoti_torch_cpu_attention(" in text
    assert "aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu(" not in text
    assert any("torchquant_native.attention" in c or "torchquant_native::attention" in c
               for c in codes)
    assert torch.equal(out, again)  # both paths of torchquant.compile: one graph, one kernel


def test_plain_torch_compile_keeps_aten_attention(converted):
    import torch._inductor.config as inductor_config

    x = _inputs(3)
    with torch.no_grad(), inductor_config.patch(freezing=True):
        plain, codes = run_and_get_code(torch.compile(copy.deepcopy(converted)), *x)
        ours = torchquant.compile(copy.deepcopy(converted))(*x)
    text = "".join(codes)
    assert "torch.ops.aten._scaled_dot_product_flash_attention_for_cpu" in text
    assert "torchquant_native" not in text
    torch.testing.assert_close(ours, plain, rtol=0, atol=0.05)  # module docstring
