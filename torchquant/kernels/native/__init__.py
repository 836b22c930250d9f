"""Native (C++) kernels: fbgemm's int8 GEMM on plain buffers, through ``torch.library``.

``csrc/`` is built by the package's own build (setup.py, ``torch.utils.cpp_extension``) into
``_C.so`` beside this file; it registers ``torch.ops.torchquant_native.*`` and the custom class
``FbgemmLinearPack`` (a prepacked int8 weight).  The numbers are those of torch.ao's x86 /
fbgemm engine, which runs the same fbgemm routines: the dynamic Linear (activation quantized
per tensor with ATen's qparam rule, fbgemm's quantize, GEMM and float epilogue), the static
uint8 Linear (fbgemm's requantizing epilogue, ReLU fused), and the dynamic LSTM / GRU loops
(that dynamic Linear on the hidden state, then torch's CPU cell arithmetic, fused into a few
passes with ATen's own sigmoid / tanh math; every step in C++).  fbgemm picks AVX2 / AVX-512 /
VNNI kernels at run time; :func:`force_isa` forces a lower one for tests.  On AMX CPUs the
Linear's int32 accumulator (four rows and more) comes from torchquant's AMX tile GEMM
(``csrc/amx.cpp``) and goes through fbgemm's own output processing: the same numbers.  The
int8 2-d conv (``csrc/conv.cpp``): that AMX GEMM reading the zero-point-padded input in place
(Sapphire Rapids and later), else fbgemm's im2col GEMM, a depthwise loop of torchquant's own,
and oneDNN's requantization order: the integers of ``onednn::qconv_pointwise`` without its
per-call set-up (:func:`conv_preferred` says where that wins).  AMX runs where the CPU has it
and neither ``TORCHQUANT_CPU_ISA`` (below ``amx``) nor :func:`force_isa` rules it out.  Two
elementwise loops of torchquant's own (``csrc/elementwise.cpp``, AVX2 with a scalar twin,
:data:`VECTOR_LOOPS`): the per-tensor quantize and the quantized add, the reference formulas'
integers in one pass.

Where the library was not built, fails to load, the CPU lacks AVX2, or ``TORCHQUANT_NATIVE=0``
is set, :func:`available` is false and the registry's other kernels run; :func:`describe`
says which, logged once on first use.
"""
from __future__ import annotations

import ctypes
import logging
import math
import weakref
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import torch

from ... import _config
from ... import affine as _affine
from ..._log import emit_once
from .. import cpu_isa
from ..registry import implementations, register
from . import onednn as _onednn_library
from ._entry import cpp_entry

__all__ = ["available", "describe", "isa", "amx", "exact_u8", "force_isa", "pack",
           "conv_preferred", "conv_preferred_any_batch", "native_max_batch", "split_conv_applies",
           "conv_output_size", "dynamic_linear",
           "static_linear", "lstm_sequence", "gru_sequence", "quantized_add", "quantize",
           "attention_lanes"]

_LIBRARY = Path(__file__).with_name("_C.so")
_state: dict[str, Any] = {}


def _load() -> Optional[str]:
    """Load the library once; the reason it is not usable, or None."""
    if not _config.native_enabled():
        return "disabled by TORCHQUANT_NATIVE=0"
    if not _LIBRARY.exists():
        return f"not built ({_LIBRARY.name} absent: reinstall with pip install --no-build-isolation)"
    try:
        # RTLD_GLOBAL: code AOTInductor generates calls the library's C shims by name
        # (aoti_c_shims); they are the only symbols it exports
        ctypes.CDLL(str(_LIBRARY), mode=ctypes.RTLD_GLOBAL)
        torch.ops.load_library(str(_LIBRARY))
    except (OSError, RuntimeError) as e:
        return f"failed to load {_LIBRARY.name}: {e}"
    if torch.ops.torchquant_native.fbgemm_isa() == "anyarch":
        return "this CPU has no AVX2 (fbgemm cannot run)"
    _register_fakes()
    _apply_amx_choice()
    _apply_int8_gemm_provider()
    return None


def _register_fakes() -> None:
    """Shapes for export / compile (the native ops are eager kernels; graphs see the
    ``torchquant::`` ops that call them)."""
    lib = "torchquant_native::"

    @torch.library.register_fake(lib + "fbgemm_linear_dynamic")
    def _(x, packed, reduce_range, relu):
        return x.new_empty(*x.shape[:-1], packed.out_features())

    @torch.library.register_fake(lib + "fbgemm_linear_static")
    def _(x, x_scale, x_zero_point, packed, out_scale, out_zero_point, relu):
        return x.new_empty(*x.shape[:-1], packed.out_features())

    def conv_output(x, weight, stride, padding, dilation, out_dtype):
        n, _, h, w = x.shape
        oh, ow = (conv_output_size(size, k, s, p, d) for size, k, s, p, d in
                  zip((h, w), weight.shape[2:], stride, padding, dilation))
        return torch.empty((n, weight.size(0), oh, ow), dtype=out_dtype, device=x.device,
                           memory_format=torch.channels_last)

    @torch.library.register_fake(lib + "qconv2d")
    def _(x, x_scale, x_zp, weight, weight_scale, bias, stride, padding, dilation, groups, other,
          other_scale, other_zp, unary, scalars, out_scale, out_zp, out_dtype):
        return conv_output(x, weight, stride, padding, dilation, out_dtype)

    @torch.library.register_fake(lib + "qconv2d_or_onednn")
    def _(x, x_scale, x_zp, weight, weight_scale, bias, stride, padding, dilation, groups, other,
          other_scale, other_zp, unary, scalars, out_scale, out_zp, out_dtype, native_max_batch,
          onednn_weight, weight_zp):
        return conv_output(x, weight, stride, padding, dilation, out_dtype)

    @torch.library.register_fake(lib + "attention")
    def _(q, k, v, attn_mask, scale, lanes):
        b, heads, tq = q.shape[:3]
        if q.stride(1) < q.stride(2):  # the kernel's layout: q's (attention_output, C++)
            return q.new_empty(b, tq, heads, v.size(3)).transpose(1, 2)
        return q.new_empty(b, heads, tq, v.size(3))

    @torch.library.register_fake(lib + "fbgemm_lstm_sequence")
    def _(ih, h0, c0, w_hh, reduce_range, reverse):
        return ih.new_empty(ih.size(0), *h0.shape), torch.empty_like(h0), torch.empty_like(c0)

    @torch.library.register_fake(lib + "fbgemm_gru_sequence")
    def _(ih, h0, w_hh, reduce_range, reverse):
        return ih.new_empty(ih.size(0), *h0.shape), torch.empty_like(h0)


def _reason() -> Optional[str]:
    if "reason" not in _state:
        _state["reason"] = _load()
    return _state["reason"]


def available() -> bool:
    """Whether the native kernels run in this process (says once which kernels are used)."""
    ok = _state.get("ok")
    if ok is None:
        reason = _reason()
        ok = _state["ok"] = reason is None
        if ok:
            emit_once(logging.DEBUG, "native kernels: fbgemm", key="native-kernels")
        else:
            level = logging.INFO if "not built" in reason or "failed" in reason else logging.DEBUG
            emit_once(level, f"native kernels unavailable ({reason}); using the Python kernels",
                      key="native-kernels")
    return ok


def describe() -> str:
    """One line: which kernels the int8 Linear / RNN paths use here and why."""
    reason = _reason()
    return f"native fbgemm kernels ({isa()})" if reason is None else f"Python kernels ({reason})"


def _require() -> None:
    if not available():
        raise RuntimeError(f"torchquant's native kernels are not available: {describe()}")


def isa() -> str:
    """The instruction set the native kernels use now: fbgemm's ('avx2', 'avx512',
    'avx512_vnni', ...), with '+amx' where the conv and the Linear run on AMX tiles."""
    current = _state.get("isa")
    if current is None:
        _require()
        current = torch.ops.torchquant_native.fbgemm_isa()
        if amx():
            current += "+amx"
        _state["isa"] = current
    return current


def amx() -> bool:
    """Whether the native conv and Linear run the AMX int8 tile GEMM (exact for every uint8
    code)."""
    return available() and bool(torch.ops.torchquant_native.amx_int8_active())


def _apply_amx_choice() -> None:
    """AMX on unless the CPU cap is below it or fbgemm is forced lower (tests of those paths)."""
    wanted = (cpu_isa.cpu_isa_cap() in ("amx", "default")
              and not _state.get("fbgemm_forced", False))
    torch.ops.torchquant_native.amx_int8_enable(wanted)
    _state.pop("isa", None)


def _apply_int8_gemm_provider() -> None:
    """The int8 Linear's accumulator from oneDNN's own library (:mod:`.onednn`) where that runs
    here and fbgemm is not forced lower; fbgemm's GEMM otherwise.  Its epilogue is fbgemm's
    either way."""
    use = _onednn_library.available() and not _state.get("fbgemm_forced", False)
    torch.ops.torchquant_native.set_int8_gemm_provider(
        _onednn_library.int8_gemm_provider() if use else 0)


def _on_cap_change() -> None:
    if _state.get("reason", "unloaded") is None:
        _apply_amx_choice()
        _apply_int8_gemm_provider()


cpu_isa.on_change(_on_cap_change)


def exact_u8() -> bool:
    """Whether fbgemm's u8 x s8 products are exact for every uint8 code (VNNI); AVX2 and
    AVX-512 without VNNI saturate int16 pairs, so only reduce_range activations (0..127, at
    most 128 after rounding) are exact there.  ``TORCHQUANT_CPU_ISA=avx2|avx512`` takes the
    saturating CPUs' choice here too (:mod:`..cpu_isa`)."""
    exact = _state.get("exact_u8")
    if exact is None:
        _require()
        exact = _state["exact_u8"] = bool(torch.ops.torchquant_native.fbgemm_exact_u8())
    return exact and not cpu_isa.int8_pairs_forced_saturating()


def force_isa(name: str) -> None:
    """Force fbgemm (this process, torch.ao's fbgemm included) down to ``name`` ('avx2',
    'avx512', 'avx512_vnni', ...; AMX off) or back to 'auto'.  Packs are kept per instruction
    set."""
    _require()
    torch.ops.torchquant_native.fbgemm_force_isa(name)
    _state["fbgemm_forced"] = name != "auto"
    _apply_amx_choice()
    _apply_int8_gemm_provider()
    _state.pop("exact_u8", None)


# packed weight -> {instruction set: FbgemmLinearPack}
_PACKS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def pack(packed: Any) -> Any:
    """The fbgemm pack of a :class:`~torchquant.kernels.packed_linear.PackedLinearWeight`, made
    once per instruction set and dropped with it."""
    per_isa = _PACKS.get(packed)
    if per_isa is None:
        per_isa = _PACKS[packed] = {}
    key = isa()
    p = per_isa.get(key)
    if p is None:
        p = per_isa[key] = torch.ops.torchquant_native.fbgemm_pack_linear(
            packed.weight, packed.channel_scale, packed.channel_zero_point, packed.bias)
    return p


def conv_output_size(size: Any, kernel: int, stride: int, padding: int, dilation: int) -> Any:
    """One spatial size of a (non-transposed) conv's output; ``size`` may be symbolic."""
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


# Where the native conv beats oneDNN's call (measured side by side: bench/bench_kernels.py,
# "Small Conv2d", and at both kinds of input zero point by a scratch script; BENCHMARKS.md
# 2026-12-06, eighth session).  With the AMX GEMM, up to convs of about batch 16 at 3x32x32
# (beyond, oneDNN's AMX kernel pulls ahead).  With fbgemm's GEMM (VNNI without AMX), where
# oneDNN's per-call set-up outweighs its faster kernel: up to about 1024 output rows, fewer
# where the input zero point is 0 (oneDNN then skips its compensation and is ~1.4x faster),
# more for a 1x1 conv (no im2col) over 64 or more input channels.
_AMX_CONV_MAX_DEPTHWISE = 40_000    # depthwise: rows x channels
_AMX_CONV_MAX_MACS = 300_000_000
_FBGEMM_CONV_MAX_ROWS = 1024        # output pixels (batch x height x width); zero point != 0
_FBGEMM_CONV_MAX_MACS = 700_000_000  # rows x (in / groups x kernel) x out channels
_FBGEMM_CONV_ZERO_ZP_MAX_ROWS = 512
_FBGEMM_CONV_ZERO_ZP_MAX_MACS = 20_000_000
_FBGEMM_POINTWISE_MAX_ROWS = 2048   # 1x1 convs over >= 64 input channels, any zero point
_FBGEMM_POINTWISE_MAX_MACS = 40_000_000
_FBGEMM_DEPTHWISE_MAX_ROWS = 1024
# Images of at most 2x2 pixels (ResNet's last stage on 32x32 inputs): a padded kernel reads
# more padding than pixels, where oneDNN's kernel is slow; the native conv won every such
# plain conv measured, 37-151 M multiply-accumulates, 64-512 rows, 1 and 2 threads
# (BENCHMARKS.md, tenth session).
_FBGEMM_TINY_IMAGE_PIXELS = 4
_FBGEMM_CONV_TINY_MAX_ROWS = 512
_FBGEMM_DEPTHWISE_MAX = 200_000     # rows x channels; half that at zero point 0
# An input zero point of 0 (activations after ReLU) spares oneDNN its zero-point compensation:
# its AMX kernel then wins at many output rows (ResNet-18's 56x56 convs and 7x7 stem at batch
# 1: 1.2-1.3x faster than the native conv; at zero point 64 it is 1.2x slower).
_AMX_ZERO_ZP_MAX_ROWS = 2048
_AMX_ZERO_ZP_MIN_MACS = 50_000_000


def conv_preferred(x_shape: Sequence[int], weight_shape: Sequence[int], stride: Sequence[int],
                   padding: Sequence[int], dilation: Sequence[int], groups: int,
                   x_zero_point: Optional[int] = None) -> bool:
    """Whether ``torchquant_native::qconv2d`` should run this uint8 conv (static shape, int8
    weight with zero zero points, input zero point ``x_zero_point``, None if unknown): a 2-d
    conv, plain or depthwise, small enough that oneDNN's per-call set-up dominates, on a CPU
    whose native products are exact (AMX or VNNI)."""
    if len(x_shape) != 4 or len(weight_shape) != 4 or not available():
        return False
    on_amx = amx()
    if not on_amx and not exact_u8():
        return False
    n, c, h, w = x_shape
    oc, icg, kh, kw = weight_shape
    depthwise = groups > 1 and groups == c == oc and icg == 1
    if groups != 1 and not depthwise:
        return False
    oh, ow = (conv_output_size(size, k, s, p, d) for size, k, s, p, d in
              zip((h, w), (kh, kw), stride, padding, dilation))
    rows = n * oh * ow
    if rows <= 0:
        return False
    zero_zp = x_zero_point == 0
    if depthwise:
        if on_amx:
            return rows * c <= _AMX_CONV_MAX_DEPTHWISE and exact_u8()
        return (rows <= _FBGEMM_DEPTHWISE_MAX_ROWS
                and rows * c <= _FBGEMM_DEPTHWISE_MAX // (2 if zero_zp else 1))
    macs = rows * icg * kh * kw * oc
    if on_amx:
        if zero_zp and rows >= _AMX_ZERO_ZP_MAX_ROWS and macs >= _AMX_ZERO_ZP_MIN_MACS:
            return False
        return macs <= _AMX_CONV_MAX_MACS
    if ((kh, kw) == (1, 1) and icg >= 64 and rows <= _FBGEMM_POINTWISE_MAX_ROWS
            and macs <= _FBGEMM_POINTWISE_MAX_MACS):
        return True
    if (h * w <= _FBGEMM_TINY_IMAGE_PIXELS and (kh, kw) != (1, 1)
            and rows <= _FBGEMM_CONV_TINY_MAX_ROWS):
        return True
    if zero_zp:
        return rows <= _FBGEMM_CONV_ZERO_ZP_MAX_ROWS and macs <= _FBGEMM_CONV_ZERO_ZP_MAX_MACS
    return rows <= _FBGEMM_CONV_MAX_ROWS and macs <= _FBGEMM_CONV_MAX_MACS


def split_conv_applies(weight_shape: Sequence[int], groups: int) -> bool:
    """Whether ``torchquant_native::qconv2d`` computes this uint8 conv exactly on a CPU whose
    fbgemm saturates int16 pairs of u8 x s8 products (AVX2, AVX-512 without VNNI): depthwise
    convs (its own int32 loops) and plain convs (codes of 128 and above, the padding's
    included, take the high-bit split: the GEMM on ``x & 127``, their high bits added to the
    accumulators, scattered or by a second GEMM).  The freezing pass uses it where oneDNN's
    int8 saturates too, instead of a float conv; not for convs of fewer than 8 input channels
    (an image's first conv), where fbgemm's im2col GEMM and the split cost more than oneDNN's
    float conv (BENCHMARKS.md, 2026-12-07 eleventh session)."""
    if not available() or len(weight_shape) != 4:
        return False
    oc, icg = weight_shape[0], weight_shape[1]
    return (groups == 1 and icg >= 8) or (icg == 1 and oc == groups)


def conv_preferred_any_batch(image_shape: Sequence[int], weight_shape: Sequence[int],
                             stride: Sequence[int], padding: Sequence[int],
                             dilation: Sequence[int], groups: int,
                             x_zero_point: Optional[int] = None) -> bool:
    """:func:`conv_preferred` for a graph compiled with a symbolic batch (``image_shape``: the
    activation's (channels, height, width)): on AMX, a plain conv the native conv wins at batch
    16; at larger batches its kernel stays within about a quarter of oneDNN's, without
    oneDNN's per-call set-up (measured in "Small Conv2d").  Elsewhere never: fbgemm's GEMM
    loses to oneDNN's from a few images on."""
    return (groups == 1 and amx()
            and conv_preferred((16, *image_shape), weight_shape, stride, padding, dilation, groups,
                               x_zero_point))


def native_max_batch(image_shape: Sequence[int], weight_shape: Sequence[int],
                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                     groups: int, x_zero_point: Optional[int] = None, limit: int = 4096) -> int:
    """The largest batch at which :func:`conv_preferred` takes the native conv for this image
    shape (0 if none, at most ``limit``): a graph compiled with a symbolic batch calls
    ``torchquant_native::qconv2d_or_onednn``, which runs the native conv up to it and
    oneDNN's beyond.  conv_preferred only grows stricter with the batch."""
    def preferred(batch: int) -> bool:
        return conv_preferred((batch, *image_shape), weight_shape, stride, padding, dilation,
                              groups, x_zero_point)
    if not preferred(1):
        return 0
    low, high = 1, limit + 1           # preferred(low), and high is past the answer
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if preferred(mid) else (low, mid)
    return low


def _applies(x: torch.Tensor, packed: Any = None, reduce_range: bool = True, **_: Any) -> bool:
    return (packed is not None and x.dtype == torch.float32 and x.device.type == "cpu"
            and packed.weight.device.type == "cpu" and packed.weight.numel() > 0
            and (bool(reduce_range) or exact_u8()))


def dynamic_linear(x2d: torch.Tensor, packed: Any, reduce_range: bool, relu: bool) -> torch.Tensor:
    """torch.ao's dynamic Linear (fbgemm) of a float32 ``[M, K]`` input, float32 out."""
    return cpp_entry("fbgemm_linear_dynamic")(x2d, pack(packed), reduce_range, relu)


def _static_applies(x: torch.Tensor, packed: Any = None, out_qdtype: Any = None,
                    post_op: str = "", **_: Any) -> bool:
    """uint8 in and out, no post-op but ReLU, and exact u8 x s8 products (VNNI: fbgemm's AVX2
    kernels saturate int16 pairs of full-range uint8 activations)."""
    return (packed is not None and x.dtype == torch.uint8 and packed.weight.numel() > 0
            and packed.weight.device.type == "cpu" and post_op in ("none", "relu")
            and getattr(out_qdtype, "storage_dtype", None) == torch.uint8
            and getattr(out_qdtype, "qmin", None) == 0 and getattr(out_qdtype, "qmax", None) == 255
            and exact_u8())


def static_linear(x2d: torch.Tensor, x_scale: float, x_zp: int, packed: Any, out_scale: float,
                  out_zp: int, out_qdtype: Any, post_op: Any, other: Any) -> torch.Tensor:
    """torch.ao's static quantized Linear (fbgemm): uint8 ``[M, K]`` in, uint8 out, ReLU fused
    (the registry's ``quantized_linear`` signature)."""
    if not _static_applies(x2d, packed, out_qdtype, post_op.name) or other is not None:
        # a call this kernel does not cover: the next registered implementation that does
        hints = {"packed": packed, "out_qdtype": out_qdtype, "post_op": post_op.name}
        impls = [k for name, k in implementations("quantized_linear").items() if name != "native"]
        kernel = next((k for k in impls if k.name != "reference" and k.accepts(x2d, hints)),
                      impls[-1])
        return kernel.fn(x2d, x_scale, x_zp, packed, out_scale, out_zp, out_qdtype, post_op,
                         other)
    return cpp_entry("fbgemm_linear_static")(
        x2d, float(x_scale), int(x_zp), pack(packed), float(out_scale), int(out_zp),
        post_op.name == "relu")


def _static_linear_plan(x2d: torch.Tensor, x_scale: float, x_zp: int, packed: Any,
                        out_scale: float, out_zp: int, out_qdtype: Any,
                        post_op: Any) -> Optional[Callable[[torch.Tensor], torch.Tensor]]:
    """:func:`static_linear` bound for inputs like ``x2d`` with these qparams (its checks done
    once): ``plan(x2d)``; None where the kernel does not take such calls.  The pack is looked
    up per call (fbgemm may be forced to another instruction set)."""
    if not _static_applies(x2d, packed, out_qdtype, post_op.name):
        return None
    op = cpp_entry("fbgemm_linear_static")
    numbers = (float(x_scale), int(x_zp))
    tail = (float(out_scale), int(out_zp), post_op.name == "relu")
    return lambda x: op(x, *numbers, pack(packed), *tail)


static_linear.plan = _static_linear_plan  # what kernels.linear.linear_plan binds


def lstm_sequence(ih: torch.Tensor, h0: torch.Tensor, c0: torch.Tensor, packed: Any,
                  reduce_range: bool, reverse: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A dynamic LSTM direction over ``ih`` ([T, B, 4H], input projections with their bias):
    ``(outputs [T, B, H], h_T, c_T)``."""
    return torch.ops.torchquant_native.fbgemm_lstm_sequence(ih, h0, c0, pack(packed), reduce_range,
                                                            reverse)


def gru_sequence(ih: torch.Tensor, h0: torch.Tensor, packed: Any, reduce_range: bool,
                 reverse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A dynamic GRU direction over ``ih`` ([T, B, 3H]): ``(outputs [T, B, H], h_T)``."""
    return torch.ops.torchquant_native.fbgemm_gru_sequence(ih, h0, pack(packed), reduce_range,
                                                           reverse)


# The AVX2 loops of the quantize and the quantized add (False: their scalar loops, the same
# integers; for tests).
VECTOR_LOOPS = True


def _add_applies(x: torch.Tensor, *_: Any, **__: Any) -> bool:
    return x.dtype in (torch.uint8, torch.int8)


def quantized_add(x: torch.Tensor, y: torch.Tensor, x_scale: torch.Tensor,
                  x_premul: torch.Tensor, y_scale: torch.Tensor, y_premul: torch.Tensor,
                  inv_out: torch.Tensor, zp_out: torch.Tensor, qmin: int, qmax: int,
                  storage_dtype: torch.dtype, relu: bool) -> torch.Tensor:
    """The registry's ``add`` (the reference formula's arguments) in one native pass."""
    if y.dtype != x.dtype or y.shape != x.shape or storage_dtype != x.dtype:
        kernel = implementations("add")["reference"]
        return kernel.fn(x, y, x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin,
                         qmax, storage_dtype, relu)
    return torch.ops.torchquant_native.quantized_add(x, y, x_scale, x_premul, y_scale, y_premul,
                                                     inv_out, zp_out, qmin, qmax, relu,
                                                     VECTOR_LOOPS)


def quantized_add_plan(operands: Sequence[torch.Tensor], qmin: int, qmax: int,
                       relu: bool) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """:func:`quantized_add` bound to its six one-element float32 operands, read once:
    ``plan(x, y)`` for operands of one shape, storage dtype and dense layout (the caller's
    checks), the output in that layout."""
    numbers = [float(t) for t in operands]
    op = torch.ops.torchquant_native.quantized_add_numbers.default
    return lambda x, y: op(x, y, *numbers, qmin, qmax, relu, VECTOR_LOOPS)


def attention_lanes() -> int:
    """The vector width of the native attention's loops: 16 (AVX-512) where the CPU has it
    and torchquant's ISA cap is above AVX2, 8 (AVX2), else 1 (scalar)."""
    flags = cpu_isa.cpu_flags()
    if "avx512f" in flags and cpu_isa.cpu_isa_cap() != "avx2":
        return 16
    return 8 if "avx2" in flags and "fma" in flags else 1


def max_pool2d_applies(values: torch.Tensor) -> bool:
    """Whether :func:`max_pool2d` takes ``values``: 4-d uint8 / int8 on the CPU, contiguous or
    channels-last, the extension loaded."""
    return (available() and values.device.type == "cpu" and values.dim() == 4
            and values.dtype in (torch.uint8, torch.int8) and _dense(values))


def max_pool2d(values: torch.Tensor, kernel: Sequence[int], stride: Sequence[int],
               padding: Sequence[int], dilation: Sequence[int],
               out_size: Sequence[int]) -> torch.Tensor:
    """2-d max pooling of 8-bit codes in one native pass (padded taps never win), to the
    output size the caller computed and checked; the output keeps the input's layout."""
    return torch.ops.torchquant_native.max_pool2d_8bit.default(
        values, list(kernel), list(stride), list(padding), list(dilation), list(out_size))


_SHIM_HEAD = ("AOTITorchError aoti_torch_cpu_{name}(AtenTensorHandle x, double x_scale, "
              "int64_t x_zero_point, AtenTensorHandle weight, AtenTensorHandle weight_scale, "
              "AtenTensorHandle* bias, const int64_t* stride, int64_t stride_len_, "
              "const int64_t* padding, int64_t padding_len_, const int64_t* dilation, "
              "int64_t dilation_len_, int64_t groups, AtenTensorHandle* other, "
              "double other_scale, int64_t other_zero_point, const char* unary, "
              "const double* scalars, int64_t scalars_len_, double out_scale, "
              "int64_t out_zero_point, int32_t out_dtype")


def aoti_c_shims() -> dict[Any, list[str]]:
    """AOTInductor's ``custom_ops_to_c_shims`` for the native convs (csrc/aoti_shims.cpp): the
    C functions generated code calls instead of going through its proxy executor.  For code
    that runs in this process only (the library must be loaded); empty without it."""
    if not available():
        return {}
    ops = torch.ops.torchquant_native
    return {
        ops.qconv2d.default: [_SHIM_HEAD.format(name="qconv2d") + ", AtenTensorHandle* ret0)"],
        ops.qconv2d_or_onednn.default: [
            _SHIM_HEAD.format(name="qconv2d_or_onednn")
            + ", int64_t native_max_batch, AtenTensorHandle onednn_weight, "
              "AtenTensorHandle weight_zero_point, AtenTensorHandle* ret0)"],
        ops.attention.default: [
            "AOTITorchError aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k, "
            "AtenTensorHandle v, AtenTensorHandle* attn_mask, double scale, int64_t lanes, "
            "AtenTensorHandle* ret0)"],
    }


def global_mean_applies(values: torch.Tensor, ndim: int) -> bool:
    """Whether :func:`global_mean` takes ``values``: uint8 / int8 (N, C, *spatial) with 2 or 3
    spatial dims on the CPU, contiguous or channels-last, under 2**22 elements per channel,
    the extension loaded."""
    if not (available() and values.device.type == "cpu" and ndim in (2, 3)
            and values.dim() == ndim + 2 and values.dtype in (torch.uint8, torch.int8)):
        return False
    per_channel = math.prod(values.shape[2:])
    layout = torch.channels_last if ndim == 2 else torch.channels_last_3d
    return (0 < per_channel < (1 << 22) and
            (values.is_contiguous() or values.is_contiguous(memory_format=layout)))


def global_mean(values: torch.Tensor, ndim: int, zero_point: int, qmin: int,
                qmax: int) -> torch.Tensor:
    """The mean over the spatial dims of 8-bit codes, requantized to their own zero point with
    torch's rounding, in one native pass (keepdim; channels-last in, channels-last out)."""
    return torch.ops.torchquant_native.global_mean_8bit.default(values, ndim, zero_point, qmin,
                                                                qmax)


def _dense(x: torch.Tensor) -> bool:
    return x.is_contiguous() or (x.dim() == 4 and x.is_contiguous(memory_format=torch.channels_last))


def _quantize_applies(x: torch.Tensor, mode: str = "", per_channel: bool = True,
                      **_: Any) -> bool:
    return x.dtype == torch.float32 and mode == _affine.FMA and not per_channel


def quantize(x: torch.Tensor, inv: torch.Tensor, zp: torch.Tensor, qmin: int, qmax: int,
             storage_dtype: torch.dtype, mode: str) -> torch.Tensor:
    """The registry's ``quantize`` (per tensor, FMA rounding, 8-bit codes) in one native pass;
    other forms go to the reference formula."""
    if (mode != _affine.FMA or inv.numel() != 1 or zp.numel() != 1
            or storage_dtype not in (torch.uint8, torch.int8) or x.dtype != torch.float32
            or inv.dtype != torch.float32 or zp.dtype != torch.float32
            or not _dense(x)):
        return implementations("quantize")["reference"].fn(x, inv, zp, qmin, qmax,
                                                           storage_dtype, mode)
    nan = _affine.nan_code(qmin, qmax, storage_dtype, mode)
    return torch.ops.torchquant_native.quantize_per_tensor_fma(
        x, inv, zp, qmin, qmax, float(nan), storage_dtype == torch.int8, VECTOR_LOOPS)


register("add", "native", devices=("cpu",), applies=_add_applies,
         available=available)(quantized_add)
register("quantize", "native", devices=("cpu",), applies=_quantize_applies,
         available=available)(quantize)
register("dynamic_linear_float", "native", devices=("cpu",), applies=_applies,
         available=available)(dynamic_linear)
register("quantized_linear", "native", devices=("cpu",), applies=_static_applies,
         available=available)(static_linear)
register("lstm_sequence", "native", devices=("cpu",), applies=_applies,
         available=available)(lstm_sequence)
register("gru_sequence", "native", devices=("cpu",), applies=_applies,
         available=available)(gru_sequence)
