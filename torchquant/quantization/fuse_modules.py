"""``fuse_modules`` / ``fuse_modules_qat``: replace named module sequences by fused modules
(the first name gets the fused module, the others ``nn.Identity``)."""
from __future__ import annotations

import copy
from typing import Any, Callable, Optional, Sequence, Union

from torch import nn

from .fuser_method_mappings import get_fuser_method

__all__ = ["fuse_known_modules", "fuse_modules", "fuse_modules_qat"]


def _get_module(model: nn.Module, name: str) -> nn.Module:
    module = model
    for part in name.split("."):
        if not hasattr(module, part) or not isinstance(getattr(module, part), nn.Module):
            raise AttributeError(f"fuse_modules: {type(model).__name__} has no submodule "
                                 f"named {name!r}")
        module = getattr(module, part)
    return module


def _set_module(model: nn.Module, name: str, new_module: nn.Module) -> None:
    *parents, last = name.split(".")
    module = model
    for part in parents:
        module = getattr(module, part)
    setattr(module, last, new_module)


def fuse_known_modules(mod_list: Sequence[nn.Module], is_qat: bool,
                       additional_fuser_method_mapping: Optional[dict] = None) -> list[nn.Module]:
    """Fuse a list of modules with the known fuser methods: ``[fused, Identity, ...]``.

    Forward pre-hooks of the first module and forward hooks of the last move to the fused one.
    """
    types = tuple(type(m) for m in mod_list)
    try:
        fuser_method = get_fuser_method(types, additional_fuser_method_mapping)
    except AssertionError:
        fuser_method = None
    if fuser_method is None:
        raise NotImplementedError(f"Cannot fuse modules: {types}")
    # Detach the hooks before fusing: eval-mode BN folding deep-copies the conv, and a copied
    # pre-hook would run twice (torch.ao's fuse_modules has that bug).
    pre_hooks = list(mod_list[0]._forward_pre_hooks.values())
    post_hooks = list(mod_list[-1]._forward_hooks.values())
    mod_list[0]._forward_pre_hooks.clear()
    mod_list[-1]._forward_hooks.clear()
    fused = fuser_method(is_qat, *mod_list)
    for pre_hook in pre_hooks:
        fused.register_forward_pre_hook(pre_hook)
    for hook in post_hooks:
        fused.register_forward_hook(hook)
    new_mods: list[nn.Module] = [fused]
    for _ in mod_list[1:]:
        identity = nn.Identity()
        identity.training = mod_list[0].training
        new_mods.append(identity)
    return new_mods


def _fuse_one(model: nn.Module, names: Sequence[str], is_qat: bool, fuser_func: Callable,
              fuse_custom_config_dict: Optional[dict]) -> None:
    additional = (fuse_custom_config_dict or {}).get("additional_fuser_method_mapping", {})
    mod_list = [_get_module(model, name) for name in names]
    new_mods = fuser_func(mod_list, is_qat, additional)
    for name, new_mod in zip(names, new_mods):
        _set_module(model, name, new_mod)


def _fuse_modules(model: nn.Module, modules_to_fuse: Union[Sequence[str], Sequence[Sequence[str]]],
                  is_qat: bool, inplace: bool, fuser_func: Callable,
                  fuse_custom_config_dict: Optional[dict]) -> nn.Module:
    if not inplace:
        model = copy.deepcopy(model)
    if all(isinstance(name, str) for name in modules_to_fuse):
        groups: list[Sequence[str]] = [modules_to_fuse]  # type: ignore[list-item]
    else:
        groups = list(modules_to_fuse)  # type: ignore[arg-type]
    for names in groups:
        _fuse_one(model, names, is_qat, fuser_func, fuse_custom_config_dict)
    return model


def fuse_modules(model: nn.Module, modules_to_fuse: Any, inplace: bool = False,
                 fuser_func: Callable = fuse_known_modules,
                 fuse_custom_config_dict: Optional[dict] = None) -> nn.Module:
    """Fuse each named sequence (a list of names, or a list of such lists) for inference.

    Known patterns: conv-bn, conv-bn-relu, conv-relu, linear-bn, linear-relu, bn-relu and
    convtranspose-bn (1d/2d/3d where they exist); the model must be in eval mode for the BN
    folds.  Unknown names raise AttributeError, unsupported patterns NotImplementedError.
    """
    return _fuse_modules(model, modules_to_fuse, False, inplace, fuser_func,
                         fuse_custom_config_dict)


def fuse_modules_qat(model: nn.Module, modules_to_fuse: Any, inplace: bool = False,
                     fuser_func: Callable = fuse_known_modules,
                     fuse_custom_config_dict: Optional[dict] = None) -> nn.Module:
    """:func:`fuse_modules` for quantization-aware training: BN stays (in fused containers)."""
    return _fuse_modules(model, modules_to_fuse, True, inplace, fuser_func,
                         fuse_custom_config_dict)
