// 2-d max pooling of 8-bit integers (quantized values pool as their codes: quantize() is
// monotone, so the max of the codes is the code of the max).  One pass over the input per
// output row, in the input's layout: channels-last inputs take the max across a window's taps
// for all channels at once (the compiler vectorises the channel loop), NCHW inputs per plane.
// Padded taps never win (they are skipped, not filled), as in torch's quantized max pooling;
// a window with no tap inside the input (ceil mode's last windows can be) gives the type's
// lowest value, as the separable reference (torchquant/ops/pooling.py) does.
//
// The caller (torchquant.ops.pooling) checks the arguments and computes the output size with
// torch's rules; tests compare this kernel with the separable torch-op path and torch's float
// kernel on every layout.

#include <torch/library.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace torchquant_native {
namespace {

struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh, dw;
};

// out[c] = max(out[c], src[c]): the loop the compiler vectorises (restrict: no aliasing)
template <typename T>
inline void max_into(T* __restrict out, const T* __restrict src, int64_t count) {
  for (int64_t c = 0; c < count; ++c) out[c] = out[c] < src[c] ? src[c] : out[c];
}

template <typename T>
__attribute__((target("avx2"))) void max_into_avx2(T* __restrict out, const T* __restrict src,
                                                   int64_t count) {
  for (int64_t c = 0; c < count; ++c) out[c] = out[c] < src[c] ? src[c] : out[c];
}

// Calls tap(ih * W + iw) for every tap of output pixel (oh, ow) inside the H x W input.
template <typename Tap>
inline void for_each_tap(int64_t oh, int64_t ow, int64_t H, int64_t W, const Window& w,
                         const Tap& tap) {
  for (int64_t i = 0; i < w.kh; ++i) {
    const int64_t ih = oh * w.sh - w.ph + i * w.dh;
    if (ih < 0 || ih >= H) continue;
    for (int64_t j = 0; j < w.kw; ++j) {
      const int64_t iw = ow * w.sw - w.pw + j * w.dw;
      if (iw >= 0 && iw < W) tap(ih * W + iw);
    }
  }
}

// The rows [begin, end) of a channels-last pooling (row = n * OH + oh).
template <typename T, bool kAvx2>
void channels_last_rows(const T* x, T* out, int64_t C, int64_t H, int64_t W, int64_t OH,
                        int64_t OW, const Window& w, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t n = row / OH, oh = row % OH;
    const T* image = x + n * H * W * C;
    for (int64_t ow = 0; ow < OW; ++ow) {
      T* o = out + (row * OW + ow) * C;
      std::fill(o, o + C, std::numeric_limits<T>::lowest());
      for_each_tap(oh, ow, H, W, w, [&](int64_t pixel) {
        if (kAvx2) {
          max_into_avx2(o, image + pixel * C, C);
        } else {
          max_into(o, image + pixel * C, C);
        }
      });
    }
  }
}

// The rows [begin, end) of an NCHW pooling (row = plane * OH + oh).
template <typename T>
void plane_rows(const T* x, T* out, int64_t H, int64_t W, int64_t OH, int64_t OW,
                const Window& w, int64_t begin, int64_t end) {
  for (int64_t row = begin; row < end; ++row) {
    const int64_t p = row / OH, oh = row % OH;
    const T* plane = x + p * H * W;
    T* o = out + row * OW;
    for (int64_t ow = 0; ow < OW; ++ow) {
      T best = std::numeric_limits<T>::lowest();
      for_each_tap(oh, ow, H, W, w, [&](int64_t pixel) { best = std::max(best, plane[pixel]); });
      o[ow] = best;
    }
  }
}

}  // namespace

// Max pooling of a 4-d uint8 / int8 tensor, NCHW-contiguous or else channels-last (the output
// in the same layout), to the given output size.
at::Tensor max_pool2d_8bit(const at::Tensor& x, at::IntArrayRef kernel, at::IntArrayRef stride,
                           at::IntArrayRef padding, at::IntArrayRef dilation,
                           at::IntArrayRef out_size) {
  const char* op = "torchquant_native::max_pool2d_8bit";
  TORCH_CHECK_TYPE((x.scalar_type() == at::kByte || x.scalar_type() == at::kChar) &&
                       x.dim() == 4, op, ": expected a 4-d uint8 or int8 tensor, got ",
                   x.scalar_type(), " ", x.sizes());
  TORCH_CHECK_VALUE(kernel.size() == 2 && stride.size() == 2 && padding.size() == 2 &&
                        dilation.size() == 2 && out_size.size() == 2, op,
                    ": kernel, stride, padding, dilation and output size take 2 values each");
  const bool channels_last = !x.is_contiguous() &&
                             x.is_contiguous(at::MemoryFormat::ChannelsLast);
  TORCH_CHECK_VALUE(channels_last || x.is_contiguous(), op,
                    ": the input must be contiguous or channels-last");
  const int64_t N = x.size(0), C = x.size(1), H = x.size(2), W = x.size(3);
  const int64_t OH = out_size[0], OW = out_size[1];
  TORCH_CHECK_VALUE(OH > 0 && OW > 0 && kernel[0] > 0 && kernel[1] > 0 && stride[0] > 0 &&
                        stride[1] > 0 && dilation[0] > 0 && dilation[1] > 0 &&
                        padding[0] >= 0 && padding[1] >= 0, op, ": invalid pooling arguments");
  const Window w{kernel[0], kernel[1], stride[0], stride[1],
                 padding[0], padding[1], dilation[0], dilation[1]};
  auto out = at::empty({N, C, OH, OW}, x.options(),
                       channels_last ? at::MemoryFormat::ChannelsLast
                                     : at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  // rows of about 64 K tap reads per task: small inputs stay on the calling thread
  const int64_t row_work = OW * w.kh * w.kw * (channels_last ? C : 1);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, row_work));
  const bool avx2 = __builtin_cpu_supports("avx2");
  auto run = [&](auto* xp, auto* op_) {
    using T = std::remove_pointer_t<decltype(xp)>;
    if (channels_last) {
      at::parallel_for(0, N * OH, grain, [&](int64_t begin, int64_t end) {
        (avx2 ? channels_last_rows<T, true> : channels_last_rows<T, false>)(
            xp, op_, C, H, W, OH, OW, w, begin, end);
      });
    } else {
      at::parallel_for(0, N * C * OH, grain, [&](int64_t begin, int64_t end) {
        plane_rows<T>(xp, op_, H, W, OH, OW, w, begin, end);
      });
    }
  };
  if (x.scalar_type() == at::kByte) {
    run(x.data_ptr<uint8_t>(), out.data_ptr<uint8_t>());
  } else {
    run(x.data_ptr<int8_t>(), out.data_ptr<int8_t>());
  }
  return out;
}

namespace {

// Sums of each channel over `count` spatial positions: channels-last memory (N, count, C).
template <typename T>
void channel_sums_channels_last(const T* x, int32_t* sums, int64_t C, int64_t count) {
  std::fill(sums, sums + C, 0);
  for (int64_t p = 0; p < count; ++p) {
    const T* row = x + p * C;
    for (int64_t c = 0; c < C; ++c) sums[c] += row[c];
  }
}

template <typename T>
int32_t plane_sum(const T* x, int64_t count) {
  int32_t sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += x[i];
  return sum;
}

// torch's quantized mean of a window: nearbyint(float(sum - count * zp) * (1.0f / count) + zp),
// each float operation rounded on its own (the build turns off FMA contraction), clamped.
template <typename T>
inline T requantize_mean(int32_t sum, int32_t count_zp, float inv_count, float zp, float lo,
                         float hi) {
  float y = static_cast<float>(sum - count_zp) * inv_count;
  y = std::nearbyint(y + zp);
  return static_cast<T>(std::min(std::max(y, lo), hi));
}

}  // namespace

// The mean over the `ndim` innermost dims of an 8-bit (N, C, *spatial) tensor, requantized to
// its own zero point (adaptive average pooling to size 1, torch's rounding), keepdim; the
// output is channels-last where the input is (and is not also contiguous), else contiguous.
at::Tensor global_mean_8bit(const at::Tensor& x, int64_t ndim, int64_t zero_point, int64_t qmin,
                            int64_t qmax) {
  const char* op = "torchquant_native::global_mean_8bit";
  TORCH_CHECK_TYPE((x.scalar_type() == at::kByte || x.scalar_type() == at::kChar) &&
                       (ndim == 2 || ndim == 3) && x.dim() == ndim + 2, op,
                   ": expected a uint8 or int8 (N, C, *spatial) tensor with 2 or 3 spatial "
                   "dims, got ", x.scalar_type(), " ", x.sizes(), " ndim=", ndim);
  const auto channels_last_format =
      ndim == 2 ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::ChannelsLast3d;
  const bool channels_last = !x.is_contiguous() && x.is_contiguous(channels_last_format);
  TORCH_CHECK_VALUE(channels_last || x.is_contiguous(), op,
                    ": the input must be contiguous or channels-last");
  const int64_t N = x.size(0), C = x.size(1);
  const int64_t count = x.numel() / std::max<int64_t>(1, N * C);
  TORCH_CHECK_VALUE(count > 0 && count < (int64_t{1} << 22), op,
                    ": expected between 1 and 2**22 - 1 elements per channel, got ", count);
  std::vector<int64_t> shape{N, C};
  shape.resize(ndim + 2, 1);
  auto out = at::empty(shape, x.options(), channels_last ? channels_last_format
                                                         : at::MemoryFormat::Contiguous);
  if (out.numel() == 0) return out;
  // torch's float32 1.0f / count, the zero point and the bounds as floats
  const float inv_count = 1.0f / static_cast<float>(count);
  const float zp = static_cast<float>(zero_point), lo = static_cast<float>(qmin),
              hi = static_cast<float>(qmax);
  const int32_t count_zp = static_cast<int32_t>(count * zero_point);
  auto run = [&](auto* xp, auto* op_) {
    using T = std::remove_pointer_t<decltype(xp)>;
    if (channels_last) {
      // one image per task, about 64 K reads per task at least
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (count * C));
      at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
        std::vector<int32_t> sums(C);
        for (int64_t n = begin; n < end; ++n) {
          channel_sums_channels_last(xp + n * count * C, sums.data(), C, count);
          for (int64_t c = 0; c < C; ++c)
            op_[n * C + c] = requantize_mean<T>(sums[c], count_zp, inv_count, zp, lo, hi);
        }
      });
    } else {
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / count);
      at::parallel_for(0, N * C, grain, [&](int64_t begin, int64_t end) {
        for (int64_t p = begin; p < end; ++p)
          op_[p] = requantize_mean<T>(plane_sum(xp + p * count, count), count_zp, inv_count, zp,
                                      lo, hi);
      });
    }
  };
  if (x.scalar_type() == at::kByte) {
    run(x.data_ptr<uint8_t>(), out.data_ptr<uint8_t>());
  } else {
    run(x.data_ptr<int8_t>(), out.data_ptr<int8_t>());
  }
  return out;
}

}  // namespace torchquant_native

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("max_pool2d_8bit(Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, "
        "int[] out_size) -> Tensor");
  m.def("global_mean_8bit(Tensor x, int ndim, int zero_point, int qmin, int qmax) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("max_pool2d_8bit", &torchquant_native::max_pool2d_8bit);
  m.impl("global_mean_8bit", &torchquant_native::global_mean_8bit);
}
