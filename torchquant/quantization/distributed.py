"""Observers across processes (``torch.distributed``): calibration and QAT on sharded data.

Every rank of a data-parallel job observes only its own shard.  Left alone, each rank would
compute its own qparams (and under ``DistributedDataParallel`` the observer buffers are simply
overwritten with rank 0's on every forward, so only rank 0's data counts).  Two tools fix that,
on the process groups users already run:

* :func:`sync_observers` — one call after calibration (before ``convert``) that merges every
  observer's statistics across the group, so every rank holds the statistics of the union of
  the shards and computes the same qparams.  Ranks may have seen different numbers of batches,
  or none at all.
* :func:`observe_across_ranks` (the ``sync_across_ranks=`` keyword of ``prepare``,
  ``prepare_qat``, ``prepare_fx``, ``prepare_qat_fx``, ``prepare_pt2e``, ``prepare_qat_pt2e``) —
  each observed batch is reduced across the group before it is folded into the running
  statistics, so after every forward all ranks hold exactly the state of one process that saw
  the concatenation of the ranks' batches.  This keeps fake-quant qparams identical on all
  ranks at every QAT step.  Every rank must run the same number of forwards (as DDP already
  requires); a rank whose batch is empty still joins each step's reduction and takes the
  others' statistics.  For shards of different numbers of batches calibrate unsynced and call
  :func:`sync_observers` once.

How statistics combine (``sync_observers``):

* ``MinMaxObserver`` / ``PerChannelMinMaxObserver`` (and torchao-style
  ``AffineQuantizedMinMaxObserver``): min of mins, max of maxes — exactly the statistics of one
  process that observed all shards, in any order.
* Moving-average variants (``MovingAverage*MinMaxObserver``, the observers inside
  ``FakeQuantize`` / ``FusedMovingAvgObsFakeQuantize``): also min of mins, max of maxes.  This
  is exact when ``averaging_constant == 1`` or each rank observed one batch.  Otherwise no exact
  answer exists (a moving average depends on the order of the whole stream, which is gone); the
  result is the widest per-rank average, which never clips a range any rank kept.  Per-step
  sync (above) is exact for moving averages.
* ``HistogramObserver``: the global range is the min / max over ranks; each rank re-bins its
  histogram onto it (the observer's own re-binning, as one process does when a batch widens its
  range) and the histograms are added in rank order, identically on every rank.  Exact (equal
  to one process that saw all shards) when no rank's range differs from the global one;
  otherwise the same approximation one process makes when its range grows.
* Fake-quant modules: their observer is merged as above and, when observation is on, their
  ``scale`` / ``zero_point`` are recomputed from it as their forward would.

Ranks whose observers saw nothing (an empty shard) contribute nothing; they end up with the
others' statistics.  An observer holding NaN statistics on any rank makes ``sync_observers``
raise ``ValueError`` on every rank, naming that rank and module.  When ``torch.distributed`` is not initialised both tools do nothing, so
the same script runs single-process.  A failed collective (a rank died, timed out or did not
call) raises ``RuntimeError`` naming this rank; set ``timeout=`` in ``init_process_group`` so a
dead peer ends the others instead of hanging them.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

from .. import affine
from .fake_quantize import (FakeQuantize, FakeQuantizeBase, FixedQParamsFakeQuantize,
                            FusedMovingAvgObsFakeQuantize, _LearnableFakeQuantize)
from .observer import (HistogramObserver, MinMaxObserver, PerChannelMinMaxObserver,
                       _histc_of_covered, _is_activation_post_process)

__all__ = ["sync_observers", "observe_across_ranks"]

ProcessGroup = Any  # torch.distributed.ProcessGroup (absent from builds without distributed)


def _active(group: Optional[ProcessGroup]) -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def _comm_device(group: Optional[ProcessGroup]) -> torch.device:
    """NCCL reduces CUDA tensors only; every other backend here gets CPU tensors."""
    if "nccl" in str(dist.get_backend(group)).lower():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _collective(what: str, group: Optional[ProcessGroup], fn, *args, **kwargs):
    """Run one collective; a failure (dead peer, timeout) becomes a RuntimeError naming us."""
    try:
        return fn(*args, group=group, **kwargs)
    except Exception as exc:  # gloo / NCCL raise RuntimeError or DistBackendError subclasses
        rank = dist.get_rank() if dist.is_initialized() else "?"
        raise RuntimeError(
            f"{what}: a collective across the process group failed on rank {rank}: another rank "
            f"probably died, timed out or did not make the same call ({type(exc).__name__}: "
            f"{exc})") from exc


def _min_max_holder(mod: nn.Module) -> bool:
    """Observers whose whole state is running ``min_val`` / ``max_val`` tensors."""
    return (not isinstance(mod, HistogramObserver)
            and isinstance(getattr(mod, "min_val", None), torch.Tensor)
            and isinstance(getattr(mod, "max_val", None), torch.Tensor))


def _is_set(mod: nn.Module) -> bool:
    """Whether the observer has seen data (empty buffers or the +inf/-inf start mean no)."""
    lo, hi = mod.min_val, mod.max_val
    if lo.numel() == 0:
        return False
    return not bool((torch.isinf(lo) & (lo > 0)).all() and (torch.isinf(hi) & (hi < 0)).all())


# --------------------------------------------------------------------------------------------
# sync_observers: merge once, after calibration
# --------------------------------------------------------------------------------------------

def _layout(name: str, mod: nn.Module) -> tuple:
    shape = tuple(mod.min_val.shape) if _is_set(mod) else None
    extra = (mod.bins,) if isinstance(mod, HistogramObserver) else ()
    affine_info = (getattr(mod, "block_size", None), getattr(mod, "original_dtype", None))
    held = [mod.min_val, mod.max_val] + ([mod.histogram] if isinstance(mod, HistogramObserver) else [])
    has_nan = any(bool(torch.isnan(t).any()) for t in held if t.is_floating_point())
    return (name, type(mod).__qualname__, shape, extra, affine_info, has_nan)


def _agreed_layouts(holders: list[tuple[str, nn.Module]], group: Optional[ProcessGroup]) -> list:
    """Per observer: the statistics shape every set rank agrees on (None: no rank saw data) and
    the torchao-style block info of a rank that saw data.  Raises when the ranks' models differ."""
    local = [_layout(name, mod) for name, mod in holders]
    world = dist.get_world_size(group)
    gathered: list = [None] * world
    _collective("sync_observers", group, dist.all_gather_object, gathered, local)
    for rank, layouts in enumerate(gathered):  # every rank sees the same: all raise alike
        poisoned = [layout[0] for layout in layouts if layout[5]]
        if poisoned:
            raise ValueError(f"sync_observers: rank {rank}'s observer {poisoned[0]!r} holds NaN "
                             "statistics (min_val / max_val / histogram), which would poison "
                             "every rank's qparams; recalibrate it or reset that observer"
                             + (f" (also: {', '.join(map(repr, poisoned[1:]))})"
                                if len(poisoned) > 1 else ""))
    agreed = []
    for i, (name, kind, _, extra, _, _) in enumerate(local):
        entries = []
        for rank, layouts in enumerate(gathered):
            if len(layouts) != len(local) or layouts[i][0] != name or layouts[i][1] != kind \
                    or layouts[i][3] != extra:
                raise ValueError(f"sync_observers: the models differ across ranks: this rank's "
                                 f"observer #{i} is {name!r} ({kind}, {extra}), rank {rank} has "
                                 f"{layouts[i][:2] + (layouts[i][3],) if i < len(layouts) else 'none'}")
            entries.append(layouts[i])
        shapes = {e[2] for e in entries if e[2] is not None}
        if len(shapes) > 1:
            raise ValueError(f"sync_observers: observer {name!r} recorded statistics of different "
                             f"shapes on different ranks: {sorted(shapes)}")
        info = next((e[4] for e in entries if e[2] is not None), (None, None))
        agreed.append((shapes.pop() if shapes else None, info))
    return agreed


def sync_observers(model: nn.Module, group: Optional[ProcessGroup] = None) -> nn.Module:
    """Merge every observer's statistics across ``group`` (default: the world) in place, so all
    ranks hold the statistics of the union of their shards and compute the same qparams.

    Call it on every rank, after calibration and before ``convert`` (or before reading qparams);
    ranks may have observed different amounts of data, or none.  A ``DistributedDataParallel``
    wrapper may be passed.  How each observer kind combines is in this module's docstring.
    Does nothing when ``torch.distributed`` is not initialised or the group has one rank.
    Returns ``model``.
    """
    if not _active(group):
        return model
    modules = [(name, mod) for name, mod in model.named_modules() if _is_activation_post_process(mod)]
    holders = [(name, mod) for name, mod in modules
               if _min_max_holder(mod) or isinstance(mod, HistogramObserver)]
    agreed = _agreed_layouts(holders, group)
    device = _comm_device(group)

    # One MIN all-reduce of [min, -max] for every observer that any rank saw data in.
    parts = []
    for (name, mod), (shape, _) in zip(holders, agreed):
        if shape is None:
            continue
        if _is_set(mod):
            lo, hi = mod.min_val, mod.max_val
        else:
            lo = torch.full(shape, math.inf, dtype=torch.float64)
            hi = torch.full(shape, -math.inf, dtype=torch.float64)
        parts += [lo.detach().reshape(-1).to(device, torch.float64),
                  hi.detach().reshape(-1).to(device, torch.float64).neg()]
    if parts:
        packed = torch.cat(parts)
        _collective("sync_observers", group, dist.all_reduce, packed, op=dist.ReduceOp.MIN)
        packed = packed.cpu()

    # Unpack; histograms re-binned onto the global range locally, then gathered in one go.
    offset = 0
    histograms = []
    for (name, mod), (shape, info) in zip(holders, agreed):
        if shape is None:
            continue
        n = math.prod(shape)
        lo = packed[offset:offset + n].view(shape)
        hi = packed[offset + n:offset + 2 * n].view(shape).neg()
        offset += 2 * n
        if isinstance(mod, HistogramObserver):
            histograms.append((mod, lo, hi, _rebinned_onto(mod, lo, hi)))
        else:
            was_set = _is_set(mod)
            for buffer, value in ((mod.min_val, lo), (mod.max_val, hi)):
                buffer.resize_(shape).copy_(value.to(buffer.dtype))
            if not was_set and info[0] is not None and hasattr(mod, "block_size"):
                mod.block_size, mod.original_dtype = info  # torchao-style: learnt in forward
    if histograms:
        local = torch.cat([h for *_, h in histograms]).to(device)
        gathered = [torch.empty_like(local) for _ in range(dist.get_world_size(group))]
        _collective("sync_observers", group, dist.all_gather, gathered, local)
        total = gathered[0].cpu().clone()
        for other in gathered[1:]:
            total += other.cpu()  # rank order: the same sum on every rank
        offset = 0
        for mod, lo, hi, own in histograms:
            n = own.numel()
            mod.histogram.resize_(own.shape).copy_(total[offset:offset + n])
            offset += n
            mod.min_val.resize_(lo.shape).copy_(lo.to(mod.min_val.dtype))
            mod.max_val.resize_(hi.shape).copy_(hi.to(mod.max_val.dtype))

    for _, mod in modules:
        if isinstance(mod, FakeQuantizeBase):
            _refresh_fake_quant_qparams(mod)
    return model


def _rebinned_onto(obs: HistogramObserver, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """This rank's histogram over the global range [lo, hi] (zeros if it saw nothing)."""
    if not _is_set(obs):
        return torch.zeros(obs.bins, dtype=obs.histogram.dtype)
    new_min, new_max = lo.to(obs.min_val.dtype), hi.to(obs.max_val.dtype)
    if bool(obs.min_val == new_min) and bool(obs.max_val == new_max):
        return obs.histogram.detach().cpu().clone()
    rebinned = obs._rebinned(obs.min_val, obs.max_val, new_min.to(obs.min_val.device),
                             new_max.to(obs.max_val.device))
    return rebinned.to("cpu", obs.histogram.dtype)


def _refresh_fake_quant_qparams(fq: FakeQuantizeBase) -> None:
    """Recompute a fake quant's qparams buffers from its (merged) observer, as its forward
    would with observation on.  Frozen (observer-disabled) and fixed-qparams modules keep theirs."""
    obs = getattr(fq, "activation_post_process", None)
    if isinstance(fq, FixedQParamsFakeQuantize) or obs is None:
        return
    if not (_min_max_holder(obs) or isinstance(obs, HistogramObserver)) or not _is_set(obs):
        return
    if isinstance(fq, _LearnableFakeQuantize):
        if fq.static_enabled[0] == 1:
            scale, zero_point = obs.calculate_qparams()
            fq.scale.data.copy_(scale.to(fq.scale.device))
            fq.zero_point.data.copy_(zero_point.to(fq.zero_point.device))
        return
    if not bool(fq.observer_enabled[0] == 1):
        return
    if isinstance(fq, FusedMovingAvgObsFakeQuantize):
        scale, zero_point = affine.choose_qparams_aten(
            torch.clamp(obs.min_val, max=0.0), torch.clamp(obs.max_val, min=0.0),
            obs.quant_min, obs.quant_max, preserve_sparsity=fq.is_symmetric_quant, fbgemm=True)
    elif isinstance(fq, FakeQuantize):
        scale, zero_point = fq.calculate_qparams()
    else:
        return
    for buffer, value in ((fq.scale, scale), (fq.zero_point, zero_point)):
        value = value.to(buffer.device, buffer.dtype)
        if buffer.shape != value.shape:
            buffer.resize_(value.shape)
        buffer.copy_(value)


# --------------------------------------------------------------------------------------------
# observe_across_ranks: reduce every observed batch
# --------------------------------------------------------------------------------------------

class _RankSync:
    """Attached to an observer (``_rank_sync``): reduces each batch's statistics across the
    group before the observer folds them in.  Deep copies share it; pickling keeps only
    "the default group" (process groups do not pickle)."""

    def __init__(self, group: Optional[ProcessGroup] = None) -> None:
        self.group = group

    def __deepcopy__(self, memo: dict) -> "_RankSync":
        return self

    def __reduce__(self):
        return (_RankSync, ())

    def min_max(self, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The min of ``lo`` and max of ``hi`` over the group (elementwise, exact)."""
        if not _active(self.group):
            return lo, hi
        device = _comm_device(self.group)
        packed = torch.cat([lo.detach().reshape(-1).to(device, torch.float64),
                            hi.detach().reshape(-1).to(device, torch.float64).neg()])
        _collective("observer sync", self.group, dist.all_reduce, packed, op=dist.ReduceOp.MIN)
        n = lo.numel()
        return (packed[:n].view(lo.shape).to(lo.device, lo.dtype),
                packed[n:].neg().view(hi.shape).to(hi.device, hi.dtype))

    def min_max_without_data(self, shape: tuple, dtype: torch.dtype, device: torch.device
                             ) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """This rank's part of a step in which its own batch was empty: it still joins the
        reduction (the other ranks are waiting in it) with the identity (+inf, -inf).  Returns
        the group's min / max, or None when no rank had data this step."""
        lo, hi = self.min_max(torch.full(shape, math.inf, dtype=dtype, device=device),
                              torch.full(shape, -math.inf, dtype=dtype, device=device))
        if bool((lo == math.inf).all()) and bool((hi == -math.inf).all()):
            return None
        return lo, hi

    def histogram_forward(self, obs: HistogramObserver, x_orig: torch.Tensor) -> torch.Tensor:
        """``obs.forward`` on the concatenation of every rank's batch: the global range first,
        then each rank's counts over the new range, summed (integer counts: exact)."""
        x = x_orig.detach()
        if x.numel():
            x_min, x_max = torch.aminmax(x)
            if math.isnan(x_min.item()) or math.isnan(x_max.item()):
                raise ValueError(f"{obs._label()}: the input contains NaN, which has no "
                                 "place in a histogram")
            if math.isinf(x_min.item()) or math.isinf(x_max.item()):
                raise ValueError(f"{obs._label()}: the input contains Inf (min "
                                 f"{x_min.item()}, max {x_max.item()}), which has no "
                                 "quantization range")
        if x.numel():
            x_min, x_max = torch.aminmax(x)
        else:
            x_min = torch.tensor(math.inf, dtype=obs.min_val.dtype)
            x_max = torch.tensor(-math.inf, dtype=obs.max_val.dtype)
        x_min, x_max = self.min_max(x_min.to(obs.min_val.dtype), x_max.to(obs.max_val.dtype))
        if x_min.item() > x_max.item():  # no rank had data
            return x_orig
        unset = obs.min_val.item() == math.inf or obs.max_val.item() == -math.inf
        cur_min, cur_max = obs.min_val, obs.max_val
        new_min = x_min if unset else torch.min(cur_min, x_min.to(cur_min.device))
        new_max = x_max if unset else torch.max(cur_max, x_max.to(cur_max.device))
        if x.numel():
            counts = _histc_of_covered(x, obs.bins, new_min.to(x.device), new_max.to(x.device))
        else:
            counts = torch.zeros(obs.bins, dtype=obs.histogram.dtype)
        device = _comm_device(self.group)
        counts = counts.to(device, obs.histogram.dtype)
        _collective("observer sync", self.group, dist.all_reduce, counts, op=dist.ReduceOp.SUM)
        update = counts.to(obs.histogram.device)
        if unset:
            combined = update
        elif bool(new_min == cur_min) and bool(new_max == cur_max):
            combined = obs.histogram + update
        else:
            combined = update + obs._rebinned(cur_min, cur_max, new_min, new_max)
        if unset or not (bool(new_min == cur_min) and bool(new_max == cur_max)):
            obs.min_val.resize_(new_min.shape).copy_(new_min)
            obs.max_val.resize_(new_max.shape).copy_(new_max)
        obs.histogram.resize_(combined.shape).copy_(combined)
        return x_orig


_PER_STEP_TYPES = (MinMaxObserver, PerChannelMinMaxObserver, HistogramObserver)


def observe_across_ranks(model: nn.Module, group: Optional[ProcessGroup] = None,
                         enabled: bool = True) -> nn.Module:
    """Make every observer of ``model`` reduce each observed batch across ``group`` (default:
    the world) before folding it in, so after each forward every rank holds the statistics of
    one process that saw all the ranks' batches (exact, moving averages included).

    Covers the min/max, per-channel, moving-average and histogram observers, also inside
    ``FakeQuantize`` and ``FusedMovingAvgObsFakeQuantize``; other observers (torchao-style
    ``AffineQuantizedMinMaxObserver``) warn and are left to :func:`sync_observers`.  Every rank
    must run the same number of forwards; empty batches are allowed.  ``enabled=False`` removes the sync.
    Does nothing when ``torch.distributed`` is not initialised.  Returns ``model``.
    """
    if enabled and not (dist.is_available() and dist.is_initialized()):
        return model
    sync = _RankSync(group) if enabled else None
    unsupported = []
    for name, mod in model.named_modules():
        if isinstance(mod, _PER_STEP_TYPES):
            if sync is None:
                mod.__dict__.pop("_rank_sync", None)
            else:
                mod.__dict__["_rank_sync"] = sync
        elif _min_max_holder(mod) and _is_activation_post_process(mod) and enabled:
            unsupported.append(f"{name} ({type(mod).__name__})")
    if unsupported:
        warnings.warn("observe_across_ranks: these observers are not reduced per step; call "
                      "sync_observers(model) before convert: " + ", ".join(unsupported),
                      stacklevel=2)
    return model


def _apply_prepare_option(model: nn.Module, sync_across_ranks: Union[bool, ProcessGroup]) -> nn.Module:
    """The ``sync_across_ranks=`` keyword of the prepare functions: False / None: nothing;
    True: the default group; a process group: that group.  Returns ``model``."""
    if sync_across_ranks is False or sync_across_ranks is None:
        return model
    return observe_across_ranks(model, None if sync_across_ranks is True else sync_across_ranks)
