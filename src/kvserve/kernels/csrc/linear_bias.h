// The optional parameters of the linear kernels, checked in one place: the bias (linear.cpp,
// amx_linear.cpp, quant_linear.cpp, amx_quant_linear.cpp), a contiguous float32 [N], or none; the
// negated int4 offsets of the quantized kernels, float32 shaped like their scales, or none.
#pragma once
#include <torch/extension.h>

#include <vector>

// The bias's data, or nullptr when it is absent (or an undefined tensor).
inline const float* optional_bias(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->numel() == N,
              "bias must be a contiguous float32 [N]");
  return bias->data_ptr<float>();
}

// The negated offsets' data (int4 only, the scales' shape), or nullptr when they are absent.
inline const float* optional_offsets(const c10::optional<torch::Tensor>& neg_offsets, int64_t bits,
                                     const std::vector<int64_t>& scale_shape) {
  if (!neg_offsets.has_value() || !neg_offsets->defined()) return nullptr;
  TORCH_CHECK(bits == 4 && neg_offsets->is_contiguous() && neg_offsets->sizes() == scale_shape &&
                  neg_offsets->scalar_type() == torch::kFloat,
              "offsets (int4 only) must be float32 like the scales");
  return neg_offsets->data_ptr<float>();
}
