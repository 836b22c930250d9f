// An exact u8 x s8 -> s32 GEMM that another library of torchquant's supplies to _C.so at run
// time (the oneDNN library, _onednn.so, which _C.so does not link): the fbgemm Linear computes
// its accumulator with it and applies fbgemm's own epilogue, so the numbers stay torch.ao's.
// Plain C so the two libraries share nothing but this table.
#pragma once

#include <cstdint>

extern "C" {

struct TorchquantInt8Gemm {
  // A handle for the int8 weight [N, K] (row-major), which must outlive the handle (it is read
  // again for each new row count); nullptr on failure.
  void* (*create)(const int8_t* weight, int64_t N, int64_t K);
  // c[M, N] = a[M, K] (uint8) x weight^T, exact int32 sums; false where it cannot.
  bool (*run)(void* handle, const uint8_t* a, int64_t M, int32_t* c);
  void (*destroy)(void* handle);
};

}  // extern "C"
