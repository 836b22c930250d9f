// What the oneDNN library's primitives share: one engine, a stream and a scratchpad per
// calling thread.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

namespace torchquant_native {

// The one CPU engine every primitive and memory of this library uses (oneDNN runs a
// primitive only on memories of its own engine).
dnnl::engine& onednn_cpu_engine();

// The calling thread's stream (creating one per call costs more than a small GEMM's set-up).
dnnl::stream& onednn_thread_stream();

// The calling thread's scratchpad for a primitive built with scratchpad_mode::user, grown to
// `desc`'s size and kept: oneDNN's own scratchpad is allocated on every execution, and the
// large ones are fresh pages each time.
dnnl::memory onednn_thread_scratchpad(const dnnl::memory::desc& desc);

// A primitive attribute set to the user scratchpad mode.
dnnl::primitive_attr onednn_attr();

}  // namespace torchquant_native
