// Int8 2-d convolution: the AMX tile GEMM (amx.h) where the CPU has AMX, else fbgemm's im2col
// GEMM (a depthwise loop of our own) for the int32 accumulator, then oneDNN's requantization
// order, so the integers equal those of
// onednn::qconv_pointwise / qconv2d_pointwise.binary -- what torch's x86 quantized conv and
// torchquant's oneDNN path compute on VNNI / AMX CPUs -- without their per-call set-up.
//
//   y = float(acc - x_zp * sum_k w[k, c]) * (x_scale * w_scale[c]) + bias[c]
//       [+ (float(other) - other_zp) * other_scale] [relu | hardtanh(lo, hi)]
//   out = clamp(round_half_even(y * (1 / out_scale) + out_zp), 0, 255)   (or y as float32)
//
// Activations are uint8 channels-last, weights int8 with zero point 0.  The weight is packed
// once per (weight storage, instruction set, AMX or not) and cached beside it.  fbgemm's AVX2
// kernels saturate int16 pairs of products: there the GEMM runs on x & 127 and the codes of 128
// and above are added to the accumulators from the weight (the high-bit split, below).  AMX is
// exact for every code.
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/Parallel.h>
#include <c10/core/StorageImpl.h>

#include <fbgemm/Fbgemm.h>

#include "amx.h"
#include "conv.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchquant_native {

bool fbgemm_exact_u8();  // fbgemm_linear.cpp
std::string fbgemm_isa();
bool wide_loops();  // elementwise.cpp

namespace {

enum class Unary { kNone, kRelu, kHardtanh };

// Convs of at most this many multiply-accumulates run on one thread (fbgemm's GEMM path):
// a 1x1 downsample at batch 1; from ResNet-18's 0.6 M-MAC convs at batch 1 on, two threads win.
constexpr int64_t kSerialConvMacs = 1 << 16;

// A 64-byte aligned buffer of one thread's, kept and grown between calls: the int32
// accumulators and fbgemm's packed activation blocks, which it would otherwise allocate (and
// free) on every call -- in a compiled batch-1 ResNet-shaped forward the allocator was ~12 % of
// perf's samples (BENCHMARKS.md, 2026-12-06 eighth session).
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  template <typename T>
  T* get(int64_t count) {
    const size_t bytes = (static_cast<size_t>(count) * sizeof(T) + 63) / 64 * 64;
    if (bytes > bytes_) {
      std::free(data_);
      data_ = std::aligned_alloc(64, bytes);
      TORCH_CHECK(data_ != nullptr, "torchquant_native::qconv2d: out of memory (", bytes,
                  " bytes of scratch)");
      bytes_ = bytes;
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

thread_local Scratch acc_scratch;         // the calling thread's, shared with its workers
thread_local Scratch packed_a_scratch;    // each worker's own
thread_local Scratch row_offset_scratch;
thread_local Scratch comb_scratch;        // the calling thread's: per-channel scales
thread_local Scratch zp_corr_scratch;     // and zero-point corrections of the epilogue
constexpr int64_t kScratchAccMax = 1 << 20;  // int32 accumulators kept between calls (4 MiB)

// A conv weight as the kernels read it.
struct ConvPack {
  explicit ConvPack(c10::weak_intrusive_ptr<c10::StorageImpl> s) : storage(std::move(s)) {}
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;  // the weight it was made from
  int64_t version = -1;
  fbgemm::inst_set_t isa = fbgemm::inst_set_t::anyarch;
  std::vector<int64_t> sizes;
  bool amx = false;                                   // packed for the AMX GEMM
  AmxPackedB amx_b;                                   // groups == 1 on AMX: B^T as amx.h
  std::unique_ptr<fbgemm::PackBMatrix<int8_t>> gemm;  // groups == 1: B^T is [OC, KH*KW*IC]
  std::vector<int32_t> col_sums;                      // groups == 1: sum of each channel's taps
  std::vector<int32_t> taps;                          // depthwise: [KH * KW][C]
  std::vector<int32_t> high_taps;  // groups == 1, saturating CPUs: 128 * w as [IC][KH][KW][OC]
};

std::mutex cache_mutex;
std::unordered_map<const void*, std::shared_ptr<ConvPack>> cache;

// Inference tensors keep no version counter: like a weight prepacked for oneDNN (what torch's
// quantized modules hold), their pack does not see later in-place writes to them.
int64_t weight_version(const at::Tensor& w) {
  return w.is_inference() ? -2 : static_cast<int64_t>(w._version());
}

bool pack_matches(const ConvPack& p, const at::Tensor& w) {
  auto alive = p.storage.lock();
  return alive && alive.get() == w.storage().unsafeGetStorageImpl() &&
         p.version == weight_version(w) &&
         p.isa == fbgemm::fbgemmInstructionSet() && p.amx == amx_int8_active() &&
         p.sizes == w.sizes().vec();
}

// Bytes of one kernel row's reduction (KW taps x IC channels) in the AMX pack: a multiple of
// the tiles' 64-byte depth.
int64_t amx_run_pitch(int64_t KW, int64_t IC) { return (KW * IC + kAmxK - 1) / kAmxK * kAmxK; }

std::shared_ptr<ConvPack> make_pack(const at::Tensor& weight, bool depthwise) {
  auto pack = std::make_shared<ConvPack>(weight.storage().getWeakStorageImpl());
  pack->version = weight_version(weight);
  pack->isa = fbgemm::fbgemmInstructionSet();
  pack->sizes = weight.sizes().vec();
  pack->amx = amx_int8_active();
  const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
  if (depthwise) {
    // [C, 1, KH, KW] -> [KH * KW][C]
    auto t = weight.reshape({OC, KH * KW}).t().contiguous().to(at::kInt);
    pack->taps.assign(t.data_ptr<int32_t>(), t.data_ptr<int32_t>() + t.numel());
    return pack;
  }
  // fbgemm's im2col orders the reduction as (kh, kw, ic): B^T is the weight in KRSC order
  auto krsc = weight.permute({0, 2, 3, 1}).contiguous();
  const int64_t K = krsc.numel() / OC;
  if (pack->amx) {
    // the reduction as the AMX conv reads it: per kernel row kh, the KW taps' channels as one
    // run of KW * IC bytes (adjacent in the padded input), padded to a multiple of 64
    const int64_t IC = weight.size(1), run = KW * IC, run_p = amx_run_pitch(KW, IC);
    auto rows = at::zeros({OC, KH, run_p}, krsc.options());
    rows.narrow(2, 0, run).copy_(krsc.reshape({OC, KH, run}));
    pack->amx_b = amx_pack_b(rows.data_ptr<int8_t>(), OC, KH * run_p, KH * run_p);
  } else {
    pack->gemm = std::make_unique<fbgemm::PackBMatrix<int8_t>>(
        fbgemm::matrix_op_t::Transpose, static_cast<int32_t>(K), static_cast<int32_t>(OC),
        krsc.data_ptr<int8_t>(), static_cast<int32_t>(K), nullptr, 1);
  }
  auto sums = krsc.reshape({OC, K}).sum(1, /*keepdim=*/false, at::kInt);
  pack->col_sums.assign(sums.data_ptr<int32_t>(), sums.data_ptr<int32_t>() + OC);
  if (!fbgemm_exact_u8()) {
    auto high = weight.permute({1, 2, 3, 0}).contiguous().to(at::kInt).mul_(128);
    pack->high_taps.assign(high.data_ptr<int32_t>(), high.data_ptr<int32_t>() + high.numel());
  }
  return pack;
}

// ---- the high-bit split, for CPUs whose fbgemm saturates int16 pairs of products ------------
// (AVX2, AVX-512 without VNNI).  Products of codes below 128 never saturate (2 * 127 * 128 <
// 2^15), so the GEMM runs on lo = x & 127, and every input code of 128 and above adds 128 times
// its weight taps to the accumulators of the outputs it reaches: the same int32 sums as an
// exact GEMM of x.  7-bit (reduce_range) activations have few such codes, the observer's
// clipped tail; full-range 8-bit ones (PT2E's) several percent, where a second GEMM of the 0/1
// high bits costs less than the scatter.

// Whether any code of x is 128 or above.
bool has_high_codes(const uint8_t* x, int64_t n) {
  uint8_t any = 0;
  for (int64_t i = 0; i < n; ++i) any |= x[i];
  return (any & 0x80) != 0;
}

// How many codes of x are 128 or above.
int64_t count_high_codes(const uint8_t* x, int64_t n) {
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += x[i] >> 7;
  return count;
}

// lo[i] = x[i] & 127, hi[i] = x[i] >> 7 (hi null: not wanted)
void split_codes(const uint8_t* x, uint8_t* lo, uint8_t* hi, int64_t n) {
  at::parallel_for(0, n, 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) lo[i] = x[i] & 0x7f;
    if (hi != nullptr) {
      for (int64_t i = begin; i < end; ++i) hi[i] = x[i] >> 7;
    }
  });
}

// Above this share of high codes their accumulator terms come from a second GEMM of the 0/1
// high bits instead of being scattered code by code (both exact; measured crossover).
constexpr int64_t kDenseHighPerMille = 25;

// acc[(n, oh, ow), :] += 128 * w[:, c, kh, kw] for every code x[n, ih, iw, c] >= 128 and every
// tap (kh, kw) that carries it to output (oh, ow).  x channels-last, acc [N * OH * OW][OC].
void add_high_codes(const uint8_t* x, int64_t N, int64_t IC, int64_t H, int64_t W,
                    int64_t OC, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
                    at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
                    const int32_t* high_taps, int32_t* acc) {
  // images in parallel: an image's codes only reach its own outputs
  at::parallel_for(0, N, 1, [&](int64_t n_begin, int64_t n_end) {
    for (int64_t n = n_begin; n < n_end; ++n) {
      for (int64_t ih = 0; ih < H; ++ih) {
        for (int64_t iw = 0; iw < W; ++iw) {
          const uint8_t* px = x + ((n * H + ih) * W + iw) * IC;
          if (!has_high_codes(px, IC)) continue;
          for (int64_t c = 0; c < IC; ++c) {
            if (px[c] < 128) continue;
            for (int64_t kh = 0; kh < KH; ++kh) {
              const int64_t th = ih + padding[0] - kh * dilation[0];
              if (th < 0 || th % stride[0] != 0 || th / stride[0] >= OH) continue;
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t tw = iw + padding[1] - kw * dilation[1];
                if (tw < 0 || tw % stride[1] != 0 || tw / stride[1] >= OW) continue;
                int32_t* a = acc + ((n * OH + th / stride[0]) * OW + tw / stride[1]) * OC;
                const int32_t* t = high_taps + ((c * KH + kh) * KW + kw) * OC;
                for (int64_t o = 0; o < OC; ++o) a[o] += t[o];
              }
            }
          }
        }
      }
    }
  });
}

std::shared_ptr<ConvPack> cached_pack(const at::Tensor& weight, bool depthwise) {
  const void* key = weight.data_ptr();
  std::lock_guard<std::mutex> guard(cache_mutex);
  auto it = cache.find(key);
  if (it != cache.end() && pack_matches(*it->second, weight)) return it->second;
  if (cache.size() >= 256) {  // drop the packs of freed weights
    for (auto e = cache.begin(); e != cache.end();) {
      e = e->second->storage.expired() ? cache.erase(e) : std::next(e);
    }
  }
  auto pack = make_pack(weight, depthwise);
  cache[key] = pack;
  return pack;
}

// The requantization of an output row (oneDNN's order; see the file comment).
struct Epilogue {
  const float* comb;        // x_scale * w_scale[c] (split: w_scale[c])
  float split_x_scale;      // depthwise: oneDNN's kernel scales by x_scale, then by w_scale[c]
  const int32_t* zp_corr;   // x_zp * col_sums[c] (or zeros)
  const float* bias;        // or nullptr
  const uint8_t* other;     // same layout as the output, or nullptr
  float other_scale;
  float other_zp;
  Unary unary;
  float lo, hi;
  bool out_u8;
  float inv_out;
  float out_zp;
};

inline float finish(const Epilogue& e, float y, float addend) {
  if (e.other) y += addend;
  if (e.unary == Unary::kRelu) y = std::max(y, 0.0f);
  if (e.unary == Unary::kHardtanh) y = std::min(std::max(y, e.lo), e.hi);
  return y;
}

// Channels [c, end) of output row `row` of `n` channels; acc points at the row's accumulators,
// indexed by channel.
__attribute__((target("avx2,fma"))) void epilogue_row(const Epilogue& e, const int32_t* acc,
                                                      int64_t row, int64_t n, int64_t c,
                                                      int64_t end, void* out) {
  const uint8_t* other = e.other ? e.other + row * n : nullptr;
  float* out_f = e.out_u8 ? nullptr : static_cast<float*>(out) + row * n;
  uint8_t* out_q = e.out_u8 ? static_cast<uint8_t*>(out) + row * n : nullptr;
  const __m256 vinv = _mm256_set1_ps(e.inv_out), vzp = _mm256_set1_ps(e.out_zp);
  const __m256 vos = _mm256_set1_ps(e.other_scale), vozp = _mm256_set1_ps(e.other_zp);
  const __m256 vlo = _mm256_set1_ps(e.unary == Unary::kRelu ? 0.0f : e.lo);
  const __m256 vhi = _mm256_set1_ps(e.hi);
  const __m256 vmin = _mm256_set1_ps(0.0f), vmax = _mm256_set1_ps(255.0f);
  for (; c + 8 <= end; c += 8) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(acc + c));
    a = _mm256_sub_epi32(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.zp_corr + c)));
    __m256 y = _mm256_cvtepi32_ps(a);
    if (e.split_x_scale != 0.0f) y = _mm256_mul_ps(y, _mm256_set1_ps(e.split_x_scale));
    y = _mm256_mul_ps(y, _mm256_loadu_ps(e.comb + c));
    if (e.bias) y = _mm256_add_ps(y, _mm256_loadu_ps(e.bias + c));
    if (other) {
      __m128i o8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(other + c));
      __m256 o = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(o8));
      y = _mm256_add_ps(y, _mm256_mul_ps(_mm256_sub_ps(o, vozp), vos));
    }
    if (e.unary != Unary::kNone) y = _mm256_max_ps(y, vlo);
    if (e.unary == Unary::kHardtanh) y = _mm256_min_ps(y, vhi);
    if (!out_q) {
      _mm256_storeu_ps(out_f + c, y);
      continue;
    }
    __m256 q = _mm256_add_ps(_mm256_mul_ps(y, vinv), vzp);
    q = _mm256_round_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    q = _mm256_min_ps(_mm256_max_ps(q, vmin), vmax);
    __m256i qi = _mm256_cvtps_epi32(q);
    __m128i lo = _mm256_castsi256_si128(qi), hi = _mm256_extracti128_si256(qi, 1);
    __m128i w16 = _mm_packus_epi32(lo, hi);
    __m128i b8 = _mm_packus_epi16(w16, w16);
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out_q + c), b8);
  }
  for (; c < end; ++c) {
    float y = static_cast<float>(acc[c] - e.zp_corr[c]);
    if (e.split_x_scale != 0.0f) y *= e.split_x_scale;
    y *= e.comb[c];
    if (e.bias) y += e.bias[c];
    const float addend = other ? (static_cast<float>(other[c]) - e.other_zp) * e.other_scale : 0.f;
    y = finish(e, y, addend);
    if (!out_q) {
      out_f[c] = y;
    } else {
      float q = std::nearbyint(y * e.inv_out + e.out_zp);
      out_q[c] = static_cast<uint8_t>(std::min(std::max(q, 0.0f), 255.0f));
    }
  }
}

// The epilogue of a block of accumulator rows with AVX-512 (every AMX CPU has it; fbgemm's
// 512-bit GEMM path and the depthwise loop use it too, see wide_loops): output row
// rows[i] from accumulator row acc_rows[i] (ldc apart), epilogue_row's operations in the same
// order, sixteen channels at a time with the tail masked; each channel vector's constants are
// loaded once per block and the post-ops are compiled in.
template <bool kOther, bool kU8, Unary kUnary>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void epilogue_block512_impl(
    const Epilogue& e, const int32_t* __restrict acc, int64_t ldc,
    const int64_t* __restrict acc_rows, const int64_t* __restrict rows, int64_t count,
    int64_t n, int64_t c_begin, int64_t c_end, void* out) {
  const __m512 vinv = _mm512_set1_ps(e.inv_out), vzp = _mm512_set1_ps(e.out_zp);
  const __m512 vos = _mm512_set1_ps(e.other_scale), vozp = _mm512_set1_ps(e.other_zp);
  const __m512 vlo = _mm512_set1_ps(kUnary == Unary::kRelu ? 0.0f : e.lo);
  const __m512 vhi = _mm512_set1_ps(e.hi), vzero = _mm512_setzero_ps();
  const __m512 vsplit = _mm512_set1_ps(e.split_x_scale);
  const bool split = e.split_x_scale != 0.0f;
  const uint8_t* __restrict other = e.other;
  const int32_t* zp_corr = e.zp_corr;
  const float* comb_p = e.comb;
  const float* bias_p = e.bias;
  for (int64_t c = c_begin; c < c_end; c += 16) {
    const __mmask16 m = c_end - c >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (c_end - c)) - 1);
    const __m512i zp = _mm512_maskz_loadu_epi32(m, zp_corr + c);
    const __m512 comb = _mm512_maskz_loadu_ps(m, comb_p + c);
    const __m512 bias = bias_p ? _mm512_maskz_loadu_ps(m, bias_p + c) : vzero;
    for (int64_t i = 0; i < count; ++i) {
      const int64_t at = rows[i] * n + c;
      __m512 y = _mm512_cvtepi32_ps(
          _mm512_sub_epi32(_mm512_maskz_loadu_epi32(m, acc + acc_rows[i] * ldc + c), zp));
      if (split) y = _mm512_mul_ps(y, vsplit);
      y = _mm512_mul_ps(y, comb);
      if (bias_p) y = _mm512_add_ps(y, bias);
      if constexpr (kOther) {
        const __m512 o =
            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, other + at)));
        y = _mm512_add_ps(y, _mm512_mul_ps(_mm512_sub_ps(o, vozp), vos));
      }
      if constexpr (kUnary != Unary::kNone) y = _mm512_max_ps(y, vlo);
      if constexpr (kUnary == Unary::kHardtanh) y = _mm512_min_ps(y, vhi);
      if constexpr (!kU8) {
        _mm512_mask_storeu_ps(static_cast<float*>(out) + at, m, y);
      } else {
        // clamp below at 0; above 255 the unsigned saturating store clamps (a value too large
        // for int32 converts to 0x80000000, which saturates to 255 as well); NaN -> 0
        __m512 q = _mm512_add_ps(_mm512_mul_ps(y, vinv), vzp);
        q = _mm512_max_ps(_mm512_roundscale_ps(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                          vzero);
        _mm512_mask_cvtusepi32_storeu_epi8(static_cast<uint8_t*>(out) + at, m,
                                           _mm512_cvtps_epi32(q));
      }
    }
  }
}

template <bool kOther, bool kU8>
void epilogue_block512_unary(const Epilogue& e, const int32_t* acc, int64_t ldc,
                             const int64_t* acc_rows, const int64_t* rows, int64_t count,
                             int64_t n, int64_t c_begin, int64_t c_end, void* out) {
  switch (e.unary) {
    case Unary::kNone:
      return epilogue_block512_impl<kOther, kU8, Unary::kNone>(e, acc, ldc, acc_rows, rows,
                                                               count, n, c_begin, c_end, out);
    case Unary::kRelu:
      return epilogue_block512_impl<kOther, kU8, Unary::kRelu>(e, acc, ldc, acc_rows, rows,
                                                               count, n, c_begin, c_end, out);
    case Unary::kHardtanh:
      return epilogue_block512_impl<kOther, kU8, Unary::kHardtanh>(
          e, acc, ldc, acc_rows, rows, count, n, c_begin, c_end, out);
  }
}

void epilogue_block512(const Epilogue& e, const int32_t* acc, int64_t ldc,
                       const int64_t* acc_rows, const int64_t* rows, int64_t count, int64_t n,
                       int64_t c_begin, int64_t c_end, void* out) {
  auto run = e.other ? (e.out_u8 ? epilogue_block512_unary<true, true>
                                 : epilogue_block512_unary<true, false>)
                     : (e.out_u8 ? epilogue_block512_unary<false, true>
                                 : epilogue_block512_unary<false, false>);
  run(e, acc, ldc, acc_rows, rows, count, n, c_begin, c_end, out);
}

// Output rows [begin, end) from accumulator rows of the same index (OC apart): the AVX-512
// block epilogue where `wide` (fbgemm runs 512-bit kernels), else the AVX2 row epilogue.
void epilogue_rows(const Epilogue& e, const int32_t* acc, int64_t begin, int64_t end, int64_t OC,
                   bool wide, void* out) {
  if (!wide) {
    for (int64_t r = begin; r < end; ++r) epilogue_row(e, acc + r * OC, r, OC, 0, OC, out);
    return;
  }
  int64_t rows[kAmxRows];
  for (int64_t r0 = begin; r0 < end; r0 += kAmxRows) {
    const int64_t count = std::min(kAmxRows, end - r0);
    for (int64_t i = 0; i < count; ++i) rows[i] = r0 + i;
    epilogue_block512(e, acc, OC, rows, rows, count, OC, 0, OC, out);
  }
}

// The in-bounds taps of depthwise output row r (of the flattened [N * OH * OW] image): each
// one's input pixel and weights (C channels); how many there are.
inline int64_t in_bounds_taps(const uint8_t* x, const int32_t* taps, int64_t C, int64_t H,
                              int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW,
                              int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh,
                              int64_t dw, int64_t r, const uint8_t** src, const int32_t** tap) {
  const int64_t n = r / (OH * OW), oh = (r / OW) % OH, ow = r % OW;
  int64_t count = 0;
  for (int64_t i = 0; i < KH; ++i) {
    const int64_t ih = oh * sh - ph + i * dh;
    if (ih < 0 || ih >= H) continue;
    for (int64_t j = 0; j < KW; ++j) {
      const int64_t iw = ow * sw - pw + j * dw;
      if (iw < 0 || iw >= W) continue;
      src[count] = x + ((n * H + ih) * W + iw) * C;
      tap[count++] = taps + (i * KW + j) * C;
    }
  }
  return count;
}

// Depthwise accumulators (zero point subtracted, so padding adds nothing) for output rows
// [begin, end) of the flattened [N * OH * OW] image, C channels each.  Eight channels at a
// time stay in a register across the row's in-bounds taps: one store per row and block.
__attribute__((target("avx2,fma"))) void depthwise_rows(
    const uint8_t* x, int32_t x_zp, const int32_t* taps, int64_t C, int64_t H, int64_t W,
    int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph,
    int64_t pw, int64_t dh, int64_t dw, int64_t begin, int64_t end, int32_t* acc) {
  std::vector<const uint8_t*> src(KH * KW);
  std::vector<const int32_t*> tap(KH * KW);
  const __m256i zp = _mm256_set1_epi32(x_zp);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t count = in_bounds_taps(x, taps, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh,
                                         dw, r, src.data(), tap.data());
    int32_t* a = acc + r * C;
    int64_t c = 0;
    for (; c + 32 <= C; c += 32) {  // four independent sums: mullo's latency overlaps
      __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = 0; k < count; ++k) {
        const __m128i xb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[k] + c));
        const __m128i xb2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src[k] + c + 16));
        const __m256i* t = reinterpret_cast<const __m256i*>(tap[k] + c);
        s0 = _mm256_add_epi32(s0, _mm256_mullo_epi32(
                 _mm256_sub_epi32(_mm256_cvtepu8_epi32(xb), zp), _mm256_loadu_si256(t)));
        s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(
                 _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(xb, 8)), zp),
                 _mm256_loadu_si256(t + 1)));
        s2 = _mm256_add_epi32(s2, _mm256_mullo_epi32(
                 _mm256_sub_epi32(_mm256_cvtepu8_epi32(xb2), zp), _mm256_loadu_si256(t + 2)));
        s3 = _mm256_add_epi32(s3, _mm256_mullo_epi32(
                 _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_srli_si128(xb2, 8)), zp),
                 _mm256_loadu_si256(t + 3)));
      }
      __m256i* out = reinterpret_cast<__m256i*>(a + c);
      _mm256_storeu_si256(out, s0);
      _mm256_storeu_si256(out + 1, s1);
      _mm256_storeu_si256(out + 2, s2);
      _mm256_storeu_si256(out + 3, s3);
    }
    for (; c + 8 <= C; c += 8) {
      __m256i sum = _mm256_setzero_si256();
      for (int64_t k = 0; k < count; ++k) {
        const __m256i xv = _mm256_cvtepu8_epi32(
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(src[k] + c)));
        const __m256i tv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tap[k] + c));
        sum = _mm256_add_epi32(sum, _mm256_mullo_epi32(_mm256_sub_epi32(xv, zp), tv));
      }
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + c), sum);
    }
    for (; c < C; ++c) {
      int32_t sum = 0;
      for (int64_t k = 0; k < count; ++k)
        sum += (static_cast<int32_t>(src[k][c]) - x_zp) * tap[k][c];
      a[c] = sum;
    }
  }
}

// (x - x_zp) * tap for sixteen channels (those in m).
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline __m512i depthwise_term(
    __m512i zp, const uint8_t* x, const int32_t* tap, __mmask16 m) {
  return _mm512_mullo_epi32(
      _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, x)), zp),
      _mm512_maskz_loadu_epi32(m, tap));
}

// depthwise_rows with AVX-512: sixty-four channels at a time in four registers, then sixteen,
// the tail masked; the same exact int32 sums.
__attribute__((target("avx512f,avx512bw,avx512vl"))) void depthwise_rows512(
    const uint8_t* x, int32_t x_zp, const int32_t* taps, int64_t C, int64_t H, int64_t W,
    int64_t OH, int64_t OW, int64_t KH, int64_t KW, int64_t sh, int64_t sw, int64_t ph,
    int64_t pw, int64_t dh, int64_t dw, int64_t begin, int64_t end, int32_t* acc) {
  std::vector<const uint8_t*> src(KH * KW);
  std::vector<const int32_t*> tap(KH * KW);
  const __m512i zp = _mm512_set1_epi32(x_zp);
  for (int64_t r = begin; r < end; ++r) {
    const int64_t count = in_bounds_taps(x, taps, C, H, W, OH, OW, KH, KW, sh, sw, ph, pw, dh,
                                         dw, r, src.data(), tap.data());
    int32_t* a = acc + r * C;
    int64_t c = 0;
    const __mmask16 all = 0xFFFF;
    for (; c + 64 <= C; c += 64) {
      __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
      for (int64_t k = 0; k < count; ++k) {
        s0 = _mm512_add_epi32(s0, depthwise_term(zp, src[k] + c, tap[k] + c, all));
        s1 = _mm512_add_epi32(s1, depthwise_term(zp, src[k] + c + 16, tap[k] + c + 16, all));
        s2 = _mm512_add_epi32(s2, depthwise_term(zp, src[k] + c + 32, tap[k] + c + 32, all));
        s3 = _mm512_add_epi32(s3, depthwise_term(zp, src[k] + c + 48, tap[k] + c + 48, all));
      }
      _mm512_storeu_si512(a + c, s0);
      _mm512_storeu_si512(a + c + 16, s1);
      _mm512_storeu_si512(a + c + 32, s2);
      _mm512_storeu_si512(a + c + 48, s3);
    }
    for (; c < C; c += 16) {
      const __mmask16 m = C - c >= 16 ? all : __mmask16((1u << (C - c)) - 1);
      __m512i sum = _mm512_setzero_si512();
      for (int64_t k = 0; k < count; ++k)
        sum = _mm512_add_epi32(sum, depthwise_term(zp, src[k] + c, tap[k] + c, m));
      _mm512_mask_storeu_epi32(a + c, m, sum);
    }
  }
}

int64_t out_dim(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// How the AMX conv forms its A tiles (see amx_conv).
enum class AmxLayout { kDirect, kFlat, kHalves, kIm2col };

// The AMX conv splits columns across threads for every row block (see amx_conv) when it has
// fewer than this many row blocks per thread and a packed weight of at least this many bytes.
constexpr int64_t kColumnSplitMaxBlocks = 8;
constexpr int64_t kColumnSplitMinWeightBytes = int64_t{1} << 19;

// A layout tests force where it applies (-1: the estimate's choice).
std::atomic<int> forced_layout{-1};

// groups == 1 on AMX.  In the input padded with its zero point ([N][Hp][Wp][IC]), kernel row kh
// of an undilated conv's output pixel (oh, ow) is the run of KW * IC bytes at
// ((oh * sh + kh) * Wp + ow * sw) * IC, and pixels along a row are sw * IC bytes apart: a tile of
// 16 output pixels is one strided load, no im2col.  The rows of a 32-row block are laid out as
//   kDirect  a 1x1 unpadded stride-1 conv: the input's own pixels, read in place;
//   kFlat    q = oh * Wp + ow over one image (equal strides), the rows with ow >= OW computed and
//            dropped: few wasted rows when OW is close to Wp;
//   kHalves  16 pixels of one output row per tile (two per block): nothing wasted when OW is a
//            multiple of 16, whatever the stride;
//   kIm2col  a copied block (dilated convs; small images, where the others are mostly padding).
// The cheapest by a rough estimate (ns: a 64-deep step of one 32x32 block, a copied run) runs.
// Per block: the tile GEMM, then the epilogue from the block's accumulators; few blocks split
// the output channels as well, so both cores work.
void amx_conv(const uint8_t* x, uint8_t x_zp, int64_t N, int64_t IC, int64_t H, int64_t W,
              int64_t OC, int64_t KH, int64_t KW, int64_t OH, int64_t OW,
              at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation,
              const AmxPackedB& b, const Epilogue& e, void* out) {
  const int64_t run_p = amx_run_pitch(KW, IC), steps = b.Kp / kAmxK;
  const int64_t sh = stride[0], sw = stride[1], dh = dilation[0], dw = dilation[1];
  const int64_t ph = padding[0], pw = padding[1];
  const int64_t Hp = H + 2 * ph, Wp = W + 2 * pw, M = N * OH * OW;
  const int64_t half_row_tiles = (OW + 15) / 16, halves = N * OH * half_row_tiles;
  const auto blocks_of = [](int64_t rows) { return (rows + kAmxRows - 1) / kAmxRows; };
  const int64_t flat_blocks_per_image = blocks_of(OH * Wp), half_blocks = (halves + 1) / 2;
  const bool undilated = dh == 1 && dw == 1;
  AmxLayout layout = AmxLayout::kIm2col;
  if (KH == 1 && KW == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0) {
    layout = AmxLayout::kDirect;
  } else if (undilated) {
    const double step_ns = 40.0 * (b.Np / kAmxN) * steps;
    const double run_ns = 5.0 + KW * IC / 32.0;
    double best = blocks_of(M) * (step_ns + kAmxRows * KH * run_ns);
    if (half_blocks * step_ns < best) {
      best = half_blocks * step_ns;
      layout = AmxLayout::kHalves;
    }
    if (sh == sw && N * flat_blocks_per_image * step_ns < best) layout = AmxLayout::kFlat;
  }
  const int forced = forced_layout.load();
  if (forced == static_cast<int>(AmxLayout::kIm2col) ||
      (forced == static_cast<int>(AmxLayout::kHalves) && undilated) ||
      (forced == static_cast<int>(AmxLayout::kFlat) && undilated && sh == sw)) {
    layout = static_cast<AmxLayout>(forced);
  }
  const int64_t blocks = layout == AmxLayout::kHalves ? half_blocks
                         : layout == AmxLayout::kFlat ? N * flat_blocks_per_image
                                                      : blocks_of(M);
  const bool copies = layout == AmxLayout::kIm2col;
  std::vector<int64_t> a_steps(steps);
  for (int64_t i = 0; i < steps; ++i) {
    const int64_t kh = i * kAmxK / run_p, j = i * kAmxK % run_p;
    a_steps[i] = copies ? i * kAmxK : kh * Wp * IC + j;
  }
  // the padded input, with slack past its end for the rows computed and dropped; an unpadded
  // conv reads its input in place and copies only the last image (whose dropped rows would read
  // past the input's end)
  at::Tensor padded;
  const uint8_t* src = x;
  const uint8_t* last_image = nullptr;
  int64_t img_pitch = H * W * IC;
  if (layout != AmxLayout::kDirect) {
    const bool unpadded = ph == 0 && pw == 0;
    img_pitch = Hp * Wp * IC;
    const int64_t flat_end = (sh * (flat_blocks_per_image * kAmxRows - 1) + (KH - 1) * Wp) * IC;
    const int64_t images = unpadded ? 1 : N;
    const int64_t bytes = (images - 1) * img_pitch + std::max(img_pitch, flat_end) +
                          ((OW + 16) * sw + Wp) * IC + run_p + kAmxK;
    padded = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
    uint8_t* p = padded.data_ptr<uint8_t>();
    std::memset(p + images * img_pitch, 0, bytes - images * img_pitch);
    const int64_t first = unpadded ? N - 1 : 0;  // the images copied
    at::parallel_for(0, images * Hp, 16, [&](int64_t begin, int64_t end) {
      for (int64_t row = begin; row < end; ++row) {
        const int64_t n = row / Hp + first, h = row % Hp - ph;
        uint8_t* dst = p + row * Wp * IC;
        if (h < 0 || h >= H) {
          std::memset(dst, x_zp, Wp * IC);
          continue;
        }
        std::memset(dst, x_zp, pw * IC);
        std::memcpy(dst + pw * IC, x + (n * H + h) * W * IC, W * IC);
        std::memset(dst + (pw + W) * IC, x_zp, pw * IC);
      }
    });
    if (unpadded) {
      last_image = p;
    } else {
      src = p;
    }
  }
  // the first tap of output pixel (n, oh, ow) in the (padded) input
  const auto pixel = [&](int64_t n, int64_t oh, int64_t ow) {
    const uint8_t* image = last_image && n == N - 1 ? last_image : src + n * img_pitch;
    return image + ((oh * sh) * Wp + ow * sw) * IC;
  };
  const int64_t lda = copies ? b.Kp : sw * IC;
  const int64_t col_blocks = b.Np / kAmxN;
  const int64_t threads = at::get_num_threads();
  // Few row blocks against a large weight: each thread takes a share of the columns for every
  // row block (split-major tasks), so that it streams its share of B from memory once and
  // re-reads it from its own cache, where a row block per thread would stream all of B on
  // every thread.
  const bool column_major = blocks >= threads && blocks < kColumnSplitMaxBlocks * threads &&
                            b.Kp * b.Np >= kColumnSplitMinWeightBytes && col_blocks >= threads;
  const int64_t col_splits =
      column_major ? threads
      : blocks >= threads ? 1 : std::min(col_blocks, (threads + blocks - 1) / blocks);
  const int64_t end_of_x = N * H * W * IC;
  at::parallel_for(0, blocks * col_splits, 1, [&](int64_t begin, int64_t end) {
    std::vector<uint8_t> local;  // an im2col block, or the direct input's last rows
    std::unique_ptr<int32_t[], AmxPackedB::Free> c_mem(static_cast<int32_t*>(
        std::aligned_alloc(64, kAmxRows * b.Np * sizeof(int32_t))));
    int32_t* c = c_mem.get();
    int64_t have = -1, count = 0;
    int64_t acc_rows[kAmxRows], out_rows[kAmxRows];
    const uint8_t* a = nullptr;
    const uint8_t* a_hi = nullptr;
    amx_tiles_begin();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t block = column_major ? task % blocks : task / col_splits;
      const int64_t split = column_major ? task / blocks : task % col_splits;
      if (block != have) {  // the block's A rows and the output row of each accumulator row
        have = block;
        count = 0;
        switch (layout) {
          case AmxLayout::kDirect: {
            const int64_t r0 = block * kAmxRows;
            a = x + r0 * IC;
            if ((r0 + kAmxRows - 1) * IC + run_p > end_of_x) {  // would read past the input
              local.assign(kAmxRows * IC + run_p, 0);
              std::memcpy(local.data(), a, (M - r0) * IC);
              a = local.data();
            }
            a_hi = a + 16 * lda;
            for (int64_t i = 0; i < kAmxRows && r0 + i < M; ++i, ++count) {
              acc_rows[count] = i;
              out_rows[count] = r0 + i;
            }
            break;
          }
          case AmxLayout::kIm2col: {
            const int64_t r0 = block * kAmxRows;
            local.assign(kAmxRows * b.Kp, 0);
            for (int64_t i = 0; i < kAmxRows && r0 + i < M; ++i, ++count) {
              const int64_t r = r0 + i, n = r / (OH * OW), oh = r / OW % OH, ow = r % OW;
              const uint8_t* from = pixel(n, oh, ow);
              for (int64_t kh = 0; kh < KH; ++kh) {
                uint8_t* dst = local.data() + i * b.Kp + kh * run_p;
                const uint8_t* row = from + kh * dh * Wp * IC;
                if (dw == 1) {
                  std::memcpy(dst, row, KW * IC);
                } else {
                  for (int64_t kw = 0; kw < KW; ++kw)
                    std::memcpy(dst + kw * IC, row + kw * dw * IC, IC);
                }
              }
              acc_rows[count] = i;
              out_rows[count] = r;
            }
            a = local.data();
            a_hi = a + 16 * lda;
            break;
          }
          case AmxLayout::kFlat: {
            const int64_t img = block / flat_blocks_per_image;
            const int64_t q0 = block % flat_blocks_per_image * kAmxRows;
            a = pixel(img, 0, 0) + sh * q0 * IC;
            a_hi = a + 16 * lda;
            for (int64_t i = 0; i < kAmxRows && q0 + i < OH * Wp; ++i) {
              const int64_t oh = (q0 + i) / Wp, ow = (q0 + i) % Wp;
              if (ow >= OW) continue;
              acc_rows[count] = i;
              out_rows[count++] = (img * OH + oh) * OW + ow;
            }
            break;
          }
          case AmxLayout::kHalves: {
            for (int64_t half = 0; half < 2; ++half) {
              const int64_t h = std::min(2 * block + half, halves - 1);
              const int64_t row_of_out = h / half_row_tiles, ow0 = h % half_row_tiles * 16;
              const uint8_t* base = pixel(row_of_out / OH, row_of_out % OH, ow0);
              (half == 0 ? a : a_hi) = base;
              if (2 * block + half >= halves) continue;  // garbage rows, dropped
              for (int64_t r = 0; r < 16 && ow0 + r < OW; ++r, ++count) {
                acc_rows[count] = half * 16 + r;
                out_rows[count] = row_of_out * OW + ow0 + r;
              }
            }
            break;
          }
        }
      }
      const int64_t n0 = col_blocks * split / col_splits * kAmxN;
      const int64_t n1 = col_blocks * (split + 1) / col_splits * kAmxN;
      amx_gemm_rows(a, a_hi, lda, a_steps.data(), b, n0, n1, c, b.Np);
      epilogue_block512(e, c, b.Np, acc_rows, out_rows, count, OC, n0, std::min(n1, OC), out);
    }
    amx_tiles_end();
  });
}

}  // namespace

// Force the AMX conv's layout ("direct", "flat", "halves", "im2col") where it applies, or "" for
// the estimate's choice: tests run every layout on every shape.
void amx_conv_force_layout(c10::string_view name) {
  static const char* names[] = {"direct", "flat", "halves", "im2col"};
  if (name.empty()) {
    forced_layout.store(-1);
    return;
  }
  for (int i = 0; i < 4; ++i) {
    if (name == names[i]) {
      forced_layout.store(i);
      return;
    }
  }
  TORCH_CHECK_VALUE(false, "amx_conv_force_layout: unknown layout '", std::string(name),
                    "' (direct, flat, halves, im2col or empty)");
}

at::Tensor qconv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                   const at::Tensor& weight, const at::Tensor& weight_scale,
                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                   at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                   const std::optional<at::Tensor>& other, double other_scale,
                   int64_t other_zero_point, c10::string_view unary, at::ArrayRef<double> scalars,
                   double out_scale, int64_t out_zero_point, at::ScalarType out_dtype) {
  const char* op = "torchquant_native::qconv2d";
  TORCH_CHECK_TYPE(x.scalar_type() == at::kByte && x.dim() == 4, op,
                   ": expected a 4-d uint8 activation, got ", x.scalar_type(), " ", x.sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kChar && weight.dim() == 4, op,
                   ": expected a 4-d int8 weight, got ", weight.scalar_type(), " ",
                   weight.sizes());
  TORCH_CHECK_VALUE(stride.size() == 2 && padding.size() == 2 && dilation.size() == 2, op,
                    ": stride, padding and dilation must have 2 values each");
  TORCH_CHECK_VALUE(out_dtype == at::kByte || out_dtype == at::kFloat, op,
                    ": out_dtype must be uint8 or float32, got ", out_dtype);
  const int64_t N = x.size(0), IC = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OC = weight.size(0), KH = weight.size(2), KW = weight.size(3);
  const bool depthwise = groups > 1 && groups == IC && OC == IC && weight.size(1) == 1;
  TORCH_CHECK_VALUE((groups == 1 && weight.size(1) == IC) || depthwise, op,
                    ": only groups=1 or depthwise convs, got groups=", groups, " for input ",
                    x.sizes(), " and weight ", weight.sizes());
  TORCH_CHECK_VALUE(weight_scale.scalar_type() == at::kFloat &&
                    (weight_scale.numel() == 1 || weight_scale.numel() == OC), op,
                    ": weight_scale must be float32 with 1 or ", OC, " values");
  TORCH_CHECK_VALUE(0 <= x_zero_point && x_zero_point <= 255 && 0 <= out_zero_point &&
                    out_zero_point <= 255, op, ": zero points must be in 0..255");
  Unary kind = Unary::kNone;
  float lo = 0.f, hi = 0.f;
  if (unary == "relu") {
    kind = Unary::kRelu;
  } else if (unary == "hardtanh") {
    TORCH_CHECK_VALUE(scalars.size() == 2, op, ": hardtanh takes [min, max]");
    kind = Unary::kHardtanh;
    lo = static_cast<float>(scalars[0]);
    hi = static_cast<float>(scalars[1]);
  } else {
    TORCH_CHECK_VALUE(unary == "none" || unary.empty(), op, ": unknown unary post-op '",
                      std::string(unary), "' (none, relu, hardtanh)");
  }
  const int64_t OH = out_dim(H, KH, stride[0], padding[0], dilation[0]);
  const int64_t OW = out_dim(W, KW, stride[1], padding[1], dilation[1]);
  TORCH_CHECK_VALUE(OH > 0 && OW > 0, op, ": the output would be empty for input ", x.sizes());
  auto out = at::empty({N, OC, OH, OW}, x.options().dtype(out_dtype),
                       at::MemoryFormat::ChannelsLast);
  at::Tensor other_cl;
  if (other.has_value() && other->defined()) {
    TORCH_CHECK_VALUE(other->scalar_type() == at::kByte && other->sizes() == out.sizes(), op,
                      ": the addend must be uint8 of the output's shape ", out.sizes());
    other_cl = other->contiguous(at::MemoryFormat::ChannelsLast);
  }
  at::Tensor bias_f;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK_VALUE(bias->numel() == OC, op, ": bias must have ", OC, " values");
    bias_f = bias->to(at::kFloat).contiguous();
  }
  const int64_t M = N * OH * OW;
  if (M == 0) return out;
  auto xc = x.contiguous(at::MemoryFormat::ChannelsLast);
  const uint8_t* xp = xc.data_ptr<uint8_t>();
  auto pack = cached_pack(weight, depthwise);
  // per-channel epilogue operands in the calling thread's kept buffers (two allocations per
  // call otherwise); the workers read them while this call waits for them
  float* comb = comb_scratch.get<float>(OC);
  int32_t* zp_corr = zp_corr_scratch.get<int32_t>(OC);
  std::fill(zp_corr, zp_corr + OC, 0);
  const float xs = static_cast<float>(x_scale);
  const float* ws = weight_scale.data_ptr<float>();
  for (int64_t c = 0; c < OC; ++c) {
    const float w_scale = ws[weight_scale.numel() == 1 ? 0 : c];
    comb[c] = depthwise ? w_scale : xs * w_scale;
    if (!depthwise) zp_corr[c] = static_cast<int32_t>(x_zero_point) * pack->col_sums[c];
  }
  const Epilogue e{comb, depthwise ? xs : 0.0f, zp_corr,
                   bias_f.defined() ? bias_f.data_ptr<float>() : nullptr,
                   other_cl.defined() ? other_cl.data_ptr<uint8_t>() : nullptr,
                   static_cast<float>(other_scale), static_cast<float>(other_zero_point), kind,
                   lo, hi, out_dtype == at::kByte, 1.0f / static_cast<float>(out_scale),
                   static_cast<float>(out_zero_point)};
  void* outp = out.data_ptr();
  if (!depthwise && pack->amx) {
    amx_conv(xp, static_cast<uint8_t>(x_zero_point), N, IC, H, W, OC, KH, KW, OH, OW, stride,
             padding, dilation, pack->amx_b, e, outp);
    return out;
  }
  at::Tensor acc_tensor;  // only for accumulators too large to keep between calls
  int32_t* accp = nullptr;
  if (M * OC <= kScratchAccMax) {
    accp = acc_scratch.get<int32_t>(M * OC);
  } else {
    acc_tensor = at::empty({M, OC}, x.options().dtype(at::kInt));
    accp = acc_tensor.data_ptr<int32_t>();
  }
  const int num_tasks = at::get_num_threads();
  if (depthwise) {
    const bool wide = wide_loops();
    at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
      (wide ? depthwise_rows512 : depthwise_rows)(
          xp, static_cast<int32_t>(x_zero_point), pack->taps.data(), OC, H, W, OH, OW, KH, KW,
          stride[0], stride[1], padding[0], padding[1], dilation[0], dilation[1], begin, end,
          accp);
      epilogue_rows(e, accp, begin, end, OC, wide, outp);
    });
    return out;
  } else {
    // Never saturated integers: where fbgemm's u8 x s8 pairs saturate (no VNNI, or forced
    // lower) codes of 128 and above take the high-bit split (above).
    // (a padding code of 128 or above, the zero point, takes the split through the dense
    // second GEMM, whose im2col pads with the code's high bit)
    const bool padded = padding[0] != 0 || padding[1] != 0;
    const bool high_padding = !fbgemm_exact_u8() && padded && x_zero_point >= 128;
    const int64_t high_codes = fbgemm_exact_u8() ? 0 : count_high_codes(xp, xc.numel());
    const bool split = high_codes > 0 || high_padding;
    const bool dense_high =
        high_padding || high_codes * 1000 > kDenseHighPerMille * xc.numel();
    at::Tensor lo_tensor, hi_tensor, hi_acc;
    if (split) {
      lo_tensor = at::empty_like(xc);
      if (dense_high) {
        hi_tensor = at::empty_like(xc);
        hi_acc = at::empty({M, OC}, x.options().dtype(at::kInt));
      }
      split_codes(xp, lo_tensor.data_ptr<uint8_t>(),
                  dense_high ? hi_tensor.data_ptr<uint8_t>() : nullptr, xc.numel());
    }
    const uint8_t* lo_x = split ? lo_tensor.data_ptr<uint8_t>() : xp;
    const bool pointwise = KH == 1 && KW == 1 && stride[0] == 1 && stride[1] == 1 &&
                           padding[0] == 0 && padding[1] == 0;
    fbgemm::conv_param_t<2> conv_p(
        static_cast<int>(N), static_cast<int>(IC), static_cast<int>(OC),
        {static_cast<int>(H), static_cast<int>(W)}, 1, {static_cast<int>(KH), static_cast<int>(KW)},
        {static_cast<int>(stride[0]), static_cast<int>(stride[1])},
        {static_cast<int>(padding[0]), static_cast<int>(padding[1]), static_cast<int>(padding[0]),
         static_cast<int>(padding[1])},
        {static_cast<int>(dilation[0]), static_cast<int>(dilation[1])});
    // A conv this small runs on the calling thread: waking the others costs more than it saves.
    const bool serial = M * KH * KW * IC * OC <= kSerialConvMacs;
    const int tasks = serial ? 1 : num_tasks;
    // acc = the GEMM of codes a (padding's code pad) with the weight, one task's share
    auto gemm_of = [&](const uint8_t* a, int32_t pad, int32_t* acc, int64_t begin, int64_t end) {
      fbgemm::DoNothing<int32_t, int32_t> done;
      fbgemm::memCopy<> copy(done);
      for (int64_t task = begin; task < end; ++task) {
        if (pointwise) {
          using PackA = fbgemm::PackAMatrix<uint8_t>;
          auto* buf = packed_a_scratch.get<uint8_t>(PackA::packedBufferSize());
          PackA packA(fbgemm::matrix_op_t::NoTranspose, static_cast<int32_t>(M),
                      static_cast<int32_t>(IC), a, static_cast<int32_t>(IC), buf, 1);
          fbgemm::fbgemmPacked(packA, *pack->gemm, acc, acc, static_cast<int32_t>(OC), copy,
                               static_cast<int>(task), tasks);
        } else {
          using PackA = fbgemm::PackAWithIm2Col<uint8_t, int32_t, 2>;
          auto* buf = packed_a_scratch.get<uint8_t>(PackA::packedBufferSize());
          auto* row_offsets = row_offset_scratch.get<int32_t>(PackA::rowOffsetBufferSize());
          PackA packA(conv_p, a, buf, pad, row_offsets, /*b_symmetric=*/true);
          fbgemm::fbgemmPacked(packA, *pack->gemm, acc, acc, static_cast<int32_t>(OC), copy,
                               static_cast<int>(task), tasks);
        }
      }
    };
    const int32_t pad_code = static_cast<int32_t>(x_zero_point);
    auto gemm = [&](int64_t begin, int64_t end) {
      gemm_of(lo_x, split ? pad_code & 0x7f : pad_code, accp, begin, end);
      if (dense_high) {
        gemm_of(hi_tensor.data_ptr<uint8_t>(), pad_code >> 7, hi_acc.data_ptr<int32_t>(), begin,
                end);
      }
    };
    const bool wide = wide_loops();
    auto epilogue = [&](int64_t begin, int64_t end) {
      epilogue_rows(e, accp, begin, end, OC, wide, outp);
    };
    auto high = [&]() {
      if (dense_high) {
        const int32_t* h = hi_acc.data_ptr<int32_t>();
        at::parallel_for(0, M * OC, 1 << 14, [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) accp[i] += h[i] * 128;
        });
      } else if (split) {
        add_high_codes(xp, N, IC, H, W, OC, KH, KW, OH, OW, stride, padding, dilation,
                       pack->high_taps.data(), accp);
      }
    };
    if (serial) {
      gemm(0, 1);
      high();
      epilogue(0, M);
      return out;
    }
    at::parallel_for(0, num_tasks, 1, gemm);
    high();
    at::parallel_for(0, M, std::max<int64_t>(1, 4096 / OC), epilogue);
  }
  return out;
}

// qconv2d where the batch is at most native_max_batch, else oneDNN's call on its prepacked
// weight: one op for a graph compiled with a symbolic batch, whose convs the native kernel wins
// at small batches and oneDNN's at large ones (torchquant.kernels.native.conv_preferred).  The
// oneDNN call is the one the compile lowering makes otherwise (the addend copied, as oneDNN
// sums into it in place); it is called boxed: its argument conversion is small beside a conv
// large enough to reach it.
at::Tensor qconv2d_or_onednn(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                             const at::Tensor& weight, const at::Tensor& weight_scale,
                             const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                             at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                             const std::optional<at::Tensor>& other, double other_scale,
                             int64_t other_zero_point, c10::string_view unary,
                             at::ArrayRef<double> scalars, double out_scale,
                             int64_t out_zero_point, at::ScalarType out_dtype,
                             int64_t native_max_batch, const at::Tensor& onednn_weight,
                             const at::Tensor& weight_zero_point) {
  if (x.dim() != 4 || x.size(0) <= native_max_batch) {  // (qconv2d names a bad input)
    return qconv2d(x, x_scale, x_zero_point, weight, weight_scale, bias, stride, padding,
                   dilation, groups, other, other_scale, other_zero_point, unary, scalars,
                   out_scale, out_zero_point, out_dtype);
  }
  c10::List<std::optional<c10::Scalar>> unary_scalars;
  for (double v : scalars) unary_scalars.push_back(c10::Scalar(v));
  const bool binary = other.has_value() && other->defined();
  static const auto pointwise =
      c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qconv_pointwise", "");
  static const auto with_sum =
      c10::Dispatcher::singleton().findSchemaOrThrow("onednn::qconv2d_pointwise", "binary");
  std::vector<c10::IValue> stack{x, x_scale, x_zero_point, onednn_weight, weight_scale,
                                 weight_zero_point};
  if (binary) stack.emplace_back(other->clone(at::MemoryFormat::ChannelsLast));
  stack.emplace_back(bias);
  stack.emplace_back(stride);
  stack.emplace_back(padding);
  stack.emplace_back(dilation);
  stack.emplace_back(groups);
  stack.emplace_back(out_scale);
  stack.emplace_back(out_zero_point);
  stack.emplace_back(out_dtype);
  if (binary) {
    stack.emplace_back(other_scale);
    stack.emplace_back(other_zero_point);
    stack.emplace_back(std::string("sum"));
    stack.emplace_back(c10::Scalar(1.0));
  }
  stack.emplace_back(std::string(unary.empty() ? "none" : unary));
  stack.emplace_back(unary_scalars);
  stack.emplace_back(std::string(""));
  (binary ? with_sum : pointwise).callBoxed(&stack);
  return stack.at(0).toTensor();
}

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("amx_conv_force_layout(str name) -> ()", &torchquant_native::amx_conv_force_layout);
  m.def("qconv2d(Tensor x, float x_scale, int x_zero_point, Tensor weight, Tensor weight_scale, "
        "Tensor? bias, int[] stride, int[] padding, int[] dilation, int groups, Tensor? other, "
        "float other_scale, int other_zero_point, str unary, float[] scalars, float out_scale, "
        "int out_zero_point, ScalarType out_dtype) -> Tensor");
  m.def("qconv2d_or_onednn(Tensor x, float x_scale, int x_zero_point, Tensor weight, "
        "Tensor weight_scale, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
        "int groups, Tensor? other, float other_scale, int other_zero_point, str unary, "
        "float[] scalars, float out_scale, int out_zero_point, ScalarType out_dtype, "
        "int native_max_batch, Tensor onednn_weight, Tensor weight_zero_point) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("qconv2d", &torchquant_native::qconv2d);
  m.impl("qconv2d_or_onednn", &torchquant_native::qconv2d_or_onednn);
}

// The oneDNN-packed weight is an MkldnnCPU tensor: the dispatcher picks that key.
TORCH_LIBRARY_IMPL(torchquant_native, MkldnnCPU, m) {
  m.impl("qconv2d_or_onednn", &torchquant_native::qconv2d_or_onednn);
}

}  // namespace torchquant_native
