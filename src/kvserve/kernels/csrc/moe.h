// A mixture-of-experts feed-forward in one call (moe.cpp; kvserve/model/moe.py is the reference,
// kvserve/kernels/ops_moe.py builds it, decoder.cpp runs it as a layer's MLP).
#pragma once

#include <cstdint>
#include <vector>

#include "projection.h"

namespace kvserve {

struct MoeLayer {
  int64_t num_experts, top_k, hidden, intermediate;
  bool normalize;        // norm_topk_prob
  bool weights_float32;  // the routing weight multiplies in float32 (Mixtral), else in the dtype
  Projection router;
  std::vector<Projection> gate_up, down;  // one each per expert
  bool shared;                            // Qwen2-MoE's shared expert
  Projection shared_gate_up, shared_down, shared_gate;
};

struct MoeScratch {
  ProjectionScratch projection;
  Buffer logits, weights, ids, order, rows, gathered, gate_up, act, y, acc, shared_gate_up, shared_act, shared_y,
      shared_gate;
};

// Router softmax over E experts in float32 (kvserve's exp), the top k of each row (of equal
// probabilities the lowest expert first), renormalised when `normalize`: weights [T, k] float32,
// ids [T, k].
void moe_route(DType dtype, const void* logits, int64_t tokens, int64_t experts, int64_t top_k, bool normalize,
               float* weights, int32_t* ids);

// x [T, hidden] -> out [T, hidden], both in dtype (moe.cpp's file comment).
void moe_forward(const MoeLayer& layer, DType dtype, const void* x, void* out, int64_t tokens, MoeScratch& scratch);

// The layer of a handle made by kvserve_moe_create.
const MoeLayer* moe_layer_of(const void* handle);

}  // namespace kvserve
