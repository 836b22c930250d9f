"""Train / eval on exported models (torchao's ``pt2e.export_utils``).

An exported graph has no ``.training`` switch: dropout and batch norm are baked into the graph
as calls with a ``train`` argument.  These helpers rewrite that argument, which is what
``model.train()`` / ``model.eval()`` would change on the eager model.
"""
from __future__ import annotations

import types

import torch
from torch.fx import GraphModule

from .utils import set_graph_train_mode

__all__ = ["model_is_exported", "move_exported_model_to_eval", "move_exported_model_to_train",
           "allow_exported_model_train_eval"]


def model_is_exported(model: torch.nn.Module) -> bool:
    """Whether ``model`` is the GraphModule of an exported program (its nodes carry export's
    ``val`` metadata), as ``torch.export.export(...).module()`` returns."""
    return isinstance(model, GraphModule) and any("val" in n.meta for n in model.graph.nodes)


def _check(model: torch.nn.Module, fn: str) -> None:
    if not model_is_exported(model):
        raise TypeError(f"{fn} expects the GraphModule of an exported model "
                        f"(torch.export.export(model, args).module()), got {type(model).__name__}")


def move_exported_model_to_eval(model: GraphModule) -> GraphModule:
    """Dropout and batch norm of the exported ``model`` switched to eval behaviour, in place."""
    _check(model, "move_exported_model_to_eval")
    return set_graph_train_mode(model, False)


def move_exported_model_to_train(model: GraphModule) -> GraphModule:
    """Dropout and batch norm of the exported ``model`` switched to training behaviour, in place."""
    _check(model, "move_exported_model_to_train")
    return set_graph_train_mode(model, True)


def _train(self: GraphModule, mode: bool = True) -> GraphModule:
    return move_exported_model_to_train(self) if mode else move_exported_model_to_eval(self)


def _eval(self: GraphModule) -> GraphModule:
    return move_exported_model_to_eval(self)


def allow_exported_model_train_eval(model: GraphModule) -> GraphModule:
    """Let ``model.train()`` / ``model.eval()`` work on an exported (or PT2E-prepared) model,
    limited to what they mean there: dropout and batch norm switch modes."""
    _check(model, "allow_exported_model_train_eval")
    model.train = types.MethodType(_train, model)  # type: ignore[method-assign]
    model.eval = types.MethodType(_eval, model)  # type: ignore[method-assign]
    return model
