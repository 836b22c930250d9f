// Elementwise 8-bit kernels in one pass over memory: the per-tensor quantize of a float32
// tensor and the quantized add (and add + ReLU) of two 8-bit tensors.
//
// Quantize: kernels/reference.py quantize_formula in its FMA mode, per tensor: nearbyint(fma(x,
// inv, zp)), NaN to torch's code for it, clamped to [qmin, qmax].
//
// Add: the same arithmetic as torchquant's reference formula (kernels/reference.py add_formula, the
// numbers of torch's vectorised quantized add): each operand dequantized as
// fma(q, scale, -zp * scale) in float32, the two summed, ReLU as max(t, 0), then
// round-half-to-even(t * inv_out) + out_zp, clamped to [qmin, qmax].  Every step is one
// IEEE float32 operation (no contraction: -ffp-contract=off; the fma is an explicit fma), so
// the AVX2 loop and the scalar tail give the reference's integers bit for bit.
//
// Without them an eager residual add ran as six torch ops (about 2 ms a call on a ResNet-18
// batch of 16) and the input quantize as five, until the amortised compiled kernels were built.

#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>

#include <fbgemm/Fbgemm.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

namespace torchquant_native {
namespace {

struct AddOperands {
  float x_scale, x_premul, y_scale, y_premul, inv_out, zp_out, qmin, qmax;
  bool relu;
};

template <typename T>
inline T add_one(T x, T y, const AddOperands& o) {
  float t = std::fma(static_cast<float>(x), o.x_scale, o.x_premul) +
            std::fma(static_cast<float>(y), o.y_scale, o.y_premul);
  if (o.relu) t = std::max(t, 0.0f);
  float q = std::nearbyint(t * o.inv_out) + o.zp_out;
  q = std::min(std::max(q, o.qmin), o.qmax);
  return static_cast<T>(static_cast<int32_t>(q));
}

template <typename T>
void add_scalar(const T* x, const T* y, T* out, int64_t begin, int64_t end,
                const AddOperands& o) {
  for (int64_t i = begin; i < end; ++i) out[i] = add_one(x[i], y[i], o);
}

template <typename T>
__attribute__((target("avx2,fma"))) inline __m256 load8(const T* p) {
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  const __m256i ints = std::is_same<T, uint8_t>::value ? _mm256_cvtepu8_epi32(bytes)
                                                       : _mm256_cvtepi8_epi32(bytes);
  return _mm256_cvtepi32_ps(ints);
}

template <typename T>
__attribute__((target("avx2,fma"))) void add_avx2(const T* x, const T* y, T* out,
                                                  int64_t begin, int64_t end,
                                                  const AddOperands& o) {
  const __m256 xs = _mm256_set1_ps(o.x_scale), xp = _mm256_set1_ps(o.x_premul);
  const __m256 ys = _mm256_set1_ps(o.y_scale), yp = _mm256_set1_ps(o.y_premul);
  const __m256 inv = _mm256_set1_ps(o.inv_out), zp = _mm256_set1_ps(o.zp_out);
  const __m256 lo = _mm256_set1_ps(o.qmin), hi = _mm256_set1_ps(o.qmax);
  const __m256 zero = _mm256_setzero_ps();
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 t = _mm256_add_ps(_mm256_fmadd_ps(load8(x + i), xs, xp),
                             _mm256_fmadd_ps(load8(y + i), ys, yp));
    if (o.relu) t = _mm256_max_ps(t, zero);
    __m256 q = _mm256_round_ps(_mm256_mul_ps(t, inv),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(q, zp), lo), hi);
    const __m256i v32 = _mm256_cvtps_epi32(q);  // exact: q is an in-range integer
    const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v32),
                                        _mm256_extracti128_si256(v32, 1));
    const __m128i v8 = std::is_same<T, uint8_t>::value ? _mm_packus_epi16(v16, v16)
                                                       : _mm_packs_epi16(v16, v16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), v8);
  }
  add_scalar(x, y, out, i, end, o);
}

template <typename T>
__attribute__((target("avx512f,avx512bw"))) inline __m512 load16(const T* p) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m512i ints = std::is_same<T, uint8_t>::value ? _mm512_cvtepu8_epi32(bytes)
                                                       : _mm512_cvtepi8_epi32(bytes);
  return _mm512_cvtepi32_ps(ints);
}

// 16 in-range integer floats to 8-bit codes (no saturation happens: they are clamped)
template <typename T>
__attribute__((target("avx512f,avx512bw"))) inline void store16(T* p, __m512 q) {
  const __m512i v32 = _mm512_cvtps_epi32(q);
  const __m128i v8 = std::is_same<T, uint8_t>::value ? _mm512_cvtusepi32_epi8(v32)
                                                     : _mm512_cvtsepi32_epi8(v32);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v8);
}

// add_avx2's operations on 16 lanes, in the same order (the same integers)
template <typename T>
__attribute__((target("avx512f,avx512bw"))) void add_avx512(const T* x, const T* y, T* out,
                                                          int64_t begin, int64_t end,
                                                          const AddOperands& o) {
  const __m512 xs = _mm512_set1_ps(o.x_scale), xp = _mm512_set1_ps(o.x_premul);
  const __m512 ys = _mm512_set1_ps(o.y_scale), yp = _mm512_set1_ps(o.y_premul);
  const __m512 inv = _mm512_set1_ps(o.inv_out), zp = _mm512_set1_ps(o.zp_out);
  const __m512 lo = _mm512_set1_ps(o.qmin), hi = _mm512_set1_ps(o.qmax);
  const __m512 zero = _mm512_setzero_ps();
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 t = _mm512_add_ps(_mm512_fmadd_ps(load16(x + i), xs, xp),
                             _mm512_fmadd_ps(load16(y + i), ys, yp));
    if (o.relu) t = _mm512_max_ps(t, zero);
    __m512 q = _mm512_roundscale_ps(_mm512_mul_ps(t, inv),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm512_min_ps(_mm512_max_ps(_mm512_add_ps(q, zp), lo), hi);
    store16(out + i, q);
  }
  add_avx2(x, y, out, i, end, o);
}

struct QuantizeOperands {
  float inv, zp, nan_code, qmin, qmax;
};

template <typename T>
void quantize_scalar(const float* x, T* out, int64_t begin, int64_t end,
                     const QuantizeOperands& o) {
  for (int64_t i = begin; i < end; ++i) {
    float y = std::nearbyint(std::fma(x[i], o.inv, o.zp));
    if (std::isnan(y)) y = o.nan_code;
    y = std::min(std::max(y, o.qmin), o.qmax);
    out[i] = static_cast<T>(static_cast<int32_t>(y));
  }
}

template <typename T>
__attribute__((target("avx2,fma"))) void quantize_avx2(const float* x, T* out, int64_t begin,
                                                       int64_t end, const QuantizeOperands& o) {
  const __m256 inv = _mm256_set1_ps(o.inv), zp = _mm256_set1_ps(o.zp);
  const __m256 nan_code = _mm256_set1_ps(o.nan_code);
  const __m256 lo = _mm256_set1_ps(o.qmin), hi = _mm256_set1_ps(o.qmax);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 y = _mm256_round_ps(_mm256_fmadd_ps(_mm256_loadu_ps(x + i), inv, zp),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm256_blendv_ps(nan_code, y, _mm256_cmp_ps(y, y, _CMP_ORD_Q));
    y = _mm256_min_ps(_mm256_max_ps(y, lo), hi);
    const __m256i v32 = _mm256_cvtps_epi32(y);
    const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v32),
                                        _mm256_extracti128_si256(v32, 1));
    const __m128i v8 = std::is_same<T, uint8_t>::value ? _mm_packus_epi16(v16, v16)
                                                       : _mm_packs_epi16(v16, v16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), v8);
  }
  quantize_scalar(x, out, i, end, o);
}

// quantize_avx2's operations on 16 lanes, in the same order (the same integers)
template <typename T>
__attribute__((target("avx512f,avx512bw"))) void quantize_avx512(const float* x, T* out,
                                                               int64_t begin, int64_t end,
                                                               const QuantizeOperands& o) {
  const __m512 inv = _mm512_set1_ps(o.inv), zp = _mm512_set1_ps(o.zp);
  const __m512 nan_code = _mm512_set1_ps(o.nan_code);
  const __m512 lo = _mm512_set1_ps(o.qmin), hi = _mm512_set1_ps(o.qmax);
  int64_t i = begin;
  for (; i + 16 <= end; i += 16) {
    __m512 y = _mm512_roundscale_ps(_mm512_fmadd_ps(_mm512_loadu_ps(x + i), inv, zp),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    y = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(y, y, _CMP_ORD_Q), nan_code, y);
    y = _mm512_min_ps(_mm512_max_ps(y, lo), hi);
    store16(out + i, y);
  }
  quantize_avx2(x, out, i, end, o);
}

float scalar_of(const at::Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.numel() == 1 && t.scalar_type() == at::kFloat,
                    "quantized_add: ", what, " must be a one-element float32 tensor");
  return t.item<float>();
}

}  // namespace

// The AVX-512 loops (these and the depthwise conv's) where fbgemm runs AVX-512: forcing fbgemm
// to AVX2 tests the AVX2 loops
bool wide_loops() {
  const auto isa = fbgemm::fbgemmInstructionSet();
  return isa == fbgemm::inst_set_t::avx512 || isa == fbgemm::inst_set_t::avx512_vnni;
}

// out = quantized add of x and y (same shape, both uint8 or both int8).  The 0-d float32
// operands are those of the reference formula: scale and -zp * scale per input, the output's
// inverse scale and zero point.
namespace {
at::Tensor quantized_add_impl(const at::Tensor& x, const at::Tensor& y, const AddOperands& o,
                              bool use_avx2);
}  // namespace

at::Tensor quantized_add(const at::Tensor& x, const at::Tensor& y, const at::Tensor& x_scale,
                         const at::Tensor& x_premul, const at::Tensor& y_scale,
                         const at::Tensor& y_premul, const at::Tensor& inv_out,
                         const at::Tensor& zp_out, int64_t qmin, int64_t qmax, bool relu,
                         bool use_avx2) {
  const AddOperands o{scalar_of(x_scale, "x_scale"), scalar_of(x_premul, "x_premul"),
                      scalar_of(y_scale, "y_scale"), scalar_of(y_premul, "y_premul"),
                      scalar_of(inv_out, "inv_out"), scalar_of(zp_out, "zp_out"),
                      static_cast<float>(qmin), static_cast<float>(qmax), relu};
  return quantized_add_impl(x, y, o, use_avx2);
}

// quantized_add with its float32 operands passed as numbers (each a float32 value, exact as a
// double): the eager plans' form, without six one-element tensor reads per call.
at::Tensor quantized_add_numbers(const at::Tensor& x, const at::Tensor& y, double x_scale,
                                 double x_premul, double y_scale, double y_premul,
                                 double inv_out, double zp_out, int64_t qmin, int64_t qmax,
                                 bool relu, bool use_avx2) {
  const AddOperands o{static_cast<float>(x_scale), static_cast<float>(x_premul),
                      static_cast<float>(y_scale), static_cast<float>(y_premul),
                      static_cast<float>(inv_out), static_cast<float>(zp_out),
                      static_cast<float>(qmin), static_cast<float>(qmax), relu};
  return quantized_add_impl(x, y, o, use_avx2);
}

namespace {
at::Tensor quantized_add_impl(const at::Tensor& x, const at::Tensor& y, const AddOperands& o,
                              bool use_avx2) {
  TORCH_CHECK_VALUE(x.scalar_type() == y.scalar_type() &&
                        (x.scalar_type() == at::kByte || x.scalar_type() == at::kChar),
                    "quantized_add: both operands uint8 or both int8, got ", x.scalar_type(),
                    " and ", y.scalar_type());
  TORCH_CHECK_VALUE(x.sizes() == y.sizes(), "quantized_add: operands of shapes ", x.sizes(),
                    " and ", y.sizes());
  // Operands of one dense layout (channels-last ones too) are read in place, the output in
  // that layout; others are made contiguous first.
  const bool in_place = x.strides() == y.strides() && x.is_non_overlapping_and_dense();
  const at::Tensor xc = in_place ? x : x.contiguous(), yc = in_place ? y : y.contiguous();
  at::Tensor out = at::empty_like(xc);
  TORCH_CHECK(out.strides() == xc.strides(), "quantized_add: layout not kept");
  const int64_t n = xc.numel();
  constexpr int64_t kGrain = 1 << 15;
  const bool wide = use_avx2 && wide_loops();
  auto run = [&](auto* xp, auto* yp, auto* op) {
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (wide) {
        add_avx512(xp, yp, op, begin, end, o);
      } else if (use_avx2) {
        add_avx2(xp, yp, op, begin, end, o);
      } else {
        add_scalar(xp, yp, op, begin, end, o);
      }
    });
  };
  if (xc.scalar_type() == at::kByte) {
    run(xc.data_ptr<uint8_t>(), yc.data_ptr<uint8_t>(), out.data_ptr<uint8_t>());
  } else {
    run(xc.data_ptr<int8_t>(), yc.data_ptr<int8_t>(), out.data_ptr<int8_t>());
  }
  return out;
}
}  // namespace

// The 8-bit codes of float32 ``x`` (any dense layout, kept) quantized per tensor with the
// float32 inverse scale and zero point.
at::Tensor quantize_per_tensor_fma(const at::Tensor& x, const at::Tensor& inv,
                                   const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                   double nan_code, bool is_signed, bool use_avx2) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat && x.is_non_overlapping_and_dense(),
                    "quantize_per_tensor_fma: a dense float32 tensor, got ", x.scalar_type());
  const QuantizeOperands o{scalar_of(inv, "inv"), scalar_of(zero_point, "zero_point"),
                           static_cast<float>(nan_code), static_cast<float>(qmin),
                           static_cast<float>(qmax)};
  at::Tensor out = at::empty_like(x, x.options().dtype(is_signed ? at::kChar : at::kByte));
  TORCH_CHECK(out.strides() == x.strides(), "quantize_per_tensor_fma: layout not kept");
  const float* xp = x.data_ptr<float>();
  const int64_t n = x.numel();
  constexpr int64_t kGrain = 1 << 15;
  const bool wide = use_avx2 && wide_loops();
  auto run = [&](auto* op) {
    at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
      if (wide) {
        quantize_avx512(xp, op, begin, end, o);
      } else if (use_avx2) {
        quantize_avx2(xp, op, begin, end, o);
      } else {
        quantize_scalar(xp, op, begin, end, o);
      }
    });
  };
  if (is_signed) {
    run(out.data_ptr<int8_t>());
  } else {
    run(out.data_ptr<uint8_t>());
  }
  return out;
}

}  // namespace torchquant_native

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("quantized_add(Tensor x, Tensor y, Tensor x_scale, Tensor x_premul, Tensor y_scale, "
        "Tensor y_premul, Tensor inv_out, Tensor zp_out, int qmin, int qmax, bool relu, "
        "bool use_avx2) -> Tensor");
  m.def("quantized_add_numbers(Tensor x, Tensor y, float x_scale, float x_premul, "
        "float y_scale, float y_premul, float inv_out, float zp_out, int qmin, int qmax, "
        "bool relu, bool use_avx2) -> Tensor");
  m.def("quantize_per_tensor_fma(Tensor x, Tensor inv, Tensor zero_point, int qmin, int qmax, "
        "float nan_code, bool is_signed, bool use_avx2) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("quantized_add", &torchquant_native::quantized_add);
  m.impl("quantized_add_numbers", &torchquant_native::quantized_add_numbers);
  m.impl("quantize_per_tensor_fma", &torchquant_native::quantize_per_tensor_fma);
}
