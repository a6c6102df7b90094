// The decoder layers of a Llama-family model in one call (kvserve.model.fused_decoder).
//
// A decode step of a small model on a CPU spends milliseconds between its kernels: each of the
// ~15 operations of a layer is a Python module call, a few reshapes and a trip through the
// dispatcher (about 100 us per layer on the Qwen2.5-0.5B shape, 2.4 ms of a 18 ms int4 step).
// DecoderStack holds every layer's packed weights and runs the same kernels, with the same
// arguments and in the same order as the modules do (kvserve/model/llama.py), from C++:
//
//   h0 = embedding (Python)          layer i:  normed, res = rms_norm(h, w_in, res)
//                                              q, k, v   = split(qkv(normed))   [q/k norm]
//                                              q, k      = rotary(q), rotary(k)
//                                              write_kv_cache(k, v); a = paged_attention(q)
//                                              normed, res = rms_norm(o(a), w_post, res)
//                                              h = down(silu_and_mul(gate_up(normed)))  (512-row tiles)
//   out = rms_norm(h, w_final, res)
//
// so its output has the modules' bits exactly (tests/model/test_fused_decoder.py). It runs
// without the GIL: it touches no Python object.
#include <torch/extension.h>

#include <vector>

#include "kernels.h"

namespace kvserve {
namespace {

enum LinearKind : int64_t { kVector = 0, kAmx = 1, kQuantVector = 2, kQuantAmx = 3 };

// One linear layer's packed weight and the kernel that reads it (InvariantLinear or
// QuantizedLinear's forward, kvserve/model/invariant_linear.py and quant_linear.py).
struct LinearPart {
  int64_t kind;
  torch::Tensor packed;
  c10::optional<torch::Tensor> scales, neg_offsets, bias, input_perm;
  int64_t in_features, out_features, group_size, bits, isa;

  torch::Tensor operator()(torch::Tensor x) const;
};

// A projection: one part, or several whose outputs are concatenated (StackedLinear).
struct Projection {
  std::vector<LinearPart> parts;
  torch::Tensor operator()(const torch::Tensor& x) const;
};

struct DecoderLayer {
  int64_t index;
  torch::Tensor input_norm, post_norm;
  c10::optional<torch::Tensor> q_norm, k_norm;
  Projection qkv, o, gate_up, down;
  int64_t window;  // sliding window, 0 = none
  // gate_up is one bfloat16 AMX weight without bias, of 2d outputs with d a multiple of 16:
  // silu_and_mul(gate_up(x)) is then amx_linear_silu_mul, one pass with the same bits that never
  // writes the [rows, 2d] projection (in a 2,048-token prefill step the separate SiLU pass was 9%).
  bool swiglu_in_store;
};

// What every layer of one forward reads.
struct Batch {
  torch::Tensor cos, sin;
  const std::vector<torch::Tensor>& kv_caches;
  torch::Tensor block_tables, seq_lens, query_start_loc, slot_mapping;
};

class DecoderStack {
 public:
  DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
               int64_t mlp_tile_rows, int64_t max_kernel_query_len, torch::Tensor final_norm, int64_t attention_amx);
  void add_layer(int64_t window, torch::Tensor input_norm, torch::Tensor post_norm,
                 c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm,
                 std::vector<LinearPart> qkv, std::vector<LinearPart> o, std::vector<LinearPart> gate_up,
                 std::vector<LinearPart> down);
  torch::Tensor forward(torch::Tensor hidden, torch::Tensor cos, torch::Tensor sin,
                        std::vector<torch::Tensor> kv_caches, torch::Tensor block_tables, torch::Tensor seq_lens,
                        torch::Tensor query_start_loc, torch::Tensor slot_mapping) const;

 private:
  torch::Tensor rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) const;
  torch::Tensor head_norm(const torch::Tensor& x, const torch::Tensor& weight) const;
  torch::Tensor attention(const DecoderLayer& layer, const torch::Tensor& normed, const Batch& batch) const;
  torch::Tensor mlp(const DecoderLayer& layer, const torch::Tensor& x) const;

  int64_t num_heads_, num_kv_heads_, head_dim_;
  double eps_, scale_;
  int64_t mlp_tile_rows_, max_kernel_query_len_, attention_amx_;  // attention_amx_: paged_attention's amx
  torch::Tensor final_norm_;
  std::vector<DecoderLayer> layers_;
};

}  // namespace

torch::Tensor LinearPart::operator()(torch::Tensor x) const {
  if (input_perm) x = x.index_select(-1, *input_perm);
  torch::Tensor rows = x.reshape({-1, in_features}).contiguous();
  switch (kind) {
    case kVector:
      return invariant_linear(rows, packed, bias, out_features);
    case kAmx:
      return amx_linear(rows, packed, bias, out_features);
    case kQuantVector:
      return quant_linear(rows, packed, *scales, neg_offsets, bias, out_features, group_size, bits, isa);
    case kQuantAmx:
      return amx_quant_linear(rows, packed, *scales, neg_offsets, bias, out_features, group_size, bits);
  }
  TORCH_CHECK(false, "DecoderStack: unknown linear kind ", kind);
}

torch::Tensor Projection::operator()(const torch::Tensor& x) const {
  if (parts.size() == 1) return parts[0](x);
  std::vector<torch::Tensor> outs;
  for (const auto& part : parts) outs.push_back(part(x));
  return torch::cat(outs, -1);
}

DecoderStack::DecoderStack(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps, double scale,
                           int64_t mlp_tile_rows, int64_t max_kernel_query_len, torch::Tensor final_norm,
                           int64_t attention_amx)
    : num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim), eps_(eps), scale_(scale),
      mlp_tile_rows_(mlp_tile_rows), max_kernel_query_len_(max_kernel_query_len), attention_amx_(attention_amx),
      final_norm_(final_norm) {}

void DecoderStack::add_layer(int64_t window, torch::Tensor input_norm, torch::Tensor post_norm,
                             c10::optional<torch::Tensor> q_norm, c10::optional<torch::Tensor> k_norm,
                             std::vector<LinearPart> qkv, std::vector<LinearPart> o, std::vector<LinearPart> gate_up,
                             std::vector<LinearPart> down) {
  TORCH_CHECK(!qkv.empty() && !o.empty() && !gate_up.empty() && !down.empty() && q_norm.has_value() == k_norm.has_value());
  const LinearPart& first = gate_up[0];
  const bool swiglu_in_store = gate_up.size() == 1 && first.kind == kAmx && !first.bias && !first.input_perm &&
                               first.out_features % 32 == 0;
  layers_.push_back(DecoderLayer{static_cast<int64_t>(layers_.size()), input_norm, post_norm, q_norm, k_norm,
                                 Projection{std::move(qkv)}, Projection{std::move(o)}, Projection{std::move(gate_up)},
                                 Projection{std::move(down)}, window, swiglu_in_store});
}

// RotaryEmbedding.apply (kvserve/model/layers.py): the C++ kernel for bfloat16 heads of a multiple
// of 32, else the rotate-half formula in the same ATen operators as the module.
torch::Tensor DecoderStack::rotary(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) const {
  if (x.scalar_type() == at::kBFloat16 && x.size(-1) % 32 == 0 && x.stride(-1) == 1 &&
      cos.scalar_type() == at::kBFloat16) {
    return rotary_embedding(x, cos, sin);
  }
  const int64_t half = x.size(-1) / 2;
  torch::Tensor rotated = torch::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

// RMSNorm.forward of [T, heads, head_dim] (the q/k norms of Qwen3).
torch::Tensor DecoderStack::head_norm(const torch::Tensor& x, const torch::Tensor& weight) const {
  return rms_norm(x.reshape({-1, x.size(-1)}), weight, c10::nullopt, eps_)[0].view(x.sizes());
}

torch::Tensor DecoderStack::attention(const DecoderLayer& layer, const torch::Tensor& normed, const Batch& batch) const {
  const int64_t tokens = normed.size(0), q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
  torch::Tensor qkv = layer.qkv(normed);
  torch::Tensor q = qkv.slice(-1, 0, q_size).reshape({tokens, num_heads_, head_dim_});
  torch::Tensor k = qkv.slice(-1, q_size, q_size + kv_size).reshape({tokens, num_kv_heads_, head_dim_});
  torch::Tensor v = qkv.slice(-1, q_size + kv_size).reshape({tokens, num_kv_heads_, head_dim_});
  if (layer.q_norm) {
    q = head_norm(q, *layer.q_norm);
    k = head_norm(k, *layer.k_norm);
  }
  q = rotary(q, batch.cos, batch.sin);
  k = rotary(k, batch.cos, batch.sin);
  write_kv_cache(k, v, batch.kv_caches[layer.index], batch.slot_mapping);
  q = q.contiguous();
  torch::Tensor out = torch::empty_like(q);
  paged_attention(out, q, batch.kv_caches[layer.index], batch.block_tables, batch.seq_lens, batch.query_start_loc,
                  scale_, layer.window, max_kernel_query_len_, attention_amx_);
  return layer.o(out.reshape({tokens, q_size}));
}

torch::Tensor DecoderStack::mlp(const DecoderLayer& layer, const torch::Tensor& x) const {
  auto swiglu = [&](const torch::Tensor& rows) {
    if (!layer.swiglu_in_store) return layer.down(silu_and_mul(layer.gate_up(rows)));
    const LinearPart& gate_up = layer.gate_up.parts[0];
    return layer.down(amx_linear_silu_mul(rows.reshape({-1, gate_up.in_features}).contiguous(), gate_up.packed,
                                          gate_up.out_features));
  };
  if (x.size(0) <= mlp_tile_rows_) return swiglu(x);
  std::vector<torch::Tensor> tiles;
  for (const auto& tile : x.split(mlp_tile_rows_)) tiles.push_back(swiglu(tile));
  return torch::cat(tiles);
}

torch::Tensor DecoderStack::forward(torch::Tensor hidden, torch::Tensor cos, torch::Tensor sin,
                                    std::vector<torch::Tensor> kv_caches, torch::Tensor block_tables,
                                    torch::Tensor seq_lens, torch::Tensor query_start_loc,
                                    torch::Tensor slot_mapping) const {
  TORCH_CHECK(!layers_.empty() && kv_caches.size() == layers_.size(), "DecoderStack: ", layers_.size(),
              " layers, ", kv_caches.size(), " KV caches");
  TORCH_CHECK(hidden.dim() == 2 && slot_mapping.scalar_type() == at::kLong);
  const Batch batch{cos, sin, kv_caches, block_tables, seq_lens, query_start_loc, slot_mapping};
  torch::Tensor residual;
  for (const auto& layer : layers_) {
    std::vector<torch::Tensor> normed = layer.index == 0
        ? std::vector<torch::Tensor>{rms_norm(hidden, layer.input_norm, c10::nullopt, eps_)[0], hidden}
        : rms_norm(hidden, layer.input_norm, residual, eps_);
    residual = normed[1];
    torch::Tensor attn = attention(layer, normed[0], batch);
    normed = rms_norm(attn, layer.post_norm, residual.contiguous(), eps_);
    residual = normed[1];
    hidden = mlp(layer, normed[0]);
  }
  return rms_norm(hidden, final_norm_, residual.contiguous(), eps_)[0];
}

}  // namespace kvserve

void bind_decoder(pybind11::module& m) {
  namespace py = pybind11;
  using kvserve::DecoderStack;
  using kvserve::LinearPart;
  py::class_<LinearPart>(m, "LinearPart", "one linear layer's packed weight and its kernel (see decoder.cpp)")
      .def(py::init([](int64_t kind, torch::Tensor packed, c10::optional<torch::Tensor> scales,
                       c10::optional<torch::Tensor> neg_offsets, c10::optional<torch::Tensor> bias,
                       c10::optional<torch::Tensor> input_perm, int64_t in_features, int64_t out_features,
                       int64_t group_size, int64_t bits, int64_t isa) {
             TORCH_CHECK(kind >= kvserve::kVector && kind <= kvserve::kQuantAmx, "LinearPart: unknown kind ", kind);
             TORCH_CHECK(kind < kvserve::kQuantVector || scales.has_value(), "LinearPart: a quantized kind needs scales");
             return LinearPart{kind, packed, scales, neg_offsets, bias, input_perm, in_features, out_features,
                               group_size, bits, isa};
           }),
           py::arg("kind"), py::arg("packed"), py::arg("scales"), py::arg("neg_offsets"), py::arg("bias"),
           py::arg("input_perm"), py::arg("in_features"), py::arg("out_features"), py::arg("group_size"),
           py::arg("bits"), py::arg("isa"));
  py::class_<DecoderStack>(m, "DecoderStack", "a Llama-family model's decoder layers in one call (see decoder.cpp)")
      .def(py::init<int64_t, int64_t, int64_t, double, double, int64_t, int64_t, torch::Tensor, int64_t>(),
           py::arg("num_heads"), py::arg("num_kv_heads"), py::arg("head_dim"), py::arg("eps"), py::arg("scale"),
           py::arg("mlp_tile_rows"), py::arg("max_kernel_query_len"), py::arg("final_norm"),
           py::arg("attention_amx") = -1)
      .def("add_layer", &DecoderStack::add_layer, py::arg("window"), py::arg("input_norm"), py::arg("post_norm"),
           py::arg("q_norm"), py::arg("k_norm"), py::arg("qkv"), py::arg("o"), py::arg("gate_up"), py::arg("down"))
      .def("forward", &DecoderStack::forward, py::call_guard<py::gil_scoped_release>(),
           "hidden [T, H] of the embedding -> the final norm's output [T, H]");
}
