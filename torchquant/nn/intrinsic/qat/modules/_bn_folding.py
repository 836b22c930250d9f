"""What ConvBn* and LinearBn1d share: a child ``bn`` whose folding into the weight is simulated.

Quantized inference folds BN into the weights, so training must fake-quantize the *folded*
weight ``w * gamma / running_std`` rather than ``w``.  The forward therefore runs the layer on
``fake_quant(w * s)`` (``s = gamma / running_std``) with zero bias, divides the output by ``s``
to undo the scaling, adds the layer's own bias and hands that to the real BN, which normalizes
with batch statistics in training (and updates its running ones) unless frozen.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import nn
from torch.nn import init

from ...._torch_names import torch_quantization_function
from ....qat.modules._common import require_qconfig


class _BnFoldingMixin:
    """State handling of the BN child; subclasses provide ``_weighted(x, w, b)``."""

    bn: nn.modules.batchnorm._BatchNorm
    freeze_bn: bool
    weight: nn.Parameter
    bias: Optional[nn.Parameter]

    def _init_bn(self, bn_cls: type, num_features: int, eps: float, momentum: float,
                 freeze_bn: bool, qconfig: Any) -> None:
        require_qconfig(qconfig)
        self.qconfig = qconfig
        self.freeze_bn = freeze_bn if self.training else True
        self.bn = bn_cls(num_features, eps, momentum, True, True)
        self.weight_fake_quant = qconfig.weight()

    def _finish_init(self, freeze_bn: bool) -> None:
        self.reset_bn_parameters()
        if self.training and not freeze_bn:
            self.update_bn_stats()
        else:
            self.freeze_bn_stats()

    def reset_running_stats(self) -> None:
        self.bn.reset_running_stats()

    def reset_bn_parameters(self) -> None:
        """Fresh running stats, ``bn.weight ~ U(0, 1)``, ``bn.bias = 0``."""
        self.bn.reset_running_stats()
        init.uniform_(self.bn.weight)
        init.zeros_(self.bn.bias)

    def update_bn_stats(self) -> "_BnFoldingMixin":
        """BN normalizes with batch statistics and updates its running ones."""
        self.freeze_bn = False
        self.bn.training = True
        return self

    def freeze_bn_stats(self) -> "_BnFoldingMixin":
        """BN uses (and keeps) its running statistics, whatever ``train()`` says later."""
        self.freeze_bn = True
        self.bn.training = False
        return self

    def apply(self, fn: Callable[[nn.Module], None]) -> "_BnFoldingMixin":
        """``nn.Module.apply``, plus torch's own ``freeze_bn_stats`` / ``update_bn_stats``
        (which only recognise torch's classes) act on this module as on torch's."""
        super().apply(fn)  # type: ignore[misc]
        name = torch_quantization_function(fn)
        if name in ("freeze_bn_stats", "update_bn_stats"):
            getattr(self, name)()
        return self

    def train(self, mode: bool = True) -> "_BnFoldingMixin":
        """Children (BN, weight fake-quant) follow ``mode`` only while BN is not frozen."""
        self.training = mode
        if not self.freeze_bn:
            for child in self.children():  # type: ignore[attr-defined]
                child.train(mode)
        return self

    def _channel_shapes(self) -> tuple[list[int], list[int]]:
        """Broadcast shapes of a per-output-channel vector against the weight / the output."""
        weight_shape = [1] * self.weight.dim()
        weight_shape[0] = -1
        out_shape = [1] * self.weight.dim()
        out_shape[1] = -1
        return weight_shape, out_shape

    def _folded_forward(self, input: torch.Tensor,
                        weighted: Callable[[torch.Tensor, torch.Tensor, torch.Tensor],
                                           torch.Tensor],
                        zero_bias: torch.Tensor) -> torch.Tensor:
        """One-pass simulation (uses the running std of the batches seen so far)."""
        if self.bn.running_var is None:
            raise AssertionError("self.bn.running_var must not be None")
        weight_shape, out_shape = self._channel_shapes()
        scale = self.bn.weight / torch.sqrt(self.bn.running_var + self.bn.eps)
        w_q = self.weight_fake_quant(self.weight * scale.reshape(weight_shape))
        out = weighted(input, w_q, zero_bias) / scale.reshape(out_shape)
        if self.bias is not None:
            out = out + self.bias.reshape(out_shape)
        return self.bn(out)
