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
//                                              h = down(silu_and_mul(gate_up(normed)))  (tiles of rows)
//   out = rms_norm(h, w_final, res)
//
// so its output has the modules' bits exactly (tests/model/test_fused_decoder.py). The weights
// stay where Python put them (the Python DecoderStack keeps them alive); the activations live in
// buffers of the stack's own that grow to the largest step and are reused, so a step allocates
// nothing. It runs without the GIL: it touches no Python object.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "abi.h"
#include "kernels.h"
#include "moe.h"
#include "projection.h"

namespace kvserve {
namespace {

struct DecoderLayer {
  int64_t index;
  const void *input_norm, *post_norm, *q_norm, *k_norm;  // q/k norms: Qwen3, else nullptr
  Projection qkv, o, gate_up, down;
  const MoeLayer* moe;  // a mixture of experts instead of gate_up / down, or nullptr
  int64_t window;       // sliding window, 0 = none
  // gate_up is one bfloat16 AMX weight without bias, of 2d outputs with d a multiple of 16:
  // silu_and_mul(gate_up(x)) is then amx_linear with swiglu, one pass with the same bits that
  // never writes the [rows, 2d] projection (in a 2,048-token prefill step the separate SiLU pass was 9%).
  bool swiglu_in_store;
};

}  // namespace

// What every layer of one forward reads.
struct DecoderBatch {
  const void *cos, *sin;
  const void* const* kv_caches;
  const int32_t *block_tables, *seq_lens, *query_start_loc;
  const int64_t* slot_mapping;
  AttentionShape attention;
};

class DecoderStack {
 public:
  DecoderStack(DType dtype, int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
               double scale, int64_t mlp_tile_rows, int64_t max_kernel_query_len, const void* final_norm,
               int64_t attention_amx)
      : dtype_(dtype), hidden_(hidden_size), num_heads_(num_heads), num_kv_heads_(num_kv_heads), head_dim_(head_dim),
        eps_(static_cast<float>(eps)), scale_(scale), mlp_tile_rows_(mlp_tile_rows),
        max_kernel_query_len_(max_kernel_query_len), attention_amx_(attention_amx), final_norm_(final_norm) {}

  void add_layer(int64_t window, const void* input_norm, const void* post_norm, const void* q_norm, const void* k_norm,
                 const LinearPart* parts, const int64_t* counts, const MoeLayer* moe);
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  void forward(const void* hidden, void* out, int64_t tokens, const DecoderBatch& batch);

 private:
  int64_t element_size() const { return dtype_ == kFloat32 ? 4 : 2; }
  void project(const Projection& projection, const void* x, void* out, int64_t rows) {
    run_projection(projection, dtype_, x, out, rows, projection_scratch_);
  }
  void rotary(const void* x, int64_t row_stride, int64_t head_stride, int64_t heads, void* out, int64_t tokens,
              const DecoderBatch& batch);
  const void* head_norm(const void* x, int64_t row_stride, int64_t heads, const void* weight, Buffer& copy,
                        Buffer& normed, int64_t tokens);
  void attention(const DecoderLayer& layer, const void* normed, void* out, int64_t tokens, const DecoderBatch& batch);
  void mlp(const DecoderLayer& layer, const void* x, void* out, int64_t tokens);

  DType dtype_;
  int64_t hidden_, num_heads_, num_kv_heads_, head_dim_;
  float eps_;
  double scale_;
  int64_t mlp_tile_rows_, max_kernel_query_len_, attention_amx_;
  const void* final_norm_;
  std::vector<DecoderLayer> layers_;
  std::mutex forward_mutex_;  // one forward at a time: the buffers are the stack's
  Buffer residual_[2], normed_, attn_, qkv_, q_copy_, q_normed_, k_copy_, k_normed_, q_rot_, k_rot_, attn_heads_,
      gate_up_, act_, hidden_next_;
  ProjectionScratch projection_scratch_;
  MoeScratch moe_scratch_;
};

void DecoderStack::add_layer(int64_t window, const void* input_norm, const void* post_norm, const void* q_norm,
                             const void* k_norm, const LinearPart* parts, const int64_t* counts, const MoeLayer* moe) {
  check(counts[0] > 0 && counts[1] > 0 && (moe != nullptr || (counts[2] > 0 && counts[3] > 0)) &&
            (q_norm == nullptr) == (k_norm == nullptr),
        "DecoderStack.add_layer: every projection needs a part (or an MoE layer for the MLP); q and k norms go together");
  Projection projections[4];
  for (int i = 0; i < 4; ++i) {
    projections[i] = make_projection(parts, counts[i]);
    parts += counts[i];
  }
  bool swiglu_in_store = false;
  if (moe == nullptr) {
    const LinearPart& first = projections[2].parts[0];
    swiglu_in_store = projections[2].parts.size() == 1 && first.kind == kAmx && first.bias == nullptr &&
                      first.input_perm == nullptr && first.out_features % 32 == 0;
  }
  layers_.push_back(DecoderLayer{static_cast<int64_t>(layers_.size()), input_norm, post_norm, q_norm, k_norm,
                                 std::move(projections[0]), std::move(projections[1]), std::move(projections[2]),
                                 std::move(projections[3]), moe, window, swiglu_in_store});
}

}  // namespace kvserve

// RotaryEmbedding.apply's torch operators where its kernel does not apply (float32, or a head_dim
// that is not a multiple of 32): x * cos + cat(-x2, x1) * sin, each product and the sum rounded
// to the dtype as torch rounds them, without contraction into FMAs.
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")
namespace {
template <typename T>
void rotary_torch_ops(const T* x, int64_t row_stride, int64_t head_stride, int64_t heads, const T* cos, const T* sin,
                      T* out, int64_t tokens, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* src = x + t * row_stride + h * head_stride;
      T* dst = out + (t * heads + h) * dim;
      for (int64_t i = 0; i < dim; ++i) {
        const float rot = i < half ? -static_cast<float>(src[i + half]) : static_cast<float>(src[i - half]);
        const float a = static_cast<float>(T(static_cast<float>(src[i]) * static_cast<float>(cos[t * dim + i])));
        const float b = static_cast<float>(T(rot * static_cast<float>(sin[t * dim + i])));
        dst[i] = T(a + b);
      }
    }
  }
}
}  // namespace
#pragma GCC pop_options

namespace kvserve {

// RotaryEmbedding.apply (kvserve/model/layers.py) of x [tokens, heads, head_dim] (strides per row
// and head) into out, contiguous: the C++ kernel for bfloat16 heads of a multiple of 32, else the
// torch operators' arithmetic.
void DecoderStack::rotary(const void* x, int64_t row_stride, int64_t head_stride, int64_t heads, void* out,
                          int64_t tokens, const DecoderBatch& batch) {
  if (dtype_ == kBFloat16 && head_dim_ % 32 == 0) {
    rotary_embedding(static_cast<const BFloat16*>(x), row_stride, head_stride, static_cast<const BFloat16*>(batch.cos),
                     static_cast<const BFloat16*>(batch.sin), static_cast<BFloat16*>(out), tokens, heads, head_dim_);
  } else if (dtype_ == kBFloat16) {
    rotary_torch_ops(static_cast<const BFloat16*>(x), row_stride, head_stride, heads,
                     static_cast<const BFloat16*>(batch.cos), static_cast<const BFloat16*>(batch.sin),
                     static_cast<BFloat16*>(out), tokens, head_dim_);
  } else {
    rotary_torch_ops(static_cast<const float*>(x), row_stride, head_stride, heads, static_cast<const float*>(batch.cos),
                     static_cast<const float*>(batch.sin), static_cast<float*>(out), tokens, head_dim_);
  }
}

// RMSNorm.forward of [tokens, heads, head_dim] heads (Qwen3's q/k norms): the heads copied to
// contiguous rows first, as torch's reshape of the strided view copies them.
const void* DecoderStack::head_norm(const void* x, int64_t row_stride, int64_t heads, const void* weight, Buffer& copy,
                                    Buffer& normed, int64_t tokens) {
  const int64_t es = element_size(), row = heads * head_dim_;
  char* rows = copy.get<char>(tokens * row * es);
  for (int64_t t = 0; t < tokens; ++t)
    std::memcpy(rows + t * row * es, static_cast<const char*>(x) + t * row_stride * es, row * es);
  void* out = normed.get<char>(tokens * row * es);
  rms_norm(dtype_, rows, head_dim_, weight, nullptr, out, nullptr, tokens * heads, head_dim_, eps_);
  return out;
}

void DecoderStack::attention(const DecoderLayer& layer, const void* normed, void* out, int64_t tokens,
                             const DecoderBatch& batch) {
  const int64_t es = element_size(), q_size = num_heads_ * head_dim_, kv_size = num_kv_heads_ * head_dim_;
  const int64_t width = q_size + 2 * kv_size;
  char* qkv = qkv_.get<char>(tokens * width * es);
  project(layer.qkv, normed, qkv, tokens);
  const void* q = qkv;
  const void* k = qkv + q_size * es;
  const void* v = qkv + (q_size + kv_size) * es;
  int64_t q_stride = width, k_stride = width;
  if (layer.q_norm != nullptr) {
    q = head_norm(q, width, num_heads_, layer.q_norm, q_copy_, q_normed_, tokens);
    k = head_norm(k, width, num_kv_heads_, layer.k_norm, k_copy_, k_normed_, tokens);
    q_stride = q_size;
    k_stride = kv_size;
  }
  void* q_rot = q_rot_.get<char>(tokens * q_size * es);
  void* k_rot = k_rot_.get<char>(tokens * kv_size * es);
  rotary(q, q_stride, head_dim_, num_heads_, q_rot, tokens, batch);
  rotary(k, k_stride, head_dim_, num_kv_heads_, k_rot, tokens, batch);
  void* cache = const_cast<void*>(batch.kv_caches[layer.index]);
  AttentionShape shape = batch.attention;
  shape.num_tokens = tokens;
  shape.num_heads = num_heads_;
  shape.head_dim = head_dim_;
  shape.num_kv_heads = num_kv_heads_;
  write_kv_cache(k_rot, kv_size, head_dim_, v, width, head_dim_, tokens, num_kv_heads_, head_dim_, es, cache,
                 shape.num_blocks * shape.block_size, batch.slot_mapping);
  void* heads = attn_heads_.get<char>(tokens * q_size * es);
  paged_attention(heads, q_rot, dtype_, cache, dtype_, batch.block_tables, batch.seq_lens, batch.query_start_loc,
                  shape, scale_, layer.window, max_kernel_query_len_, attention_amx_);
  project(layer.o, heads, out, tokens);
}

// down(silu_and_mul(gate_up(x))) of x [tokens, hidden] into out, mlp_tile_rows rows at a time; or
// the layer's mixture of experts (moe.cpp), all rows at once.
void DecoderStack::mlp(const DecoderLayer& layer, const void* x, void* out, int64_t tokens) {
  if (layer.moe != nullptr) {
    moe_forward(*layer.moe, dtype_, x, out, tokens, moe_scratch_);
    return;
  }
  const int64_t es = element_size(), inter = layer.gate_up.out_features / 2;
  for (int64_t row0 = 0; row0 < tokens; row0 += mlp_tile_rows_) {
    const int64_t rows = std::min(mlp_tile_rows_, tokens - row0);
    const char* in = static_cast<const char*>(x) + row0 * hidden_ * es;
    void* act = act_.get<char>(rows * inter * es);
    if (layer.swiglu_in_store) {
      const LinearPart& part = layer.gate_up.parts[0];
      amx_linear(reinterpret_cast<const BFloat16*>(in), static_cast<const BFloat16*>(part.packed), nullptr,
                 static_cast<BFloat16*>(act), rows, part.in_features, part.out_features, true);
    } else {
      void* gate_up = gate_up_.get<char>(rows * 2 * inter * es);
      project(layer.gate_up, in, gate_up, rows);
      silu_and_mul(dtype_, gate_up, act, rows, inter);
    }
    project(layer.down, act, static_cast<char*>(out) + row0 * hidden_ * es, rows);
  }
}

void DecoderStack::forward(const void* hidden, void* out, int64_t tokens, const DecoderBatch& batch) {
  std::lock_guard<std::mutex> lock(forward_mutex_);
  const int64_t es = element_size(), size = tokens * hidden_ * es;
  char* residual[2] = {residual_[0].get<char>(size), residual_[1].get<char>(size)};
  char* normed = normed_.get<char>(size);
  char* attn = attn_.get<char>(size);
  char* next = hidden_next_.get<char>(size);
  const void* h = hidden;
  const void* res = nullptr;
  int turn = 0;
  for (const DecoderLayer& layer : layers_) {
    if (layer.index == 0) {  // the embedding is the first residual
      rms_norm(dtype_, h, hidden_, layer.input_norm, nullptr, normed, nullptr, tokens, hidden_, eps_);
      res = h;
    } else {
      rms_norm(dtype_, h, hidden_, layer.input_norm, res, normed, residual[turn], tokens, hidden_, eps_);
      res = residual[turn];
      turn ^= 1;
    }
    attention(layer, normed, attn, tokens, batch);
    rms_norm(dtype_, attn, hidden_, layer.post_norm, res, normed, residual[turn], tokens, hidden_, eps_);
    res = residual[turn];
    turn ^= 1;
    mlp(layer, normed, next, tokens);
    h = next;
  }
  rms_norm(dtype_, h, hidden_, final_norm_, res, out, residual[turn], tokens, hidden_, eps_);
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int kvserve_decoder_create(int32_t dtype, int64_t hidden_size, int64_t num_heads, int64_t num_kv_heads,
                                          int64_t head_dim, double eps, double scale, int64_t mlp_tile_rows,
                                          int64_t max_kernel_query_len, const void* final_norm, int64_t attention_amx,
                                          void** stack) {
  return kvserve::guarded([&] {
    *stack = new kvserve::DecoderStack(static_cast<kvserve::DType>(dtype), hidden_size, num_heads, num_kv_heads,
                                       head_dim, eps, scale, mlp_tile_rows, max_kernel_query_len, final_norm,
                                       attention_amx);
  });
}

KVSERVE_EXPORT void kvserve_decoder_destroy(void* stack) { delete static_cast<kvserve::DecoderStack*>(stack); }

// parts: the layer's LinearParts, qkv's then o's, gate_up's and down's; counts: int64 [4], how many each;
// moe: a handle of kvserve_moe_create for a mixture-of-experts layer (gate_up, down: 0 parts), or nullptr.
KVSERVE_EXPORT int kvserve_decoder_add_layer(void* stack, int64_t window, const void* input_norm,
                                             const void* post_norm, const void* q_norm, const void* k_norm,
                                             const kvserve::LinearPart* parts, const int64_t* counts, const void* moe) {
  return kvserve::guarded([&] {
    static_cast<kvserve::DecoderStack*>(stack)->add_layer(window, input_norm, post_norm, q_norm, k_norm, parts, counts,
                                                          moe == nullptr ? nullptr : kvserve::moe_layer_of(moe));
  });
}

// hidden, out: [tokens, hidden_size] in the stack's dtype; cos, sin [tokens, head_dim]; kv_caches:
// one per layer, [2, num_blocks, block_size, H_kv, head_dim] in the stack's dtype; the attention
// metadata as paged_attention takes it.
KVSERVE_EXPORT int kvserve_decoder_forward(void* stack, const void* hidden, void* out, int64_t tokens, const void* cos,
                                           const void* sin, const void* const* kv_caches, int64_t num_caches,
                                           const int32_t* block_tables, const int32_t* seq_lens,
                                           const int32_t* query_start_loc, const int64_t* slot_mapping,
                                           int64_t num_blocks, int64_t block_size, int64_t num_seqs,
                                           int64_t table_width) {
  return kvserve::guarded([&] {
    auto* decoder = static_cast<kvserve::DecoderStack*>(stack);
    kvserve::check(decoder->num_layers() > 0 && num_caches == decoder->num_layers(),
                   "DecoderStack: " + std::to_string(decoder->num_layers()) + " layers, " +
                       std::to_string(num_caches) + " KV caches");
    const kvserve::AttentionShape attention{tokens, 0, 0, 0, block_size, num_blocks, num_seqs, table_width};
    kvserve::DecoderBatch batch{cos, sin, kv_caches, block_tables, seq_lens, query_start_loc, slot_mapping, attention};
    decoder->forward(hidden, out, tokens, batch);
  });
}

}  // extern "C"
