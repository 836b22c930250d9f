"""QAT ``LinearBn1d``: Linear + BatchNorm1d with the BN folding simulated in training."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ....qat.modules._common import check_float_module
from ....utils.fusion import fuse_linear_bn_weights
from ...modules import fused as nni
from ._bn_folding import _BnFoldingMixin

__all__ = ["LinearBn1d"]


class LinearBn1d(_BnFoldingMixin, nn.Linear, nni._FusedModule):
    """Linear whose weight is fake-quantized after scaling by the BN child's
    ``gamma / running_std``; see ``_bn_folding`` for the forward.  Inputs are ``(N, C)``.

    [TQ] a freshly built module keeps ``nn.Linear``'s initialised bias (torch replaces it by
    an uninitialised tensor); ``from_float`` overwrites it either way.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 eps: float = 1e-05, momentum: float = 0.1, freeze_bn: bool = False,
                 qconfig: Any = None) -> None:
        nn.Linear.__init__(self, in_features, out_features, bias)
        self._init_bn(nn.BatchNorm1d, out_features, eps, momentum, freeze_bn, qconfig)
        self._finish_init(freeze_bn)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self.bias is not None:
            zero_bias = torch.zeros_like(self.bias)
        else:
            zero_bias = torch.zeros(self.out_features, device=self.weight.device)
        return self._folded_forward(input, F.linear, zero_bias)

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "LinearBn1d":
        """From an ``nni.LinearBn1d`` with a ``qconfig``; parameters and BN buffers shared."""
        check_float_module(cls, mod, nni.LinearBn1d, type(mod), config_word="config")
        linear, bn = mod[0], mod[1]
        qat = cls(linear.in_features, linear.out_features, linear.bias is not None, bn.eps,
                  bn.momentum, False, mod.qconfig)
        qat.weight = linear.weight
        qat.bias = linear.bias
        for name in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked"):
            setattr(qat.bn, name, getattr(bn, name))
        return qat

    def _fold_bn_into_linear(self) -> None:
        """Fold the BN running statistics into ``weight`` / ``bias`` in place (what converting
        to ``nnq.Linear`` does first; ``nnq.Linear.from_float`` calls this hook)."""
        self.weight, self.bias = fuse_linear_bn_weights(
            self.weight, self.bias, self.bn.running_mean, self.bn.running_var, self.bn.eps,
            self.bn.weight, self.bn.bias)

    def to_float(self) -> nn.Linear:
        """A float ``nn.Linear`` with the BN (running statistics) folded in."""
        if self.bn.running_var is None or self.bn.running_mean is None:
            raise AssertionError("self.bn.running_var and self.bn.running_mean must not be None")
        linear = nn.Linear(self.in_features, self.out_features)
        linear.weight, linear.bias = fuse_linear_bn_weights(
            self.weight, self.bias, self.bn.running_mean, self.bn.running_var, self.bn.eps,
            self.bn.weight, self.bn.bias)
        return linear
