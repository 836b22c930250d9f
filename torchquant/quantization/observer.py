"""Observers: modules that watch tensors during calibration or QAT and turn what they saw into
quantization parameters (PyTorch's quantization observers, on torchquant's dtypes).

Every observer's ``forward`` records statistics and returns its input unchanged;
``calculate_qparams()`` returns ``(scale, zero_point)``.  Buffer names, state-dict keys and the
arithmetic match torch 2.13, so torch-saved observer state dicts load here and back, and the
qparams are bit-identical.  Where torch silently produces garbage, torchquant raises:

* NaN / Inf in the data of a min/max observer -> ``ValueError`` naming the observer and the
  statistic (``HistogramObserver`` warns and drops +-inf as torch does; NaN raises);
* a ``ch_axis`` outside the input's dims -> ``IndexError``; a per-channel observer fed a
  different channel count -> ``ValueError``.

``dtype`` arguments accept torchquant dtypes and their torch aliases and are stored normalised
(``MinMaxObserver(dtype=torch.uint8).dtype is torchquant.quint8``); dtypes without a torchquant
counterpart (``torch.int16``, ``torch.uint16``, float8, float dtypes) stay torch dtypes.
Observers are plain modules; FX quantization traces them as leaf modules.
"""
from __future__ import annotations

import abc
import bisect
import math
import struct
import warnings
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch
import torch.nn as nn

from .. import affine
from .. import dtypes as _dt
from ..dtypes import (QDType, QScheme, per_channel_affine, per_channel_affine_float_qparams,
                      per_channel_symmetric, per_tensor_affine, per_tensor_symmetric, qint8,
                      qint32, quint4x2, quint8)
from .affine_quantized import AffineQuantizedMinMaxObserver, AffineQuantizedObserverBase
from .granularity import (Granularity, MappingType, PerAxis, PerBlock, PerGroup, PerRow,
                          PerTensor, PerToken, TorchAODType, ZeroPointDomain, get_block_size)
from ._partial_wrapper import _PartialWrapper, _with_args, _with_callable_args

__all__ = [
    "default_affine_fixed_qparams_observer", "default_debug_observer",
    "default_dynamic_quant_observer", "default_fixed_qparams_range_0to1_observer",
    "default_fixed_qparams_range_neg1to1_observer", "default_float_qparams_observer",
    "default_float_qparams_observer_4bit", "default_histogram_observer", "default_observer",
    "default_per_channel_weight_observer", "default_placeholder_observer",
    "default_reuse_input_observer", "default_symmetric_fixed_qparams_observer",
    "default_weight_observer", "get_observer_state_dict", "load_observer_state_dict",
    "per_channel_weight_observer_range_neg_127_to_127", "weight_observer_range_neg_127_to_127",
    "FixedQParamsObserver", "HistogramObserver", "MinMaxObserver", "MovingAverageMinMaxObserver",
    "MovingAveragePerChannelMinMaxObserver", "NoopObserver", "ObserverBase",
    "PerChannelMinMaxObserver", "PlaceholderObserver", "RecordingObserver", "ReuseInputObserver",
    "UniformQuantizationObserverBase",
    "AffineQuantizedObserverBase", "AffineQuantizedMinMaxObserver",
    "Granularity", "MappingType", "PerAxis", "PerBlock", "PerGroup", "PerRow", "PerTensor",
    "PerToken", "TorchAODType", "ZeroPointDomain", "get_block_size",
]

# --------------------------------------------------------------------------------------------
# Argument normalisation
# --------------------------------------------------------------------------------------------

def is_per_tensor(qscheme: Any) -> bool:
    return qscheme == _dt.per_tensor_affine or qscheme == _dt.per_tensor_symmetric


def is_per_channel(qscheme: Any) -> bool:
    return qscheme in (_dt.per_channel_affine, _dt.per_channel_affine_float_qparams,
                       _dt.per_channel_symmetric)


def _normalise_dtype(dtype: Any) -> Any:
    return _dt.to_qdtype(dtype) if _dt.is_qdtype_like(dtype) else dtype


def _as_qscheme(qscheme: Any) -> Optional[QScheme]:
    """The torchquant qscheme for ``qscheme`` (or its torch alias); None when it is neither."""
    try:
        return _dt.to_qscheme(qscheme)
    except TypeError:
        return None


def _require_per_tensor(owner: str, qscheme: Any) -> None:
    if not is_per_tensor(qscheme):
        raise NotImplementedError(f"{owner} supports per_tensor_affine and per_tensor_symmetric "
                                  f"only, got {qscheme!r}")


def _require_per_channel(owner: str, qscheme: Any) -> None:
    if not is_per_channel(qscheme):
        raise NotImplementedError(f"{owner} supports per_channel_affine, per_channel_symmetric and "
                                  f"per_channel_affine_float_qparams only, got {qscheme!r}")


def _require_static(owner: str, is_dynamic: bool) -> None:
    if is_dynamic:
        raise NotImplementedError(f"{owner} does not support dynamic quantization")


def _step_down_while_at_least(beta: float, alpha: float, step: float, total: float,
                              level: float) -> float:
    """Repeat ``beta -= step`` while ``beta > alpha`` and ``float32((beta - step) * total) >= level``.

    ``level`` is a non-negative float32 value.  Rounding to float32 is monotone, so the test is
    the same as comparing with the midpoint between ``level`` and the float32 just below it (a
    value exactly there rounds to the even one of the two); that keeps this loop cheap.
    """
    bits = struct.unpack("<I", struct.pack("<f", level))[0]
    below = struct.unpack("<f", struct.pack("<I", bits - 1))[0] if bits else -(2.0**-149)
    midpoint = (below + level) / 2
    level_is_even = bits % 2 == 0
    while alpha < beta:
        value = (beta - step) * total
        if value < midpoint or (value == midpoint and not level_is_even):
            break
        beta -= step
    return beta


# --------------------------------------------------------------------------------------------
# Base classes
# --------------------------------------------------------------------------------------------

class ObserverBase(abc.ABC, nn.Module):
    """Base of all observers: carries ``dtype`` (normalised) and ``is_dynamic``.

    Subclasses implement ``forward`` (record, return the input) and ``calculate_qparams``.
    """

    def __init__(self, dtype: Any, is_dynamic: bool = False) -> None:
        super().__init__()
        self.dtype = _normalise_dtype(dtype)
        self.is_dynamic = is_dynamic

    @abc.abstractmethod
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Record statistics of ``x`` and return ``x``."""

    @abc.abstractmethod
    def calculate_qparams(self, **kwargs: Any) -> Any:
        """Quantization parameters from the recorded statistics."""

    with_args = classmethod(_with_args)
    with_callable_args = classmethod(_with_callable_args)

    def _label(self) -> str:
        """This observer's class, and the module it observes once ``prepare`` has named it."""
        where = owner_label(self)
        return f"{type(self).__name__} of {where}" if where else type(self).__name__

    def _warn_if_huge(self, lo: Any, hi: Any) -> None:
        """Warn once when calibration data reaches |x| >= 1e30: a range that wide leaves one
        quantization step for everything of ordinary size (usually overflow upstream)."""
        if self.__dict__.get("_torchquant_warned_huge"):
            return
        extreme = max(abs(float(lo)), abs(float(hi)))
        if extreme >= _HUGE:
            self.__dict__["_torchquant_warned_huge"] = True
            warnings.warn(f"{self._label()}: the calibration data reaches {extreme:.3g} "
                          f"(|x| >= {_HUGE:g}); the quantization range will be absurd. Check the "
                          "input for overflow or uninitialised values", stacklevel=3)


# Calibration values this large get a warning (see ObserverBase._warn_if_huge).
_HUGE = 1e30


def set_observer_owner(observer: nn.Module, name: str, kind: str = "module") -> None:
    """Record ``name`` (the observed module, or graph node for ``kind="node"``) on ``observer``
    and any observer inside it (a fake-quant's), so that their messages say where they are.
    The first name recorded stays (an observer shared by several nodes names the first)."""
    for m in observer.modules():
        if "_torchquant_owner" not in m.__dict__ or kind == "module":
            m.__dict__["_torchquant_owner"] = name
            m.__dict__["_torchquant_owner_kind"] = kind


def owner_label(observer: nn.Module) -> str:
    """``"module 'fc1'"`` / ``"node 'conv2d'"`` for an observer named by prepare, else ``""``."""
    owner = observer.__dict__.get("_torchquant_owner")
    if not owner:
        return ""
    return f"{observer.__dict__.get('_torchquant_owner_kind', 'module')} {owner!r}"


class UniformQuantizationObserverBase(ObserverBase):
    """Shared machinery of the observers that produce affine (scale, zero_point) qparams.

    Validates ``qscheme`` (the five schemes; else ``AssertionError``) and ``dtype`` (quint8,
    qint8, qint32, quint4x2 and aliases, torch.int16/uint16/float8_e5m2/float8_e4m3fn; else
    ``AssertionError``), derives ``quant_min``/``quant_max`` (a custom range must contain 0 and
    be non-empty: ``AssertionError``), and stores ``eps`` (the smallest scale) as a buffer.
    ``reduce_range=True`` is deprecated in torch and warns here too.
    """

    # State-dict format: v2 added the ``eps`` buffer, v3 renamed per-channel ``min_vals`` /
    # ``max_vals`` and made the histogram observer's unset min/max 0-d.
    _version = 3

    _ALLOWED_QSCHEMES = (per_tensor_affine, per_tensor_symmetric, per_channel_affine,
                         per_channel_symmetric, per_channel_affine_float_qparams)
    _ALLOWED_DTYPES = (quint8, qint8, qint32, quint4x2, torch.int16, torch.uint16,
                       torch.float8_e5m2, torch.float8_e4m3fn)

    eps: torch.Tensor

    def __init__(self, dtype: Any = quint8, qscheme: Any = per_tensor_affine,
                 reduce_range: bool = False, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, factory_kwargs: Optional[dict] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        factory_kwargs = torch.nn.factory_kwargs(factory_kwargs)
        super().__init__(dtype=dtype, is_dynamic=is_dynamic, **kwargs)
        scheme = _as_qscheme(qscheme)
        if scheme not in self._ALLOWED_QSCHEMES:
            raise AssertionError(f"{type(self).__name__}: unsupported qscheme {qscheme!r}; expected "
                                 "per_tensor_affine, per_tensor_symmetric, per_channel_affine, "
                                 "per_channel_symmetric or per_channel_affine_float_qparams")
        self.qscheme = scheme
        if reduce_range:
            warnings.warn("reduce_range is deprecated (as in torch); pass quant_min and quant_max "
                          "to choose the range", stacklevel=2)
        self.reduce_range = reduce_range
        self.register_buffer("eps", torch.tensor([eps], **factory_kwargs))
        if self.dtype not in self._ALLOWED_DTYPES:
            raise AssertionError(f"{type(self).__name__}: unsupported dtype {dtype!r}; expected "
                                 "quint8, qint8, qint32, quint4x2 (or torch.uint8/int8/int32), "
                                 "torch.int16, torch.uint16, torch.float8_e5m2 or "
                                 "torch.float8_e4m3fn")
        self.has_customized_qrange = quant_min is not None and quant_max is not None
        if self.has_customized_qrange:
            affine.validate_qmin_qmax(quant_min, quant_max)
        self.quant_min, self.quant_max = affine.calculate_qmin_qmax(
            quant_min, quant_max, self.has_customized_qrange, self.dtype, self.reduce_range)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        if local_metadata.get("version") in (None, 1):
            # v1 dicts predate the eps buffer: they meant the default eps.
            state_dict[prefix + "eps"] = torch.tensor([affine.FP32_EPS])
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def _calculate_qparams(self, min_val: torch.Tensor,
                           max_val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(scale, zero_point) for per-tensor (0-d) or per-channel (1-d) min/max (SPEC §1.5)."""
        never_observed = min_val.numel() == 0 or max_val.numel() == 0 or (
            min_val.dim() == 0 and bool(min_val == float("inf")) and bool(max_val == float("-inf")))
        if never_observed:
            # torch's words, plus which module's observer it was.
            warnings.warn(f"{self._label()}: must run observer before calling calculate_qparams. "
                          "Returning default values.", stacklevel=3)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return affine.choose_qparams(min_val, max_val, self.quant_min, self.quant_max,
                                             self.dtype, self.eps, self.has_customized_qrange,
                                             self.qscheme)
        return affine.choose_qparams(min_val, max_val, self.quant_min, self.quant_max, self.dtype,
                                     self.eps, self.has_customized_qrange, self.qscheme)

    def _reject_non_finite(self, min_val: torch.Tensor, max_val: torch.Tensor) -> None:
        """ValueError naming this observer and the statistic when a batch had NaN or Inf."""
        for name, value in (("min_val", min_val), ("max_val", max_val)):
            if not bool(torch.isfinite(value).all()):
                kind = "NaN" if bool(torch.isnan(value).any()) else "Inf"
                raise ValueError(f"{self._label()}: the observed {name} is not finite "
                                 f"({value.flatten()[:8].tolist()}); the input contains {kind}, "
                                 "which has no quantization range")

    def _reject_symmetric_reduced_quint8(self) -> None:
        """Symmetric quint8 centres on 128, which a reduced 0..127 range does not contain."""
        if self.qscheme.is_symmetric and self.reduce_range and self.dtype == quint8:
            raise NotImplementedError(f"{type(self).__name__}: reduce_range is not supported for "
                                      "symmetric quantization to quint8")

    def _fold_min_max(self, lo: torch.Tensor, hi: torch.Tensor,
                      averaging_constant: Optional[float] = None, reduced: bool = False) -> None:
        """Fold one batch's (checked) min/max into the running ``min_val`` / ``max_val`` buffers.

        Unset statistics (an empty per-channel buffer, or per-tensor +inf / -inf) take the batch
        values; later batches keep the extremes or, with ``averaging_constant``, move that
        fraction of the way towards the batch values.  Under
        :func:`~torchquant.quantization.observe_across_ranks` the batch values are first reduced
        across the process group (unless ``reduced``: they already were).
        """
        rank_sync = self.__dict__.get("_rank_sync")
        if rank_sync is not None and not reduced:
            lo, hi = rank_sync.min_max(lo, hi)
        if averaging_constant is None and self.min_val.numel():
            torch.minimum(self.min_val, lo, out=self.min_val)  # +inf / -inf fold like any value
            torch.maximum(self.max_val, hi, out=self.max_val)
        elif self.min_val.numel() == 0 or (self.min_val.dim() == 0 and self.min_val.item() == math.inf
                                           and self.max_val.item() == -math.inf):
            self.min_val.resize_(lo.shape).copy_(lo)
            self.max_val.resize_(hi.shape).copy_(hi)
        else:
            self.min_val.add_(averaging_constant * (lo - self.min_val))
            self.max_val.add_(averaging_constant * (hi - self.max_val))

    def _fold_empty_batch(self, shape: tuple, averaging_constant: Optional[float] = None) -> None:
        """An empty batch adds nothing on its own; under
        :func:`~torchquant.quantization.observe_across_ranks` this rank still joins the step's
        reduction, and folds in what the other ranks saw (as one process would)."""
        rank_sync = self.__dict__.get("_rank_sync")
        if rank_sync is None:
            return
        reduced = rank_sync.min_max_without_data(shape, self.min_val.dtype, self.min_val.device)
        if reduced is None:
            return
        self._fold_min_max(*reduced, averaging_constant, reduced=True)

    def reset_min_max_vals(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} cannot reset its min/max values")


# --------------------------------------------------------------------------------------------
# Per-tensor min/max observers
# --------------------------------------------------------------------------------------------

class MinMaxObserver(UniformQuantizationObserverBase):
    """Qparams from the running min and max of everything observed (per tensor).

    Per-tensor qschemes only (``NotImplementedError`` otherwise, and for symmetric quint8 with
    ``reduce_range``).  Buffers ``min_val`` = +inf and ``max_val`` = -inf until data arrives;
    ``calculate_qparams`` before that warns and returns ``(tensor([1.]), tensor([0]))``.  All-zero
    data gives ``scale = eps``.  NaN/Inf in a batch raises ``ValueError`` and leaves the running
    statistics untouched.
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, dtype: Any = quint8, qscheme: Any = per_tensor_affine,
                 reduce_range: bool = False, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, factory_kwargs: Optional[dict] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_per_tensor(type(self).__name__, qscheme)
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs,
                         eps=eps, is_dynamic=is_dynamic, **kwargs)
        factory_kwargs = torch.nn.factory_kwargs(factory_kwargs)
        self.register_buffer("min_val", torch.tensor(float("inf"), **factory_kwargs))
        self.register_buffer("max_val", torch.tensor(float("-inf"), **factory_kwargs))
        self._reject_symmetric_reduced_quint8()

    def _batch_min_max(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """min and max of one batch in the buffer dtype, checked finite.

        Reducing before the cast equals torch's cast-then-reduce: rounding is monotone.
        """
        x = x.detach()
        if not x.is_floating_point():
            x = x.to(self.min_val.dtype)
        lo, hi = torch.aminmax(x)
        lo, hi = lo.to(self.min_val.dtype), hi.to(self.max_val.dtype)
        lo_value, hi_value = lo.item(), hi.item()
        if not (math.isfinite(lo_value) and math.isfinite(hi_value)):
            self._reject_non_finite(lo, hi)
        if lo_value <= -_HUGE or hi_value >= _HUGE:
            self._warn_if_huge(lo_value, hi_value)
        return lo, hi

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            self._fold_empty_batch(())
            return x_orig
        self._fold_min_max(*self._batch_min_max(x_orig))
        return x_orig

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._calculate_qparams(self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def reset_min_max_vals(self) -> None:
        self.min_val.fill_(float("inf"))
        self.max_val.fill_(float("-inf"))


class MovingAverageMinMaxObserver(MinMaxObserver):
    """Per-tensor qparams from exponential moving averages of each batch's min and max.

    The first batch sets min/max; later ones move them by ``averaging_constant`` times the
    difference.  ``is_dynamic=True`` only makes sense with ``averaging_constant == 1``
    (``NotImplementedError`` otherwise).  Other decisions as :class:`MinMaxObserver`.
    """

    def __init__(self, averaging_constant: float = 0.01, dtype: Any = quint8,
                 qscheme: Any = per_tensor_affine, reduce_range: bool = False,
                 quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_per_tensor(type(self).__name__, qscheme)
        if is_dynamic and averaging_constant != 1:
            raise NotImplementedError(f"{type(self).__name__}: dynamic quantization needs "
                                      f"averaging_constant 1, got {averaging_constant}")
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, eps=eps,
                         is_dynamic=is_dynamic, **kwargs)
        self.averaging_constant = averaging_constant

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            self._fold_empty_batch((), self.averaging_constant)
            return x_orig
        self._fold_min_max(*self._batch_min_max(x_orig), self.averaging_constant)
        return x_orig


# --------------------------------------------------------------------------------------------
# Per-channel min/max observers
# --------------------------------------------------------------------------------------------

class PerChannelMinMaxObserver(UniformQuantizationObserverBase):
    """Qparams from the running min and max of every slice along ``ch_axis``.

    Per-channel qschemes only and no dynamic mode (``NotImplementedError``).  Buffers
    ``min_val`` / ``max_val`` start as empty 1-d tensors and take their length from the first
    input or from a loaded state dict (v<3 names ``min_vals`` / ``max_vals`` are accepted).
    Decisions [TQ]: ``ch_axis`` outside the input's dims raises ``IndexError``; an input with a
    different channel count than before raises ``ValueError``; NaN/Inf raises ``ValueError``; a
    1-d input is one value per channel (torch raises on it).
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, ch_axis: int = 0, dtype: Any = quint8, qscheme: Any = per_channel_affine,
                 reduce_range: bool = False, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, factory_kwargs: Optional[dict] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_per_channel(type(self).__name__, qscheme)
        _require_static(type(self).__name__, is_dynamic)
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs,
                         eps=eps, is_dynamic=is_dynamic, **kwargs)
        factory_kwargs = torch.nn.factory_kwargs(factory_kwargs)
        self.ch_axis = ch_axis
        self.register_buffer("min_val", torch.tensor([], **factory_kwargs))
        self.register_buffer("max_val", torch.tensor([], **factory_kwargs))
        self._reject_symmetric_reduced_quint8()

    def _channel_min_max(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-channel min and max of one batch in the buffer dtype, checked finite."""
        x = x.detach()
        ndim = x.dim()
        if ndim == 0 or not -ndim <= self.ch_axis < ndim:
            raise IndexError(f"{type(self).__name__}: ch_axis={self.ch_axis} is out of range for "
                             f"an input of shape {tuple(x.shape)}")
        axis = self.ch_axis % ndim
        if not x.is_floating_point():
            x = x.to(self.min_val.dtype)
        # amin/amax over the other dims: no transposed copy, and (measured) several times faster
        # than aminmax along a dim; min and max do not depend on the reduction order.
        others = tuple(d for d in range(ndim) if d != axis)
        if others:
            lo = torch.amin(x, dim=others).to(self.min_val.dtype)
            hi = torch.amax(x, dim=others).to(self.max_val.dtype)
        else:  # a 1-d input: every element is a channel (torch fails on it with an IndexError)
            lo = hi = x.to(self.min_val.dtype)
        if not bool((torch.isfinite(lo) & torch.isfinite(hi)).all()):
            self._reject_non_finite(lo, hi)
        if lo.numel() and not self.__dict__.get("_torchquant_warned_huge"):
            self._warn_if_huge(lo.min().item(), hi.max().item())
        if self.min_val.numel() and self.min_val.shape != lo.shape:
            raise ValueError(f"{type(self).__name__}: input of shape {tuple(x.shape)} has "
                             f"{lo.numel()} channels along ch_axis={self.ch_axis}, but the observer "
                             f"has recorded {self.min_val.numel()}")
        return lo, hi

    def _channels_of_empty(self, x: torch.Tensor) -> tuple:
        """The statistics shape an empty batch would have had (for the per-step reduction)."""
        ndim = x.dim()
        channels = x.size(self.ch_axis) if ndim and -ndim <= self.ch_axis < ndim else 0
        return (channels or self.min_val.numel(),)

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            self._fold_empty_batch(self._channels_of_empty(x_orig))
            return x_orig
        self._fold_min_max(*self._channel_min_max(x_orig))
        return x_orig

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._calculate_qparams(self.min_val, self.max_val)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        version = local_metadata.get("version")
        if version is not None and version < 3:
            for old, new in (("min_vals", "min_val"), ("max_vals", "max_val")):
                if prefix + old in state_dict:
                    state_dict[prefix + new] = state_dict.pop(prefix + old)
        # The buffers have the length of whatever was observed; take the loaded one.
        for name in ("min_val", "max_val"):
            if prefix + name in state_dict:
                getattr(self, name).resize_(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def reset_min_max_vals(self) -> None:
        self.min_val.resize_(0)
        self.max_val.resize_(0)


class MovingAveragePerChannelMinMaxObserver(PerChannelMinMaxObserver):
    """Per-channel moving averages of each batch's min and max (update rule of
    :class:`MovingAverageMinMaxObserver`, decisions of :class:`PerChannelMinMaxObserver`)."""

    def __init__(self, averaging_constant: float = 0.01, ch_axis: int = 0, dtype: Any = quint8,
                 qscheme: Any = per_channel_affine, reduce_range: bool = False,
                 quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_per_channel(type(self).__name__, qscheme)
        _require_static(type(self).__name__, is_dynamic)
        super().__init__(ch_axis=ch_axis, dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, eps=eps,
                         is_dynamic=is_dynamic, **kwargs)
        self.averaging_constant = averaging_constant

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if x_orig.numel() == 0:
            self._fold_empty_batch(self._channels_of_empty(x_orig), self.averaging_constant)
            return x_orig
        self._fold_min_max(*self._channel_min_max(x_orig), self.averaging_constant)
        return x_orig


# --------------------------------------------------------------------------------------------
# Histogram observer
# --------------------------------------------------------------------------------------------

def _histogram_code_bits(dtype: Any) -> int:
    """Bits of the integer type whose codes the histogram search targets.

    torch sizes this with ``torch.iinfo`` of the quantized dtype, which reports the storage byte
    for quint4x2 (8 bits, not 4); kept for identical results.
    """
    storage = dtype.storage_dtype if isinstance(dtype, QDType) else dtype
    try:
        return torch.iinfo(storage).bits
    except TypeError:
        raise TypeError(f"HistogramObserver needs an integer dtype to size its search, got "
                        f"{dtype!r}") from None


_HISTC_MIN_NUMEL = 1 << 20  # below this histc's own loop is as fast
_HISTC_CHUNK = 1 << 18  # elements per pass: the scratch stays in cache


def _histc_of_covered(x: torch.Tensor, bins: int, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """``torch.histc(x, bins, lo, hi)`` for an ``x`` whose every element lies in ``[lo, hi]``.

    histc bins a float32 value ``v`` as ``int((v - lo) * bins / (hi - lo))`` in float32 (the top
    edge folded into the last bin) and counts in float32, which is exact for up to 2**24
    elements.  For large float32 inputs this computes the same indices with a few in-place
    passes and an integer ``bincount`` over cache-sized chunks, about twice as fast as histc's
    per-element loop (measured at 16M elements, 2 threads); anything else goes to torch.histc.
    """
    if x.dtype != torch.float32 or x.device.type != "cpu" or not _HISTC_MIN_NUMEL <= x.numel() <= 2**24:
        return torch.histc(x, bins, min=lo, max=hi)
    lo32, hi32 = lo.to(torch.float32), hi.to(torch.float32)  # histc's edges are in x's dtype
    start, span = lo32.item(), (hi32 - lo32).item()
    if not (span > 0 and math.isfinite(span)):  # histc widens empty ranges; rare, let it
        return torch.histc(x, bins, min=lo, max=hi)
    flat = x.reshape(-1)
    scaled = torch.empty(_HISTC_CHUNK)
    index = torch.empty(_HISTC_CHUNK, dtype=torch.int32)
    counts = torch.zeros(bins + 1, dtype=torch.int64)  # the extra bin holds values equal to hi
    for first in range(0, flat.numel(), _HISTC_CHUNK):
        part = flat[first:first + _HISTC_CHUNK]
        chunk_scaled, chunk_index = scaled[:part.numel()], index[:part.numel()]
        torch.sub(part, start, out=chunk_scaled)
        chunk_scaled.mul_(float(bins)).div_(span)
        chunk_index.copy_(chunk_scaled)  # truncation, as histc's cast
        counts += torch.bincount(chunk_index, minlength=bins + 1)
    counts[bins - 1] += counts[bins]
    return counts[:bins].to(torch.float32)


class HistogramObserver(UniformQuantizationObserverBase):
    """Per-tensor qparams from a running histogram and a search for the range that minimises the
    (approximate) L2 quantization error.

    forward: the histogram spans the running [min, max]; when a batch widens the range, the old
    histogram is upsampled 16x and re-binned into the new range (as torch).  calculate_qparams:
    the search torch ports from caffe2 — shrink the range from whichever side drops less mass,
    one 1e-5 quantile step at a time, and stop at the first step that increases the error.  The
    step sequence does not depend on the errors, so the candidates are generated cheaply and
    their errors evaluated in batches (one tensor expression per batch instead of one per step);
    every float operation is torch's, so the result is bit-identical.

    Per-tensor qschemes only and no dynamic mode (``NotImplementedError``).  ±inf values warn and
    are dropped (torch's behaviour); NaN raises ``ValueError`` [TQ].  Never observed: warns and
    returns ``(tensor([1.]), tensor([0]))``.
    """

    histogram: torch.Tensor
    min_val: torch.Tensor
    max_val: torch.Tensor

    _STEP = 1e-5
    _MAX_BATCH = 256  # candidate ranges whose errors are computed in one tensor expression

    def __init__(self, bins: int = 2048, dtype: Any = quint8, qscheme: Any = per_tensor_affine,
                 reduce_range: bool = False, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, factory_kwargs: Optional[dict] = None,
                 eps: float = affine.FP32_EPS, is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_per_tensor(type(self).__name__, qscheme)
        _require_static(type(self).__name__, is_dynamic)
        super().__init__(dtype=dtype, qscheme=qscheme, reduce_range=reduce_range,
                         quant_min=quant_min, quant_max=quant_max, factory_kwargs=factory_kwargs,
                         eps=eps, is_dynamic=is_dynamic, **kwargs)
        factory_kwargs = torch.nn.factory_kwargs(factory_kwargs)
        self.bins = bins
        self.register_buffer("histogram", torch.zeros(self.bins, **factory_kwargs))
        self.register_buffer("min_val", torch.tensor(float("inf"), **factory_kwargs))
        self.register_buffer("max_val", torch.tensor(float("-inf"), **factory_kwargs))
        self.dst_nbins = 2 ** _histogram_code_bits(self.dtype)
        self.upsample_rate = 16  # fine bins per bin when re-binning into a wider range

    # ---- forward ------------------------------------------------------------------------------

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        rank_sync = self.__dict__.get("_rank_sync")  # set by observe_across_ranks
        if rank_sync is not None:
            return rank_sync.histogram_forward(self, x_orig)
        if x_orig.numel() == 0:
            return x_orig
        x = x_orig.detach()
        x_min, x_max = torch.aminmax(x)
        lo, hi = x_min.item(), x_max.item()
        if math.isnan(lo) or math.isnan(hi):
            raise ValueError(f"{self._label()}: the input contains NaN, which has no place "
                             "in a histogram")
        if math.isinf(lo) or math.isinf(hi):
            # [TQ] torch drops +-inf with a warning; the Inf then flows on and poisons later
            # observers as NaN, far from where it entered: name it here instead
            raise ValueError(f"{self._label()}: the input contains Inf (min {lo}, max {hi}), "
                             "which has no quantization range")
        if lo <= -_HUGE or hi >= _HUGE:
            self._warn_if_huge(lo, hi)
        if self.min_val.item() == float("inf") or self.max_val.item() == float("-inf"):
            self._start_histogram(x, x_min, x_max)
            return x_orig
        cur_min, cur_max = self.min_val, self.max_val
        new_min = torch.min(cur_min, x_min)
        new_max = torch.max(cur_max, x_max)
        update = _histc_of_covered(x, self.bins, new_min, new_max).to(self.histogram.device)
        if new_min == cur_min and new_max == cur_max:
            combined = self.histogram + update
        else:
            combined = update + self._rebinned(cur_min, cur_max, new_min, new_max)
            self.min_val.resize_(new_min.shape).copy_(new_min)
            self.max_val.resize_(new_max.shape).copy_(new_max)
        self.histogram.resize_(combined.shape).copy_(combined)
        return x_orig

    def _start_histogram(self, x: torch.Tensor, x_min: torch.Tensor, x_max: torch.Tensor) -> None:
        self.min_val.resize_(x_min.shape).copy_(x_min)
        self.max_val.resize_(x_max.shape).copy_(x_max)
        fresh = _histc_of_covered(x, self.bins, x_min, x_max)
        self.histogram.resize_(fresh.shape).copy_(fresh)

    def _rebinned(self, old_min: torch.Tensor, old_max: torch.Tensor, new_min: torch.Tensor,
                  new_max: torch.Tensor) -> torch.Tensor:
        """The current histogram (over [old_min, old_max]) re-binned into [new_min, new_max]."""
        if old_min == old_max:  # a single point: all mass goes to the bin holding it
            return torch.histc(old_min, bins=self.bins, min=new_min, max=new_max) * self.histogram.sum()
        rate = self.upsample_rate
        fine = self.histogram.repeat_interleave(rate) / rate
        fine_width = (old_max - old_min) / (self.bins * rate)
        fine_centres = (torch.linspace(old_min, old_max, self.bins * rate + 1,
                                       device=old_min.device)[:-1].to(fine.device)
                        + 0.5 * fine_width)
        new_edges = torch.linspace(new_min, new_max, self.bins + 1,
                                   device=new_min.device).to(fine.device)
        target = torch.bucketize(fine_centres, new_edges, right=True) - 1
        target.clamp_(0, self.bins - 1)  # centres a rounding error outside the new range
        return torch.bincount(target, weights=fine, minlength=self.bins)

    # ---- calculate_qparams --------------------------------------------------------------------

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.min_val.item() == float("inf") and self.max_val.item() == float("-inf"):
            warnings.warn(f"{self._label()}: must run observer before calling "
                          "calculate_qparams; returning scale 1.0, zero_point 0", stacklevel=2)
            device = self.min_val.device.type
            return torch.tensor([1.0], device=device), torch.tensor([0], device=device)
        if self.bins != len(self.histogram):
            raise AssertionError(f"{type(self).__name__}: the histogram has "
                                 f"{len(self.histogram)} bins but the observer was built with "
                                 f"bins={self.bins}")
        new_min, new_max = self._non_linear_param_search()
        return self._calculate_qparams(new_min, new_max)

    def _non_linear_param_search(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The (min, max) the error search settles on, as 0-d tensors."""
        bin_width = (self.max_val - self.min_val) / self.bins
        start_bin, end_bin = self._search_bins()
        return self.min_val + bin_width * start_bin, self.min_val + bin_width * (end_bin + 1)

    def _search_bins(self) -> tuple[int, int]:
        """First and last histogram bin of the chosen range (torch's step rule, batched errors)."""
        total = torch.sum(self.histogram).item()
        cumulative = torch.cumsum(self.histogram, dim=0).tolist()  # non-decreasing: bisectable
        alpha, beta = 0.0, 1.0  # mass fractions cut below / kept below
        start, end = 0, self.bins - 1
        best, best_norm = (start, end), float("inf")
        batch: list[tuple[int, int]] = []
        batch_limit = 4
        while alpha < beta:
            next_alpha, next_beta = alpha + self._STEP, beta - self._STEP
            # torch compares float32 partial sums with Python floats: the float is rounded first
            left = bisect.bisect_left(cumulative, affine.round_to_float32(next_alpha * total),
                                      start, end)
            right = bisect.bisect_right(cumulative, affine.round_to_float32(next_beta * total),
                                        start + 1, end + 1) - 1
            if left - start > end - right:
                candidate, alpha = (left, end), next_alpha
            else:
                candidate, beta = (start, right), next_beta
            if candidate == (start, end):
                # Nothing moved, so left == start and right == end: only beta steps on, until the
                # kept-mass threshold drops below cumulative[end].  Skip there without bisecting.
                if start == end:
                    break
                beta = _step_down_while_at_least(beta, alpha, self._STEP, total, cumulative[end])
                continue
            start, end = candidate
            batch.append(candidate)
            if len(batch) == batch_limit:
                best, best_norm, stopped = self._accept_while_improving(batch, best, best_norm)
                if stopped:
                    return best
                batch, batch_limit = [], min(2 * batch_limit, self._MAX_BATCH)
        if batch:
            best, _, _ = self._accept_while_improving(batch, best, best_norm)
        return best

    def _accept_while_improving(self, candidates: list[tuple[int, int]], best: tuple[int, int],
                                best_norm: float) -> tuple[tuple[int, int], float, bool]:
        """Walk the candidates in order; stop at the first whose error exceeds its predecessor's."""
        for candidate, norm in zip(candidates, self._quantization_errors(candidates)):
            if norm > best_norm:
                return best, best_norm, True
            best, best_norm = candidate, norm
        return best, best_norm, False

    def _quantization_errors(self, candidates: list[tuple[int, int]]) -> list[float]:
        """Approximate L2 error of quantizing the histogram to ``dst_nbins`` codes over each
        candidate bin range, computed for all candidates at once.

        Each source bin's mass is taken as uniform; its error is the integral of the squared
        distance to the centre of the destination bin(s) it overlaps.  Per-candidate scalars are
        rounded to float32 exactly where torch's scalar-tensor arithmetic rounds them.
        """
        bin_width = (self.max_val.item() - self.min_val.item()) / self.bins
        dst_widths = [bin_width * (e - s + 1) / self.dst_nbins for s, e in candidates]
        errors = [0.0] * len(candidates)
        rows = [i for i, w in enumerate(dst_widths) if w != 0.0]
        if not rows:
            return errors
        device = self.histogram.device

        def column(values: list[float], dtype: torch.dtype = torch.float32) -> torch.Tensor:
            return torch.tensor(values, dtype=dtype, device=device).unsqueeze(1)

        dst_width = column([dst_widths[i] for i in rows])
        half_width = column([dst_widths[i] / 2 for i in rows])
        neg_half_width = column([-dst_widths[i] / 2 for i in rows])
        start = column([candidates[i][0] for i in rows], torch.int64)
        density = self.histogram / bin_width
        top_bin = self.dst_nbins - 1

        src_begin = (torch.arange(self.bins, device=device) - start) * bin_width
        src_end = src_begin + bin_width
        dst_of_begin = torch.clamp(torch.div(src_begin, dst_width, rounding_mode="floor"), 0, top_bin)
        dst_of_end = torch.clamp(torch.div(src_end, dst_width, rounding_mode="floor"), 0, top_bin)
        begin_centre = (dst_of_begin + 0.5) * dst_width
        end_centre = dst_of_end * dst_width + half_width

        norm = _cube_integral(src_begin - begin_centre, half_width, density)
        norm += (dst_of_end - dst_of_begin - 1) * _cube_integral(neg_half_width, half_width, density)
        norm += _cube_integral(neg_half_width, src_end - end_centre, density)
        for i, value in zip(rows, norm.sum(dim=1).tolist()):
            errors[i] = value
        return errors

    # ---- state dict ---------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        version = local_metadata.get("version")
        if version is None or version < 3:
            # Before v3 an unset min/max was an empty tensor; now it is +-inf.
            for name, unset in (("min_val", float("inf")), ("max_val", float("-inf"))):
                key = prefix + name
                if key in state_dict and state_dict[key].shape == torch.Size([0]):
                    state_dict[key] = torch.tensor(unset)
        for name in ("min_val", "max_val"):
            if prefix + name in state_dict:
                getattr(self, name).resize_(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}"


def _cube_integral(delta_begin: torch.Tensor, delta_end: torch.Tensor,
                   density: torch.Tensor) -> torch.Tensor:
    """``density * (end^3 - begin^3) / 3``: the squared-distance mass of a uniform stretch."""
    return density * ((delta_end * delta_end * delta_end - delta_begin * delta_begin * delta_begin) / 3)


# --------------------------------------------------------------------------------------------
# Observers that only carry configuration
# --------------------------------------------------------------------------------------------

class FixedQParamsObserver(ObserverBase):
    """Identity observer with constant qparams (ops with a known output range: sigmoid, tanh).

    Buffers ``scale`` (float32 ``[1]``) and ``zero_point`` (int32 ``[1]``).  Per-tensor qschemes
    only and no dynamic mode (``NotImplementedError``); a non-positive or non-finite scale raises
    ``ValueError`` [TQ].
    """

    scale: torch.Tensor
    zero_point: torch.Tensor

    def __init__(self, scale: float, zero_point: int, dtype: Any = quint8,
                 qscheme: Any = per_tensor_affine, quant_min: int = 0, quant_max: int = 255,
                 is_dynamic: bool = False, **kwargs: Any) -> None:
        _require_static(type(self).__name__, is_dynamic)
        _require_per_tensor(type(self).__name__, qscheme)
        super().__init__(dtype=dtype, is_dynamic=is_dynamic, **kwargs)
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.register_buffer("scale", torch.tensor([scale], dtype=torch.float))
        self.register_buffer("zero_point", torch.tensor([zero_point], dtype=torch.int))
        affine.check_scale(self.scale, f"{type(self).__name__} scale")
        self.qscheme = _as_qscheme(qscheme)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        return X

    def calculate_qparams(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.scale, self.zero_point


class PlaceholderObserver(ObserverBase):
    """Identity observer that only carries ``dtype``, ``qscheme`` (default per_tensor_affine),
    the quant range, ``eps`` (default float32 eps) and ``is_dynamic`` to the converters (float16
    and dynamic quantization).  ``compute_dtype`` is deprecated; setting it warns and marks the
    observer dynamic [TQ: torch warns but forgets to set the flag].  ``calculate_qparams``
    raises ``RuntimeError``.
    """

    def __init__(self, dtype: Any = torch.float32, custom_op_name: str = "",
                 compute_dtype: Any = None, quant_min: Optional[int] = None,
                 quant_max: Optional[int] = None, qscheme: Any = None, eps: Optional[float] = None,
                 is_dynamic: bool = False) -> None:
        super().__init__(dtype=dtype, is_dynamic=is_dynamic)
        self.qscheme = per_tensor_affine if qscheme is None else _dt.to_qscheme(qscheme)
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.eps = affine.FP32_EPS if eps is None else eps
        self.custom_op = custom_op_name
        if compute_dtype is not None:
            warnings.warn("compute_dtype is deprecated (as in torch); use is_dynamic=True",
                          stacklevel=2)
            self.is_dynamic = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def extra_repr(self) -> str:
        return f"dtype={self.dtype}, is_dynamic={self.is_dynamic}"

    def calculate_qparams(self) -> Any:
        raise RuntimeError("calculate_qparams should not be called for PlaceholderObserver")


class RecordingObserver(ObserverBase):
    """Debug observer: keeps a copy of every tensor it sees (``get_tensor_value()``)."""

    def __init__(self, dtype: Any = quint8) -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.tensor_val: list[torch.Tensor] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.tensor_val.append(x.clone())
        return x

    def calculate_qparams(self) -> Any:
        raise RuntimeError("calculate_qparams should not be called for RecordingObserver")

    def get_tensor_value(self) -> list[torch.Tensor]:
        return self.tensor_val


class NoopObserver(ObserverBase):
    """Identity observer carrying only ``dtype`` (float16 by default) to the converters."""

    def __init__(self, dtype: Any = torch.float16, custom_op_name: str = "") -> None:
        super().__init__(dtype=dtype, is_dynamic=False)
        self.custom_op = custom_op_name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> Any:
        raise RuntimeError("calculate_qparams should not be called for NoopObserver")


class ReuseInputObserver(ObserverBase):
    """FX marker: the op's output shares the observer of its input (reshape, view, ...)."""

    def __init__(self) -> None:
        super().__init__(quint8, is_dynamic=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def calculate_qparams(self) -> Any:
        raise RuntimeError("calculate_qparams should not be called for ReuseInputObserver")


# --------------------------------------------------------------------------------------------
# Observer state of a whole model
# --------------------------------------------------------------------------------------------

class _ActivationPostProcess(abc.ABC):
    """What prepare inserts: observers and fake-quantize modules.  An ABC to register with
    rather than a base class: :mod:`.fake_quantize` builds on this module and registers
    ``FakeQuantizeBase`` itself."""


_ActivationPostProcess.register(ObserverBase)
_ActivationPostProcess.register(AffineQuantizedObserverBase)


def _is_activation_post_process(module: nn.Module) -> bool:
    """True for observers and fake-quantize modules (what prepare inserts)."""
    return isinstance(module, _ActivationPostProcess)


def get_observer_state_dict(mod: nn.Module) -> "OrderedDict[str, torch.Tensor]":
    """The entries of ``mod.state_dict()`` that belong to observers / fake quants (keys containing
    ``activation_post_process``), with the state dict's version metadata."""
    full = mod.state_dict()
    observed: OrderedDict = OrderedDict(
        (key, value) for key, value in full.items() if "activation_post_process" in key)
    observed._metadata = full._metadata  # type: ignore[attr-defined]
    return observed


def load_observer_state_dict(mod: nn.Module, obs_dict: dict) -> None:
    """Load observer / fake-quant statistics saved by :func:`get_observer_state_dict` (or torch's).

    Per-channel buffers take the saved length.  A missing or unexpected observer key raises
    ``RuntimeError`` naming it.  Without version metadata the dict is read as the current format
    [TQ: torch reads it as version 1 and resets every ``eps`` to the default].
    """
    state = OrderedDict(obs_dict)  # loaders rewrite legacy entries in place
    metadata = getattr(obs_dict, "_metadata", None)
    missing: list[str] = []
    unexpected: list[str] = []
    errors: list[str] = []
    for name, module in mod.named_modules():
        if not _is_activation_post_process(module):
            continue
        prefix = f"{name}." if name else ""
        if metadata is not None:
            local_metadata = metadata.get(name, {})
        else:
            local_metadata = {"version": getattr(type(module), "_version", 1)}
        module._load_from_state_dict(state, prefix, local_metadata, True, missing, unexpected,
                                     errors)
    for key in missing:
        if "observer" in key or "activation_post_process" in key:
            raise RuntimeError(f"Missing keys for observer {key} in state_dict")
    for key in unexpected:
        if "observer" in key or "activation_post_process" in key:
            raise RuntimeError(f"Unexpected keys for observer {key} in state_dict")
    if errors:
        raise RuntimeError("Error(s) loading observer state:\n\t" + "\n\t".join(errors))


# --------------------------------------------------------------------------------------------
# Default observer factories (torch's exact settings)
# --------------------------------------------------------------------------------------------

default_observer = MinMaxObserver.with_args(quant_min=0, quant_max=127)
"""Activations to 0..127 (the x86 reduce_range convention); mostly for debugging."""

default_placeholder_observer = PlaceholderObserver
"""Carries a dtype only, e.g. for float16."""

default_debug_observer = RecordingObserver
"""Records every observed tensor."""

default_weight_observer = MinMaxObserver.with_args(dtype=qint8, qscheme=per_tensor_symmetric)
"""Symmetric qint8 per-tensor weights."""

weight_observer_range_neg_127_to_127 = MinMaxObserver.with_args(
    dtype=qint8, qscheme=per_tensor_symmetric, quant_min=-127, quant_max=127, eps=2**-12)
"""Symmetric qint8 weights restricted to -127..127 (no -128)."""

default_histogram_observer = HistogramObserver.with_args(quant_min=0, quant_max=127)
"""Histogram-searched activations to 0..127, the usual PTQ choice."""

default_per_channel_weight_observer = PerChannelMinMaxObserver.with_args(
    dtype=qint8, qscheme=per_channel_symmetric)
"""Symmetric qint8 per-channel weights."""

per_channel_weight_observer_range_neg_127_to_127 = PerChannelMinMaxObserver.with_args(
    dtype=qint8, qscheme=per_channel_symmetric, quant_min=-127, quant_max=127, eps=2**-12)
"""Symmetric qint8 per-channel weights restricted to -127..127."""

default_dynamic_quant_observer = PlaceholderObserver.with_args(
    dtype=quint8, quant_min=0, quant_max=255, is_dynamic=True)
"""Marks activations for dynamic quantization to quint8."""

default_float_qparams_observer = PerChannelMinMaxObserver.with_args(
    dtype=quint8, qscheme=per_channel_affine_float_qparams, ch_axis=0)
"""Per-row quint8 with float zero points (embeddings)."""

default_float_qparams_observer_4bit = PerChannelMinMaxObserver.with_args(
    dtype=quint4x2, qscheme=per_channel_affine_float_qparams, ch_axis=0)
"""Per-row quint4x2 with float zero points (4-bit embeddings)."""

default_fixed_qparams_range_neg1to1_observer = FixedQParamsObserver.with_args(
    scale=2.0 / 256.0, zero_point=128, dtype=quint8, quant_min=0, quant_max=255)
"""Outputs in [-1, 1] (tanh)."""

default_fixed_qparams_range_0to1_observer = FixedQParamsObserver.with_args(
    scale=1.0 / 256.0, zero_point=0, dtype=quint8, quant_min=0, quant_max=255)
"""Outputs in [0, 1] (sigmoid, hardsigmoid)."""

default_symmetric_fixed_qparams_observer = default_fixed_qparams_range_neg1to1_observer
default_affine_fixed_qparams_observer = default_fixed_qparams_range_0to1_observer

default_reuse_input_observer = ReuseInputObserver
"""For ops such as reshape whose output reuses the input's observer."""
