"""Weight-only quantized ``Embedding`` / ``EmbeddingBag`` (as ``torch.ao.nn.quantized``).

The table is quantized per row (axis 0) to quint8 or quint4x2 with float scales and float
zero points (``per_channel_affine_float_qparams``); lookups return float rows computed the way
torch's fbgemm kernels compute them (:mod:`torchquant.ops.embedding`, one op per forward), so
'sum' bags and plain lookups match torch bit for bit.

Where torch's modules misbehave we do what their arguments say instead (each is tested):

* torch's ``EmbeddingBag.forward`` never passes its ``mode`` to the kernel, so 'mean' and 'max'
  bags silently come out as sums.  Here 'mean' divides the (torch-exact) sum by the bag length
  and 'max' takes the elementwise maximum.
* torch's ``Embedding.from_float`` builds a quint8 module whatever the qconfig, so a 4-bit
  qconfig gives a module that reads the packed 4-bit table as bytes.  Here the module takes the
  observer's dtype.
* ``EmbeddingBag`` also takes ``padding_idx`` (keyword, last; ``from_float`` copies it): entries
  equal to it are skipped and not counted, as in ``torch.nn.EmbeddingBag``.
* A fresh module's table is all zeros (scale 1, zero point 0) rather than uninitialised memory.

As in torch, ``max_norm`` / ``norm_type`` / ``scale_grad_by_freq`` / ``sparse`` are kept but
have no effect at inference, and ``compressed_indices_mapping`` is ignored (the table is never
pruned).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from .... import dtypes as _dt
from ....ops import embedding as ops_embedding
from ....tensor.qtensor import QTensor
from ....tensor.functions import quantize_per_channel
from ... import _workflow
from ...qat.modules.embedding_ops import Embedding as QATEmbedding
from .utils import NotScriptable, quantize_weight

__all__ = ["EmbeddingPackedParams", "Embedding", "EmbeddingBag"]

_SUPPORTED = (_dt.quint8, _dt.quint4x2)


def _embedding_dtype(dtype: Any) -> _dt.QDType:
    try:
        qdtype = _dt.to_qdtype(dtype)
    except TypeError:
        qdtype = None
    if qdtype not in _SUPPORTED:
        raise NotImplementedError(f"Unsupported dtype on quantized embedding! Supports quint8 "
                                  f"and quint4x2. Got dtype: {dtype}")
    return qdtype


def _zero_table(num_embeddings: int, embedding_dim: int, qdtype: _dt.QDType) -> QTensor:
    return QTensor.from_int(torch.zeros(num_embeddings, embedding_dim, dtype=torch.uint8),
                            torch.ones(num_embeddings), torch.zeros(num_embeddings), qdtype,
                            axis=0)


class EmbeddingPackedParams(NotScriptable, nn.Module):
    """The quantized table plus its lookup-ready form; serialized under ``dtype`` and
    ``_packed_weight`` (our QTensor) like torch's."""

    _version = 1

    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: Any = _dt.quint8) -> None:
        super().__init__()
        self.dtype = _embedding_dtype(dtype)
        self.set_weight(_zero_table(num_embeddings, embedding_dim, self.dtype))

    def set_weight(self, weight: QTensor) -> None:
        """Take a 2-D row-quantized QTensor of this module's dtype and prepare it for lookups."""
        if not isinstance(weight, QTensor):
            raise TypeError(f"quantized embedding weights must be a torchquant QTensor, got "
                            f"{type(weight).__name__} of dtype {getattr(weight, 'dtype', None)}")
        if weight.qscheme() != _dt.per_channel_affine_float_qparams or weight.axis != 0:
            raise ValueError("Expect embedding_bag weights to be quantized using "
                             "per_channel_affine_float_qparams along axis 0, got "
                             f"{weight.qscheme()!r} (axis {weight.axis})")
        if weight.qdtype is not self.dtype:
            raise TypeError(f"this quantized embedding holds {self.dtype!r} weights, got a "
                            f"{weight.qdtype!r} QTensor")
        if weight.dim() != 2:
            raise ValueError(f"embedding weights must be 2-D, got shape {tuple(weight.shape)}")
        self._qweight = weight
        self._packed_weight = ops_embedding.pack_embedding(
            weight._values(), weight.scale, weight.zero_point, weight.qdtype.name)

    def _weight(self) -> QTensor:
        return self._qweight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "dtype"] = self.dtype
        destination[prefix + "_packed_weight"] = self._weight()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs):
        dtype_key, weight_key = prefix + "dtype", prefix + "_packed_weight"
        old_dtype = self.dtype
        if dtype_key in state_dict:
            loaded = state_dict.pop(dtype_key)
            try:
                self.dtype = _embedding_dtype(loaded)  # a checkpoint may switch 8 <-> 4 bits
            except NotImplementedError as exc:
                error_msgs.append(f"{dtype_key}: {exc}")
        elif strict:
            missing_keys.append(dtype_key)
        if weight_key in state_dict:
            weight = state_dict.pop(weight_key)
            current = tuple(self._qweight.shape)
            if tuple(getattr(weight, "shape", ())) != current:
                error_msgs.append(f"size mismatch for {weight_key}: copying a weight of shape "
                                  f"{tuple(getattr(weight, 'shape', ()))}, the module has "
                                  f"{current}")
                self.dtype = old_dtype
            else:
                try:
                    self.set_weight(weight)
                except (TypeError, ValueError) as exc:
                    error_msgs.append(f"{weight_key}: {exc}")
                    self.dtype = old_dtype
        elif strict:
            missing_keys.append(weight_key)
        if self._qweight.qdtype is not self.dtype:  # dtype key without a matching weight
            error_msgs.append(f"{dtype_key}: {self.dtype!r} does not match the module's "
                              f"{self._qweight.qdtype!r} weight")
            self.dtype = self._qweight.qdtype
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys,
                                      unexpected_keys, error_msgs)

    def __repr__(self) -> str:
        return repr(self._weight())


def _reference_weight(ref: nn.Module) -> QTensor:
    """The QTensor table of a reference quantized embedding: from its ``weight_*`` qparams
    (works for torch's reference modules too) or from ``get_quantized_weight()``."""
    names = ("weight_qscheme", "weight_dtype", "weight_scale", "weight_zero_point")
    if not all(hasattr(ref, n) for n in names):
        w = ref.get_quantized_weight()
        if not isinstance(w, QTensor):
            raise TypeError(f"{type(ref).__name__}.get_quantized_weight() must return a "
                            f"QTensor, got {type(w).__name__}")
        return w
    if _dt.to_qscheme(ref.weight_qscheme) != _dt.per_channel_affine_float_qparams:
        raise AssertionError("Embedding quantization is only supported with "
                             f"per_channel_affine_float_qparams, got {ref.weight_qscheme!r}")
    return quantize_per_channel(ref.weight.detach().float(),
                                torch.as_tensor(ref.weight_scale).float(),
                                torch.as_tensor(ref.weight_zero_point).float(),
                                int(getattr(ref, "weight_axis", 0)),
                                _embedding_dtype(ref.weight_dtype))


def _weight_observer(cls: type, mod: nn.Module, float_type: type, qat_type: Optional[type]):
    """The (not yet run) weight observer for ``from_float``, with torch's checks and messages."""
    what = "Embedding" if float_type is nn.Embedding else "EmbeddingBag"
    if hasattr(mod, "weight_fake_quant"):
        if qat_type is not None and type(mod) is not qat_type:
            raise AssertionError(f"nnq.{cls.__name__}.from_float with fake quant only works for "
                                 f"{qat_type.__name__}")
        observer = mod.weight_fake_quant
    else:
        if type(mod) is not float_type:
            raise AssertionError(f"nnq.{cls.__name__}.from_float only works for "
                                 f"{float_type.__name__}")
        if not hasattr(mod, "qconfig"):
            raise AssertionError(f"{what} input float module must have qconfig defined")
        qconfig = mod.qconfig
        if qconfig is not None and qconfig.weight is not None:
            observer = qconfig.weight()
        else:
            observer = _workflow.float_qparams_weight_only_qconfig().weight()
    if observer.qscheme != _dt.per_channel_affine_float_qparams:
        raise AssertionError(f"{what} quantization is only supported with "
                             "float_qparams_weight_only_qconfig.")
    try:
        qdtype = _dt.to_qdtype(observer.dtype)
    except TypeError:
        qdtype = None
    if qdtype not in _SUPPORTED:
        raise AssertionError(f"The only supported dtype for nnq.{what} is quint8 and quint4x2, "
                             f"got {observer.dtype}")
    return observer, qdtype


class Embedding(NotScriptable, nn.Module):
    """Lookups in a row-quantized table; ``forward(indices)`` returns float32 rows of shape
    ``indices.shape + (embedding_dim,)``."""

    _version = 1

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 padding_idx: Optional[int] = None, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False,
                 _weight: Optional[QTensor] = None, dtype: Any = _dt.quint8) -> None:
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        if padding_idx is not None:
            if not -num_embeddings <= padding_idx < num_embeddings:
                raise AssertionError("Padding_idx must be within num_embeddings")
            padding_idx = padding_idx % num_embeddings
        self.padding_idx = padding_idx
        self.max_norm = max_norm
        self.norm_type = norm_type
        self.scale_grad_by_freq = scale_grad_by_freq
        self.sparse = sparse
        if _weight is not None and list(_weight.shape) != [num_embeddings, embedding_dim]:
            raise AssertionError(f"Shape of weight does not match num_embeddings and "
                                 f"embedding_dim: expected {[num_embeddings, embedding_dim]}, "
                                 f"got {list(_weight.shape)}")
        self._packed_params = EmbeddingPackedParams(num_embeddings, embedding_dim, dtype)
        if _weight is not None:
            self._packed_params.set_weight(_weight)

    @property
    def dtype(self) -> _dt.QDType:
        return self._packed_params.dtype

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        return ops_embedding.embedding(indices, self._packed_params._packed_weight)

    def _get_name(self) -> str:
        return "QuantizedEmbedding"

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings}, embedding_dim={self.embedding_dim}, "
                f"dtype={self._packed_params.dtype}, qscheme={self.weight().qscheme()}")

    def __repr__(self) -> str:  # the packed params child is an implementation detail
        return f"{self._get_name()}({self.extra_repr()})"

    def set_weight(self, w: QTensor) -> None:
        if isinstance(w, torch.Tensor) and tuple(w.shape) != (self.num_embeddings,
                                                              self.embedding_dim):
            raise ValueError(f"weight of shape {tuple(w.shape)} does not fit a table of "
                             f"{self.num_embeddings} x {self.embedding_dim}")
        self._packed_params.set_weight(w)

    def weight(self) -> QTensor:
        return self._packed_params._weight()

    @classmethod
    def from_float(cls, mod: nn.Module, use_precomputed_fake_quant: bool = False) -> "Embedding":
        """Quantize a float ``nn.Embedding`` (with ``.qconfig``) or a QAT Embedding."""
        observer, qdtype = _weight_observer(cls, mod, nn.Embedding, QATEmbedding)
        observer(mod.weight)
        qweight = quantize_weight(mod.weight.float(), observer)
        q = cls(mod.num_embeddings, mod.embedding_dim, mod.padding_idx, mod.max_norm,
                mod.norm_type, mod.scale_grad_by_freq, mod.sparse, dtype=qdtype)
        q.set_weight(qweight)
        return q

    @classmethod
    def from_reference(cls, ref_embedding: nn.Module) -> "Embedding":
        w = _reference_weight(ref_embedding)
        return cls(ref_embedding.num_embeddings, ref_embedding.embedding_dim,
                   ref_embedding.padding_idx, ref_embedding.max_norm, ref_embedding.norm_type,
                   ref_embedding.scale_grad_by_freq, ref_embedding.sparse, w, w.qdtype)


class EmbeddingBag(Embedding):
    """Bag reductions over a row-quantized table: ``forward(indices, offsets=None,
    per_sample_weights=None, compressed_indices_mapping=None)`` -> float32 ``[bags, dim]``."""

    _version = 1

    def __init__(self, num_embeddings: int, embedding_dim: int, max_norm: Optional[float] = None,
                 norm_type: float = 2.0, scale_grad_by_freq: bool = False, mode: str = "sum",
                 sparse: bool = False, _weight: Optional[QTensor] = None,
                 include_last_offset: bool = False, dtype: Any = _dt.quint8,
                 padding_idx: Optional[int] = None) -> None:
        if mode not in ops_embedding.MODES:
            raise ValueError(f"mode has to be one of sum, mean or max, got {mode!r}")
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, dtype)
        self.mode = mode
        self.pruned_weights = False
        self.include_last_offset = include_last_offset

    def forward(self, indices: torch.Tensor, offsets: Optional[torch.Tensor] = None,
                per_sample_weights: Optional[torch.Tensor] = None,
                compressed_indices_mapping: Optional[torch.Tensor] = None) -> torch.Tensor:
        return ops_embedding.embedding_bag(indices, self._packed_params._packed_weight, offsets,
                                           self.mode, per_sample_weights,
                                           self.include_last_offset, self.padding_idx)

    def _get_name(self) -> str:
        return "QuantizedEmbeddingBag"

    @classmethod
    def from_float(cls, mod: nn.Module,
                   use_precomputed_fake_quant: bool = False) -> "EmbeddingBag":
        """Quantize a float ``nn.EmbeddingBag`` (with ``.qconfig``) or a QAT EmbeddingBag."""
        observer, qdtype = _weight_observer(cls, mod, nn.EmbeddingBag, None)
        observer(mod.weight)
        qweight = quantize_weight(mod.weight.float(), observer)
        q = cls(mod.num_embeddings, mod.embedding_dim, max_norm=mod.max_norm,
                norm_type=mod.norm_type, scale_grad_by_freq=mod.scale_grad_by_freq,
                mode=mod.mode, sparse=mod.sparse, include_last_offset=mod.include_last_offset,
                dtype=qdtype, padding_idx=mod.padding_idx)
        q.set_weight(qweight)
        return q

    @classmethod
    def from_reference(cls, ref_embedding_bag: nn.Module) -> "EmbeddingBag":
        r = ref_embedding_bag
        w = _reference_weight(r)
        return cls(r.num_embeddings, r.embedding_dim, r.max_norm, r.norm_type,
                   r.scale_grad_by_freq, r.mode, r.sparse, w, r.include_last_offset, w.qdtype,
                   padding_idx=getattr(r, "padding_idx", None))
