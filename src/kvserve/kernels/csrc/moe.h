// A mixture-of-experts feed-forward in one call (moe.cpp; kvserve/model/moe.py is the reference,
// kvserve/kernels/ops_moe.py builds it, decoder.cpp runs it as a layer's MLP).
#pragma once

#include <cstdint>
#include <vector>

#include "projection.h"

namespace kvserve {

// softmax then top k; top k then softmax (GPT-OSS); given by the caller (DeepSeek's grouped routers,
// moe_forward_routed)
enum MoeRouting { kSoftmaxTopk = 0, kTopkSoftmax = 1, kExternal = 2 };
enum MoeActivation { kSiluAndMul = 0, kClampedSwiglu = 1 };

struct MoeLayer {
  int64_t num_experts, top_k, hidden, intermediate;
  // the experts held here (expert parallelism: a rank's share; else 0 and num_experts): gate_up[i]
  // and down[i] are expert first_expert + i; tokens routed to the others add nothing here
  int64_t first_expert, local_experts;
  bool normalize;        // norm_topk_prob
  bool weights_float32;  // the routing weight multiplies in float32 (Mixtral), else in the dtype
  MoeRouting routing;
  MoeActivation activation;
  float alpha, limit;  // kClampedSwiglu's
  Projection router;   // its bias (GPT-OSS) added as any projection's
  std::vector<Projection> gate_up, down;  // one each per expert
  // per expert, in the dtype, or empty: added after each product, rounded (GPT-OSS)
  std::vector<const void*> gate_up_bias, down_bias;
  bool shared;                            // a shared expert (Qwen2-MoE, DeepSeek)
  bool shared_gated;                      // its output times sigmoid(shared_gate(x)) (Qwen2-MoE)
  Projection shared_gate_up, shared_down, shared_gate;
};

struct MoeScratch {
  ProjectionScratch projection;
  Buffer logits, weights, ids, order, rows, gathered, gate_up, act, y, acc, shared_gate_up, shared_act, shared_y,
      shared_gate;
};

// kSoftmaxTopk: the router's softmax over E experts in float32 (kvserve's exp), the top k of each
// row (of equal probabilities the lowest expert first), renormalised when `normalize`;
// kTopkSoftmax: the top k logits (the same order), then their softmax in float32. weights [T, k]
// float32, ids [T, k].
void moe_route(DType dtype, const void* logits, int64_t tokens, int64_t experts, int64_t top_k, bool normalize,
               MoeRouting routing, float* weights, int32_t* ids);

// x [T, hidden] -> out [T, hidden], both in dtype (moe.cpp's file comment); the layer routes.
void moe_forward(const MoeLayer& layer, DType dtype, const void* x, void* out, int64_t tokens, MoeScratch& scratch);
// The same with the routing given: weights float32 [T, top_k] (rounded to the dtype here unless
// weights_float32), ids [T, top_k] in [0, num_experts).
void moe_forward_routed(const MoeLayer& layer, DType dtype, const void* x, const float* weights, const int32_t* ids,
                        void* out, int64_t tokens, MoeScratch& scratch);

// The layer of a handle made by kvserve_moe_create.
const MoeLayer* moe_layer_of(const void* handle);

}  // namespace kvserve
