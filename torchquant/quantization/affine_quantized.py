"""Block-granular affine quantization (torchao's ``choose_qparams_affine`` / ``quantize_affine`` /
``dequantize_affine``) and the observers that feed it.

A ``block_size`` with one entry per input dim says which elements share a (scale, zero_point):
the input is viewed as ``[..., n // b, b, ...]`` for every dim with ``1 < b < n`` and reduced
over the ``b`` (and every fully-blocked) dims.  Per-group int4/int8 weight-only quantization is
``block_size = (1, group_size)`` on an ``[out, in]`` weight.

The arithmetic is torchquant's (:mod:`torchquant.affine`): quantizing multiplies by the float32
reciprocal of the scale, rounds half to even and then adds the zero point, exactly as torchao's
integer-zero-point path.  Differences from torchao, all [TQ]:

* min/max and qparams are computed in at least float32 (torchao computes bf16/fp16 inputs in
  their own dtype); the results are cast to ``scale_dtype`` / ``zero_point_dtype`` at the end;
* the FLOAT zero-point domain also multiplies by the reciprocal (torchao divides), so a value
  within an ulp of a rounding tie may land one code apart;
* sub-byte targets (``torch.uint1``..``uint7``, ``torch.int1``..``int7``, ``TorchAODType``,
  ``quint4x2``) are stored unpacked in uint8 / int8; float8 targets are not supported;
* NaN/Inf statistics raise ``ValueError`` instead of producing NaN scales.

The three functions are also registered as ``torch.ops.torchquant.*`` so converted FX graphs
(:meth:`AffineQuantizedObserverBase.convert`) stay exportable; the ops take enum *names*.
"""
from __future__ import annotations

import abc
import operator
import warnings
from typing import Any, Optional, Union

import torch

from .. import affine
from ..ops import quantize as ops_quantize
from .. import dtypes as _dt
from .._graph import fresh_attr_name
from ._partial_wrapper import _with_args
from .granularity import Granularity, MappingType, TorchAODType, ZeroPointDomain, get_block_size

__all__ = [
    "choose_qparams_affine", "quantize_affine", "dequantize_affine",
    "AffineQuantizedObserverBase", "AffineQuantizedMinMaxObserver",
]

_PLAIN_INT_BOUNDS = {
    torch.uint8: (0, 255),
    torch.int8: (-128, 127),
    torch.int16: (-(2**15), 2**15 - 1),
    torch.int32: (-(2**31), 2**31 - 1),
}


def _target_storage_and_bounds(target_dtype: Any) -> tuple[torch.dtype, int, int]:
    """(plain storage dtype, lowest code, highest code) for an affine target dtype."""
    if _dt.is_qdtype_like(target_dtype):
        q = _dt.to_qdtype(target_dtype)
        return q.storage_dtype, q.qmin, q.qmax
    if target_dtype in _PLAIN_INT_BOUNDS:
        return (target_dtype,) + _PLAIN_INT_BOUNDS[target_dtype]
    if isinstance(target_dtype, TorchAODType):
        bits = target_dtype.value
        return torch.int8, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    for bits in range(1, 8):
        if target_dtype is getattr(torch, f"uint{bits}", None):
            return torch.uint8, 0, 2**bits - 1
        if target_dtype is getattr(torch, f"int{bits}", None):
            return torch.int8, -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    raise ValueError(f"unsupported affine target dtype {target_dtype!r}; expected an integer "
                     "dtype (torch.uint8/int8/int16/int32, torch.uint1..7/int1..7, TorchAODType, "
                     "or a torchquant quantized dtype)")


def _resolve_bounds(target_dtype: Any, quant_min: Optional[int],
                    quant_max: Optional[int]) -> tuple[torch.dtype, int, int]:
    """Storage dtype and the (possibly narrowed) code range; AssertionError outside the dtype."""
    storage, lower, upper = _target_storage_and_bounds(target_dtype)
    qmin = lower if quant_min is None else int(quant_min)
    qmax = upper if quant_max is None else int(quant_max)
    assert lower <= qmin, f"quant_min {qmin} is below the lowest value {lower} of {target_dtype!r}"
    assert qmax <= upper, f"quant_max {qmax} is above the highest value {upper} of {target_dtype!r}"
    assert qmin < qmax, f"quant_min ({qmin}) must be less than quant_max ({qmax})"
    return storage, qmin, qmax


def _enum_name(value: Union[str, MappingType, ZeroPointDomain], enum_cls: type) -> str:
    """Accept the enum member or its name (the registered ops pass names)."""
    if isinstance(value, enum_cls):
        return value.name
    if isinstance(value, str) and value in enum_cls.__members__:
        return value
    raise ValueError(f"expected a {enum_cls.__name__} or one of {list(enum_cls.__members__)}, "
                     f"got {value!r}")


# The block layout is affine's (the ops' per-block quantize uses the same one).
_block_layout = affine.block_layout
_qparam_shape = affine.block_qparam_shape
_as_block_param = affine.block_qparams_view


def _block_min_max(x: torch.Tensor, block_size: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-block min and max (reduced dims dropped, as torchao) in at least float32."""
    view_shape, reduce_dims = _block_layout(block_size, x.shape)
    xv = x.reshape(view_shape)
    if not reduce_dims:
        mn = mx = xv
    elif len(reduce_dims) == xv.dim():
        mn, mx = torch.aminmax(xv)
    else:  # amin + amax beat aminmax along dims several times over (measured on CPU)
        mn, mx = torch.amin(xv, dim=reduce_dims), torch.amax(xv, dim=reduce_dims)
    compute_dtype = torch.promote_types(x.dtype, torch.float32)
    return mn.to(compute_dtype), mx.to(compute_dtype)


def _check_finite_statistics(owner: str, min_val: torch.Tensor, max_val: torch.Tensor) -> None:
    for name, value in (("min_val", min_val), ("max_val", max_val)):
        if not bool(torch.isfinite(value).all()):
            raise ValueError(f"{owner}: observed {name} is not finite ({value.flatten()[:8].tolist()}); "
                             "the input contains NaN or Inf")


def _integral_zero_point(zero_point: torch.Tensor) -> torch.Tensor:
    """INT-domain zero points as int32; a fractional one has no integer meaning."""
    if zero_point.dtype.is_floating_point:
        if not bool((zero_point == torch.round(zero_point)).all()):
            raise ValueError("zero_point_domain INT needs integral zero points; use "
                             "ZeroPointDomain.FLOAT for fractional ones")
    return zero_point.to(torch.int32)


def choose_qparams_affine(input: torch.Tensor, mapping_type: MappingType,
                          block_size: tuple[int, ...], target_dtype: Any,
                          quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                          eps: Optional[float] = None, scale_dtype: Optional[torch.dtype] = None,
                          zero_point_dtype: Optional[torch.dtype] = None,
                          preserve_zero: bool = True,
                          zero_point_domain: Optional[ZeroPointDomain] = ZeroPointDomain.INT,
                          ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-block (scale, zero_point) of ``input`` (torchao semantics, reduced dims dropped).

    ``eps`` defaults to the input dtype's machine epsilon; ``scale_dtype`` / ``zero_point_dtype``
    default to the input dtype.  ``zero_point`` is ``None`` for ``ZeroPointDomain.NONE``.
    """
    if not input.is_floating_point():
        raise TypeError(f"choose_qparams_affine expects a floating-point input, got {input.dtype}")
    _, qmin, qmax = _resolve_bounds(target_dtype, quant_min, quant_max)
    mn, mx = _block_min_max(input.detach(), tuple(block_size))
    _check_finite_statistics("choose_qparams_affine", mn, mx)
    return _qparams_from_min_max(mn, mx, mapping_type, qmin, qmax,
                                 torch.finfo(input.dtype).eps if eps is None else eps,
                                 scale_dtype or input.dtype, zero_point_dtype or input.dtype,
                                 preserve_zero, zero_point_domain)


def _qparams_from_min_max(min_val: torch.Tensor, max_val: torch.Tensor, mapping_type: Any,
                          qmin: int, qmax: int, eps: float, scale_dtype: torch.dtype,
                          zero_point_dtype: torch.dtype, preserve_zero: bool,
                          zero_point_domain: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    domain = "NONE" if zero_point_domain is None else _enum_name(zero_point_domain, ZeroPointDomain)
    scale, zero_point = affine.choose_block_qparams(
        min_val, max_val, _enum_name(mapping_type, MappingType), qmin, qmax, eps, preserve_zero,
        domain)
    if zero_point is not None:
        zero_point = zero_point.to(zero_point_dtype)
    return scale.to(scale_dtype), zero_point


def quantize_affine(input: torch.Tensor, block_size: tuple[int, ...], scale: torch.Tensor,
                    zero_point: Optional[torch.Tensor], output_dtype: Any,
                    quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                    zero_point_domain: Optional[ZeroPointDomain] = ZeroPointDomain.INT,
                    ) -> torch.Tensor:
    """Integer codes of ``input`` (plain storage dtype, same shape), one qparam set per block.

    ``scale`` / ``zero_point`` may have any shape with one element per block.  With
    ``ZeroPointDomain.NONE`` the zero point is ignored (may be ``None``).
    """
    if not input.is_floating_point():
        raise TypeError(f"quantize_affine expects a floating-point input, got {input.dtype}")
    storage, qmin, qmax = _resolve_bounds(output_dtype, quant_min, quant_max)
    domain = "NONE" if zero_point_domain is None else _enum_name(zero_point_domain, ZeroPointDomain)
    view_shape, reduce_dims = _block_layout(tuple(block_size), input.shape)
    qshape = _qparam_shape(view_shape, reduce_dims)
    affine.check_scale(scale)
    scale_b = _as_block_param(scale, qshape, "scale").to(torch.float32)
    x = input.reshape(view_shape).to(torch.float32)
    no_offset = torch.zeros((), dtype=torch.int32, device=input.device)
    if domain == "INT":
        offset = _integral_zero_point(_as_block_param(_require(zero_point), qshape, "zero_point"))
    elif domain == "FLOAT":
        zp_b = _as_block_param(_require(zero_point), qshape, "zero_point").to(torch.float32)
        x = x - (zp_b - scale_b * ((qmax + qmin + 1) / 2))
        offset = no_offset
    else:
        offset = no_offset
    q = ops_quantize.quantize_int(x, scale_b, offset, qmin, qmax, storage, None, affine.ROUND_ADD)
    return q.reshape(input.shape)


def dequantize_affine(input: torch.Tensor, block_size: tuple[int, ...], scale: torch.Tensor,
                      zero_point: Optional[torch.Tensor], input_dtype: Any,
                      quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                      zero_point_domain: Optional[ZeroPointDomain] = ZeroPointDomain.INT, *,
                      output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Float values of the integer codes ``input``: ``(q - zp) * scale`` per block (INT domain),
    ``(q - mid) * scale + zp`` (FLOAT) or ``q * scale`` (NONE); computed in float32."""
    storage, qmin, qmax = _resolve_bounds(input_dtype, quant_min, quant_max)
    if input.dtype != storage:
        raise TypeError(f"dequantize_affine: codes of {input_dtype!r} are stored as {storage}, "
                        f"got a {input.dtype} tensor")
    if not output_dtype.is_floating_point:
        raise TypeError(f"dequantize_affine: output_dtype must be floating, got {output_dtype}")
    domain = "NONE" if zero_point_domain is None else _enum_name(zero_point_domain, ZeroPointDomain)
    view_shape, reduce_dims = _block_layout(tuple(block_size), input.shape)
    qshape = _qparam_shape(view_shape, reduce_dims)
    scale_b = _as_block_param(scale, qshape, "scale").to(torch.float32)
    q = input.reshape(view_shape)
    if domain == "INT":
        zp_b = _integral_zero_point(_as_block_param(_require(zero_point), qshape, "zero_point"))
        out = ops_quantize.dequantize_int(q, scale_b, zp_b)
    elif domain == "FLOAT":
        mid = torch.tensor((qmax + qmin + 1) / 2, dtype=torch.float32, device=input.device)
        zp_b = _as_block_param(_require(zero_point), qshape, "zero_point").to(torch.float32)
        out = ops_quantize.dequantize_int(q, scale_b, mid) + zp_b
    else:
        out = ops_quantize.dequantize_int(q, scale_b, torch.zeros((), dtype=torch.int32,
                                                            device=input.device))
    return out.reshape(input.shape).to(output_dtype)


def _require(zero_point: Optional[torch.Tensor]) -> torch.Tensor:
    if zero_point is None:
        raise ValueError("this zero_point_domain needs a zero_point tensor (only NONE takes None)")
    return zero_point


# --------------------------------------------------------------------------------------------
# Registered ops (what converted graphs call)
# --------------------------------------------------------------------------------------------

@torch.library.custom_op("torchquant::choose_qparams_affine", mutates_args=())
def _choose_qparams_affine_op(input: torch.Tensor, mapping_type: str, block_size: list[int],
                              target_dtype: torch.dtype, quant_min: Optional[int],
                              quant_max: Optional[int], eps: Optional[float],
                              scale_dtype: Optional[torch.dtype],
                              zero_point_dtype: Optional[torch.dtype], preserve_zero: bool,
                              zero_point_domain: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Op form; an op cannot return None, so the NONE domain returns a zero zero_point."""
    scale, zero_point = choose_qparams_affine(input, mapping_type, tuple(block_size), target_dtype,
                                              quant_min, quant_max, eps, scale_dtype,
                                              zero_point_dtype, preserve_zero, zero_point_domain)
    if zero_point is None:
        zero_point = torch.zeros_like(scale, dtype=zero_point_dtype or input.dtype)
    return scale, zero_point


@_choose_qparams_affine_op.register_fake
def _(input, mapping_type, block_size, target_dtype, quant_min, quant_max, eps, scale_dtype,
      zero_point_dtype, preserve_zero, zero_point_domain):
    view_shape, reduce_dims = _block_layout(tuple(block_size), input.shape)
    shape = [n for d, n in enumerate(view_shape) if d not in reduce_dims]
    return (input.new_empty(shape, dtype=scale_dtype or input.dtype),
            input.new_empty(shape, dtype=zero_point_dtype or input.dtype))


@torch.library.custom_op("torchquant::quantize_affine", mutates_args=())
def _quantize_affine_op(input: torch.Tensor, block_size: list[int], scale: torch.Tensor,
                        zero_point: Optional[torch.Tensor], output_dtype: torch.dtype,
                        quant_min: Optional[int], quant_max: Optional[int],
                        zero_point_domain: str) -> torch.Tensor:
    return quantize_affine(input, tuple(block_size), scale, zero_point, output_dtype, quant_min,
                           quant_max, zero_point_domain)


@_quantize_affine_op.register_fake
def _(input, block_size, scale, zero_point, output_dtype, quant_min, quant_max, zero_point_domain):
    return torch.empty_like(input, dtype=_target_storage_and_bounds(output_dtype)[0])


@torch.library.custom_op("torchquant::dequantize_affine", mutates_args=())
def _dequantize_affine_op(input: torch.Tensor, block_size: list[int], scale: torch.Tensor,
                          zero_point: Optional[torch.Tensor], input_dtype: torch.dtype,
                          quant_min: Optional[int], quant_max: Optional[int],
                          zero_point_domain: str, *,
                          output_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return dequantize_affine(input, tuple(block_size), scale, zero_point, input_dtype, quant_min,
                             quant_max, zero_point_domain, output_dtype=output_dtype)


@_dequantize_affine_op.register_fake
def _(input, block_size, scale, zero_point, input_dtype, quant_min, quant_max, zero_point_domain,
      *, output_dtype=torch.float32):
    return torch.empty_like(input, dtype=output_dtype)


# --------------------------------------------------------------------------------------------
# Observers
# --------------------------------------------------------------------------------------------

class AffineQuantizedObserverBase(abc.ABC, torch.nn.Module):
    """Base of observers that produce block-granular qparams for ``quantize_affine``.

    ``forward`` fills ``block_size`` (from ``granularity`` and the input shape) and
    ``original_dtype``; :meth:`convert` needs both.  Extra keyword arguments are ignored, as in
    torch, so configs written for richer observers still construct.
    """

    def __init__(self, mapping_type: MappingType, target_dtype: Any, granularity: Granularity,
                 quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                 eps: Optional[float] = None, scale_dtype: Optional[torch.dtype] = None,
                 zero_point_dtype: Optional[torch.dtype] = None, preserve_zero: bool = True,
                 zero_point_domain: Optional[ZeroPointDomain] = ZeroPointDomain.INT,
                 **kwargs: Any) -> None:
        super().__init__()
        if granularity is None:
            raise AssertionError("AffineQuantizedObserverBase needs a granularity, got None")
        _resolve_bounds(target_dtype, quant_min, quant_max)  # fail at construction, not in forward
        self.mapping_type = mapping_type
        self.target_dtype = target_dtype
        self.granularity = granularity
        self.quant_min = quant_min
        self.quant_max = quant_max
        self.eps = eps
        self.scale_dtype = scale_dtype
        self.zero_point_dtype = zero_point_dtype
        self.preserve_zero = preserve_zero
        self.zero_point_domain = zero_point_domain
        self.block_size: Optional[tuple[int, ...]] = None
        self.original_dtype: Optional[torch.dtype] = None

    @classmethod
    def with_args(cls, **kwargs: Any):
        """A factory (``_PartialWrapper``) building this observer with ``kwargs``."""
        return _with_args(cls, **kwargs)

    @abc.abstractmethod
    def forward(self, input: torch.Tensor) -> torch.Tensor:
        """Record statistics of ``input`` and return it unchanged."""

    @abc.abstractmethod
    def calculate_qparams(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """(scale, zero_point) from the recorded statistics."""

    def convert(self, model: torch.fx.GraphModule, observer_node: torch.fx.Node) -> None:
        """Replace ``observer_node`` by quantize_affine -> dequantize_affine ops.

        Static observers bake their qparams in as buffers of ``model``; a dynamic one
        (``is_dynamic`` attribute true) computes them in the graph with choose_qparams_affine.
        """
        if self.block_size is None:
            raise AssertionError("convert needs block_size; run the observer on data first")
        if self.original_dtype is None:
            raise AssertionError("convert needs original_dtype; run the observer on data first")
        storage, qmin, qmax = _resolve_bounds(self.target_dtype, self.quant_min, self.quant_max)
        domain = ("NONE" if self.zero_point_domain is None
                  else _enum_name(self.zero_point_domain, ZeroPointDomain))
        block_size = list(self.block_size)
        graph = model.graph
        source = observer_node.args[0]
        with graph.inserting_before(observer_node):
            if getattr(self, "is_dynamic", False):
                qparams = graph.call_function(
                    torch.ops.torchquant.choose_qparams_affine,
                    (source, _enum_name(self.mapping_type, MappingType), block_size, storage,
                     qmin, qmax, self.eps, self.scale_dtype, self.zero_point_dtype,
                     self.preserve_zero, domain))
                scale_node = graph.call_function(operator.getitem, (qparams, 0))
                zero_point_node = graph.call_function(operator.getitem, (qparams, 1))
            else:
                scale, zero_point = self.calculate_qparams()
                scale_node = _constant_node(model, "_scale", scale)
                zero_point_node = (None if zero_point is None
                                   else _constant_node(model, "_zero_point", zero_point))
            q_node = graph.call_function(
                torch.ops.torchquant.quantize_affine,
                (source, block_size, scale_node, zero_point_node, storage, qmin, qmax, domain))
            dq_node = graph.call_function(
                torch.ops.torchquant.dequantize_affine,
                (q_node, block_size, scale_node, zero_point_node, storage, qmin, qmax, domain),
                {"output_dtype": self.original_dtype})
        observer_node.replace_all_uses_with(dq_node)
        graph.erase_node(observer_node)


def _constant_node(model: torch.fx.GraphModule, prefix: str, value: torch.Tensor) -> torch.fx.Node:
    """Store ``value`` as a new buffer of ``model`` and return a get_attr node reading it."""
    name = fresh_attr_name(model, prefix)
    model.register_buffer(name, value.detach().clone())
    return model.graph.create_node("get_attr", name)


class AffineQuantizedMinMaxObserver(AffineQuantizedObserverBase):
    """Running per-block min/max; qparams by torchao's rule (:func:`choose_qparams_affine`).

    Buffers ``min_val`` / ``max_val`` hold the per-block statistics (float32, reduced dims
    dropped); they start empty and take their shape from the first input or from a loaded
    state dict.  Decisions [TQ]: NaN/Inf statistics raise ``ValueError``; an input whose block
    grid differs from the one seen before raises ``ValueError``; ``calculate_qparams`` before
    any data warns and returns ``(tensor([1.]), tensor([0]))`` like the uniform observers.
    ``scale_dtype`` / ``zero_point_dtype`` / ``eps`` default to those of the observed dtype.
    """

    min_val: torch.Tensor
    max_val: torch.Tensor

    def __init__(self, mapping_type: MappingType, target_dtype: Any, granularity: Granularity,
                 quant_min: Optional[int] = None, quant_max: Optional[int] = None,
                 eps: Optional[float] = None, scale_dtype: Optional[torch.dtype] = None,
                 zero_point_dtype: Optional[torch.dtype] = None, preserve_zero: bool = True,
                 zero_point_domain: Optional[ZeroPointDomain] = ZeroPointDomain.INT,
                 **kwargs: Any) -> None:
        super().__init__(mapping_type, target_dtype, granularity, quant_min, quant_max, eps,
                         scale_dtype, zero_point_dtype, preserve_zero, zero_point_domain, **kwargs)
        self.register_buffer("min_val", torch.tensor([]))
        self.register_buffer("max_val", torch.tensor([]))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if input.numel() == 0:
            return input
        x = input.detach()
        block_size = get_block_size(tuple(x.shape), self.granularity)
        mn, mx = _block_min_max(x, block_size)
        _check_finite_statistics(type(self).__name__, mn, mx)
        mn, mx = mn.to(self.min_val.dtype), mx.to(self.max_val.dtype)
        if self.min_val.numel() == 0:
            self.min_val.resize_(mn.shape).copy_(mn)
            self.max_val.resize_(mx.shape).copy_(mx)
        else:
            if mn.shape != self.min_val.shape:
                raise ValueError(f"{type(self).__name__}: input of shape {tuple(x.shape)} gives a "
                                 f"block grid {tuple(mn.shape)}, but earlier inputs gave "
                                 f"{tuple(self.min_val.shape)}")
            torch.minimum(self.min_val, mn, out=self.min_val)
            torch.maximum(self.max_val, mx, out=self.max_val)
        self.block_size = block_size
        self.original_dtype = input.dtype
        return input

    def calculate_qparams(self) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if self.min_val.numel() == 0:
            warnings.warn(f"{type(self).__name__}.calculate_qparams called before observing any "
                          "data; returning scale 1.0 and zero_point 0", stacklevel=2)
            return torch.tensor([1.0]), torch.tensor([0])
        _, qmin, qmax = _resolve_bounds(self.target_dtype, self.quant_min, self.quant_max)
        observed = self.original_dtype or self.min_val.dtype
        eps = self.eps if self.eps is not None else torch.finfo(observed).eps
        return _qparams_from_min_max(self.min_val, self.max_val, self.mapping_type, qmin, qmax,
                                     eps, self.scale_dtype or observed,
                                     self.zero_point_dtype or observed, self.preserve_zero,
                                     self.zero_point_domain)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        # Buffers take the loaded shape (they are empty until the first forward).
        for name in ("min_val", "max_val"):
            if prefix + name in state_dict:
                getattr(self, name).resize_(state_dict[prefix + name].shape)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
