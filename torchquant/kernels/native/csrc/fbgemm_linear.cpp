// Dynamic int8 Linear and the dynamic LSTM / GRU sequence loops on fbgemm's plain buffers.
//
// The numbers are those of torch's dynamic quantized Linear on its x86 / fbgemm engine: the
// activation is quantized per tensor (uint8) with ATen's qparam rule, fbgemm packs and
// quantizes it (PackAWithQuantRowOffset), multiplies it by the prepacked int8 weight and
// applies its float epilogue (ReQuantizeForFloat).  Only torch's generic tensor ops and
// fbgemm's public packing / GEMM routines are used; no quantized ATen op, no quantized dtype.
// On AMX CPUs the accumulator comes from torchquant's AMX GEMM instead (amx.h), then the same
// fbgemm epilogue objects run on it.
#include <torch/library.h>
#include <torch/custom_class.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/sub.h>
#include <ATen/TensorOperators.h>
#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <fbgemm/Fbgemm.h>
#include <fbgemm/QuantUtils.h>
#include <fbgemm/Utils.h>

#include <immintrin.h>

#include "amx.h"
#include "int8_gemm_provider.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

namespace torchquant_native {

// ---- CPU features ------------------------------------------------------------------------

static std::string isa_name(fbgemm::inst_set_t isa) {
  switch (isa) {
    case fbgemm::inst_set_t::anyarch: return "anyarch";
    case fbgemm::inst_set_t::avx2: return "avx2";
    case fbgemm::inst_set_t::avx512: return "avx512";
    case fbgemm::inst_set_t::avx512_ymm: return "avx512_ymm";
    case fbgemm::inst_set_t::avx512_vnni: return "avx512_vnni";
    case fbgemm::inst_set_t::avx512_vnni_ymm: return "avx512_vnni_ymm";
    default: return "other";
  }
}

// fbgemm's GEMM kernels need AVX2 at least; an anyarch CPU gets the Python kernels.
static bool supported() {
  return fbgemm::fbgemmSupportedCPU() && fbgemm::fbgemmInstructionSet() != fbgemm::inst_set_t::anyarch;
}

// The instruction set fbgemm's kernels use now (packing depends on it).
std::string fbgemm_isa() { return isa_name(fbgemm::fbgemmInstructionSet()); }

// Whether u8 x s8 products accumulate exactly in int32 whatever the uint8 codes (VNNI's
// vpdpbusd); AVX2 / AVX-512 without VNNI saturate int16 pairs above 127-valued activations.
bool fbgemm_exact_u8() {
  auto isa = fbgemm::fbgemmInstructionSet();
  return isa == fbgemm::inst_set_t::avx512_vnni || isa == fbgemm::inst_set_t::avx512_vnni_ymm;
}

// Force fbgemm's kernels down to `name` ("avx2", "avx512", "avx512_vnni", ... or "auto").
// Packs made under another instruction set refuse to run (their layout differs).
void fbgemm_force_isa(const std::string& name) {
  static const std::pair<const char*, fbgemm::inst_set_t> table[] = {
      {"auto", fbgemm::inst_set_t::anyarch}, {"avx2", fbgemm::inst_set_t::avx2},
      {"avx512", fbgemm::inst_set_t::avx512}, {"avx512_ymm", fbgemm::inst_set_t::avx512_ymm},
      {"avx512_vnni", fbgemm::inst_set_t::avx512_vnni},
      {"avx512_vnni_ymm", fbgemm::inst_set_t::avx512_vnni_ymm}};
  for (const auto& entry : table) {
    if (name == entry.first) {
      fbgemm::fbgemmForceIsa(entry.second);
      return;
    }
  }
  TORCH_CHECK_VALUE(false, "fbgemm_force_isa: unknown instruction set '", name,
                    "' (auto, avx2, avx512, avx512_ymm, avx512_vnni, avx512_vnni_ymm)");
}

// ---- ATen's per-tensor qparam rule (ChooseQuantizationParams), for a (min, max) pair -------

struct QParams {
  float scale;
  int32_t zero_point;
};

static QParams choose_qparams(float mn, float mx, int32_t qmin, int32_t qmax, bool reduce_range) {
  if (reduce_range) {
    qmin /= 2;
    qmax /= 2;
  }
  TORCH_CHECK_VALUE(std::isfinite(mn) && std::isfinite(mx), "choose_qparams: min ", mn,
                    " and max ", mx, " must be finite");
  mn = std::min(mn, 0.0f);
  mx = std::max(mx, 0.0f);
  double scale = (static_cast<double>(mx) - mn) / (qmax - qmin);
  if (static_cast<float>(scale) == 0.0f || std::isinf(1.0f / static_cast<float>(scale))) {
    scale = 0.1;
  }
  constexpr float kSmallScale = 6.1e-5f;
  if (scale < kSmallScale) {
    const float org_scale = static_cast<float>(scale);
    scale = kSmallScale;
    if (mn == 0.0f) {
      mx = kSmallScale * (qmax - qmin);
    } else if (mx == 0.0f) {
      mn = -kSmallScale * (qmax - qmin);
    } else {
      const float amplifier = kSmallScale / org_scale;
      mn *= amplifier;
      mx *= amplifier;
    }
  }
  const double from_min = qmin - mn / scale;
  const double from_max = qmax - mx / scale;
  const double err_min = std::abs(qmin) - std::abs(mn / scale);
  const double err_max = std::abs(qmax) - std::abs(mx / scale);
  const double initial = err_min < err_max ? from_min : from_max;
  int32_t zp;
  if (initial < qmin) {
    zp = qmin;
  } else if (initial > qmax) {
    zp = qmax;
  } else {
    zp = static_cast<int32_t>(std::nearbyint(initial));
  }
  return {static_cast<float>(scale), zp};
}

// min and max of x in one pass, as fbgemm's FindMinMax (what torch.ao's dynamic Linear
// uses) plus a finiteness check: x * 0 is 0 for finite x and NaN otherwise, and a NaN or
// infinity anywhere makes both results NaN, so the qparam rule raises instead of quantizing
// garbage.  AVX2 is there whenever fbgemm runs (supported()), so the loop is built for it.
__attribute__((target("avx2"))) static void min_max_finite_serial(const float* x, int64_t n,
                                                                  float* mn_out, float* mx_out) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo, sentinel = 0.0f;
  int64_t i = 0;
  if (n >= 16) {
    const __m256 zero = _mm256_setzero_ps();
    __m256 lo0 = _mm256_set1_ps(lo), lo1 = lo0, hi0 = _mm256_set1_ps(hi), hi1 = hi0;
    __m256 bad0 = zero, bad1 = zero;
    for (; i + 16 <= n; i += 16) {
      const __m256 v0 = _mm256_loadu_ps(x + i), v1 = _mm256_loadu_ps(x + i + 8);
      lo0 = _mm256_min_ps(lo0, v0);
      lo1 = _mm256_min_ps(lo1, v1);
      hi0 = _mm256_max_ps(hi0, v0);
      hi1 = _mm256_max_ps(hi1, v1);
      bad0 = _mm256_add_ps(bad0, _mm256_mul_ps(v0, zero));
      bad1 = _mm256_add_ps(bad1, _mm256_mul_ps(v1, zero));
    }
    alignas(32) float l[8], h[8], b[8];
    _mm256_store_ps(l, _mm256_min_ps(lo0, lo1));
    _mm256_store_ps(h, _mm256_max_ps(hi0, hi1));
    _mm256_store_ps(b, _mm256_add_ps(bad0, bad1));
    for (int j = 0; j < 8; ++j) {
      lo = std::min(lo, l[j]);
      hi = std::max(hi, h[j]);
      sentinel += b[j];
    }
  }
  for (; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sentinel += x[i] * 0.0f;
  }
  if (sentinel != 0.0f) {
    lo = hi = std::numeric_limits<float>::quiet_NaN();
  }
  *mn_out = lo;
  *mx_out = hi;
}

// min_max_finite_serial over chunks on every thread for large inputs (a dynamic Linear's
// activation of several MB is read at memory speed: one core's share of the bandwidth is not
// all of it).  Min and max are exact in any order; a NaN / Inf anywhere makes both NaN.
static void min_max_finite(const float* x, int64_t n, float* mn_out, float* mx_out) {
  constexpr int64_t kChunk = 1 << 18;
  if (n < 2 * kChunk || at::get_num_threads() < 2) {
    min_max_finite_serial(x, n, mn_out, mx_out);
    return;
  }
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<float> lo(chunks), hi(chunks);
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      min_max_finite_serial(x + c * kChunk, std::min(kChunk, n - c * kChunk), &lo[c], &hi[c]);
    }
  });
  float mn = lo[0], mx = hi[0];
  for (int64_t c = 0; c < chunks; ++c) {
    if (std::isnan(lo[c])) {
      mn = mx = std::numeric_limits<float>::quiet_NaN();
      break;
    }
    mn = std::min(mn, lo[c]);
    mx = std::max(mx, hi[c]);
  }
  *mn_out = mn;
  *mx_out = mx;
}

// ---- the packed weight ---------------------------------------------------------------------

struct FbgemmLinearPack : torch::CustomClassHolder {
  std::unique_ptr<fbgemm::PackBMatrix<int8_t>> packed;
  std::vector<int32_t> col_offsets;  // sum_k w[n, k] - w_zp[n] * K
  std::vector<float> w_scale;        // one per tensor or per output channel
  std::vector<int32_t> w_zp;
  at::Tensor bias;                   // float32 [N] or undefined
  int64_t in_features = 0;
  int64_t out_features = 0;
  bool per_channel = false;
  bool symmetric = true;             // every weight zero point 0: no row offsets needed
  fbgemm::inst_set_t isa = fbgemm::inst_set_t::anyarch;
  std::unique_ptr<AmxPackedB> amx;   // the weight for the AMX GEMM, where the CPU has AMX
  at::Tensor weight;                 // int8 [N, K]: an external GEMM reads it (outlives its handle)
  // the external GEMM's handle for this weight (int8_gemm_provider.h), made on first use
  mutable std::mutex external_mutex;
  mutable const TorchquantInt8Gemm* external_provider = nullptr;
  mutable std::shared_ptr<void> external;

  int64_t in_features_() const { return in_features; }
  int64_t out_features_() const { return out_features; }
  std::string isa_() const { return isa_name(isa); }
};

c10::intrusive_ptr<FbgemmLinearPack> fbgemm_pack_linear(const at::Tensor& weight,
                                                        const at::Tensor& scale,
                                                        const at::Tensor& zero_point,
                                                        const c10::optional<at::Tensor>& bias) {
  TORCH_CHECK(supported(), "fbgemm_pack_linear: this CPU has no AVX2 (fbgemm cannot run)");
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kChar && weight.dim() == 2,
                   "fbgemm_pack_linear: weight must be a 2-D int8 tensor, got ", weight.scalar_type(),
                   " of shape ", weight.sizes());
  TORCH_CHECK(weight.device().is_cpu(), "fbgemm_pack_linear: weight must be on the CPU");
  const int64_t N = weight.size(0), K = weight.size(1);
  TORCH_CHECK_VALUE(N > 0 && K > 0, "fbgemm_pack_linear: empty weight ", weight.sizes());
  auto w = weight.contiguous();
  auto s = scale.to(at::kFloat).contiguous().reshape({-1});
  auto z = zero_point.to(at::kLong).contiguous().reshape({-1});
  TORCH_CHECK_VALUE(s.numel() == z.numel() && (s.numel() == 1 || s.numel() == N),
                    "fbgemm_pack_linear: need 1 or ", N, " scales / zero points, got ", s.numel(),
                    " and ", z.numel());
  auto pack = c10::make_intrusive<FbgemmLinearPack>();
  pack->in_features = K;
  pack->out_features = N;
  pack->per_channel = s.numel() == N && N > 1;
  const int64_t channels = pack->per_channel ? N : 1;
  pack->w_scale.assign(s.data_ptr<float>(), s.data_ptr<float>() + channels);
  pack->w_zp.resize(channels);
  for (int64_t c = 0; c < channels; ++c) pack->w_zp[c] = static_cast<int32_t>(z.data_ptr<int64_t>()[c]);
  const int8_t* wp = w.data_ptr<int8_t>();
  pack->weight = w;
  pack->col_offsets.resize(N);
  for (int64_t n = 0; n < N; ++n) {
    int32_t sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += wp[n * K + k];
    pack->col_offsets[n] = sum - pack->w_zp[pack->per_channel ? n : 0] * static_cast<int32_t>(K);
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK_VALUE(bias->numel() == N, "fbgemm_pack_linear: bias must have ", N,
                      " elements, got ", bias->numel());
    pack->bias = bias->detach().to(at::kFloat).contiguous().reshape({N}).clone();
  }
  // B = W^T (K x N): fbgemm reads the [N, K] weight transposed.
  pack->packed = std::make_unique<fbgemm::PackBMatrix<int8_t>>(
      fbgemm::matrix_op_t::Transpose, static_cast<int32_t>(K), static_cast<int32_t>(N), wp,
      static_cast<int32_t>(K), nullptr, 1);
  pack->isa = fbgemm::fbgemmInstructionSet();
  for (int32_t zp : pack->w_zp) pack->symmetric = pack->symmetric && zp == 0;
  if (amx_int8_supported()) pack->amx = std::make_unique<AmxPackedB>(amx_pack_b(wp, N, K, K));
  return pack;
}

// ---- the AMX GEMM with fbgemm's epilogues ------------------------------------------------------
// On AMX CPUs the int32 accumulator of a uint8 [M, K] activation and the pack's weight comes
// from the AMX tile GEMM (amx.h; exact, as fbgemm's), 32 rows at a time, and each block goes
// through the very output processing fbgemm's GEMM would apply (its ReQuantizeOutput /
// ReQuantizeForFloat objects, whose AVX2 and AVX-512 variants are one routine): the same
// numbers as the fbgemm path, bit for bit.  `make_proc(row offsets of the block, or null for a
// weight without zero points)` builds it.

// Whether a call of M rows takes the AMX GEMM (a single row is bound by reading the weight).
// The AMX packing's GEMMs: tiles from four rows on, AVX-512 VNNI below (amx_linear).
static bool use_amx(const FbgemmLinearPack& w, int64_t M) {
  return w.amx && M >= 1 && amx_int8_active();
}

// ---- an external exact GEMM (int8_gemm_provider.h) ----------------------------------------
// Set from Python once the oneDNN library is loaded and exact here (set_int8_gemm_provider);
// used only where fbgemm's own products are exact too (the numbers are those of the exact sums
// either way), never beside AMX.  The dynamic Linear takes it from kExternalMinRows rows on:
// there oneDNN's GEMM and fbgemm's epilogue beat fbgemm's quantizing packing and GEMM; below,
// and in the RNNs' per-step GEMMs, the separate epilogue pass costs more than the GEMM saves,
// and the static Linear's fused requantization is as fast as oneDNN's GEMM plus that pass
// (BENCHMARKS.md, twelfth session).
constexpr int64_t kExternalMinRows = 256;

static std::atomic<const TorchquantInt8Gemm*> g_int8_gemm{nullptr};

void set_int8_gemm_provider(int64_t address) {
  g_int8_gemm.store(reinterpret_cast<const TorchquantInt8Gemm*>(address));
}

bool int8_gemm_provider_set() { return g_int8_gemm.load() != nullptr; }

// The provider's handle for this pack's weight, or nullptr where none is to be used.
static void* external_gemm(const FbgemmLinearPack& w, int64_t M) {
  const TorchquantInt8Gemm* provider = g_int8_gemm.load();
  if (provider == nullptr || M < kExternalMinRows || use_amx(w, M) || !fbgemm_exact_u8()) {
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(w.external_mutex);
  if (w.external_provider != provider) {
    void* handle = provider->create(w.weight.data_ptr<int8_t>(), w.out_features, w.in_features);
    w.external = handle ? std::shared_ptr<void>(handle, provider->destroy) : nullptr;
    w.external_provider = provider;
  }
  return w.external.get();
}

// Sums of each row of a uint8 [M, K] matrix (fbgemm's row offsets).
static std::vector<int32_t> row_sums(const uint8_t* a, int64_t M, int64_t K) {
  std::vector<int32_t> sums(M);
  at::parallel_for(0, M, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      int32_t sum = 0;
      for (int64_t k = 0; k < K; ++k) sum += a[i * K + k];
      sums[i] = sum;
    }
  });
  return sums;
}

// Calls f with fbgemm's granularity of the pack's weight qparams as a compile-time constant.
template <class F>
static void with_granularity(const FbgemmLinearPack& w, F&& f) {
  using G = fbgemm::QuantizationGranularity;
  if (w.per_channel) {
    f(std::integral_constant<G, G::OUT_CHANNEL>());
  } else {
    f(std::integral_constant<G, G::TENSOR>());
  }
}

// The external GEMM's exact accumulator for a[M, K], then fbgemm's epilogue (make_proc) over
// blocks of rows on every thread; false where the provider declined (nothing written).
template <class Out, class MakeProc>
static bool external_linear(void* handle, const uint8_t* a, int64_t M,
                            const FbgemmLinearPack& w, Out* out, const MakeProc& make_proc) {
  const int64_t N = w.out_features;
  auto acc = at::empty({M, N}, at::kInt);
  int32_t* c = acc.data_ptr<int32_t>();
  // the provider that made the handle (the global one may have been unset since)
  if (!w.external_provider->run(handle, a, M, c)) return false;
  const std::vector<int32_t> offsets =
      w.symmetric ? std::vector<int32_t>() : row_sums(a, M, w.in_features);
  const int32_t* row_offsets = offsets.empty() ? nullptr : offsets.data();
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / N), [&](int64_t begin, int64_t end) {
    const fbgemm::block_type_t block{static_cast<int>(begin), static_cast<int>(end - begin), 0,
                                     static_cast<int>(N)};
    make_proc(row_offsets ? row_offsets + begin : nullptr)
        .template f<fbgemm::inst_set_t::avx2>(out, c + begin * N, block, static_cast<int>(N),
                                              static_cast<int>(N));
  });
  return true;
}

template <class Out, class MakeProc>
static void amx_linear(const uint8_t* a, int64_t M, const FbgemmLinearPack& w, Out* out,
                       const MakeProc& make_proc) {
  const AmxPackedB& b = *w.amx;
  const std::vector<int32_t> offsets =
      w.symmetric ? std::vector<int32_t>() : row_sums(a, M, w.in_features);
  const int32_t* row_offsets = offsets.empty() ? nullptr : offsets.data();
  const int64_t K = w.in_features, N = w.out_features;
  const int64_t steps = b.Kp / kAmxK, row_blocks = (M + kAmxRows - 1) / kAmxRows;
  const int64_t col_blocks = b.Np / kAmxN, threads = at::get_num_threads();
  std::vector<int64_t> a_steps(steps);
  for (int64_t i = 0; i < steps; ++i) a_steps[i] = i * kAmxK;
  // each thread keeps one slice of the weight's columns (in its cache) over every row block,
  // unless there are too few columns to go round
  const int64_t col_splits = std::min(col_blocks, threads);
  const int64_t row_splits = col_splits >= threads ? 1 : std::min(row_blocks, threads);
  at::parallel_for(0, col_splits * row_splits, 1, [&](int64_t begin, int64_t end) {
    std::unique_ptr<int32_t[], AmxPackedB::Free> c_mem(static_cast<int32_t*>(
        std::aligned_alloc(64, kAmxRows * b.Np * sizeof(int32_t))));
    int32_t* c = c_mem.get();
    std::vector<uint8_t> tail;
    const bool tiles = M >= 4;  // fewer rows: the VNNI loop on the same packing
    if (tiles) amx_tiles_begin();
    for (int64_t task = begin; task < end; ++task) {
      const int64_t cs = task % col_splits, rs = task / col_splits;
      const int64_t n0 = col_blocks * cs / col_splits * kAmxN;
      const int64_t n1 = col_blocks * (cs + 1) / col_splits * kAmxN;
      for (int64_t rb = row_blocks * rs / row_splits; rb < row_blocks * (rs + 1) / row_splits;
           ++rb) {
        const int64_t r0 = rb * kAmxRows, rows = std::min(kAmxRows, M - r0);
        const uint8_t* ap = a + r0 * K;
        if (!tiles) {
          vnni_gemv_rows(ap, rows, K, b, n0, n1, c, b.Np);
        } else {
          if ((r0 + kAmxRows - 1) * K + b.Kp > M * K) {  // the tiles would read past the input
            tail.assign(kAmxRows * K + b.Kp, 0);
            std::memcpy(tail.data(), ap, rows * K);
            ap = tail.data();
          }
          amx_gemm_rows(ap, ap + 16 * K, K, a_steps.data(), b, n0, n1, c, b.Np);
        }
        const fbgemm::block_type_t block{static_cast<int>(r0), static_cast<int>(rows),
                                         static_cast<int>(n0),
                                         static_cast<int>(std::min(n1, N) - n0)};
        make_proc(row_offsets ? row_offsets + r0 : nullptr)
            .template f<fbgemm::inst_set_t::avx2>(out, c + n0, block, static_cast<int>(N),
                                                  static_cast<int>(b.Np));
      }
    }
    if (tiles) amx_tiles_end();
  });
}


// ---- dynamic Linear --------------------------------------------------------------------------

template <bool Relu>
static void gemm_dynamic(const float* x, int64_t M, const FbgemmLinearPack& w, QParams q,
                         float* out) {
  const int64_t N = w.out_features, K = w.in_features;
  const float* bias = w.bias.defined() ? w.bias.data_ptr<float>() : nullptr;
  void* external = use_amx(w, M) ? nullptr : external_gemm(w, M);
  if (use_amx(w, M) || external != nullptr) {
    // fbgemm's quantize (what its packing applies, element by element), its row offsets
    auto xq = at::empty({M, K}, at::kByte);
    uint8_t* xq_p = xq.data_ptr<uint8_t>();
    fbgemm::TensorQuantizationParams tq;
    tq.scale = q.scale;
    tq.zero_point = q.zero_point;
    tq.precision = 8;
    at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
      fbgemm::Quantize<uint8_t>(x + begin * K, xq_p + begin * K, (end - begin) * K, tq);
    });
    fbgemm::DoNothing<float, float> done;
    bool done_here = true;
    with_granularity(w, [&](auto gran) {
      auto make_proc = [&](const int32_t* row_offsets) {
        return fbgemm::ReQuantizeForFloat<Relu, decltype(gran)::value>(
            done, q.scale, w.w_scale.data(), q.zero_point, w.w_zp.data(), row_offsets,
            w.col_offsets.data(), bias, static_cast<uint32_t>(N));
      };
      if (external != nullptr) {
        done_here = external_linear(external, xq_p, M, w, out, make_proc);
      } else {
        amx_linear(xq_p, M, w, out, make_proc);
      }
    });
    if (done_here) return;
  }
  auto acc = at::empty({M, N}, at::kInt);
  int32_t* acc_p = acc.data_ptr<int32_t>();
  const int num_tasks = at::get_num_threads();
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    fbgemm::PackAWithQuantRowOffset<uint8_t> packA(
        fbgemm::matrix_op_t::NoTranspose, static_cast<int32_t>(M), static_cast<int32_t>(K), x,
        static_cast<int32_t>(K), nullptr, q.scale, q.zero_point, 1, nullptr);
    fbgemm::DoNothing<float, float> done;
    for (int64_t task = begin; task < end; ++task) {
      if (w.per_channel) {
        fbgemm::ReQuantizeForFloat<Relu, fbgemm::QuantizationGranularity::OUT_CHANNEL> proc(
            done, q.scale, w.w_scale.data(), q.zero_point, w.w_zp.data(),
            packA.getRowOffsetBuffer(), w.col_offsets.data(), bias, static_cast<uint32_t>(N));
        fbgemm::fbgemmPacked(packA, *w.packed, out, acc_p, static_cast<int32_t>(N), proc,
                             static_cast<int>(task), num_tasks);
      } else {
        fbgemm::ReQuantizeForFloat<Relu> proc(
            done, q.scale, w.w_scale.data(), q.zero_point, w.w_zp.data(),
            packA.getRowOffsetBuffer(), w.col_offsets.data(), bias, static_cast<uint32_t>(N));
        fbgemm::fbgemmPacked(packA, *w.packed, out, acc_p, static_cast<int32_t>(N), proc,
                             static_cast<int>(task), num_tasks);
      }
    }
  });
}

static void check_pack(const FbgemmLinearPack& w, const char* op) {
  TORCH_CHECK(w.isa == fbgemm::fbgemmInstructionSet(), op, ": the weight was packed for ",
              isa_name(w.isa), " but fbgemm now runs ", isa_name(fbgemm::fbgemmInstructionSet()),
              "; pack it again");
}

// y[M, N] = dynamic_linear(x[M, K]) into `out` (float32 contiguous rows).
static void dynamic_linear_into(const float* x, int64_t M, const FbgemmLinearPack& w,
                                bool reduce_range, bool relu, float* out) {
  float mn, mx;
  min_max_finite(x, M * w.in_features, &mn, &mx);
  const QParams q = choose_qparams(mn, mx, 0, 255, reduce_range);
  if (relu) {
    gemm_dynamic<true>(x, M, w, q, out);
  } else {
    gemm_dynamic<false>(x, M, w, q, out);
  }
}

at::Tensor fbgemm_linear_dynamic(const at::Tensor& x, const c10::intrusive_ptr<FbgemmLinearPack>& w,
                                 bool reduce_range, bool relu) {
  check_pack(*w, "fbgemm_linear_dynamic");
  TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat, "fbgemm_linear_dynamic: expected a float32 "
                   "input, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w->in_features, "fbgemm_linear_dynamic: "
                    "input's last dimension must be in_features=", w->in_features, ", got shape ",
                    x.sizes());
  auto xc = x.contiguous();
  const int64_t M = xc.numel() / w->in_features;
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = w->out_features;
  auto out = at::empty(out_sizes, x.options());
  if (M == 0) return out;
  dynamic_linear_into(xc.data_ptr<float>(), M, *w, reduce_range, relu, out.data_ptr<float>());
  return out;
}

// ---- fused cell arithmetic ---------------------------------------------------------------
// torch's CPU cell runs ~10 elementwise ATen ops per step; on small states their dispatch
// costs more than the arithmetic.  These loops do the same float operations in the same order
// in a few passes: ATen's vectorized float sigmoid is 1 / (1 + exp(-x)) with Sleef's exp (the
// u10 version, exported by libtorch) at the vector width ATen dispatches to (AVX2 or AVX-512),
// its float tanh is MKL's vmsTanh in the mode ATen passes, and every product and sum is
// rounded on its own (built with -ffp-contract=off).  ATen's vector loop covers whole blocks
// of 2 vectors and leaves a scalar tail; with the hidden size a multiple of 32 no row has a
// tail, so only then (and with ATen on AVX2 or AVX-512) are the fused loops used, else the
// ATen ops themselves.

extern "C" {
__m512 Sleef_expf16_u10(__m512);
__m256 Sleef_expf8_u10(__m256);
// MKL's vector tanh, which ATen's float tanh calls (libtorch exports it; LP64 MKL).
void vmsTanh(int n, const float* a, float* r, long long mode);
}

// ATen's mode for it: high accuracy, denormals kept, errors ignored (MKL's VML_HA,
// VML_FTZDAZ_OFF, VML_ERRMODE_IGNORE).
static constexpr long long kVmlMode = 0x00000002LL | 0x00140000LL | 0x00000100LL;

static inline void tanh_like_aten(const float* in, float* out, int64_t n) {
  vmsTanh(static_cast<int>(n), in, out, kVmlMode);
}

enum class GateIsa { none, avx2, avx512 };

static GateIsa gate_isa() {
  const std::string cap = at::get_cpu_capability();
  if (cap == "AVX512") return GateIsa::avx512;
  if (cap == "AVX2") return GateIsa::avx2;
  return GateIsa::none;
}

#define TQ_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))
#define TQ_AVX2 __attribute__((target("avx2,fma")))

TQ_AVX512 static inline __m512 sigmoid16(__m512 x) {
  const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x),
                                                          _mm512_set1_epi32(0x80000000)));
  return _mm512_div_ps(_mm512_set1_ps(1.0f),
                       _mm512_add_ps(_mm512_set1_ps(1.0f), Sleef_expf16_u10(neg)));
}

TQ_AVX2 static inline __m256 sigmoid8(__m256 x) {
  const __m256 neg = _mm256_xor_ps(_mm256_set1_ps(-0.0f), x);
  return _mm256_div_ps(_mm256_set1_ps(1.0f),
                       _mm256_add_ps(_mm256_set1_ps(1.0f), Sleef_expf8_u10(neg)));
}

// The cell loops for one vector width: V is the vector type, W its float count.
#define TQ_CELL_LOOPS(SUFFIX, ATTR, V, W, LOAD, STORE, ADD, SUB, MUL, SIGMOID)                \
  /* LSTM: gates = hh + ih (i, f, g, o); c' = f * c + i * g; h' = o * tanh(c').  hh is      \
     overwritten; tmp holds B * H floats. */                                                 \
  ATTR static void lstm_cell_##SUFFIX(float* hh, const float* ih, float* c, float* h,          \
                                      float* tmp, int64_t B, int64_t H) {                      \
    for (int64_t b = 0; b < B; ++b) {                                                          \
      float* g_hh = hh + b * 4 * H;                                                            \
      const float* g_ih = ih + b * 4 * H;                                                      \
      for (int64_t j = 0; j < H; j += W) {                                                     \
        STORE(g_hh + j, SIGMOID(ADD(LOAD(g_hh + j), LOAD(g_ih + j))));                         \
        STORE(g_hh + H + j, SIGMOID(ADD(LOAD(g_hh + H + j), LOAD(g_ih + H + j))));             \
        STORE(tmp + b * H + j, ADD(LOAD(g_hh + 2 * H + j), LOAD(g_ih + 2 * H + j)));           \
        STORE(g_hh + 3 * H + j, SIGMOID(ADD(LOAD(g_hh + 3 * H + j), LOAD(g_ih + 3 * H + j)))); \
      }                                                                                        \
    }                                                                                          \
    tanh_like_aten(tmp, tmp, B * H); /* g */                                                   \
    for (int64_t b = 0; b < B; ++b) {                                                          \
      const float* g_hh = hh + b * 4 * H;                                                      \
      for (int64_t j = 0; j < H; j += W) {                                                     \
        const V fc = MUL(LOAD(g_hh + H + j), LOAD(c + b * H + j));                             \
        const V ig = MUL(LOAD(g_hh + j), LOAD(tmp + b * H + j));                               \
        STORE(c + b * H + j, ADD(fc, ig));                                                     \
      }                                                                                        \
    }                                                                                          \
    tanh_like_aten(c, tmp, B * H);                                                             \
    for (int64_t b = 0; b < B; ++b) {                                                          \
      const float* g_hh = hh + b * 4 * H;                                                      \
      for (int64_t j = 0; j < H; j += W) {                                                     \
        STORE(h + b * H + j, MUL(LOAD(g_hh + 3 * H + j), LOAD(tmp + b * H + j)));              \
      }                                                                                        \
    }                                                                                          \
  }                                                                                            \
  /* GRU: r, z = sigmoid(hh + ih); n = tanh(ih_n + hh_n * r); h' = (h - n) * z + n. */       \
  ATTR static void gru_cell_##SUFFIX(float* hh, const float* ih, const float* h, float* h_out, \
                                     float* tmp, int64_t B, int64_t H) {                       \
    for (int64_t b = 0; b < B; ++b) {                                                          \
      float* g_hh = hh + b * 3 * H;                                                            \
      const float* g_ih = ih + b * 3 * H;                                                      \
      for (int64_t j = 0; j < H; j += W) {                                                     \
        const V r = SIGMOID(ADD(LOAD(g_hh + j), LOAD(g_ih + j)));                              \
        STORE(g_hh + H + j, SIGMOID(ADD(LOAD(g_hh + H + j), LOAD(g_ih + H + j))));             \
        STORE(tmp + b * H + j, ADD(LOAD(g_ih + 2 * H + j), MUL(LOAD(g_hh + 2 * H + j), r)));   \
      }                                                                                        \
    }                                                                                          \
    tanh_like_aten(tmp, tmp, B * H); /* n */                                                   \
    for (int64_t b = 0; b < B; ++b) {                                                          \
      const float* g_hh = hh + b * 3 * H;                                                      \
      for (int64_t j = 0; j < H; j += W) {                                                     \
        const V n = LOAD(tmp + b * H + j);                                                     \
        const V d = SUB(LOAD(h + b * H + j), n);                                               \
        STORE(h_out + b * H + j, ADD(MUL(d, LOAD(g_hh + H + j)), n));                          \
      }                                                                                        \
    }                                                                                          \
  }

TQ_CELL_LOOPS(avx512, TQ_AVX512, __m512, 16, _mm512_loadu_ps, _mm512_storeu_ps, _mm512_add_ps,
              _mm512_sub_ps, _mm512_mul_ps, sigmoid16)
TQ_CELL_LOOPS(avx2, TQ_AVX2, __m256, 8, _mm256_loadu_ps, _mm256_storeu_ps, _mm256_add_ps,
              _mm256_sub_ps, _mm256_mul_ps, sigmoid8)

// The fused loops' sigmoid / tanh on a float32 tensor of 16k elements, for the tests that
// hold them to ATen's.
TQ_AVX512 static void apply_avx512(float* x, int64_t n, bool tanh) {
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = _mm512_loadu_ps(x + j);
    _mm512_storeu_ps(x + j, sigmoid16(v));
  }
}

TQ_AVX2 static void apply_avx2(float* x, int64_t n, bool tanh) {
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 v = _mm256_loadu_ps(x + j);
    _mm256_storeu_ps(x + j, sigmoid8(v));
  }
}

at::Tensor fused_activation(const at::Tensor& x, const std::string& fn) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat && x.numel() % 16 == 0 &&
                    (fn == "sigmoid" || fn == "tanh"),
                    "fused_activation: float32 with a multiple of 16 elements, sigmoid or tanh");
  auto y = x.contiguous().clone();
  const GateIsa isa = gate_isa();
  TORCH_CHECK(isa != GateIsa::none, "fused_activation: ATen runs without AVX2 here");
  if (fn == "tanh") {
    tanh_like_aten(y.data_ptr<float>(), y.data_ptr<float>(), y.numel());
  } else if (isa == GateIsa::avx512) {
    apply_avx512(y.data_ptr<float>(), y.numel(), fn == "tanh");
  } else {
    apply_avx2(y.data_ptr<float>(), y.numel(), fn == "tanh");
  }
  return y;
}

// The cells of a step split by batch rows across ATen's threads once a step has this many
// hidden values: the threads that ran the step's GEMM wait in OpenMP's barrier otherwise, and
// MKL's tanh alone is ~15 % of a 2 x 512 GRU at batch 8.  Each row's arithmetic is unchanged
// (the same per-element operations; the tanh of a row block is the tanh of its elements).
constexpr int64_t kParallelCellMinValues = 2048;

template <typename F>
static void for_row_blocks(int64_t B, int64_t H, const F& fn) {
  if (B > 1 && B * H >= kParallelCellMinValues && at::get_num_threads() > 1) {
    at::parallel_for(0, B, 1, fn);
  } else {
    fn(0, B);
  }
}

// Which fused loop runs hidden size H now (none: use the ATen ops).  TORCHQUANT_FUSED_GATES=0
// turns them off (the tests compare both).
static GateIsa fused_gates_for(int64_t H) {
  static const bool disabled = [] {
    const char* v = std::getenv("TORCHQUANT_FUSED_GATES");
    return v != nullptr && std::string(v) == "0";
  }();
  if (disabled || H % 32 != 0) return GateIsa::none;
  return gate_isa();
}

// ---- static Linear ---------------------------------------------------------------------------
// uint8 activations x int8 weights -> uint8 output, requantized in fbgemm's epilogue as torch's
// fbgemm Linear does: multiplier = (x_scale * w_scale) / out_scale in float32, the float bias
// divided by x_scale * w_scale and added to the exact accumulator, nearbyint, + out_zp, clamp
// (at out_zp with ReLU).

template <bool Relu>
static void gemm_static(const uint8_t* x, int64_t M, int32_t x_zp, const FbgemmLinearPack& w,
                        const float* multiplier, const float* act_times_w_scale, int32_t out_zp,
                        uint8_t* out) {
  const int64_t N = w.out_features, K = w.in_features;
  const float* bias = w.bias.defined() ? w.bias.data_ptr<float>() : nullptr;
  if (use_amx(w, M)) {
    fbgemm::DoNothing<uint8_t, uint8_t> done;
    with_granularity(w, [&](auto gran) {
      amx_linear(x, M, w, out, [&](const int32_t* row_offsets) {
        return fbgemm::ReQuantizeOutput<Relu, decltype(gran)::value, float>(
            done, multiplier, out_zp, x_zp, w.w_zp.data(), row_offsets, w.col_offsets.data(),
            bias, static_cast<uint32_t>(N), 1, act_times_w_scale);
      });
    });
    return;
  }
  auto acc = at::empty({M, N}, at::kInt);
  int32_t* acc_p = acc.data_ptr<int32_t>();
  const int num_tasks = at::get_num_threads();
  at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
    fbgemm::PackAWithRowOffset<uint8_t> packA(
        fbgemm::matrix_op_t::NoTranspose, static_cast<int32_t>(M), static_cast<int32_t>(K), x,
        static_cast<int32_t>(K), nullptr, 1, nullptr);
    fbgemm::DoNothing<uint8_t, uint8_t> done;
    for (int64_t task = begin; task < end; ++task) {
      if (w.per_channel) {
        fbgemm::ReQuantizeOutput<Relu, fbgemm::QuantizationGranularity::OUT_CHANNEL, float> proc(
            done, multiplier, out_zp, x_zp, w.w_zp.data(), packA.getRowOffsetBuffer(),
            w.col_offsets.data(), bias, static_cast<uint32_t>(N), 1, act_times_w_scale);
        fbgemm::fbgemmPacked(packA, *w.packed, out, acc_p, static_cast<int32_t>(N), proc,
                             static_cast<int>(task), num_tasks);
      } else {
        fbgemm::ReQuantizeOutput<Relu, fbgemm::QuantizationGranularity::TENSOR, float> proc(
            done, multiplier, out_zp, x_zp, w.w_zp.data(), packA.getRowOffsetBuffer(),
            w.col_offsets.data(), bias, static_cast<uint32_t>(N), 1, act_times_w_scale);
        fbgemm::fbgemmPacked(packA, *w.packed, out, acc_p, static_cast<int32_t>(N), proc,
                             static_cast<int>(task), num_tasks);
      }
    }
  });
}

at::Tensor fbgemm_linear_static(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                                const c10::intrusive_ptr<FbgemmLinearPack>& w, double out_scale,
                                int64_t out_zero_point, bool relu) {
  check_pack(*w, "fbgemm_linear_static");
  TORCH_CHECK_TYPE(x.scalar_type() == at::kByte, "fbgemm_linear_static: expected uint8 "
                   "activations, got ", x.scalar_type());
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) == w->in_features, "fbgemm_linear_static: "
                    "input's last dimension must be in_features=", w->in_features, ", got shape ",
                    x.sizes());
  TORCH_CHECK_VALUE(0 <= x_zero_point && x_zero_point <= 255 && 0 <= out_zero_point &&
                    out_zero_point <= 255, "fbgemm_linear_static: zero points must be in 0..255");
  auto xc = x.contiguous();
  const int64_t M = xc.numel() / w->in_features, N = w->out_features;
  auto out_sizes = x.sizes().vec();
  out_sizes.back() = N;
  auto out = at::empty(out_sizes, x.options());
  if (M == 0) return out;
  const size_t channels = w->w_scale.size();
  std::vector<float> act_times_w_scale(channels), multiplier(channels);
  const float xs = static_cast<float>(x_scale), os = static_cast<float>(out_scale);
  for (size_t c = 0; c < channels; ++c) {
    act_times_w_scale[c] = xs * w->w_scale[c];
    multiplier[c] = act_times_w_scale[c] / os;
  }
  if (relu) {
    gemm_static<true>(xc.data_ptr<uint8_t>(), M, static_cast<int32_t>(x_zero_point), *w,
                      multiplier.data(), act_times_w_scale.data(),
                      static_cast<int32_t>(out_zero_point), out.data_ptr<uint8_t>());
  } else {
    gemm_static<false>(xc.data_ptr<uint8_t>(), M, static_cast<int32_t>(x_zero_point), *w,
                       multiplier.data(), act_times_w_scale.data(),
                       static_cast<int32_t>(out_zero_point), out.data_ptr<uint8_t>());
  }
  return out;
}

// ---- the recurrent loops ---------------------------------------------------------------------
// `ih` holds a direction's input projections for every step ([T, B, G * H], bias included);
// per step the hidden state is projected by the int8 hidden weight (dynamic, as above) and the
// gates follow torch's CPU cell: the same ATen ops, in the same order, on the same views.

static at::Tensor hidden_projection(const at::Tensor& h, const FbgemmLinearPack& w,
                                    bool reduce_range) {
  auto out = at::empty({h.size(0), w.out_features}, h.options());
  dynamic_linear_into(h.data_ptr<float>(), h.size(0), w, reduce_range, false, out.data_ptr<float>());
  return out;
}

static void check_sequence(const at::Tensor& ih, const at::Tensor& h0, const FbgemmLinearPack& w,
                           int64_t gates, const char* op) {
  check_pack(w, op);
  TORCH_CHECK_VALUE(ih.dim() == 3 && ih.scalar_type() == at::kFloat, op,
                    ": ih must be float32 [steps, batch, gates * hidden], got ", ih.sizes());
  TORCH_CHECK_VALUE(h0.dim() == 2 && h0.scalar_type() == at::kFloat && h0.size(0) == ih.size(1),
                    op, ": hidden state must be float32 [batch, hidden], got ", h0.sizes());
  const int64_t H = h0.size(1);
  TORCH_CHECK_VALUE(w.in_features == H && w.out_features == gates * H && ih.size(2) == gates * H,
                    op, ": hidden weight [", w.out_features, ", ", w.in_features,
                    "] does not fit hidden size ", H, " and ih ", ih.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fbgemm_lstm_sequence(
    const at::Tensor& ih, const at::Tensor& h0, const at::Tensor& c0,
    const c10::intrusive_ptr<FbgemmLinearPack>& w_hh, bool reduce_range, bool reverse) {
  check_sequence(ih, h0, *w_hh, 4, "fbgemm_lstm_sequence");
  TORCH_CHECK_VALUE(c0.sizes() == h0.sizes() && c0.scalar_type() == at::kFloat,
                    "fbgemm_lstm_sequence: cell state must match the hidden state ", h0.sizes());
  const int64_t T = ih.size(0), H = h0.size(1);
  auto ihc = ih.contiguous();
  auto out = at::empty({T, h0.size(0), H}, h0.options());
  at::Tensor h = h0.contiguous(), c = c0.contiguous();
  const GateIsa fused = fused_gates_for(H);
  if (fused != GateIsa::none) {
    const int64_t B = h0.size(0);
    c = c.clone();
    auto hh = at::empty({B, 4 * H}, h0.options());
    auto tmp = at::empty({B, H}, h0.options());
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = reverse ? T - 1 - s : s;
      dynamic_linear_into(h.data_ptr<float>(), B, *w_hh, reduce_range, false, hh.data_ptr<float>());
      float* h_t = out.data_ptr<float>() + t * B * H;
      const float* ih_t = ihc.data_ptr<float>() + t * B * 4 * H;
      for_row_blocks(B, H, [&](int64_t b0, int64_t b1) {
        float* hh_b = hh.data_ptr<float>() + b0 * 4 * H;
        const float* ih_b = ih_t + b0 * 4 * H;
        float* c_b = c.data_ptr<float>() + b0 * H;
        float* tmp_b = tmp.data_ptr<float>() + b0 * H;
        if (fused == GateIsa::avx512) {
          lstm_cell_avx512(hh_b, ih_b, c_b, h_t + b0 * H, tmp_b, b1 - b0, H);
        } else {
          lstm_cell_avx2(hh_b, ih_b, c_b, h_t + b0 * H, tmp_b, b1 - b0, H);
        }
      });
      h = out[t];
    }
    return {out, h.clone(), c};
  }
  for (int64_t s = 0; s < T; ++s) {
    const int64_t t = reverse ? T - 1 - s : s;
    auto gates = hidden_projection(h, *w_hh, reduce_range);
    gates.add_(ihc[t]);
    auto chunks = gates.unsafe_chunk(4, 1);
    auto ingate = chunks[0].sigmoid_();
    auto forgetgate = chunks[1].sigmoid_();
    auto cellgate = chunks[2].tanh_();
    auto outgate = chunks[3].sigmoid_();
    c = (forgetgate * c).add_(ingate * cellgate);
    auto h_t = out[t];
    at::mul_out(h_t, outgate, c.tanh());
    h = h_t;
  }
  return {out, h.clone(), c};
}

std::tuple<at::Tensor, at::Tensor> fbgemm_gru_sequence(
    const at::Tensor& ih, const at::Tensor& h0, const c10::intrusive_ptr<FbgemmLinearPack>& w_hh,
    bool reduce_range, bool reverse) {
  check_sequence(ih, h0, *w_hh, 3, "fbgemm_gru_sequence");
  const int64_t T = ih.size(0), H = h0.size(1);
  auto ihc = ih.contiguous();
  auto out = at::empty({T, h0.size(0), H}, h0.options());
  at::Tensor h = h0.contiguous();
  const GateIsa fused = fused_gates_for(H);
  if (fused != GateIsa::none) {
    const int64_t B = h0.size(0);
    auto hh = at::empty({B, 3 * H}, h0.options());
    auto tmp = at::empty({B, H}, h0.options());
    for (int64_t s = 0; s < T; ++s) {
      const int64_t t = reverse ? T - 1 - s : s;
      dynamic_linear_into(h.data_ptr<float>(), B, *w_hh, reduce_range, false, hh.data_ptr<float>());
      float* h_t = out.data_ptr<float>() + t * B * H;
      const float* ih_t = ihc.data_ptr<float>() + t * B * 3 * H;
      const float* h_prev = h.data_ptr<float>();
      for_row_blocks(B, H, [&](int64_t b0, int64_t b1) {
        float* hh_b = hh.data_ptr<float>() + b0 * 3 * H;
        const float* ih_b = ih_t + b0 * 3 * H;
        float* tmp_b = tmp.data_ptr<float>() + b0 * H;
        if (fused == GateIsa::avx512) {
          gru_cell_avx512(hh_b, ih_b, h_prev + b0 * H, h_t + b0 * H, tmp_b, b1 - b0, H);
        } else {
          gru_cell_avx2(hh_b, ih_b, h_prev + b0 * H, h_t + b0 * H, tmp_b, b1 - b0, H);
        }
      });
      h = out[t];
    }
    return {out, h.clone()};
  }
  for (int64_t s = 0; s < T; ++s) {
    const int64_t t = reverse ? T - 1 - s : s;
    auto hh = hidden_projection(h, *w_hh, reduce_range);
    auto hg = hh.unsafe_chunk(3, 1);
    auto ig = ihc[t].unsafe_chunk(3, 1);
    auto reset_gate = hg[0].add_(ig[0]).sigmoid_();
    auto input_gate = hg[1].add_(ig[1]).sigmoid_();
    auto new_gate = ig[2].add(hg[2].mul_(reset_gate)).tanh_();
    auto h_t = out[t];
    at::sub_out(h_t, h, new_gate);
    h_t.mul_(input_gate).add_(new_gate);
    h = h_t;
  }
  return {out, h.clone()};
}

}  // namespace torchquant_native

using torchquant_native::FbgemmLinearPack;

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.class_<FbgemmLinearPack>("FbgemmLinearPack")
      .def("in_features", &FbgemmLinearPack::in_features_)
      .def("out_features", &FbgemmLinearPack::out_features_)
      .def("isa", &FbgemmLinearPack::isa_);
  m.def("fbgemm_isa() -> str", &torchquant_native::fbgemm_isa);
  m.def("set_int8_gemm_provider(int address) -> ()", &torchquant_native::set_int8_gemm_provider);
  m.def("int8_gemm_provider_set() -> bool", &torchquant_native::int8_gemm_provider_set);
  m.def("fbgemm_exact_u8() -> bool", &torchquant_native::fbgemm_exact_u8);
  m.def("fbgemm_force_isa(str name) -> ()", &torchquant_native::fbgemm_force_isa);
  m.def("fused_activation(Tensor x, str fn) -> Tensor", &torchquant_native::fused_activation);
  m.def("fbgemm_pack_linear(Tensor weight, Tensor scale, Tensor zero_point, Tensor? bias) -> "
        "__torch__.torch.classes.torchquant_native.FbgemmLinearPack");
  m.def("fbgemm_linear_dynamic(Tensor x, __torch__.torch.classes.torchquant_native.FbgemmLinearPack "
        "packed, bool reduce_range, bool relu) -> Tensor");
  m.def("fbgemm_linear_static(Tensor x, float x_scale, int x_zero_point, "
        "__torch__.torch.classes.torchquant_native.FbgemmLinearPack packed, float out_scale, "
        "int out_zero_point, bool relu) -> Tensor");
  m.def("fbgemm_lstm_sequence(Tensor ih, Tensor h0, Tensor c0, "
        "__torch__.torch.classes.torchquant_native.FbgemmLinearPack w_hh, bool reduce_range, "
        "bool reverse) -> (Tensor, Tensor, Tensor)");
  m.def("fbgemm_gru_sequence(Tensor ih, Tensor h0, "
        "__torch__.torch.classes.torchquant_native.FbgemmLinearPack w_hh, bool reduce_range, "
        "bool reverse) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("fbgemm_pack_linear", &torchquant_native::fbgemm_pack_linear);
  m.impl("fbgemm_linear_dynamic", &torchquant_native::fbgemm_linear_dynamic);
  m.impl("fbgemm_linear_static", &torchquant_native::fbgemm_linear_static);
  m.impl("fbgemm_lstm_sequence", &torchquant_native::fbgemm_lstm_sequence);
  m.impl("fbgemm_gru_sequence", &torchquant_native::fbgemm_gru_sequence);
}
