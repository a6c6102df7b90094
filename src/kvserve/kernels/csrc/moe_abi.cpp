// The C entry points of the mixture-of-experts layer (moe.cpp): a handle that holds a layer's
// routing, experts' weights and scratch, built once per layer from Python's LinearPart lists
// (kvserve/kernels/ops_moe.py), its forwards, and the router alone.
#include <memory>
#include <mutex>

#include "abi.h"
#include "moe.h"

namespace {

struct MoeHandle {
  kvserve::MoeLayer layer;
  kvserve::MoeScratch scratch;
  std::mutex mutex;  // one forward at a time: the scratch is the handle's
};

void check_routing(int32_t routing, bool external_allowed) {
  kvserve::check(routing == kvserve::kSoftmaxTopk || routing == kvserve::kTopkSoftmax ||
                     (external_allowed && routing == kvserve::kExternal),
                 "moe: unknown routing");
}

}  // namespace

extern "C" {

// router: 1 part (num_experts outputs; with kExternal routing only its shape is used); gate_up,
// down: one part per held expert (local_experts, from first_expert); shared: nullptr, or
// [gate_up, down, gate] (shared_gated) or [gate_up, down];
// routing, activation: MoeRouting, MoeActivation (alpha, limit: kClampedSwiglu's); gate_up_bias
// [2 * intermediate], down_bias [hidden]: one pointer per expert in the dtype, or both nullptr.
KVSERVE_EXPORT int kvserve_moe_create(int64_t num_experts, int64_t first_expert, int64_t local_experts,
                                      int64_t top_k, int64_t hidden, int64_t intermediate,
                                      int32_t normalize, int32_t weights_float32, int32_t routing, int32_t activation,
                                      float alpha, float limit, const kvserve::LinearPart* router,
                                      const kvserve::LinearPart* gate_up, const kvserve::LinearPart* down,
                                      const void* const* gate_up_bias, const void* const* down_bias,
                                      const kvserve::LinearPart* shared, int32_t shared_gated, void** handle) {
  return kvserve::guarded([&] {
    check_routing(routing, true);
    kvserve::check(activation == kvserve::kSiluAndMul || activation == kvserve::kClampedSwiglu,
                   "moe: unknown activation");
    kvserve::check((gate_up_bias == nullptr) == (down_bias == nullptr), "moe: both expert biases or neither");
    kvserve::check(first_expert >= 0 && local_experts > 0 && first_expert + local_experts <= num_experts &&
                       top_k >= 1 && top_k <= num_experts && router->out_features == num_experts,
                   "moe: experts [first, first + local) within the router's num_experts, 1 <= top_k <= num_experts");
    auto moe = std::make_unique<MoeHandle>();
    kvserve::MoeLayer& layer = moe->layer;
    layer.num_experts = num_experts;
    layer.first_expert = first_expert;
    layer.local_experts = local_experts;
    layer.top_k = top_k;
    layer.hidden = hidden;
    layer.intermediate = intermediate;
    layer.normalize = normalize != 0;
    layer.weights_float32 = weights_float32 != 0;
    layer.routing = static_cast<kvserve::MoeRouting>(routing);
    layer.activation = static_cast<kvserve::MoeActivation>(activation);
    layer.alpha = alpha;
    layer.limit = limit;
    layer.router = kvserve::make_projection(router, 1);
    for (int64_t e = 0; e < local_experts; ++e) {
      layer.gate_up.push_back(kvserve::make_projection(gate_up + e, 1));
      layer.down.push_back(kvserve::make_projection(down + e, 1));
      if (gate_up_bias != nullptr) {
        layer.gate_up_bias.push_back(gate_up_bias[e]);
        layer.down_bias.push_back(down_bias[e]);
      }
    }
    layer.shared = shared != nullptr;
    layer.shared_gated = layer.shared && shared_gated != 0;
    if (layer.shared) {
      layer.shared_gate_up = kvserve::make_projection(shared, 1);
      layer.shared_down = kvserve::make_projection(shared + 1, 1);
      if (layer.shared_gated) layer.shared_gate = kvserve::make_projection(shared + 2, 1);
    }
    *handle = moe.release();
  });
}

KVSERVE_EXPORT void kvserve_moe_destroy(void* handle) { delete static_cast<MoeHandle*>(handle); }

KVSERVE_EXPORT int kvserve_moe_forward(void* handle, int32_t dtype, const void* x, void* out, int64_t tokens) {
  return kvserve::guarded([&] {
    auto* moe = static_cast<MoeHandle*>(handle);
    std::lock_guard<std::mutex> lock(moe->mutex);
    kvserve::moe_forward(moe->layer, static_cast<kvserve::DType>(dtype), x, out, tokens, moe->scratch);
  });
}

KVSERVE_EXPORT int kvserve_moe_forward_routed(void* handle, int32_t dtype, const void* x, const float* weights,
                                              const int32_t* ids, void* out, int64_t tokens) {
  return kvserve::guarded([&] {
    auto* moe = static_cast<MoeHandle*>(handle);
    std::lock_guard<std::mutex> lock(moe->mutex);
    kvserve::moe_forward_routed(moe->layer, static_cast<kvserve::DType>(dtype), x, weights, ids, out, tokens,
                                moe->scratch);
  });
}

KVSERVE_EXPORT int kvserve_moe_route(int32_t dtype, const void* logits, int64_t tokens, int64_t experts, int64_t top_k,
                                     int32_t normalize, int32_t routing, float* weights, int32_t* ids) {
  return kvserve::guarded([&] {
    check_routing(routing, false);
    kvserve::moe_route(static_cast<kvserve::DType>(dtype), logits, tokens, experts, top_k, normalize != 0,
                       static_cast<kvserve::MoeRouting>(routing), weights, ids);
  });
}

}  // extern "C"

// The layer of a handle, for decoder.cpp (a decoder layer shares the handle's weights, not its scratch).
const kvserve::MoeLayer* kvserve::moe_layer_of(const void* handle) {
  return &static_cast<const MoeHandle*>(handle)->layer;
}
