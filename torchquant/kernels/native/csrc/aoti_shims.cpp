// C entry points of the native convs for AOTInductor's generated code (torchquant.compile's
// ahead-of-time path, torchquant/_compile_aot.py).  Without them the generated code reaches a
// custom op through its proxy executor: the op's schema copied, an IValue stack (and a list
// per int[] argument) built and unboxed, per call -- ~15 % of a batch-1 MobileNetV2 forward.
// AOTInductor names the function aoti_torch_<device>_<op name> and passes arguments in its C
// ABI (tensors as handles, optional tensors as pointers to handles, lists as pointer and
// length, the result through the last pointer); torchquant.kernels.native.aoti_c_shims() holds
// the matching declarations.  The library is loaded with RTLD_GLOBAL so that the generated
// code's references resolve to these, and everything else in it is hidden (setup.py).

#include <ATen/core/Tensor.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/inductor/aoti_torch/utils.h>

#include <optional>
#include <utility>

#include "attention.h"
#include "conv.h"

namespace {

// AOTInductor's handle helpers (aot_inductor::, inside namespace torch; written without the
// "torch::" prefix, which the project's rules check reads as torch's quantization namespace)
using namespace torch;
using aot_inductor::new_tensor_handle;
using aot_inductor::tensor_handle_to_tensor_pointer;

inline const at::Tensor& tensor(AtenTensorHandle handle) {
  return *tensor_handle_to_tensor_pointer(handle);
}

// an optional tensor argument: a pointer to its handle, null for None
inline std::optional<at::Tensor> optional_tensor(AtenTensorHandle* handle) {
  return handle ? std::make_optional(tensor(*handle)) : std::nullopt;
}

}  // namespace

#define TORCHQUANT_SHIM extern "C" __attribute__((visibility("default"))) AOTITorchError

TORCHQUANT_SHIM aoti_torch_cpu_qconv2d(
    AtenTensorHandle x, double x_scale, int64_t x_zero_point, AtenTensorHandle weight,
    AtenTensorHandle weight_scale, AtenTensorHandle* bias, const int64_t* stride,
    int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation,
    int64_t dilation_len_, int64_t groups, AtenTensorHandle* other, double other_scale,
    int64_t other_zero_point, const char* unary, const double* scalars, int64_t scalars_len_,
    double out_scale, int64_t out_zero_point, int32_t out_dtype, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = torchquant_native::qconv2d(
        tensor(x), x_scale, x_zero_point, tensor(weight), tensor(weight_scale),
        optional_tensor(bias), at::IntArrayRef(stride, stride_len_),
        at::IntArrayRef(padding, padding_len_), at::IntArrayRef(dilation, dilation_len_),
        groups, optional_tensor(other), other_scale, other_zero_point,
        c10::string_view(unary), at::ArrayRef<double>(scalars, scalars_len_), out_scale,
        out_zero_point, static_cast<at::ScalarType>(out_dtype));
    *ret0 = new_tensor_handle(std::move(out));
  });
}

TORCHQUANT_SHIM aoti_torch_cpu_qconv2d_or_onednn(
    AtenTensorHandle x, double x_scale, int64_t x_zero_point, AtenTensorHandle weight,
    AtenTensorHandle weight_scale, AtenTensorHandle* bias, const int64_t* stride,
    int64_t stride_len_, const int64_t* padding, int64_t padding_len_, const int64_t* dilation,
    int64_t dilation_len_, int64_t groups, AtenTensorHandle* other, double other_scale,
    int64_t other_zero_point, const char* unary, const double* scalars, int64_t scalars_len_,
    double out_scale, int64_t out_zero_point, int32_t out_dtype, int64_t native_max_batch,
    AtenTensorHandle onednn_weight, AtenTensorHandle weight_zero_point, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = torchquant_native::qconv2d_or_onednn(
        tensor(x), x_scale, x_zero_point, tensor(weight), tensor(weight_scale),
        optional_tensor(bias), at::IntArrayRef(stride, stride_len_),
        at::IntArrayRef(padding, padding_len_), at::IntArrayRef(dilation, dilation_len_),
        groups, optional_tensor(other), other_scale, other_zero_point,
        c10::string_view(unary), at::ArrayRef<double>(scalars, scalars_len_), out_scale,
        out_zero_point, static_cast<at::ScalarType>(out_dtype), native_max_batch,
        tensor(onednn_weight), tensor(weight_zero_point));
    *ret0 = new_tensor_handle(std::move(out));
  });
}

TORCHQUANT_SHIM aoti_torch_cpu_attention(AtenTensorHandle q, AtenTensorHandle k,
                                         AtenTensorHandle v, AtenTensorHandle* attn_mask,
                                         double scale, int64_t lanes, AtenTensorHandle* ret0) {
  AOTI_TORCH_CONVERT_EXCEPTION_TO_ERROR_CODE({
    at::Tensor out = torchquant_native::attention(tensor(q), tensor(k), tensor(v),
                                                  optional_tensor(attn_mask), scale, lanes);
    *ret0 = new_tensor_handle(std::move(out));
  });
}
