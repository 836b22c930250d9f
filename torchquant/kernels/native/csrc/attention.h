// The native float32 attention (attention.cpp), for its C shim (aoti_shims.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchquant_native {

// softmax(q k^T * scale + attn_mask) v per (batch, head); lanes 16 / 8 / 1 picks the AVX-512,
// AVX2 or scalar loops: torchquant_native::attention.
at::Tensor attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                     const std::optional<at::Tensor>& attn_mask, double scale, int64_t lanes);

// An empty output for ``query`` with value head size ``dv``, in the layout attention writes.
at::Tensor attention_output(const at::Tensor& query, int64_t dv);

}  // namespace torchquant_native
