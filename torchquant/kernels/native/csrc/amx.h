// An exact uint8 x int8 -> int32 GEMM on AMX tiles (Sapphire Rapids and later), for the
// native conv and Linear: C[M, N] = A[M, K] (uint8, row-major) x B (int8, packed from
// B^T [N, K]).  TDPBUSD accumulates every product in int32: no saturation, whatever the codes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>

namespace torchquant_native {

// Whether this CPU has AMX-INT8 and the kernel let this process use its tile registers.
bool amx_int8_supported();
// Whether the AMX kernels run now: supported and not switched off (tests force lower paths).
bool amx_int8_active();

// Rows of A one kernel call covers (A and C buffers hold this many rows; extra rows are
// computed and ignored), and the K / N granularity of the packed B.
constexpr int64_t kAmxRows = 32;
constexpr int64_t kAmxK = 64;
constexpr int64_t kAmxN = 32;

// B^T [N, K] int8 in AMX's VNNI tile order: [Np / 16][Kp / 4][16][4], zero-padded to
// Kp = round_up(K, 64) and Np = round_up(N, 32).
struct AmxPackedB {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  int64_t K = 0, Kp = 0, N = 0, Np = 0;
  std::unique_ptr<int8_t[], Free> data;  // 64-byte aligned: tile rows never straddle lines
};
AmxPackedB amx_pack_b(const int8_t* bt, int64_t N, int64_t K, int64_t ldb);

// Load / release this thread's tile configuration around a run of amx_gemm_rows calls.
void amx_tiles_begin();
void amx_tiles_end();

// C[kAmxRows, n_begin:n_end] = A x B for columns n_begin..n_end (multiples of kAmxN), ldc
// in int32 elements.  Step i of the reduction multiplies packed B's rows [64 i, 64 i + 64)
// by the 64 bytes at a + a_steps[i] + r * lda of each row r < 16 (a_hi for rows 16..31): A
// need not be materialized (a conv reads its padded input in place).  Every row read must be
// readable; results of rows past the caller's real ones are garbage and ignored.
void amx_gemm_rows(const uint8_t* a, const uint8_t* a_hi, int64_t lda, const int64_t* a_steps,
                   const AmxPackedB& b, int64_t n_begin, int64_t n_end, int32_t* c, int64_t ldc);

// The same product for 1..3 rows of A (rows of K bytes, lda apart) with AVX-512 VNNI on the
// same packing (a 64-byte row of a panel is one VPDPBUSD operand): a tile would waste 13 of
// its 16 rows.  The exact int32 sums, as amx_gemm_rows; needs AVX-512 VNNI (every AMX CPU).
void vnni_gemv_rows(const uint8_t* a, int64_t rows, int64_t lda, const AmxPackedB& b,
                    int64_t n_begin, int64_t n_end, int32_t* c, int64_t ldc);

}  // namespace torchquant_native
