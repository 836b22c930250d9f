// The native int8 convs (conv.cpp), for their C shims (aoti_shims.cpp).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

namespace torchquant_native {

// A uint8 channels-last 2-d conv (groups 1 or depthwise) with the int8 weight, requantized
// (or float) out, ReLU / hardtanh / an added uint8 tensor fused: torchquant_native::qconv2d.
at::Tensor qconv2d(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                   const at::Tensor& weight, const at::Tensor& weight_scale,
                   const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                   at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                   const std::optional<at::Tensor>& other, double other_scale,
                   int64_t other_zero_point, c10::string_view unary, at::ArrayRef<double> scalars,
                   double out_scale, int64_t out_zero_point, at::ScalarType out_dtype);

// qconv2d up to native_max_batch, oneDNN's call on its prepacked weight beyond.
at::Tensor qconv2d_or_onednn(const at::Tensor& x, double x_scale, int64_t x_zero_point,
                             const at::Tensor& weight, const at::Tensor& weight_scale,
                             const std::optional<at::Tensor>& bias, at::IntArrayRef stride,
                             at::IntArrayRef padding, at::IntArrayRef dilation, int64_t groups,
                             const std::optional<at::Tensor>& other, double other_scale,
                             int64_t other_zero_point, c10::string_view unary,
                             at::ArrayRef<double> scalars, double out_scale,
                             int64_t out_zero_point, at::ScalarType out_dtype,
                             int64_t native_max_batch, const at::Tensor& onednn_weight,
                             const at::Tensor& weight_zero_point);

}  // namespace torchquant_native
