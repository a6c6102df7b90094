// The optional bias of the linear kernels (linear.cpp, amx_linear.cpp, quant_linear.cpp), checked
// in one place: a contiguous float32 [N], or none.
#pragma once
#include <torch/extension.h>

// The bias's data, or nullptr when it is absent (or an undefined tensor).
inline const float* optional_bias(const c10::optional<torch::Tensor>& bias, int64_t N) {
  if (!bias.has_value() || !bias->defined()) return nullptr;
  TORCH_CHECK(bias->scalar_type() == torch::kFloat && bias->is_contiguous() && bias->numel() == N,
              "bias must be a contiguous float32 [N]");
  return bias->data_ptr<float>();
}
