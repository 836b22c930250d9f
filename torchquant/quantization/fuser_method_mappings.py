"""Which module sequences ``fuse_modules`` knows how to fuse, and how.

In eval mode Conv/Linear + BatchNorm fold the BN into the weights (``torch.nn.utils.fusion``);
for QAT they become fused containers the QAT modules later simulate the folding of."""
from __future__ import annotations

from typing import Any, Callable, Optional

from torch import nn
from ..nn.utils import fusion as _fusion

from ..nn.intrinsic.modules import fused as nni

__all__ = ["fuse_conv_bn", "fuse_conv_bn_relu", "fuse_linear_bn", "fuse_convtranspose_bn",
           "get_fuser_method", "get_fuser_method_new"]

_CONV_BN = {nn.Conv1d: nni.ConvBn1d, nn.Conv2d: nni.ConvBn2d, nn.Conv3d: nni.ConvBn3d}
_CONV_BN_RELU = {nn.Conv1d: nni.ConvBnReLU1d, nn.Conv2d: nni.ConvBnReLU2d,
                 nn.Conv3d: nni.ConvBnReLU3d}
_CONV_RELU = {nn.Conv1d: nni.ConvReLU1d, nn.Conv2d: nni.ConvReLU2d, nn.Conv3d: nni.ConvReLU3d}


def _check_bn_for_qat(bn: nn.Module, channels: int, what: str) -> None:
    name = type(bn).__name__
    assert bn.num_features == channels, f"Output channel of {what} must match num_features of {name}"
    assert bn.affine, f"Only support fusing {name} with affine set to True"
    assert bn.track_running_stats, \
        f"Only support fusing {name} with tracking_running_stats set to True"


def fuse_conv_bn(is_qat: bool, conv: nn.Module, bn: nn.Module) -> nn.Module:
    """Conv + BN: a ``ConvBn*d`` container for QAT, the BN folded into the conv otherwise."""
    assert conv.training == bn.training, \
        "Conv and BN both must be in the same mode (train or eval)."
    if is_qat:
        _check_bn_for_qat(bn, conv.out_channels, type(conv).__name__)
        fused_class = _CONV_BN.get(type(conv))
        if fused_class is None:
            raise NotImplementedError(f"Cannot fuse train modules: {(conv, bn)}")
        return fused_class(conv, bn)
    return _fusion.fuse_conv_bn_eval(conv, bn)


def fuse_conv_bn_relu(is_qat: bool, conv: nn.Module, bn: nn.Module, relu: nn.Module) -> nn.Module:
    """Conv + BN + ReLU: ``ConvBnReLU*d`` for QAT, ``ConvReLU*d`` of the folded conv otherwise."""
    assert conv.training == bn.training == relu.training, \
        "Conv and BN both must be in the same mode (train or eval)."
    if is_qat:
        _check_bn_for_qat(bn, conv.out_channels, type(conv).__name__)
        fused_class = _CONV_BN_RELU.get(type(conv))
        if fused_class is None:
            raise NotImplementedError(f"Cannot fuse train modules: {(conv, bn, relu)}")
        return fused_class(conv, bn, relu)
    fused_class = _CONV_RELU.get(type(conv))
    if fused_class is None:
        raise NotImplementedError(f"Cannot fuse eval modules: {(conv, bn, relu)}")
    return fused_class(_fusion.fuse_conv_bn_eval(conv, bn), relu)


def fuse_linear_bn(is_qat: bool, linear: nn.Module, bn: nn.Module) -> nn.Module:
    """Linear + BatchNorm1d: ``LinearBn1d`` for QAT, the BN folded into the Linear otherwise."""
    assert linear.training == bn.training, \
        "Linear and BN both must be in the same mode (train or eval)."
    if is_qat:
        _check_bn_for_qat(bn, linear.out_features, "Linear")
        return nni.LinearBn1d(linear, bn)
    return _fusion.fuse_linear_bn_eval(linear, bn)


def fuse_convtranspose_bn(is_qat: bool, convt: nn.Module, bn: nn.Module) -> nn.Module:
    """ConvTranspose + BN, folded (eval only, as in torch)."""
    assert convt.training == bn.training, \
        "ConvTranspose and BN both must be in the same mode (train or eval)."
    if is_qat:
        raise Exception("Fusing ConvTranspose+BatchNorm not yet supported in QAT.")
    return _fusion.fuse_conv_bn_eval(convt, bn, transpose=True)


def _sequential_wrapper2(sequential: type) -> Callable:
    """A fuser that just wraps the two modules in the fused container ``sequential``."""
    def fuser_method(is_qat: bool, m1: nn.Module, m2: nn.Module) -> nn.Module:
        return sequential(m1, m2)
    return fuser_method


_DEFAULT_OP_LIST_TO_FUSER_METHOD: dict[tuple, Callable] = {
    (nn.Conv1d, nn.BatchNorm1d): fuse_conv_bn,
    (nn.Conv1d, nn.BatchNorm1d, nn.ReLU): fuse_conv_bn_relu,
    (nn.Conv2d, nn.BatchNorm2d): fuse_conv_bn,
    (nn.Conv2d, nn.BatchNorm2d, nn.ReLU): fuse_conv_bn_relu,
    (nn.Conv3d, nn.BatchNorm3d): fuse_conv_bn,
    (nn.Conv3d, nn.BatchNorm3d, nn.ReLU): fuse_conv_bn_relu,
    (nn.Conv1d, nn.ReLU): _sequential_wrapper2(nni.ConvReLU1d),
    (nn.Conv2d, nn.ReLU): _sequential_wrapper2(nni.ConvReLU2d),
    (nn.Conv3d, nn.ReLU): _sequential_wrapper2(nni.ConvReLU3d),
    (nn.Linear, nn.BatchNorm1d): fuse_linear_bn,
    (nn.Linear, nn.ReLU): _sequential_wrapper2(nni.LinearReLU),
    (nn.BatchNorm2d, nn.ReLU): _sequential_wrapper2(nni.BNReLU2d),
    (nn.BatchNorm3d, nn.ReLU): _sequential_wrapper2(nni.BNReLU3d),
    (nn.ConvTranspose1d, nn.BatchNorm1d): fuse_convtranspose_bn,
    (nn.ConvTranspose2d, nn.BatchNorm2d): fuse_convtranspose_bn,
    (nn.ConvTranspose3d, nn.BatchNorm3d): fuse_convtranspose_bn,
}


def get_fuser_method(op_list: tuple, additional_fuser_method_mapping: Optional[dict] = None
                     ) -> Callable:
    """The fuser for a tuple of module types; AssertionError naming them if there is none."""
    mapping = dict(_DEFAULT_OP_LIST_TO_FUSER_METHOD)
    mapping.update(additional_fuser_method_mapping or {})
    fuser_method = mapping.get(op_list)
    assert fuser_method is not None, f"did not find fuser method for: {op_list} "
    return fuser_method


def get_fuser_method_new(op_pattern: Any, fuser_method_mapping: dict) -> Callable:
    """The fuser for an FX pattern ``(last_op, ..., first_op)`` or ``(first, ..., last)``."""
    fuser_method = fuser_method_mapping.get(op_pattern)
    if fuser_method is None and isinstance(op_pattern, tuple):
        fuser_method = fuser_method_mapping.get(tuple(reversed(op_pattern)))
    assert fuser_method is not None, f"did not find fuser method for: {op_pattern} "
    return fuser_method
