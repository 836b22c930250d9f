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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

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

}  // namespace torchquant_native

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.def("max_pool2d_8bit(Tensor x, int[] kernel, int[] stride, int[] padding, int[] dilation, "
        "int[] out_size) -> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("max_pool2d_8bit", &torchquant_native::max_pool2d_8bit);
}
