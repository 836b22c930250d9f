#include "onednn_common.h"

#include <cstdlib>
#include <memory>

namespace torchquant_native {

dnnl::engine& onednn_cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& onednn_thread_stream() {
  thread_local dnnl::stream stream(onednn_cpu_engine());
  return stream;
}

namespace {

struct Scratchpad {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  std::unique_ptr<void, Free> data;
  size_t size = 0;
};

}  // namespace

dnnl::memory onednn_thread_scratchpad(const dnnl::memory::desc& desc) {
  thread_local Scratchpad pad;
  const size_t need = desc.get_size();
  if (need > pad.size) {
    const size_t size = (need + 4095) / 4096 * 4096;
    pad.data.reset(std::aligned_alloc(64, size));
    pad.size = pad.data ? size : 0;
    if (!pad.data) throw std::bad_alloc();
  }
  return dnnl::memory(desc, onednn_cpu_engine(), pad.data.get());
}

dnnl::primitive_attr onednn_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

}  // namespace torchquant_native
