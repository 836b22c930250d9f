// The AMX int8 GEMM (see amx.h): four 16x16 int32 accumulator tiles per 32x32 block of C,
// two uint8 A tiles and two int8 B tiles per 64-deep step of K.
#include "amx.h"

#include <torch/library.h>

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace torchquant_native {

namespace {

constexpr int kArchReqXcompPerm = 0x1023;  // arch_prctl: ask for an XSAVE feature
constexpr int kXfeatureXtiledata = 18;     // the tile data registers

bool detect() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
  const bool tile = edx & (1u << 24), int8 = edx & (1u << 25);
  if (!tile || !int8) return false;
  // the conv's epilogue is AVX-512 (every AMX CPU has it; a VM might hide it)
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return false;
  // Linux hands out tile registers only to processes that ask (once; oneDNN asks the same).
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

std::atomic<bool> enabled{true};

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

bool amx_int8_supported() {
  static const bool supported = detect();
  return supported;
}

bool amx_int8_active() { return enabled.load(std::memory_order_relaxed) && amx_int8_supported(); }

void amx_int8_enable(bool on) { enabled.store(on); }

AmxPackedB amx_pack_b(const int8_t* bt, int64_t N, int64_t K, int64_t ldb) {
  AmxPackedB p;
  p.N = N;
  p.K = K;
  p.Kp = (K + kAmxK - 1) / kAmxK * kAmxK;
  p.Np = (N + kAmxN - 1) / kAmxN * kAmxN;
  const int64_t kgroups = p.Kp / 4;
  const int64_t bytes = p.Np * p.Kp;
  p.data.reset(static_cast<int8_t*>(std::aligned_alloc(64, bytes)));
  TORCH_CHECK(p.data, "amx_pack_b: out of memory for ", bytes, " bytes");
  std::memset(p.data.get(), 0, bytes);
  for (int64_t n = 0; n < N; ++n) {
    int8_t* panel = p.data.get() + (n / 16) * kgroups * 64 + (n % 16) * 4;
    for (int64_t k = 0; k < K; ++k) panel[(k / 4) * 64 + (k % 4)] = bt[n * ldb + k];
  }
  return p;
}

__attribute__((target("amx-tile,amx-int8"))) void amx_tiles_begin() {
  TileConfig cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.rows[t] = 16;
    cfg.colsb[t] = 64;
  }
  // gcc's _tile_loadconfig tells the compiler it reads 8 bytes, so the row / column stores
  // above were dropped as dead; the whole struct as the operand keeps them.
  asm volatile("ldtilecfg %0" : : "m"(cfg));
}

__attribute__((target("amx-tile"))) void amx_tiles_end() { _tile_release(); }

__attribute__((target("amx-tile,amx-int8"))) void amx_gemm_rows(
    const uint8_t* a, const uint8_t* a_hi, int64_t lda, const int64_t* a_steps,
    const AmxPackedB& b, int64_t n_begin, int64_t n_end, int32_t* c, int64_t ldc) {
  const int64_t panel = (b.Kp / 4) * 64;  // bytes of one 16-column panel of B
  const int64_t c_stride = ldc * static_cast<int64_t>(sizeof(int32_t));
  for (int64_t n = n_begin; n < n_end; n += kAmxN) {
    const int8_t* b0 = b.data.get() + (n / 16) * panel;
    const int8_t* b1 = b0 + panel;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t i = 0, steps = b.Kp / kAmxK; i < steps; ++i) {
      _tile_loadd(4, a + a_steps[i], lda);
      _tile_loadd(5, a_hi + a_steps[i], lda);
      _tile_loadd(6, b0 + i * kAmxK * 16, 64);
      _tile_loadd(7, b1 + i * kAmxK * 16, 64);
      _tile_dpbusd(0, 4, 6);
      _tile_dpbusd(1, 4, 7);
      _tile_dpbusd(2, 5, 6);
      _tile_dpbusd(3, 5, 7);
    }
    _tile_stored(0, c + n, c_stride);
    _tile_stored(1, c + n + 16, c_stride);
    _tile_stored(2, c + 16 * ldc + n, c_stride);
    _tile_stored(3, c + 16 * ldc + n + 16, c_stride);
  }
}

namespace {

// P panels (16 columns each) of R rows: R x P accumulators, the reduction split in two halves
// (even / odd 4-byte groups) so that twice as many VPDPBUSD chains run at once.
template <int R, int P>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_panels(
    const int32_t* a4, int64_t kgroups, const int8_t* panels, int64_t panel_bytes, int32_t* c,
    int64_t ldc) {
  __m512i acc[2][R][P];
  for (int h = 0; h < 2; ++h)
    for (int r = 0; r < R; ++r)
      for (int p = 0; p < P; ++p) acc[h][r][p] = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 2 <= kgroups; i += 2) {
    for (int h = 0; h < 2; ++h) {
      __m512i bv[P];
      for (int p = 0; p < P; ++p)
        bv[p] = _mm512_load_si512(panels + p * panel_bytes + (i + h) * 64);
      for (int r = 0; r < R; ++r) {
        const __m512i av = _mm512_set1_epi32(a4[r * kgroups + i + h]);
        for (int p = 0; p < P; ++p) acc[h][r][p] = _mm512_dpbusd_epi32(acc[h][r][p], av, bv[p]);
      }
    }
  }
  for (; i < kgroups; ++i) {
    for (int r = 0; r < R; ++r) {
      const __m512i av = _mm512_set1_epi32(a4[r * kgroups + i]);
      for (int p = 0; p < P; ++p)
        acc[0][r][p] = _mm512_dpbusd_epi32(
            acc[0][r][p], av, _mm512_load_si512(panels + p * panel_bytes + i * 64));
    }
  }
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p)
      _mm512_storeu_si512(c + r * ldc + p * 16, _mm512_add_epi32(acc[0][r][p], acc[1][r][p]));
}

template <int R>
void vnni_rows(const int32_t* a4, int64_t kgroups, const AmxPackedB& b, int64_t n_begin,
               int64_t n_end, int32_t* c, int64_t ldc) {
  const int64_t panel_bytes = kgroups * 64;
  int64_t n = n_begin;
  for (; n + 64 <= n_end; n += 64)
    vnni_panels<R, 4>(a4, kgroups, b.data.get() + (n / 16) * panel_bytes, panel_bytes, c + n, ldc);
  for (; n < n_end; n += 32)
    vnni_panels<R, 2>(a4, kgroups, b.data.get() + (n / 16) * panel_bytes, panel_bytes, c + n, ldc);
}

}  // namespace

void vnni_gemv_rows(const uint8_t* a, int64_t rows, int64_t lda, const AmxPackedB& b,
                    int64_t n_begin, int64_t n_end, int32_t* c, int64_t ldc) {
  TORCH_CHECK(rows >= 1 && rows <= 3, "vnni_gemv_rows: 1 to 3 rows, got ", rows);
  // each row's 4-byte groups as int32 broadcasts, zero past K (the packing's zero rows meet them)
  const int64_t kgroups = b.Kp / 4;
  std::vector<int32_t> a4(rows * kgroups, 0);
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(reinterpret_cast<uint8_t*>(a4.data() + r * kgroups), a + r * lda, b.K);
  switch (rows) {
    case 1: vnni_rows<1>(a4.data(), kgroups, b, n_begin, n_end, c, ldc); break;
    case 2: vnni_rows<2>(a4.data(), kgroups, b, n_begin, n_end, c, ldc); break;
    default: vnni_rows<3>(a4.data(), kgroups, b, n_begin, n_end, c, ldc); break;
  }
}

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("amx_int8_supported() -> bool", &amx_int8_supported);
  m.def("amx_int8_enable(bool on) -> ()", &amx_int8_enable);
  m.def("amx_int8_active() -> bool", &amx_int8_active);
}

}  // namespace torchquant_native
