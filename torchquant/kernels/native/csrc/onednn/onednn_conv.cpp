// The int8 2-d conv on oneDNN's own library (libdnnl, the OpenMP build of the onednn-cpu-gomp
// wheel), a primitive built once per input shape and kept: what torch.ao's x86 conv does with
// the oneDNN inside torch, which torch does not export.  The public onednn::qconv_pointwise op
// torchquant may call builds its descriptors again on every call (BENCHMARKS.md, twelfth
// session).
//
// The computation of torch's quantized conv: uint8 channels-last source with a runtime scale
// and zero point, int8 weight (zero points 0) with per-output-channel scales and a float32
// bias (post-ops, in torch's rounding order), an optional uint8 addend and ReLU, uint8
// destination with a runtime scale and zero point (or float32 out without them).  The integers
// equal torch.ao's on the CPUs the tests run on (tests/kernels/test_native_onednn.py).
//
// Built into its own library (_onednn.so) beside _C.so, so that a missing libdnnl costs these
// ops only; the headers are the oneDNN headers torch ships (oneDNN 3.x C API).
#include <torch/library.h>
#include <torch/custom_class.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/Parallel.h>

#include <oneapi/dnnl/dnnl.hpp>

#include "onednn_common.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace torchquant_native {
namespace {

using dnnl::memory;

memory::desc scalar_desc(memory::data_type type) {
  return memory::desc({1}, type, memory::format_tag::a);
}

}  // namespace

// The primitive and the memory it reads besides the input: built for one thread count.
struct ConvPrimitive {
  dnnl::convolution_forward primitive;
  memory weight, weight_scale, bias;
  memory::desc scratchpad;
  int threads = 0;
  std::string implementation;
};

// A oneDNN conv for one input shape.  oneDNN divides a primitive's work among the threads
// there were when it was built, so a plan rebuilds its primitive when ATen's thread count has
// changed since (torch.set_num_threads); the integers do not depend on it.
struct OnednnConvPlan : torch::CustomClassHolder {
  at::Tensor weight, weight_scale, bias;  // int8 [OC, IC/g, KH, KW]; float32 [OC] each
  std::vector<int64_t> in_shape, out_shape, stride, padding, dilation;
  int64_t groups = 1;
  bool relu = false;
  bool sum = false;            // an added uint8 operand (scale, zero point), before the ReLU
  float sum_scale = 1.f;
  int32_t sum_zero_point = 0;
  bool float_out = false;
  bool src_zero_point = true;  // false: built for input zero point 0 (no compensation pass)
  memory::desc src_desc, dst_desc;

  // The primitive for the current thread count, rebuilt when it changed.
  std::shared_ptr<const ConvPrimitive> current();
  std::string impl() { return current()->implementation; }

 private:
  std::mutex mutex_;
  std::shared_ptr<const ConvPrimitive> built_;
};

namespace {

std::shared_ptr<const ConvPrimitive> build(const OnednnConvPlan& plan) {
  using dt = memory::data_type;
  using tag = memory::format_tag;
  auto& engine = onednn_cpu_engine();
  const int64_t OC = plan.weight.size(0), ICG = plan.weight.size(1);
  const int64_t KH = plan.weight.size(2), KW = plan.weight.size(3), G = plan.groups;
  const bool grouped = G > 1;
  memory::dims weight_dims = grouped ? memory::dims{G, OC / G, ICG, KH, KW}
                                     : memory::dims{OC, ICG, KH, KW};
  auto channel_desc = memory::desc({1, OC, 1, 1}, dt::f32, tag::abcd);
  const bool has_bias = plan.bias.defined();

  // torch's conv rounds the input scale's product before the weight scale's,
  // (acc * x_scale) * w_scale[c] + bias[c]; oneDNN's own scales multiply acc once by their
  // product (a one-step difference where that lands on a tie).  So the input scale is
  // oneDNN's scale and the weight scale and bias are post-ops (a per-channel multiply, then
  // add), in torch's order.
  dnnl::primitive_attr attr = onednn_attr();
  attr.set_scales_mask(DNNL_ARG_SRC, 0);
  if (plan.src_zero_point) attr.set_zero_points_mask(DNNL_ARG_SRC, 0);
  if (!plan.float_out) {
    attr.set_scales_mask(DNNL_ARG_DST, 0);
    attr.set_zero_points_mask(DNNL_ARG_DST, 0);
  }
  dnnl::post_ops post;
  post.append_binary(dnnl::algorithm::binary_mul, channel_desc);
  if (has_bias) post.append_binary(dnnl::algorithm::binary_add, channel_desc);
  // torch's ConvAdd2d: the addend's codes are the destination's own, summed with their scale
  // and zero point (set per call: DNNL_RUNTIME_F32_VAL is not there for sums, so the plan is
  // per addend qparams, which the eager plan's key holds)
  if (plan.sum) post.append_sum(plan.sum_scale, plan.sum_zero_point);
  if (plan.relu) post.append_eltwise(dnnl::algorithm::eltwise_relu, 0.f, 0.f);
  attr.set_post_ops(post);
  memory::dims strides(plan.stride.begin(), plan.stride.end());
  memory::dims dilations{plan.dilation[0] - 1, plan.dilation[1] - 1};
  memory::dims pads(plan.padding.begin(), plan.padding.end());
  auto pd = dnnl::convolution_forward::primitive_desc(
      engine, dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      plan.src_desc, memory::desc(weight_dims, dt::s8, tag::any), plan.dst_desc, strides,
      dilations, pads, pads, attr);

  auto out = std::make_shared<ConvPrimitive>();
  out->threads = at::get_num_threads();
  out->implementation = pd.impl_info_str();
  out->primitive = dnnl::convolution_forward(pd);
  out->scratchpad = pd.scratchpad_desc();
  dnnl::stream stream(engine);
  memory plain(memory::desc(weight_dims, dt::s8, grouped ? tag::goihw : tag::oihw), engine,
               plan.weight.data_ptr());
  out->weight = memory(pd.weights_desc(), engine);
  dnnl::reorder(plain, out->weight).execute(stream, plain, out->weight);
  stream.wait();
  // the plan's float32 tensors stay alive with it: oneDNN reads them in place
  out->weight_scale = memory(channel_desc, engine, plan.weight_scale.data_ptr());
  if (has_bias) out->bias = memory(channel_desc, engine, plan.bias.data_ptr());
  return out;
}

}  // namespace

c10::intrusive_ptr<OnednnConvPlan> onednn_conv_plan(
    const at::Tensor& weight, const at::Tensor& weight_scale, const c10::optional<at::Tensor>& bias,
    at::IntArrayRef in_shape, at::IntArrayRef stride, at::IntArrayRef padding,
    at::IntArrayRef dilation, int64_t groups, c10::string_view unary, at::ScalarType out_dtype,
    bool src_zero_point, c10::optional<double> sum_scale, int64_t sum_zero_point) {
  const char* op = "onednn_conv_plan";
  TORCH_CHECK_TYPE(weight.scalar_type() == at::kChar && weight.dim() == 4, op,
                   ": weight must be a 4-d int8 tensor, got ", weight.scalar_type(), " ",
                   weight.sizes());
  TORCH_CHECK(weight.device().is_cpu(), op, ": weight must be on the CPU");
  TORCH_CHECK_VALUE(in_shape.size() == 4 && stride.size() == 2 && padding.size() == 2 &&
                        dilation.size() == 2, op, ": a 2-d conv needs a 4-d input shape and "
                    "2 strides, paddings and dilations");
  TORCH_CHECK_VALUE(unary == "none" || unary == "relu", op, ": unary must be 'none' or 'relu', "
                    "got '", std::string(unary), "'");
  TORCH_CHECK_VALUE(out_dtype == at::kByte || out_dtype == at::kFloat, op,
                    ": out_dtype must be uint8 or float32, got ", out_dtype);
  const int64_t N = in_shape[0], IC = in_shape[1], H = in_shape[2], W = in_shape[3];
  const int64_t OC = weight.size(0), ICG = weight.size(1), KH = weight.size(2), KW = weight.size(3);
  TORCH_CHECK_VALUE(groups >= 1 && IC == ICG * groups && OC % groups == 0, op, ": input of ", IC,
                    " channels and weight ", weight.sizes(), " do not match ", groups, " groups");
  TORCH_CHECK_VALUE(weight_scale.numel() == OC, op, ": need ", OC, " weight scales, got ",
                    weight_scale.numel());
  const bool has_bias = bias.has_value() && bias->defined();
  TORCH_CHECK_VALUE(!has_bias || bias->numel() == OC, op, ": bias must have ", OC,
                    " elements, got ", has_bias ? bias->numel() : 0);
  for (int i = 0; i < 2; ++i) {
    TORCH_CHECK_VALUE(stride[i] >= 1 && dilation[i] >= 1 && padding[i] >= 0, op,
                      ": strides and dilations must be positive, paddings non-negative");
  }
  const int64_t OH = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) / stride[0] + 1;
  const int64_t OW = (W + 2 * padding[1] - dilation[1] * (KW - 1) - 1) / stride[1] + 1;
  TORCH_CHECK_VALUE(N > 0 && OH > 0 && OW > 0, op, ": empty output for input ", in_shape);

  auto plan = c10::make_intrusive<OnednnConvPlan>();
  plan->weight = weight.contiguous();
  plan->weight_scale = weight_scale.detach().to(at::kFloat).contiguous().reshape({OC}).clone();
  if (has_bias) plan->bias = bias->detach().to(at::kFloat).contiguous().reshape({OC}).clone();
  plan->in_shape = in_shape.vec();
  plan->out_shape = {N, OC, OH, OW};
  plan->stride = stride.vec();
  plan->padding = padding.vec();
  plan->dilation = dilation.vec();
  plan->groups = groups;
  plan->relu = unary == "relu";
  plan->float_out = out_dtype == at::kFloat;
  plan->src_zero_point = src_zero_point;
  if (sum_scale.has_value()) {
    TORCH_CHECK_VALUE(!plan->float_out, op, ": an added operand needs a uint8 output");
    TORCH_CHECK_VALUE(0 <= sum_zero_point && sum_zero_point <= 255, op, ": the added operand's "
                      "zero point must be in 0..255, got ", sum_zero_point);
    plan->sum = true;
    plan->sum_scale = static_cast<float>(*sum_scale);
    plan->sum_zero_point = static_cast<int32_t>(sum_zero_point);
  }
  using dt = memory::data_type;
  plan->src_desc = memory::desc({N, IC, H, W}, dt::u8, memory::format_tag::nhwc);
  plan->dst_desc = memory::desc({N, OC, OH, OW}, plan->float_out ? dt::f32 : dt::u8,
                                memory::format_tag::nhwc);
  plan->current();  // built now: bad arguments raise here, not at the first call
  return plan;
}

std::shared_ptr<const ConvPrimitive> OnednnConvPlan::current() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!built_ || built_->threads != at::get_num_threads()) built_ = build(*this);
  return built_;
}

at::Tensor onednn_conv(const at::Tensor& x, const c10::intrusive_ptr<OnednnConvPlan>& plan,
                       double x_scale, int64_t x_zero_point, double out_scale,
                       int64_t out_zero_point, const c10::optional<at::Tensor>& other) {
  TORCH_CHECK_TYPE(x.scalar_type() == at::kByte, "onednn_conv: input must be uint8, got ",
                   x.scalar_type());
  TORCH_CHECK_VALUE(x.sizes() == at::IntArrayRef(plan->in_shape), "onednn_conv: the plan was "
                    "built for input shape ", at::IntArrayRef(plan->in_shape), ", got ", x.sizes());
  TORCH_CHECK(x.device().is_cpu(), "onednn_conv: input must be on the CPU");
  TORCH_CHECK_VALUE(plan->src_zero_point || x_zero_point == 0, "onednn_conv: the plan was built "
                    "for input zero point 0, got ", x_zero_point);
  const bool has_other = other.has_value() && other->defined();
  TORCH_CHECK_VALUE(has_other == plan->sum, "onednn_conv: the plan was built ",
                    plan->sum ? "with" : "without", " an added operand");
  auto src = x.contiguous(at::MemoryFormat::ChannelsLast);
  auto out = at::empty(plan->out_shape, x.options().dtype(plan->float_out ? at::kFloat : at::kByte)
                                           .memory_format(at::MemoryFormat::ChannelsLast));
  if (has_other) {  // oneDNN sums into its destination: a copy of the addend
    TORCH_CHECK_TYPE(other->scalar_type() == at::kByte, "onednn_conv: the added operand must be "
                     "uint8, got ", other->scalar_type());
    TORCH_CHECK_VALUE(other->sizes() == out.sizes(), "onednn_conv: the added operand has shape ",
                      other->sizes(), ", the output ", out.sizes());
    out.copy_(*other);
  }
  auto built = plan->current();
  auto& engine = onednn_cpu_engine();
  float src_scale = static_cast<float>(x_scale), dst_scale = static_cast<float>(out_scale);
  int32_t src_zp = static_cast<int32_t>(x_zero_point), dst_zp = static_cast<int32_t>(out_zero_point);
  memory src_mem(plan->src_desc, engine, src.data_ptr());
  memory dst_mem(plan->dst_desc, engine, out.data_ptr());
  memory src_scale_mem(scalar_desc(memory::data_type::f32), engine, &src_scale);
  memory src_zp_mem(scalar_desc(memory::data_type::s32), engine, &src_zp);
  std::unordered_map<int, memory> args{
      {DNNL_ARG_SRC, src_mem},
      {DNNL_ARG_WEIGHTS, built->weight},
      {DNNL_ARG_DST, dst_mem},
      {DNNL_ARG_ATTR_SCALES | DNNL_ARG_SRC, src_scale_mem},
      {DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, built->weight_scale}};
  if (plan->src_zero_point) args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, src_zp_mem);
  if (plan->bias.defined()) args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(1) | DNNL_ARG_SRC_1, built->bias);
  memory dst_scale_mem, dst_zp_mem;
  if (!plan->float_out) {
    dst_scale_mem = memory(scalar_desc(memory::data_type::f32), engine, &dst_scale);
    dst_zp_mem = memory(scalar_desc(memory::data_type::s32), engine, &dst_zp);
    args.emplace(DNNL_ARG_ATTR_SCALES | DNNL_ARG_DST, dst_scale_mem);
    args.emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_DST, dst_zp_mem);
  }
  args.emplace(DNNL_ARG_SCRATCHPAD, onednn_thread_scratchpad(built->scratchpad));
  dnnl::stream& stream = onednn_thread_stream();
  built->primitive.execute(stream, args);
  stream.wait();
  return out;
}

// The library's version (major, minor, patch) and the CPU instruction set it dispatches to.
std::vector<int64_t> onednn_version() {
  const dnnl_version_t* v = dnnl_version();
  return {v->major, v->minor, v->patch};
}

std::string onednn_cpu_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

}  // namespace torchquant_native

using torchquant_native::OnednnConvPlan;

TORCH_LIBRARY_FRAGMENT(torchquant_native, m) {
  m.class_<OnednnConvPlan>("OnednnConvPlan").def("impl", &OnednnConvPlan::impl);
  m.def("onednn_version() -> int[]", &torchquant_native::onednn_version);
  m.def("onednn_cpu_isa() -> str", &torchquant_native::onednn_cpu_isa);
  m.def("onednn_conv_plan(Tensor weight, Tensor weight_scale, Tensor? bias, int[] in_shape, "
        "int[] stride, int[] padding, int[] dilation, int groups, str unary, "
        "ScalarType out_dtype, bool src_zero_point, float? sum_scale=None, int sum_zero_point=0) "
        "-> __torch__.torch.classes.torchquant_native.OnednnConvPlan");
  m.def("onednn_conv(Tensor x, __torch__.torch.classes.torchquant_native.OnednnConvPlan plan, "
        "float x_scale, int x_zero_point, float out_scale, int out_zero_point, Tensor? other=None) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(torchquant_native, CPU, m) {
  m.impl("onednn_conv_plan", &torchquant_native::onednn_conv_plan);
  m.impl("onednn_conv", &torchquant_native::onednn_conv);
}
