// Float32 scaled dot-product attention for short sequences, one head at a time:
//
//   out[i] = sum_j p[i, j] * v[j] / sum_j p[i, j],  p[i, j] = exp(s[i, j] - max_j s[i, j]),
//   s[i, j] = (q[i] . k[j]) * scale + mask[i, j]
//
// The quantized encoders torchquant compiles (all-MiniLM: 12 heads of 32, 128 tokens) spent a
// large share of a forward in ATen's CPU flash attention, whose blocking is made for long
// sequences (BENCHMARKS.md, 2026-12-07 eleventh session).
// Here a head's K is packed transposed once, four query rows at a time get their scores in
// registers, their softmax and their weighted sum of V, all within a thread's cache.  Rows
// whose mask is -inf everywhere give zeros, as ATen's flash attention does; a NaN among a row's
// scores makes the row NaN (ATen's flash attention returns zeros for a row of NaN scores).
// Float32 results differ from ATen's in rounding only (another summation order and exp
// polynomial; bounded in tests/kernels/test_native_attention.py).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "attention.h"

namespace torchquant_native {
namespace {

constexpr int kRows = 4;  // query rows per block
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One head's operands: row pointers and strides of q, k, v, the mask's, and the output's.
struct Head {
  const float* q;
  int64_t q_row;
  const float* k;
  int64_t k_row;
  const float* v;
  int64_t v_row;
  const float* mask;  // null: no mask
  int64_t mask_row, mask_col;
  float* out;
  int64_t out_row;
  int64_t tq, tk, d, dv;
  float scale;
};

// ---- one vector width's arithmetic ------------------------------------------------------------
// Each struct gives its lane count and the handful of operations the kernel needs; the kernel
// below is written once over them.

struct Avx512 {
  static constexpr int kLanes = 16;
  using V = __m512;
  __attribute__((target("avx512f"))) static V zero() { return _mm512_setzero_ps(); }
  __attribute__((target("avx512f"))) static V set1(float x) { return _mm512_set1_ps(x); }
  __attribute__((target("avx512f"))) static V load(const float* p) { return _mm512_loadu_ps(p); }
  __attribute__((target("avx512f"))) static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  __attribute__((target("avx512f"))) static V fma(V a, V b, V c) {
    return _mm512_fmadd_ps(a, b, c);
  }
  __attribute__((target("avx512f"))) static V add(V a, V b) { return _mm512_add_ps(a, b); }
  __attribute__((target("avx512f"))) static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  __attribute__((target("avx512f"))) static V max(V a, V b) { return _mm512_max_ps(a, b); }
  __attribute__((target("avx512f"))) static float hmax(V a) { return _mm512_reduce_max_ps(a); }
  __attribute__((target("avx512f"))) static float hsum(V a) { return _mm512_reduce_add_ps(a); }
  __attribute__((target("avx512f"))) static V fnmadd(V a, V b, V c) {
    return _mm512_fnmadd_ps(a, b, c);
  }
  __attribute__((target("avx512f"))) static V round(V x) {
    return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  // 2^n for integer-valued n in [-126, 127]
  __attribute__((target("avx512f"))) static V pow2(V n) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  // value where x >= limit, 0 where x < limit, x where it is NaN
  __attribute__((target("avx512f"))) static V zero_below(V x, float limit, V value) {
    const V kept = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, set1(limit), _CMP_GE_OQ), value);
    return _mm512_mask_mov_ps(kept, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
  }
};

struct Avx2 {
  static constexpr int kLanes = 8;
  using V = __m256;
  __attribute__((target("avx2,fma"))) static V zero() { return _mm256_setzero_ps(); }
  __attribute__((target("avx2,fma"))) static V set1(float x) { return _mm256_set1_ps(x); }
  __attribute__((target("avx2,fma"))) static V load(const float* p) { return _mm256_loadu_ps(p); }
  __attribute__((target("avx2,fma"))) static void store(float* p, V x) {
    _mm256_storeu_ps(p, x);
  }
  __attribute__((target("avx2,fma"))) static V fma(V a, V b, V c) {
    return _mm256_fmadd_ps(a, b, c);
  }
  __attribute__((target("avx2,fma"))) static V add(V a, V b) { return _mm256_add_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  __attribute__((target("avx2,fma"))) static V max(V a, V b) { return _mm256_max_ps(a, b); }
  __attribute__((target("avx2,fma"))) static float hmax(V a) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
    return _mm_cvtss_f32(m);
  }
  __attribute__((target("avx2,fma"))) static float hsum(V a) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
  }
  __attribute__((target("avx2,fma"))) static V fnmadd(V a, V b, V c) {
    return _mm256_fnmadd_ps(a, b, c);
  }
  __attribute__((target("avx2,fma"))) static V round(V x) {
    return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  __attribute__((target("avx2,fma"))) static V pow2(V n) {
    return _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  __attribute__((target("avx2,fma"))) static V zero_below(V x, float limit, V value) {
    const V kept = _mm256_and_ps(_mm256_cmp_ps(x, set1(limit), _CMP_GE_OQ), value);
    return _mm256_blendv_ps(kept, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  }
};

// Whether a row of scores holds a NaN: then its output is NaN (a vector max can drop NaNs, and a
// row of NaNs would otherwise read as fully masked).
inline bool row_has_nan(const float* scores, int64_t n) {
  for (int64_t j = 0; j < n; ++j) {
    if (std::isnan(scores[j])) return true;
  }
  return false;
}

// exp(x) for x <= 0 (scores minus their row's max): 2^n * p(r) with n = round(x / ln 2),
// r = x - n ln 2 (in two parts) and Cephes' degree-6 polynomial for e^r; 0 below -87, NaN
// for NaN (a NaN score makes its row NaN, as in ATen's attention).
template <typename W>
__attribute__((always_inline)) inline typename W::V exp_nonpositive(typename W::V x) {
  using V = typename W::V;
  constexpr float kMin = -87.0f;
  constexpr float kPoly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                             4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
  const V clamped = W::max(x, W::set1(kMin));
  const V n = W::round(W::mul(clamped, W::set1(1.44269504088896341f)));
  const V r = W::fnmadd(n, W::set1(-2.12194440e-4f), W::fnmadd(n, W::set1(0.693359375f), clamped));
  V p = W::set1(kPoly[0]);
  for (int i = 1; i < 6; ++i) p = W::fma(p, r, W::set1(kPoly[i]));
  p = W::fma(p, W::mul(r, r), W::add(r, W::set1(1.0f)));
  return W::zero_below(x, kMin, W::mul(p, W::pow2(n)));
}

// Scratch of a worker thread: K transposed (d x padded tk) and a block's scores.
struct Scratch {
  std::vector<float> kt, scores;
};

// kt[d, j] = k[j, d] (d a multiple of 8), columns tk..tk_pad zero.  Blocks of 8 x 8 go
// through registers: element by element, the strided stores were a large part of the kernel.
__attribute__((target("avx2,fma"))) inline void pack_transposed(const Head& h, float* kt,
                                                                 int64_t tk_pad) {
  const int64_t tk8 = h.tk / 8 * 8;
  for (int64_t j = 0; j < tk8; j += 8) {
    for (int64_t d = 0; d < h.d; d += 8) {
      __m256 r[8], t[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(h.k + (j + i) * h.k_row + d);
      for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
      }
      for (int i = 0; i < 8; i += 4) {
        r[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
        r[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
        r[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
        r[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
      }
      for (int i = 0; i < 4; ++i) {
        _mm256_storeu_ps(kt + (d + i) * tk_pad + j, _mm256_permute2f128_ps(r[i], r[i + 4], 0x20));
        _mm256_storeu_ps(kt + (d + i + 4) * tk_pad + j,
                         _mm256_permute2f128_ps(r[i], r[i + 4], 0x31));
      }
    }
  }
  for (int64_t j = tk8; j < h.tk; ++j)
    for (int64_t d = 0; d < h.d; ++d) kt[d * tk_pad + j] = h.k[j * h.k_row + d];
  for (int64_t d = 0; d < h.d; ++d) std::fill(kt + d * tk_pad + h.tk, kt + (d + 1) * tk_pad, 0.0f);
}

// scores[r, j0 + c L ...] = (q[r] . kt[:, j0 + c L ...]) * scale for kRows rows, n vectors
template <typename W, int n>
__attribute__((always_inline)) inline void score_block(const float* const* q, const float* kt,
                                                       int64_t tk_pad, int64_t d_size,
                                                       int64_t j0, typename W::V scale,
                                                       float* scores, int rows) {
  using V = typename W::V;
  constexpr int L = W::kLanes;
  V acc[kRows][n];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < n; ++c) acc[r][c] = W::zero();
  for (int64_t d = 0; d < d_size; ++d) {
    V kv[n];
    for (int c = 0; c < n; ++c) kv[c] = W::load(kt + d * tk_pad + j0 + c * L);
    for (int r = 0; r < kRows; ++r) {
      const V qb = W::set1(q[r][d]);
      for (int c = 0; c < n; ++c) acc[r][c] = W::fma(qb, kv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < n; ++c)
      W::store(scores + r * tk_pad + j0 + c * L, W::mul(acc[r][c], scale));
}

// out[r, e0 + c L ...] = sum_j p[r, j] v[j, e0 + c L ...] * inv_sum[r], n vectors
template <typename W, int n>
__attribute__((always_inline)) inline void value_block(const Head& h, const float* p,
                                                       int64_t tk_pad, int64_t e0,
                                                       const float* inv_sum, int64_t i0,
                                                       int rows) {
  using V = typename W::V;
  constexpr int L = W::kLanes;
  V acc[kRows][n];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < n; ++c) acc[r][c] = W::zero();
  for (int64_t j = 0; j < h.tk; ++j) {
    const float* vj = h.v + j * h.v_row + e0;
    V vv[n];
    for (int c = 0; c < n; ++c) vv[c] = W::load(vj + c * L);
    for (int r = 0; r < kRows; ++r) {
      const V pb = W::set1(p[r * tk_pad + j]);
      for (int c = 0; c < n; ++c) acc[r][c] = W::fma(pb, vv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    const V inv = W::set1(inv_sum[r]);
    for (int c = 0; c < n; ++c)
      W::store(h.out + (i0 + r) * h.out_row + e0 + c * L, W::mul(acc[r][c], inv));
  }
}

// The attention of one head, with vectors of W (tk padded to whole vectors; the padding's
// scores are -inf).
template <typename W, int kCols>
__attribute__((always_inline)) inline void head_vectorized(const Head& h, Scratch& s) {
  using V = typename W::V;
  constexpr int L = W::kLanes;
  const int64_t tk_pad = (h.tk + L - 1) / L * L, tk_full = h.tk / L * L;
  s.kt.resize(static_cast<size_t>(h.d * tk_pad));
  s.scores.resize(static_cast<size_t>(kRows * tk_pad));
  float* kt = s.kt.data();
  float* scores = s.scores.data();
  pack_transposed(h, kt, tk_pad);
  const V scale = W::set1(h.scale);
  for (int64_t i0 = 0; i0 < h.tq; i0 += kRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kRows, h.tq - i0));
    const float* q[kRows];
    for (int r = 0; r < kRows; ++r) q[r] = h.q + (i0 + std::min(r, rows - 1)) * h.q_row;
    // kCols vectors of columns at a time, then the rest: widths known at compile time, so
    // the accumulators stay in registers
    int64_t j = 0;
    for (; j + kCols * L <= tk_pad; j += kCols * L)
      score_block<W, kCols>(q, kt, tk_pad, h.d, j, scale, scores, rows);
    switch ((tk_pad - j) / L) {
      case 3: score_block<W, 3 % kCols>(q, kt, tk_pad, h.d, j, scale, scores, rows); break;
      case 2: score_block<W, 2 % kCols>(q, kt, tk_pad, h.d, j, scale, scores, rows); break;
      case 1: score_block<W, 1>(q, kt, tk_pad, h.d, j, scale, scores, rows); break;
      default: break;
    }
    // mask, padding, softmax numerators, and the rows' sums
    float inv_sum[kRows];
    for (int r = 0; r < rows; ++r) {
      float* sr = scores + r * tk_pad;
      if (h.mask != nullptr) {
        const float* m = h.mask + (i0 + r) * h.mask_row;
        if (h.mask_col == 0) {
          const V mb = W::set1(m[0]);
          for (int64_t j = 0; j < tk_full; j += L) W::store(sr + j, W::add(W::load(sr + j), mb));
          for (int64_t j = tk_full; j < h.tk; ++j) sr[j] += m[0];
        } else {
          for (int64_t j = 0; j < tk_full; j += L)
            W::store(sr + j, W::add(W::load(sr + j), W::load(m + j)));
          for (int64_t j = tk_full; j < h.tk; ++j) sr[j] += m[j];
        }
      }
      std::fill(sr + h.tk, sr + tk_pad, kNegInf);
      V mx = W::set1(kNegInf);
      for (int64_t j = 0; j < tk_pad; j += L) mx = W::max(mx, W::load(sr + j));
      float row_max = W::hmax(mx);
      if (row_max == kNegInf && row_has_nan(sr, h.tk)) row_max = std::nanf("");
      if (row_max == kNegInf) {  // every key masked: zeros, as ATen's flash attention
        std::fill(sr, sr + tk_pad, 0.0f);
        inv_sum[r] = 0.0f;
        continue;
      }
      const V neg_max = W::set1(-row_max);
      V sum = W::zero();
      for (int64_t j = 0; j < tk_pad; j += L) {
        const V p = exp_nonpositive<W>(W::add(W::load(sr + j), neg_max));
        W::store(sr + j, p);
        sum = W::add(sum, p);
      }
      inv_sum[r] = 1.0f / W::hsum(sum);
    }
    int64_t e = 0;
    for (; e + kCols * L <= h.dv; e += kCols * L)
      value_block<W, kCols>(h, scores, tk_pad, e, inv_sum, i0, rows);
    switch ((h.dv - e) / L) {
      case 3: value_block<W, 3 % kCols>(h, scores, tk_pad, e, inv_sum, i0, rows); break;
      case 2: value_block<W, 2 % kCols>(h, scores, tk_pad, e, inv_sum, i0, rows); break;
      case 1: value_block<W, 1>(h, scores, tk_pad, e, inv_sum, i0, rows); break;
      default: break;
    }
  }
}

__attribute__((target("avx512f"))) void head_avx512(const Head& h, Scratch& s) {
  head_vectorized<Avx512, 4>(h, s);
}

__attribute__((target("avx2,fma"))) void head_avx2(const Head& h, Scratch& s) {
  head_vectorized<Avx2, 2>(h, s);
}

void head_scalar(const Head& h, Scratch& s) {
  s.scores.resize(static_cast<size_t>(h.tk));
  float* sr = s.scores.data();
  for (int64_t i = 0; i < h.tq; ++i) {
    const float* qi = h.q + i * h.q_row;
    float row_max = kNegInf;
    for (int64_t j = 0; j < h.tk; ++j) {
      const float* kj = h.k + j * h.k_row;
      float dot = 0.0f;
      for (int64_t d = 0; d < h.d; ++d) dot += qi[d] * kj[d];
      float score = dot * h.scale;
      if (h.mask != nullptr) score += h.mask[i * h.mask_row + j * h.mask_col];
      sr[j] = score;
      row_max = std::max(row_max, score);
    }
    if (row_max == kNegInf && row_has_nan(sr, h.tk)) row_max = std::nanf("");
    float* oi = h.out + i * h.out_row;
    if (row_max == kNegInf) {
      std::fill(oi, oi + h.dv, 0.0f);
      continue;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < h.tk; ++j) {
      sr[j] = std::exp(sr[j] - row_max);
      sum += sr[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < h.dv; ++e) {
      float acc = 0.0f;
      for (int64_t j = 0; j < h.tk; ++j) acc += sr[j] * h.v[j * h.v_row + e];
      oi[e] = acc * inv;
    }
  }
}

// q, k, v with their last dimension contiguous (made so where it is not)
at::Tensor last_dim_contiguous(const at::Tensor& t) {
  return t.stride(-1) == 1 ? t : t.contiguous();
}

}  // namespace

at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& attn_mask, double scale, int64_t lanes) {
  TORCH_CHECK_VALUE(query.dim() == 4 && key.dim() == 4 && value.dim() == 4,
                    "attention: q, k, v of shape [batch, heads, tokens, head size]");
  TORCH_CHECK_VALUE(query.scalar_type() == at::kFloat && key.scalar_type() == at::kFloat &&
                        value.scalar_type() == at::kFloat,
                    "attention: float32 q, k, v");
  const int64_t b = query.size(0), heads = query.size(1), tq = query.size(2), d = query.size(3);
  const int64_t tk = key.size(2), dv = value.size(3);
  TORCH_CHECK_VALUE(key.size(0) == b && key.size(1) == heads && key.size(3) == d &&
                        value.size(0) == b && value.size(1) == heads && value.size(2) == tk,
                    "attention: q ", query.sizes(), ", k ", key.sizes(), " and v ",
                    value.sizes(), " do not match");
  TORCH_CHECK_VALUE(lanes == 1 || lanes == 8 || lanes == 16, "attention: lanes 1, 8 or 16");
  const at::Tensor q = last_dim_contiguous(query), k = last_dim_contiguous(key),
                   v = last_dim_contiguous(value);
  at::Tensor mask;
  if (attn_mask.has_value()) {
    TORCH_CHECK_VALUE(attn_mask->scalar_type() == at::kFloat,
                      "attention: an additive float32 mask, got ", attn_mask->scalar_type());
    mask = attn_mask->expand({b, heads, tq, tk});
    if (mask.stride(3) != 0 && mask.stride(3) != 1) mask = mask.contiguous();
  }
  at::Tensor out = attention_output(query, dv);
  if (b * heads * tq == 0) return out;
  if (tk == 0) return out.zero_();
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  const float* mp = mask.defined() ? mask.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const bool vector_head = lanes > 1 && d % lanes == 0 && dv % lanes == 0;
  at::parallel_for(0, b * heads, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch scratch;
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t bi = bh / heads, hi = bh % heads;
      Head h{qp + bi * q.stride(0) + hi * q.stride(1), q.stride(2),
             kp + bi * k.stride(0) + hi * k.stride(1), k.stride(2),
             vp + bi * v.stride(0) + hi * v.stride(1), v.stride(2),
             mp ? mp + bi * mask.stride(0) + hi * mask.stride(1) : nullptr,
             mp ? mask.stride(2) : 0, mp ? mask.stride(3) : 0,
             op + bi * out.stride(0) + hi * out.stride(1), out.stride(2),
             tq, tk, d, dv, static_cast<float>(scale)};
      if (vector_head && lanes == 16) {
        head_avx512(h, scratch);
      } else if (vector_head && lanes == 8) {
        head_avx2(h, scratch);
      } else {
        head_scalar(h, scratch);
      }
    }
  });
  return out;
}

// The output's layout follows q's, as ATen's flash attention's does: [batch, tokens, heads,
// head size] in memory where q is laid out so (a transposed projection), else contiguous.
at::Tensor attention_output(const at::Tensor& query, int64_t dv) {
  const auto options = query.options().dtype(at::kFloat);
  const int64_t b = query.size(0), heads = query.size(1), tq = query.size(2);
  if (query.stride(1) < query.stride(2)) {
    return at::empty({b, tq, heads, dv}, options).transpose(1, 2);
  }
  return at::empty({b, heads, tq, dv}, options);
}

}  // namespace torchquant_native

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("attention(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, float scale, int lanes) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("attention", &torchquant_native::attention);
}
