"""Graph helpers of the PT2E flow: BN folding into conv / linear (eval semantics, as torchao's
``_fuse_conv_bn_``), the train/eval guard on prepared models, and small node predicates."""
from __future__ import annotations

import operator
import types
from typing import Any, Optional

import torch
from torch.fx import GraphModule, Node

from ..observer import _is_activation_post_process
from ..._graph import optional_attr_value

__all__ = ["fold_bn_into_weighted_ops", "disallow_train_eval", "is_observer_node",
           "set_tensor_attr", "set_graph_train_mode"]

_CONV_OPS = {torch.ops.aten.conv1d.default: False, torch.ops.aten.conv2d.default: False,
             torch.ops.aten.conv3d.default: False,
             torch.ops.aten.conv_transpose1d.default: True,
             torch.ops.aten.conv_transpose2d.input: True,
             torch.ops.aten.conv_transpose3d.input: True}
_LINEAR_OPS = {torch.ops.aten.linear.default}
# (target, index of eps among the args); batch_norm's "training" flag is arg 5
_BN_EPS_INDEX = {torch.ops.aten.batch_norm.default: 7,
                 torch.ops.aten._native_batch_norm_legit_no_training.default: 6}


def set_tensor_attr(model: torch.nn.Module, target: str, value: torch.Tensor,
                    as_parameter: bool) -> None:
    """Set ``model.<target>`` (dotted) to ``value`` as a Parameter or a buffer, creating the
    intermediate modules if needed."""
    *path, name = target.split(".")
    owner: torch.nn.Module = model
    for part in path:
        if not hasattr(owner, part):
            owner.add_module(part, torch.nn.Module())
        owner = getattr(owner, part)
    if hasattr(owner, name):
        delattr(owner, name)
    if as_parameter:
        owner.register_parameter(name, torch.nn.Parameter(value, requires_grad=value.requires_grad))
    else:
        owner.register_buffer(name, value)


def _fused_weights(w: torch.Tensor, b: Optional[torch.Tensor], rm: torch.Tensor,
                   rv: torch.Tensor, eps: float, bn_w: Optional[torch.Tensor],
                   bn_b: Optional[torch.Tensor], channel_dim: int
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """BN folded into the preceding weight / bias (the arithmetic of torch's
    ``fuse_conv_bn_weights``, so the folded values are bit-identical to torchao's)."""
    if b is None:
        b = torch.zeros_like(rm)
    if bn_w is None:
        bn_w = torch.ones_like(rm)
    if bn_b is None:
        bn_b = torch.zeros_like(rm)
    inv_std = torch.rsqrt(rv + eps)
    shape = [1] * w.dim()
    shape[channel_dim] = -1
    fused_w = (w * (bn_w * inv_std).reshape(shape)).to(dtype=w.dtype)
    fused_b = ((b - rm) * inv_std * bn_w + bn_b).to(dtype=b.dtype)
    return fused_w, fused_b


def _bn_users(node: Node) -> Optional[Node]:
    if len(node.users) != 1:
        return None
    user = next(iter(node.users))
    if user.op == "call_function" and user.target in _BN_EPS_INDEX:
        return user
    return None


def fold_bn_into_weighted_ops(model: GraphModule) -> None:
    """In place: every eval-mode BN whose only input is a conv / linear with constant weights is
    folded into that op's weight and bias (new bias attribute ``<weight>_bias`` when it had
    none); the BN nodes are removed."""
    graph = model.graph
    changed = False
    for node in list(graph.nodes):
        if node.op != "call_function" or (node.target not in _CONV_OPS
                                          and node.target not in _LINEAR_OPS):
            continue
        bn = _bn_users(node)
        if bn is None:
            continue
        if bn.target is torch.ops.aten.batch_norm.default and bn.args[5]:
            continue  # training-mode BN: statistics of the batch, nothing to fold
        weight_node = node.args[1]
        if not isinstance(weight_node, Node) or weight_node.op != "get_attr":
            continue
        bias_node = node.args[2] if len(node.args) > 2 else None
        transpose = _CONV_OPS.get(node.target, False)
        w, b = optional_attr_value(model, weight_node), optional_attr_value(model, bias_node)
        bn_w, bn_b, rm, rv = (optional_attr_value(model, a) for a in bn.args[1:5])
        eps = bn.args[_BN_EPS_INDEX[bn.target]]
        groups = node.args[7] if transpose and len(node.args) > 7 else 1
        if transpose and groups != 1:
            continue  # transposed grouped conv: weight layout [in, out/groups]; left unfused
        fused_w, fused_b = _fused_weights(w, b, rm, rv, eps, bn_w, bn_b,
                                          1 if transpose else 0)
        set_tensor_attr(model, str(weight_node.target), fused_w.detach(), as_parameter=True)
        args = list(node.args)
        if len(args) == 2:
            args.append(None)
        if bias_node is not None:
            set_tensor_attr(model, str(bias_node.target), fused_b.detach(), as_parameter=True)
        else:
            bias_name = str(weight_node.target) + "_bias"
            set_tensor_attr(model, bias_name, fused_b.detach(), as_parameter=True)
            with graph.inserting_before(node):
                args[2] = graph.get_attr(bias_name)
        node.args = tuple(args)
        if bn.target is torch.ops.aten.batch_norm.default:
            bn.replace_all_uses_with(node)
        else:  # returns (out, mean, rstd); only getitem 0 is used in eval
            for user in list(bn.users):
                if user.target is operator.getitem and user.args[1] == 0:
                    user.replace_all_uses_with(node)
                    graph.erase_node(user)
        if not bn.users:
            graph.erase_node(bn)
        changed = True
    if changed:
        graph.eliminate_dead_code()
        model.recompile()


def is_observer_node(node: Any, named_modules: dict[str, torch.nn.Module]) -> bool:
    """True for a ``call_module`` node calling an observer or fake quant."""
    return (isinstance(node, Node) and node.op == "call_module"
            and _is_activation_post_process(named_modules.get(str(node.target))))


def _refuse_train_eval(self: torch.nn.Module, mode: bool = True) -> torch.nn.Module:
    raise NotImplementedError(
        "Calling train() or eval() is not supported for exported models. Use "
        "move_exported_model_to_train(model) / move_exported_model_to_eval(model) instead "
        "(the graph's dropout and batch_norm ops, not a module flag, decide the mode).")


def _refuse_eval(self: torch.nn.Module) -> torch.nn.Module:
    return _refuse_train_eval(self)


def disallow_train_eval(model: GraphModule) -> GraphModule:
    """Make ``model.train()`` / ``model.eval()`` raise NotImplementedError (as torchao's
    prepared models do)."""
    model.train = types.MethodType(_refuse_train_eval, model)  # type: ignore[method-assign]
    model.eval = types.MethodType(_refuse_eval, model)  # type: ignore[method-assign]
    return model


def set_graph_train_mode(model: GraphModule, train: bool) -> GraphModule:
    """Switch the exported graph's ``aten.dropout`` and ``aten.batch_norm`` calls to training
    (``train=True``) or eval semantics in place -- what ``.train()`` / ``.eval()`` would do on
    the eager model (torchao's ``move_exported_model_to_train`` / ``_eval``)."""
    changed = False
    for node in model.graph.nodes:
        if node.op != "call_function":
            continue
        if node.target is torch.ops.aten.dropout.default and len(node.args) > 2:
            node.args = (*node.args[:2], train, *node.args[3:])
            changed = True
        elif node.target is torch.ops.aten.batch_norm.default and len(node.args) > 5:
            node.args = (*node.args[:5], train, *node.args[6:])
            changed = True
    if changed:
        model.recompile()
    return model
