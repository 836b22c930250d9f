// The exact u8 x s8 -> s32 GEMM of the int8 Linear on oneDNN's own library: a matmul primitive
// per row count, kept with the weight in its layout.  _C.so's fbgemm Linear takes its
// accumulator from here (int8_gemm_provider.h) at many rows, where oneDNN's brgemm GEMM is the
// faster one, and applies fbgemm's epilogue as torch.ao does (BENCHMARKS.md, twelfth session).
#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "../int8_gemm_provider.h"
#include "onednn_common.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

namespace torchquant_native {

namespace {

using dnnl::memory;

// One weight's matmuls: a primitive per (rows, thread count), the weight reordered once per
// layout the primitives ask for (the same one for every row count measured).
struct MatmulWeight {
  const int8_t* weight = nullptr;  // the caller's [N, K] row-major: oneDNN's [K, N], "ba" order
  int64_t N = 0, K = 0;
  struct Entry {
    dnnl::matmul primitive;
    memory weight;
    memory::desc scratchpad;
  };
  std::mutex mutex;
  std::unordered_map<int64_t, std::shared_ptr<const Entry>> by_rows;  // key: M * 1024 + threads
  std::vector<std::pair<memory::desc, memory>> layouts;

  std::shared_ptr<const Entry> entry(int64_t M) {
    const int threads = at::get_num_threads();
    const int64_t key = M * 1024 + threads;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = by_rows.find(key);
    if (found != by_rows.end()) return found->second;
    using dt = memory::data_type;
    using tag = memory::format_tag;
    auto& engine = onednn_cpu_engine();
    auto pd = dnnl::matmul::primitive_desc(
        engine, memory::desc({M, K}, dt::u8, tag::ab), memory::desc({K, N}, dt::s8, tag::any),
        memory::desc({M, N}, dt::s32, tag::ab), onednn_attr());
    auto made = std::make_shared<Entry>();
    made->primitive = dnnl::matmul(pd);
    made->scratchpad = pd.scratchpad_desc();
    for (const auto& layout : layouts) {
      if (layout.first == pd.weights_desc()) made->weight = layout.second;
    }
    if (!made->weight) {
      memory plain(memory::desc({K, N}, dt::s8, tag::ba), engine, const_cast<int8_t*>(weight));
      made->weight = memory(pd.weights_desc(), engine);
      dnnl::stream stream(engine);
      dnnl::reorder(plain, made->weight).execute(stream, plain, made->weight);
      stream.wait();
      layouts.emplace_back(pd.weights_desc(), made->weight);
    }
    if (by_rows.size() >= 64) by_rows.clear();  // many row counts (a varying batch): start over
    by_rows.emplace(key, made);
    return made;
  }
};

void* create(const int8_t* weight, int64_t N, int64_t K) {
  try {
    auto w = std::make_unique<MatmulWeight>();
    w->weight = weight;
    w->N = N;
    w->K = K;
    return w.release();
  } catch (...) {
    return nullptr;
  }
}

bool run(void* handle, const uint8_t* a, int64_t M, int32_t* c) {
  auto* w = static_cast<MatmulWeight*>(handle);
  try {
    auto entry = w->entry(M);
    auto& engine = onednn_cpu_engine();
    using dt = memory::data_type;
    using tag = memory::format_tag;
    memory src(memory::desc({M, w->K}, dt::u8, tag::ab), engine, const_cast<uint8_t*>(a));
    memory dst(memory::desc({M, w->N}, dt::s32, tag::ab), engine, c);
    dnnl::stream& stream = onednn_thread_stream();
    entry->primitive.execute(stream, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, entry->weight},
                                      {DNNL_ARG_DST, dst},
                                      {DNNL_ARG_SCRATCHPAD,
                                       onednn_thread_scratchpad(entry->scratchpad)}});
    stream.wait();
    return true;
  } catch (...) {  // oneDNN's errors, or memory: the caller falls back to fbgemm's GEMM
    return false;
  }
}

void destroy(void* handle) { delete static_cast<MatmulWeight*>(handle); }

const TorchquantInt8Gemm kProvider{&create, &run, &destroy};

}  // namespace

// The provider's address, for _C.so's set_int8_gemm_provider.
int64_t onednn_int8_gemm_provider() { return reinterpret_cast<int64_t>(&kProvider); }

// a[M, K] uint8 x weight[N, K] int8 -> int32 [M, N] through the provider (tests, probes).
at::Tensor onednn_int8_matmul(const at::Tensor& a, const at::Tensor& weight) {
  TORCH_CHECK_TYPE(a.scalar_type() == at::kByte && a.dim() == 2, "onednn_int8_matmul: a must be "
                   "a 2-d uint8 tensor, got ", a.scalar_type(), " ", a.sizes());
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kChar && weight.dim() == 2, "onednn_int8_matmul: "
                   "weight must be a 2-d int8 tensor, got ", weight.scalar_type(), " ",
                   weight.sizes());
  TORCH_CHECK_VALUE(a.size(1) == weight.size(1), "onednn_int8_matmul: a ", a.sizes(),
                    " and weight ", weight.sizes(), " do not multiply");
  auto w = weight.contiguous();
  auto ac = a.contiguous();
  std::unique_ptr<void, void (*)(void*)> handle(create(w.data_ptr<int8_t>(), w.size(0), w.size(1)),
                                                &destroy);
  auto out = at::empty({a.size(0), w.size(0)}, a.options().dtype(at::kInt));
  TORCH_CHECK(handle && run(handle.get(), ac.data_ptr<uint8_t>(), a.size(0),
                            out.data_ptr<int32_t>()), "onednn_int8_matmul: oneDNN failed");
  return out;
}

}  // namespace torchquant_native

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("onednn_int8_gemm_provider() -> int", &torchquant_native::onednn_int8_gemm_provider);
  m.def("onednn_int8_matmul(Tensor a, Tensor weight) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("onednn_int8_matmul", &torchquant_native::onednn_int8_matmul);
}
