"""Observable ``nn.MultiheadAttention``.

The float module packs the Q/K/V projections into one ``in_proj_weight`` and calls a fused
functional, which prepare cannot observe.  This version keeps the projections as separate
Linears (``linear_Q`` / ``linear_K`` / ``linear_V`` and ``out_proj``), scales Q through a
``FloatFunctional``, and brackets the float softmax-attention core with DeQuantStubs (on
Q/K/V) and QuantStubs (on the attention output and weights).  After ``convert`` the same
forward runs the projections quantized and only the core in float.
"""
from __future__ import annotations

import warnings
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ....tensor.qtensor import QTensor
from ....tensor.functions import quantize_per_tensor
from ... import _workflow
from ...float_functional import FloatFunctional
from ...stubs import DeQuantStub, QuantStub

__all__ = ["MultiheadAttention"]


def _linear_weight_bias(lin: nn.Module) -> tuple[Tensor, Optional[Tensor]]:
    """Float (weight, bias) of a float or quantized Linear."""
    if hasattr(lin, "_weight_bias"):
        w, b = lin._weight_bias()
    else:
        w, b = lin.weight, lin.bias
    w = w.dequantize() if isinstance(w, QTensor) else w.detach()
    return w.float(), None if b is None else b.detach().float()


def _as_float(t: Tensor) -> Tensor:
    return t.dequantize() if isinstance(t, QTensor) else t.detach()


def _bool_mask(mask: Optional[Tensor], what: str) -> Optional[Tensor]:
    if mask is not None and mask.dtype == torch.uint8:
        warnings.warn(f"Byte tensor for `{what}` in `nn.MultiheadAttention` is deprecated. Use "
                      "bool tensor instead.", stacklevel=4)
        mask = mask.to(torch.bool)
    if mask is not None and mask.dtype != torch.bool and not mask.is_floating_point():
        raise ValueError(f"Only float and bool types are supported for {what}, not {mask.dtype}")
    return mask


def _apply_mask(scores: Tensor, mask: Tensor) -> Tensor:
    """Bool masks block (``True`` -> -inf); float masks are added, as nn.MultiheadAttention."""
    if mask.dtype == torch.bool:
        return scores.masked_fill(mask, float("-inf"))
    return scores + mask


class MultiheadAttention(nn.MultiheadAttention):
    """Observable multi-head attention: ``nn.MultiheadAttention``'s constructor and forward
    (3-D inputs; ``is_causal`` is not supported -- pass an ``attn_mask``).

    The inherited packed ``in_proj_weight`` / ``in_proj_bias`` are kept (as torch does, for
    the state-dict layout) but not used: the separate projection Linears are.
    """

    _FLOAT_MODULE = nn.MultiheadAttention
    __constants__ = ["batch_first"]

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False,
                 kdim: Optional[int] = None, vdim: Optional[int] = None,
                 batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        fk = {"device": device, "dtype": dtype}
        super().__init__(embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim,
                         vdim, batch_first, **fk)
        self.linear_Q = nn.Linear(self.embed_dim, self.embed_dim, bias=bias, **fk)
        self.linear_K = nn.Linear(self.kdim, self.embed_dim, bias=bias, **fk)
        self.linear_V = nn.Linear(self.vdim, self.embed_dim, bias=bias, **fk)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=bias, **fk)  # type: ignore
        self.q_scaling_product = FloatFunctional()
        self.quant_attn_output = QuantStub()
        self.quant_attn_output_weights = QuantStub()
        self.dequant_q = DeQuantStub()
        self.dequant_k = DeQuantStub()
        self.dequant_v = DeQuantStub()

    def _get_name(self) -> str:
        return "QuantizableMultiheadAttention"

    # ---- conversion -------------------------------------------------------------------------
    @classmethod
    def from_float(cls, other: nn.MultiheadAttention) -> "MultiheadAttention":
        """Observed copy of a float MHA (weights copied, dropout kept), prepared in eval mode."""
        if type(other) is not cls._FLOAT_MODULE:
            raise AssertionError(f"{cls.__name__}.from_float expects {cls._FLOAT_MODULE}, got "
                                 f"{type(other)}")
        if not hasattr(other, "qconfig"):
            raise AssertionError("The float module must have 'qconfig'")
        ref = other.out_proj.weight
        observed = cls(other.embed_dim, other.num_heads, other.dropout,
                       other.in_proj_bias is not None, other.bias_k is not None,
                       other.add_zero_attn, other.kdim, other.vdim, other.batch_first,
                       device=ref.device, dtype=ref.dtype)
        e = other.embed_dim
        if other._qkv_same_embed_dim:
            w_q, w_k, w_v = other.in_proj_weight.detach().split(e, 0)
        else:
            w_q, w_k, w_v = (other.q_proj_weight.detach(), other.k_proj_weight.detach(),
                             other.v_proj_weight.detach())
        biases = (other.in_proj_bias.detach().split(e, 0) if other.in_proj_bias is not None
                  else (None, None, None))
        with torch.no_grad():
            for lin, w, b in zip((observed.linear_Q, observed.linear_K, observed.linear_V),
                                 (w_q, w_k, w_v), biases):
                lin.weight.copy_(w)
                if b is not None:
                    lin.bias.copy_(b)
            observed.out_proj.weight.copy_(other.out_proj.weight)
            if other.out_proj.bias is not None:
                observed.out_proj.bias.copy_(other.out_proj.bias)
            # the unused packed parameters mirror the float module's too
            for name in ("in_proj_weight", "in_proj_bias", "q_proj_weight", "k_proj_weight",
                         "v_proj_weight", "bias_k", "bias_v"):
                src, dst = getattr(other, name), getattr(observed, name)
                if src is not None and dst is not None:
                    dst.copy_(src)
        observed.qconfig = other.qconfig
        observed.eval()
        return _workflow.prepare(observed, inplace=True)

    @classmethod
    def from_observed(cls, other: Any) -> Any:
        raise NotImplementedError("It looks like you are trying to prepare an MHA module. "
                                  "Please, see the examples on quantizable MHAs.")

    @torch.jit.unused
    def dequantize(self) -> nn.MultiheadAttention:
        """A float ``nn.MultiheadAttention`` with this module's (dequantized) weights."""
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = (_linear_weight_bias(m) for m in
                                              (self.linear_Q, self.linear_K, self.linear_V))
        w_o, b_o = _linear_weight_bias(self.out_proj)
        fp = nn.MultiheadAttention(self.embed_dim, self.num_heads, self.dropout,
                                   b_q is not None, self.bias_k is not None, self.add_zero_attn,
                                   self.kdim, self.vdim, self.batch_first, device=w_q.device)
        with torch.no_grad():
            if fp._qkv_same_embed_dim:
                fp.in_proj_weight.copy_(torch.cat([w_q, w_k, w_v], 0))
            else:
                fp.q_proj_weight.copy_(w_q)
                fp.k_proj_weight.copy_(w_k)
                fp.v_proj_weight.copy_(w_v)
            if fp.in_proj_bias is not None:
                fp.in_proj_bias.copy_(torch.cat([b_q, b_k, b_v], 0))  # type: ignore[list-item]
            fp.out_proj.weight.copy_(w_o)
            if fp.out_proj.bias is not None and b_o is not None:
                fp.out_proj.bias.copy_(b_o)
            if self.bias_k is not None:
                fp.bias_k.copy_(_as_float(self.bias_k))
                fp.bias_v.copy_(_as_float(self.bias_v))
        fp.train(self.training)
        return fp

    # ---- forward ----------------------------------------------------------------------------
    def forward(self, query: Tensor, key: Tensor, value: Tensor,  # type: ignore[override]
                key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        return self._forward_impl(query, key, value, key_padding_mask, need_weights, attn_mask,
                                  average_attn_weights, is_causal)

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor) -> None:
        name = self._get_name()
        for what, t, dim in (("query", query, self.embed_dim), ("key", key, self.kdim),
                             ("value", value, self.vdim)):
            if t.dim() != 3:
                layout = "(batch, seq, feature)" if self.batch_first else "(seq, batch, feature)"
                raise ValueError(f"{name}: expected a 3-D {layout} {what}, got shape "
                                 f"{tuple(t.shape)}")
            if t.shape[-1] != dim:
                raise ValueError(f"{name}: {what} has {t.shape[-1]} features, expected {dim}")
        if key.shape[:2] != value.shape[:2]:
            raise ValueError(f"{name}: key {tuple(key.shape)} and value {tuple(value.shape)} "
                             "must agree in sequence length and batch size")
        b = 0 if self.batch_first else 1
        if key.shape[b] != query.shape[b]:
            raise ValueError(f"{name}: query batch size {query.shape[b]} differs from key "
                             f"batch size {key.shape[b]}")
        if self.embed_dim % self.num_heads:
            raise ValueError(f"{name}: embed_dim must be divisible by num_heads")

    def _forward_impl(self, query: Tensor, key: Tensor, value: Tensor,
                      key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                      attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                      is_causal: bool = False) -> tuple[Tensor, Optional[Tensor]]:
        if is_causal:
            raise NotImplementedError(f"{self._get_name()}: is_causal is not supported; pass "
                                      "the causal mask as attn_mask")
        self._check_inputs(query, key, value)
        if self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        tgt_len, bsz, _ = query.shape
        heads, head_dim = self.num_heads, self.embed_dim // self.num_heads

        attn_mask = _bool_mask(attn_mask, "attn_mask")
        key_padding_mask = _bool_mask(key_padding_mask, "key_padding_mask")
        if attn_mask is not None:
            rank = attn_mask.dim()
            if rank not in (2, 3):
                raise ValueError(f"attn_mask's dimension {rank} is not supported")
            want = [tgt_len, key.shape[0]] if rank == 2 else [bsz * heads, tgt_len, key.shape[0]]
            if list(attn_mask.shape) != want:
                raise ValueError(f"The size of the {rank}D attn_mask is not correct: expected "
                                 f"{want}, got {list(attn_mask.shape)}")
            if rank == 2:
                attn_mask = attn_mask.unsqueeze(0)
        if key_padding_mask is not None and tuple(key_padding_mask.shape) != (bsz, key.shape[0]):
            raise ValueError(f"key_padding_mask must have shape {(bsz, key.shape[0])}, got "
                             f"{tuple(key_padding_mask.shape)}")

        q = self.linear_Q(query)
        k = self.linear_K(key)
        v = self.linear_V(value)
        q = self.q_scaling_product.mul_scalar(q, float(head_dim) ** -0.5)

        if (self.bias_k is None) != (self.bias_v is None):
            raise RuntimeError("bias_k and bias_v must both be set or both be None")
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.expand(1, bsz, self.embed_dim)])
            v = torch.cat([v, self.bias_v.expand(1, bsz, self.embed_dim)])
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask,
                                                                           (0, 1))

        def split_heads(t: Tensor) -> Tensor:
            return t.contiguous().view(t.shape[0], bsz * heads, head_dim).transpose(0, 1)

        q, k, v = split_heads(q), split_heads(k), split_heads(v)
        if self.add_zero_attn:
            k = torch.cat([k, self._zeros_like_batch(k)], dim=1)
            v = torch.cat([v, self._zeros_like_batch(v)], dim=1)
            attn_mask = None if attn_mask is None else F.pad(attn_mask, (0, 1))
            key_padding_mask = None if key_padding_mask is None else F.pad(key_padding_mask,
                                                                           (0, 1))
        src_len = k.shape[1]

        # float core (identity stubs while observing; dequantize after convert)
        q, k, v = self.dequant_q(q), self.dequant_k(k), self.dequant_v(v)
        scores = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            scores = _apply_mask(scores, attn_mask)
        if key_padding_mask is not None:
            scores = _apply_mask(scores.view(bsz, heads, tgt_len, src_len),
                                 key_padding_mask.view(bsz, 1, 1, src_len))
            scores = scores.view(bsz * heads, tgt_len, src_len)
        weights = F.softmax(scores, dim=-1)
        weights = F.dropout(weights, p=self.dropout, training=self.training)
        out = torch.bmm(weights, v)
        out = out.transpose(0, 1).contiguous().view(tgt_len, bsz, self.embed_dim)

        out = self.out_proj(self.quant_attn_output(out))  # type: ignore[has-type]
        weights = self.quant_attn_output_weights(weights)
        if self.batch_first:
            out = out.transpose(0, 1)
        if not need_weights:
            return out, None
        weights = weights.view(bsz, heads, tgt_len, src_len)
        if average_attn_weights:
            weights = weights.mean(dim=1)
        return out, weights

    @staticmethod
    def _zeros_like_batch(t: Tensor) -> Tensor:
        """A zero key/value column for ``add_zero_attn`` (in ``t``'s qparams if quantized)."""
        zeros = torch.zeros((t.shape[0], 1) + tuple(t.shape[2:]), device=t.device)
        if isinstance(t, QTensor):
            return quantize_per_tensor(zeros, t.q_scale(), t.q_zero_point(), t.qdtype)
        return zeros.to(t.dtype)
