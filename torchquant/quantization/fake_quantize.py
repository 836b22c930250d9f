"""Fake-quantize modules: quantize-dequantize in float during training (QAT).

A fake-quantize module owns an observer (``activation_post_process``) that tracks statistics,
keeps the resulting ``scale`` / ``zero_point`` in buffers, and rounds its input onto that grid
with a straight-through gradient.  Two buffers switch the halves independently
(``observer_enabled``, ``fake_quant_enabled``); they are tensors, not Python flags, so they are
saved in state dicts and broadcast by DDP.  The elementwise math is
:func:`torchquant.ops.fake_quantize.fake_quantize` (bit-exact with torch's fake-quantize ops).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import torch
from torch import nn

from .. import affine
from ..ops import fake_quantize as ops_fake_quantize
from ..ops._library import traced
from ..nn._torch_names import torch_quantization_function
from .. import dtypes as _dt
from .observer import (
    FixedQParamsObserver,
    HistogramObserver,
    MovingAverageMinMaxObserver,
    MovingAveragePerChannelMinMaxObserver,
    _ActivationPostProcess,
    _with_args,
    is_per_channel,
    is_per_tensor,
    owner_label,
    default_fixed_qparams_range_0to1_observer,
    default_fixed_qparams_range_neg1to1_observer,
)

__all__ = [
    "FakeQuantizeBase", "FakeQuantize", "FixedQParamsFakeQuantize",
    "FusedMovingAvgObsFakeQuantize",
    "disable_fake_quant", "disable_observer", "enable_fake_quant", "enable_observer",
    "default_fake_quant", "default_weight_fake_quant", "default_dynamic_fake_quant",
    "default_fixed_qparams_range_neg1to1_fake_quant", "default_fixed_qparams_range_0to1_fake_quant",
    "default_symmetric_fixed_qparams_fake_quant", "default_affine_fixed_qparams_fake_quant",
    "default_per_channel_weight_fake_quant", "default_embedding_fake_quant",
    "default_embedding_fake_quant_4bit", "default_histogram_fake_quant",
    "default_fused_act_fake_quant", "default_fused_wt_fake_quant",
    "default_fused_per_channel_wt_fake_quant", "fused_wt_fake_quant_range_neg_127_to_127",
    "fused_per_channel_wt_fake_quant_range_neg_127_to_127",
]


def _is_symmetric_quant(qscheme: Any) -> bool:
    return qscheme in (_dt.per_tensor_symmetric, _dt.per_channel_symmetric)


def _is_float_qparams(qscheme: Any) -> bool:
    return qscheme == _dt.per_channel_affine_float_qparams


def _integer_bounds(dtype: Any) -> tuple[int, int]:
    """Values representable in ``dtype`` (a quantized dtype, an alias, or a plain int dtype)."""
    if _dt.is_qdtype_like(dtype):
        qdtype = _dt.to_qdtype(dtype)
        return qdtype.qmin, qdtype.qmax
    info = torch.iinfo(dtype)  # TypeError for float dtypes, as in torch
    return int(info.min), int(info.max)


class FakeQuantizeBase(ABC, nn.Module):
    """Base of all fake-quantize modules: the two on/off buffers and their switches.

    The flags are uint8 ``[1]`` tensors (NCCL cannot broadcast bool tensors).
    """

    fake_quant_enabled: torch.Tensor
    observer_enabled: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.uint8))

    @abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ...

    @abstractmethod
    def calculate_qparams(self, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        ...

    def _enabled(self, flag: str) -> bool:
        """Whether buffer ``flag`` is on.  Eager reads the buffer (and remembers the value);
        a traced graph (``torch.export``, ``torch.compile``) cannot branch on buffer data, so
        it uses the value last read eagerly or set through ``enable_*`` / ``disable_*``."""
        buffer = getattr(self, flag)
        seen = self.__dict__.setdefault("_seen_flags", {})
        if traced(buffer):
            return seen.get(flag, True)
        on = bool(buffer[0] == 1)
        seen[flag] = on
        return on

    def enable_fake_quant(self, enabled: bool = True) -> None:
        self.fake_quant_enabled[0] = 1 if enabled else 0
        self.__dict__.setdefault("_seen_flags", {})["fake_quant_enabled"] = bool(enabled)

    def disable_fake_quant(self) -> None:
        self.enable_fake_quant(False)

    def enable_observer(self, enabled: bool = True) -> None:
        self.observer_enabled[0] = 1 if enabled else 0
        self.__dict__.setdefault("_seen_flags", {})["observer_enabled"] = bool(enabled)

    def disable_observer(self) -> None:
        self.enable_observer(False)

    def apply(self, fn: Callable[[nn.Module], None]) -> "FakeQuantizeBase":
        """``nn.Module.apply``, plus torch's own ``disable_observer`` / ``enable_fake_quant`` /
        ... (which only recognise torch's classes) switch this module as they would torch's."""
        super().apply(fn)
        name = torch_quantization_function(fn)
        if name in ("disable_observer", "enable_observer", "disable_fake_quant",
                    "enable_fake_quant"):
            getattr(self, name)()
        return self

    @classmethod
    def with_args(cls, **kwargs: Any) -> Callable[..., "FakeQuantizeBase"]:
        """A factory for this class with ``kwargs`` bound (what qconfigs store)."""
        return _with_args(cls, **kwargs)


_ActivationPostProcess.register(FakeQuantizeBase)


class FakeQuantize(FakeQuantizeBase):
    """``out = (clamp(round(x / scale) + zero_point, quant_min, quant_max) - zero_point) * scale``
    with qparams from the observer, updated on every forward while the observer is enabled.

    ``quant_min`` / ``quant_max`` (both or neither) are handed to the observer after checking
    they fit the emulated dtype; ``is_dynamic`` marks a placeholder for dynamic quantization.
    Observation follows the flags only, not ``train()`` / ``eval()``.
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, observer: Any = MovingAverageMinMaxObserver, quant_min: int | None = None,
                 quant_max: int | None = None, is_dynamic: bool = False,
                 **observer_kwargs: Any) -> None:
        super().__init__()
        if quant_min is not None and quant_max is not None:
            if quant_min > quant_max:
                raise AssertionError(f"quant_min must be less than or equal to quant_max, got "
                                     f"quant_min={quant_min}, quant_max={quant_max}")
            # The dtype the range must fit: an explicit kwarg, else the factory's, else quint8.
            dtype = observer_kwargs.get("dtype", _dt.quint8)
            bound_kwargs = getattr(getattr(observer, "p", None), "keywords", {})
            dtype = bound_kwargs.get("dtype", dtype)
            lowest, highest = _integer_bounds(dtype)
            if quant_min < lowest:
                raise AssertionError(f"quant_min out of bound: {quant_min} < {lowest} for {dtype}")
            if quant_max > highest:
                raise AssertionError(f"quant_max out of bound: {quant_max} > {highest} for {dtype}")
            observer_kwargs.update(quant_min=quant_min, quant_max=quant_max)
        observer_kwargs["is_dynamic"] = is_dynamic
        self.activation_post_process = observer(**observer_kwargs)
        obs = self.activation_post_process
        self.quant_min = obs.quant_min
        self.quant_max = obs.quant_max
        self.is_dynamic = obs.is_dynamic
        zero_point_dtype = torch.float if _is_float_qparams(obs.qscheme) else torch.int
        self.register_buffer("scale", torch.tensor([1.0], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([0], dtype=zero_point_dtype))
        self.dtype = obs.dtype
        self.qscheme = obs.qscheme
        self.ch_axis = obs.ch_axis if hasattr(obs, "ch_axis") else -1
        if not (is_per_channel(self.qscheme) or is_per_tensor(self.qscheme)):
            raise AssertionError("Only per channel and per tensor quantization are supported in "
                                 f"fake quantize, got qscheme: {self.qscheme}")
        self.is_per_channel = is_per_channel(self.qscheme)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.activation_post_process.calculate_qparams()

    def _fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        axis = self.ch_axis if self.is_per_channel else None
        return ops_fake_quantize.fake_quantize(x, self.scale, self.zero_point,
                                               self.activation_post_process.quant_min,
                                               self.activation_post_process.quant_max, axis)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self._enabled("observer_enabled"):
            self.activation_post_process(X.detach())
            scale, zero_point = self.calculate_qparams()
            scale = scale.to(self.scale.device)
            zero_point = zero_point.to(self.zero_point.device)
            if self.scale.shape != scale.shape:
                self.scale.resize_(scale.shape)
                self.zero_point.resize_(zero_point.shape)
            self.scale.copy_(scale)
            self.zero_point.copy_(zero_point)
        if self._enabled("fake_quant_enabled"):
            X = self._fake_quantize(X)
        return X

    def extra_repr(self) -> str:
        obs = self.activation_post_process
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, quant_min={obs.quant_min}, "
                f"quant_max={obs.quant_max}, dtype={self.dtype}, qscheme={self.qscheme}, "
                f"ch_axis={self.ch_axis}, scale={self.scale}, zero_point={self.zero_point}")

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Per-channel qparams only get their length on the first forward: take the saved shape.
        for name in ("scale", "zero_point"):
            saved = state_dict.get(prefix + name)
            if saved is not None:
                getattr(self, name).resize_(saved.shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        seen = self.__dict__.setdefault("_seen_flags", {})
        for flag in ("fake_quant_enabled", "observer_enabled"):
            seen[flag] = bool(getattr(self, flag)[0] == 1)


class FixedQParamsFakeQuantize(FakeQuantize):
    """Fake-quantize with constant qparams (sigmoid, tanh, hardsigmoid outputs).

    ``observer`` must build a :class:`FixedQParamsObserver`; its ``scale`` / ``zero_point``
    buffers are shared with this module.  Per tensor only.
    """

    def __init__(self, observer: Any) -> None:
        super().__init__(observer=observer)
        if type(self.activation_post_process) is not FixedQParamsObserver:
            raise AssertionError(f"{type(self).__name__}'s observer must be a "
                                 f"{FixedQParamsObserver.__name__}, got "
                                 f"{type(self.activation_post_process).__name__}")
        self._observer_ctr = observer
        self.scale = self.activation_post_process.scale
        self.zero_point = self.activation_post_process.zero_point
        if not is_per_tensor(self.qscheme):
            raise AssertionError("Only per tensor quantization is supported in "
                                 f"FixedQParamsFakeQuantize, got qscheme: {self.qscheme}")

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.scale, self.zero_point

    def extra_repr(self) -> str:
        obs = self.activation_post_process
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, scale={self.scale}, "
                f"zero_point={self.zero_point}, dtype={self.dtype}, quant_min={obs.quant_min}, "
                f"quant_max={obs.quant_max}, qscheme={self.qscheme}")


class FusedMovingAvgObsFakeQuantize(FakeQuantize):
    """Observe (moving-average min/max), choose qparams and fake-quantize in one step.

    Matches torch's ``fused_moving_avg_obs_fake_quant``: the qparams come from the fbgemm
    ``ChooseQuantizationParams`` routine (:func:`torchquant.affine.choose_qparams_aten` with
    ``fbgemm=True``), not from the observer's ``calculate_qparams`` — for symmetric schemes the
    scales differ (``max(|min|/128, max/127)`` instead of ``amax/127.5``).  They are recomputed
    on every forward with fake-quant enabled, from the running min/max.  The flag buffers are
    int64 here, as in torch.  [TQ] per-channel works along any ``ch_axis`` (torch: only 0), and
    NaN/Inf inputs raise ``ValueError`` instead of producing NaN qparams.
    """

    def __init__(self, observer: Any = MovingAverageMinMaxObserver, quant_min: int = 0,
                 quant_max: int = 255, **observer_kwargs: Any) -> None:
        super().__init__(observer, quant_min, quant_max, **observer_kwargs)
        if not isinstance(self.activation_post_process,
                          (MovingAverageMinMaxObserver, MovingAveragePerChannelMinMaxObserver)):
            raise AssertionError("Fused observer+fake_quant module only works with "
                                 "MovingAverageMinMaxObserver or "
                                 "MovingAveragePerChannelMinMaxObserver, got "
                                 f"{type(self.activation_post_process).__name__}")
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.long))
        self.register_buffer("observer_enabled", torch.tensor([1], dtype=torch.long))
        self.is_symmetric_quant = _is_symmetric_quant(self.activation_post_process.qscheme)

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        return self.activation_post_process.calculate_qparams()

    def extra_repr(self) -> str:
        obs = self.activation_post_process
        return (f"fake_quant_enabled={self.fake_quant_enabled}, "
                f"observer_enabled={self.observer_enabled}, scale={self.scale}, "
                f"zero_point={self.zero_point}, dtype={self.dtype}, quant_min={obs.quant_min}, "
                f"quant_max={obs.quant_max}, qscheme={self.qscheme}, "
                f"reduce_range={obs.reduce_range}")

    def _current_min_max(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_per_channel:
            per_channel = x if self.ch_axis == 0 else x.transpose(0, self.ch_axis)
            cur_min, cur_max = torch.aminmax(per_channel.reshape(per_channel.size(0), -1), dim=1)
        else:
            cur_min, cur_max = torch.aminmax(x)
        if not bool(torch.isfinite(cur_min).all() & torch.isfinite(cur_max).all()):
            kind = "NaN" if bool(torch.isnan(cur_min).any() | torch.isnan(cur_max).any()) \
                else "Inf"
            owner = owner_label(self)
            where = f" of {owner}" if owner else ""
            raise ValueError(f"{type(self).__name__}{where}: input has {kind} values (NaN or Inf "
                             f"have no quantization range; min {cur_min.tolist()}, "
                             f"max {cur_max.tolist()})")
        rank_sync = self.activation_post_process.__dict__.get("_rank_sync")
        if rank_sync is not None:  # observe_across_ranks: the batch of all ranks together
            cur_min, cur_max = rank_sync.min_max(cur_min, cur_max)
        return cur_min, cur_max

    def _update_running_min_max(self, x: torch.Tensor) -> None:
        """First observation (running value still ±inf) sets it, later ones move it by
        ``averaging_constant`` towards the batch value."""
        self._fold_running_min_max(*self._current_min_max(x))

    def _fold_running_min_max(self, cur_min: torch.Tensor, cur_max: torch.Tensor) -> None:
        obs = self.activation_post_process
        c = obs.averaging_constant
        for running, current in ((obs.min_val, cur_min), (obs.max_val, cur_max)):
            running.copy_(torch.where(torch.isinf(running), current,
                                      running + c * (current - running)))

    def _join_ranks_without_data(self, X: torch.Tensor) -> None:
        """An empty batch under ``observe_across_ranks``: join the step's reduction with no data
        and fold in what the other ranks saw, as one process seeing their batches would."""
        obs = self.activation_post_process
        rank_sync = obs.__dict__.get("_rank_sync")
        if rank_sync is None or not self._enabled("observer_enabled"):
            return
        if self.is_per_channel:
            ndim = X.dim()
            channels = X.size(self.ch_axis) if ndim and -ndim <= self.ch_axis < ndim else 0
            shape: tuple = (channels or obs.min_val.numel(),)
        else:
            shape = ()
        reduced = rank_sync.min_max_without_data(shape, obs.min_val.dtype, obs.min_val.device)
        if reduced is None:
            return
        self._prepare_per_channel_buffers(shape[0] if shape else 0)
        self._fold_running_min_max(*reduced)
        if self._enabled("fake_quant_enabled"):
            self._refresh_qparams()

    def _prepare_per_channel_buffers(self, channels: int) -> None:
        obs = self.activation_post_process
        if self.is_per_channel and obs.min_val.numel() == 0:
            obs.min_val.resize_(channels).fill_(float("inf"))
            obs.max_val.resize_(channels).fill_(float("-inf"))
            # [TQ] torch leaves these uninitialised until fake-quant first runs.
            self.scale.resize_(channels).fill_(1.0)
            self.zero_point.resize_(channels).fill_(0)

    def _refresh_qparams(self) -> None:
        """scale / zero point from the running min / max, as the fused ATen op chooses them."""
        obs = self.activation_post_process
        # ATen widens the range to contain 0 before anything else reads it; doing that first
        # also lets the never-observed state (+inf, -inf) through as (0, 0), as in ATen.
        scale, zero_point = affine.choose_qparams_aten(
            torch.clamp(obs.min_val, max=0.0), torch.clamp(obs.max_val, min=0.0),
            obs.quant_min, obs.quant_max, preserve_sparsity=self.is_symmetric_quant,
            fbgemm=True)
        self.scale.copy_(scale)
        self.zero_point.copy_(zero_point)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if X.numel() == 0:
            self._join_ranks_without_data(X)
            return X.clone()
        if self.is_per_channel:
            self._prepare_per_channel_buffers(X.size(self.ch_axis))
        if self._enabled("observer_enabled"):
            self._update_running_min_max(X.detach())
        if not self._enabled("fake_quant_enabled"):
            return X.clone()
        self._refresh_qparams()
        return self._fake_quantize(X)


class _LearnableFakeQuantize(FakeQuantizeBase):
    """Fake-quantize whose scale and zero point are trained by backprop (LSQ).

    ``scale`` / ``zero_point`` are ``nn.Parameter``s (``channel_len`` entries per channel, or
    one).  ``static_enabled`` copies the observer's qparams into them on each forward;
    ``learning_enabled`` gives them gradients; ``use_grad_scaling`` divides those gradients by
    ``sqrt(numel * quant_max)`` (https://openreview.net/pdf?id=rkgO66VKDS).
    """

    def __init__(self, observer: Any, quant_min: int = 0, quant_max: int = 255,
                 scale: float = 1.0, zero_point: float = 0.0, channel_len: int = -1,
                 use_grad_scaling: bool = False, **observer_kwargs: Any) -> None:
        super().__init__()
        if quant_min >= quant_max:
            raise AssertionError(f"quant_min must be strictly less than quant_max, got "
                                 f"{quant_min} and {quant_max}")
        self.quant_min = quant_min
        self.quant_max = quant_max
        observer_kwargs["quant_min"] = quant_min
        observer_kwargs["quant_max"] = quant_max
        self.use_grad_scaling = use_grad_scaling
        if channel_len == -1:
            self.scale = nn.Parameter(torch.tensor([scale]))
            self.zero_point = nn.Parameter(torch.tensor([zero_point]))
        else:
            if not (isinstance(channel_len, int) and channel_len > 0):
                raise AssertionError(f"Channel size must be a positive integer, got {channel_len}")
            self.scale = nn.Parameter(torch.tensor([scale] * channel_len))
            self.zero_point = nn.Parameter(torch.tensor([zero_point] * channel_len))
        self.activation_post_process = observer(**observer_kwargs)
        lowest, highest = _integer_bounds(self.activation_post_process.dtype)
        if quant_min < lowest:
            raise AssertionError(f"quant_min out of bound: {quant_min} < {lowest}")
        if quant_max > highest:
            raise AssertionError(f"quant_max out of bound: {quant_max} > {highest}")
        self.dtype = self.activation_post_process.dtype
        self.qscheme = self.activation_post_process.qscheme
        self.ch_axis = getattr(self.activation_post_process, "ch_axis", -1)
        self.register_buffer("fake_quant_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("static_enabled", torch.tensor([1], dtype=torch.uint8))
        self.register_buffer("learning_enabled", torch.tensor([0], dtype=torch.uint8))
        self.bitwidth = (quant_max - quant_min + 1).bit_length() - 1
        self.register_buffer("eps", torch.tensor([affine.FP32_EPS]))

    def enable_param_learning(self) -> "_LearnableFakeQuantize":
        """Learn the qparams (observer frozen), fake-quantize the output."""
        self.toggle_qparam_learning(enabled=True).toggle_fake_quant(enabled=True)
        self.toggle_observer_update(enabled=False)
        return self

    def enable_static_estimate(self) -> None:
        """Take the qparams from the observer (no learning), fake-quantize the output."""
        self.toggle_qparam_learning(enabled=False).toggle_fake_quant(enabled=True)
        self.toggle_observer_update(enabled=True)

    def enable_static_observation(self) -> None:
        """Only collect statistics: qparams follow the observer, the output is the input."""
        self.toggle_qparam_learning(enabled=False).toggle_fake_quant(enabled=False)
        self.toggle_observer_update(enabled=True)

    def toggle_observer_update(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.static_enabled[0] = int(enabled)
        return self

    def enable_observer(self, enabled: bool = True) -> None:
        self.toggle_observer_update(enabled)

    def toggle_qparam_learning(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.learning_enabled[0] = int(enabled)
        self.scale.requires_grad = enabled
        self.zero_point.requires_grad = enabled
        return self

    def toggle_fake_quant(self, enabled: bool = True) -> "_LearnableFakeQuantize":
        self.fake_quant_enabled[0] = int(enabled)
        return self

    def observe_quant_params(self) -> None:
        print(f"_LearnableFakeQuantize Scale: {self.scale.detach()}")
        print(f"_LearnableFakeQuantize Zero Point: {self.zero_point.detach()}")

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        """The current (scale, integer zero point); clamps the learnt scale to ``eps`` first."""
        self.scale.data.clamp_(min=self.eps.item())
        scale = self.scale.detach()
        zero_point = self.zero_point.detach().round().clamp(self.quant_min, self.quant_max).long()
        return scale, zero_point

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        if self.static_enabled[0] == 1:
            self.activation_post_process(X.detach())
            scale, zero_point = self.activation_post_process.calculate_qparams()
            self.scale.data.copy_(scale.to(self.scale.device))
            self.zero_point.data.copy_(zero_point.to(self.zero_point.device))
        else:
            self.scale.data.clamp_(min=self.eps.item())
        if self.fake_quant_enabled[0] == 1:
            if _is_symmetric_quant(self.qscheme):
                self.zero_point.data.zero_()
            grad_factor = 1.0 / (X.numel() * self.quant_max) ** 0.5 if self.use_grad_scaling else 1.0
            per_channel = self.qscheme in (_dt.per_channel_symmetric, _dt.per_channel_affine)
            X = ops_fake_quantize.fake_quantize_learnable(
                X, self.scale, self.zero_point, self.quant_min, self.quant_max,
                self.ch_axis if per_channel else None, grad_factor)
        return X


default_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=_dt.quint8,
    qscheme=_dt.per_tensor_affine, reduce_range=True)
"""Activations: moving-average min/max, quint8 with reduce_range (effective range 0..127)."""

default_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=_dt.qint8,
    qscheme=_dt.per_tensor_symmetric, reduce_range=False)
"""Weights: qint8 per-tensor symmetric."""

default_dynamic_fake_quant = FakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, is_dynamic=True,
    dtype=_dt.quint8, averaging_constant=1)
"""Dynamically quantized activations: memoryless (averaging_constant=1) quint8."""

default_fixed_qparams_range_neg1to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_neg1to1_observer)
"""Outputs in [-1, 1] (tanh): scale 2/256, zero point 128."""

default_fixed_qparams_range_0to1_fake_quant = FixedQParamsFakeQuantize.with_args(
    observer=default_fixed_qparams_range_0to1_observer)
"""Outputs in [0, 1] (sigmoid, hardsigmoid, softmax): scale 1/256, zero point 0."""

# Older names kept by torch for backward compatibility.
default_symmetric_fixed_qparams_fake_quant = default_fixed_qparams_range_neg1to1_fake_quant
default_affine_fixed_qparams_fake_quant = default_fixed_qparams_range_0to1_fake_quant

default_per_channel_weight_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype=_dt.qint8, qscheme=_dt.per_channel_symmetric, reduce_range=False, ch_axis=0)
"""Weights: qint8 per-channel symmetric along axis 0."""

default_embedding_fake_quant = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, qscheme=_dt.per_channel_affine_float_qparams,
    dtype=_dt.quint8, quant_min=0, quant_max=255, ch_axis=0, averaging_constant=1)
"""Embedding weights: memoryless per-row quint8 with float zero points."""

default_embedding_fake_quant_4bit = FakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, qscheme=_dt.per_channel_affine_float_qparams,
    ch_axis=0, dtype=_dt.quint4x2, averaging_constant=1)
"""Embedding weights, 4-bit (quint4x2) variant."""

default_histogram_fake_quant = FakeQuantize.with_args(
    observer=HistogramObserver, quant_min=0, quant_max=255, dtype=_dt.quint8,
    qscheme=_dt.per_tensor_affine, reduce_range=True)
"""Activations with a histogram observer (slow; PTQ-quality ranges)."""

default_fused_act_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255, dtype=_dt.quint8)
"""Fused version of ``default_fake_quant`` (note: full 0..255 range, no reduce_range)."""

default_fused_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-128, quant_max=127, dtype=_dt.qint8,
    qscheme=_dt.per_tensor_symmetric)
"""Fused version of ``default_weight_fake_quant``."""

default_fused_per_channel_wt_fake_quant = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-128, quant_max=127,
    dtype=_dt.qint8, qscheme=_dt.per_channel_symmetric)
"""Fused version of ``default_per_channel_weight_fake_quant``."""

fused_wt_fake_quant_range_neg_127_to_127 = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAverageMinMaxObserver, quant_min=-127, quant_max=127, dtype=_dt.qint8,
    qscheme=_dt.per_tensor_symmetric, eps=2 ** -12)
"""Fused per-tensor weights restricted to [-127, 127] (XNNPACK)."""

fused_per_channel_wt_fake_quant_range_neg_127_to_127 = FusedMovingAvgObsFakeQuantize.with_args(
    observer=MovingAveragePerChannelMinMaxObserver, quant_min=-127, quant_max=127,
    dtype=_dt.qint8, qscheme=_dt.per_channel_symmetric, eps=2 ** -12)
"""Fused per-channel weights restricted to [-127, 127] (XNNPACK)."""


def disable_fake_quant(mod: nn.Module) -> None:
    """Turn fake-quantization off on ``mod`` if it is a fake-quantize module; use with
    ``model.apply(disable_fake_quant)``."""
    if isinstance(mod, FakeQuantizeBase):
        mod.disable_fake_quant()


def enable_fake_quant(mod: nn.Module) -> None:
    """Turn fake-quantization on (``model.apply(enable_fake_quant)``)."""
    if isinstance(mod, FakeQuantizeBase):
        mod.enable_fake_quant()


def disable_observer(mod: nn.Module) -> None:
    """Freeze the qparams (``model.apply(disable_observer)``)."""
    if isinstance(mod, FakeQuantizeBase):
        mod.disable_observer()


def enable_observer(mod: nn.Module) -> None:
    """Resume statistics collection (``model.apply(enable_observer)``)."""
    if isinstance(mod, FakeQuantizeBase):
        mod.enable_observer()
