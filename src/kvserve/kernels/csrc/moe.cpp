// A mixture-of-experts feed-forward in one call: the router, every hit expert and the shared
// expert, for all tokens of a step (kvserve/model/moe.py's SparseMoeBlock on the CPU, and a
// layer's MLP in decoder.cpp).
//
//   logits  = router(x)                                  [T, E], the dtype
//   w, ids  = moe_route(logits)                          softmax in float32, top k, renormalised
//                                                        (GPT-OSS: top k, then softmax)
//   tokens grouped by expert (counting sort, each expert's tokens in increasing order)
//   for each hit expert e, increasing:  y = down_e(act(gate_up_e(x[tokens of e])))
//                                       acc[t] = round(acc[t] + round(y[t] * w[t, e]))
//   acc = round(acc + round(sigmoid(shared_gate(x)) * shared_expert(x)))   (Qwen2-MoE)
//   acc = round(acc + shared_expert(x))                                      (DeepSeek: ungated)
//
// DeepSeek's grouped routers run in the caller (kvserve.model.moe.grouped_route), which passes
// the weights and ids (moe_forward_routed, routing kExternal); the rest is the same.
//
// act is SwiGLU (silu_and_mul) or GPT-OSS's clamped SwiGLU, whose experts also add a bias after
// each product (round(y + b), as torch adds a bias tensor).
//
// with round() to the dtype after each operation, as torch's operators round them, and w rounded
// to the dtype first unless the family multiplies in float32 (Mixtral). A token's sum runs over its
// experts in increasing id whatever the other tokens, and every linear is batch-invariant, so a
// token's output never depends on the batch. The experts' GEMMs are the linears' own (vector,
// AMX, int8/int4), each parallel over its output columns.
//
// Files: moe_route.cpp (the router's top k), here the experts' forward, moe_abi.cpp (the handle
// and the C entry points).
#include "moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "thread_pool.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve {
namespace {

#include "bf16_convert.h"

// One value of the dtype, kept as float32: the float itself, or rounded to bfloat16 (nearest even,
// as from_float; NaN -> 0x7fc0) with integer operations the compiler vectorises.
inline float as_dtype(float v, float) { return v; }
inline float as_dtype(float v, BFloat16) {
  uint32_t word;
  std::memcpy(&word, &v, sizeof(word));
  word = v != v ? 0x7fc00000u : (word + 0x7fffu + ((word >> 16) & 1u)) & 0xffff0000u;
  float out;
  std::memcpy(&out, &word, sizeof(out));
  return out;
}

// acc[row] = round(acc[row] + round(y'[i] * w)) for each of `count` rows, y' = y or, with a bias,
// round(y + bias) (y and bias in scalar_t, acc float32 holding values of the dtype): the down
// projection's bias and the weighted sum in one pass.
template <typename scalar_t>
void accumulate_rows(float* acc, const scalar_t* y, const scalar_t* bias, const int64_t* rows, const float* w,
                     int64_t count, int64_t hidden) {
  parallel_for(0, count, std::max<int64_t>(1, 4096 / hidden), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float* __restrict dst = acc + rows[i] * hidden;
      const scalar_t* __restrict src = y + i * hidden;
#if defined(__AVX512F__)
      const __m512 weight = _mm512_set1_ps(w[i]);
      for (int64_t h = 0; h < hidden; h += 16) {
        const __mmask16 m = lanes(hidden - h);
        __m512 v = load16(src + h, m);
        if (bias != nullptr) v = round_to(scalar_t{}, _mm512_add_ps(v, load16(bias + h, m)));
        v = round_to(scalar_t{}, _mm512_mul_ps(v, weight));
        store16(dst + h, round_to(scalar_t{}, _mm512_add_ps(load16(dst + h, m), v)), m);
      }
#else
      for (int64_t h = 0; h < hidden; ++h) {
        float v = to_float(src[h]);
        if (bias != nullptr) v = as_dtype(v + to_float(bias[h]), scalar_t{});
        dst[h] = as_dtype(dst[h] + as_dtype(v * w[i], scalar_t{}), scalar_t{});
      }
#endif
    }
  });
}

void accumulate(float* acc, const void* y, const void* bias, DType dtype, const int64_t* rows, const float* w,
                int64_t count, int64_t hidden) {
  if (dtype == kFloat32) {
    accumulate_rows(acc, static_cast<const float*>(y), static_cast<const float*>(bias), rows, w, count, hidden);
  } else {
    accumulate_rows(acc, static_cast<const BFloat16*>(y), static_cast<const BFloat16*>(bias), rows, w, count, hidden);
  }
}

// y[r][c] = round(y[r][c] + bias[c]) for `rows` rows of `width` values, all in scalar_t.
template <typename scalar_t>
void add_bias_rows(scalar_t* y, const scalar_t* bias, int64_t rows, int64_t width) {
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / width), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c = 0; c < width; ++c)
        y[r * width + c] = from_float<scalar_t>(to_float(y[r * width + c]) + to_float(bias[c]));
  });
}

void add_bias(DType dtype, void* y, const void* bias, int64_t rows, int64_t width) {
  if (dtype == kFloat32) {
    add_bias_rows(static_cast<float*>(y), static_cast<const float*>(bias), rows, width);
  } else {
    add_bias_rows(static_cast<BFloat16*>(y), static_cast<const BFloat16*>(bias), rows, width);
  }
}

// GPT-OSS's gate over both = [gate | up] [rows, 2d] (plus its bias [2d], or nullptr) -> act
// [rows, d] in one pass, each operation rounded to scalar_t as torch rounds it
// (kvserve.model.moe.ExpertMLP and ClampedSwiGLU):
//   gate, up = both + bias;  g = min(gate, limit);  u = clamp(up, -limit, limit)
//   act = (u + 1) * (g * sigmoid(g * alpha))          (sigmoid: elementwise.cpp's, the same bits)
// NaN passes through the clamps as torch's clamp passes it.
template <typename scalar_t>
void clamped_swiglu_rows(const scalar_t* both, const scalar_t* bias, scalar_t* act, int64_t rows, int64_t d,
                         float alpha, float limit) {
  parallel_for(0, rows, std::max<int64_t>(1, 4096 / d), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const scalar_t* gate = both + r * 2 * d;
      const scalar_t* up = gate + d;
      scalar_t* dst = act + r * d;
#if defined(__AVX512F__)
      const scalar_t t{};
      const __m512 high = _mm512_set1_ps(limit), low = _mm512_set1_ps(-limit), one = _mm512_set1_ps(1.f);
      for (int64_t c = 0; c < d; c += 16) {
        const __mmask16 m = lanes(d - c);
        __m512 x = load16(gate + c, m), y = load16(up + c, m);
        if (bias != nullptr) {
          x = round_to(t, _mm512_add_ps(x, load16(bias + c, m)));
          y = round_to(t, _mm512_add_ps(y, load16(bias + d + c, m)));
        }
        const __m512 g = round_to(t, _mm512_min_ps(high, x));  // min_ps(a, b): b when either is NaN
        const __m512 u = round_to(t, _mm512_min_ps(high, _mm512_max_ps(low, y)));
        const __m512 sig = round_to(t, sigmoid16(round_to(t, _mm512_mul_ps(g, _mm512_set1_ps(alpha)))));
        const __m512 glu = round_to(t, _mm512_mul_ps(g, sig));
        store16(dst + c, _mm512_mul_ps(round_to(t, _mm512_add_ps(u, one)), glu), m);
      }
#else
      for (int64_t c = 0; c < d; ++c) {
        float x = to_float(gate[c]), y = to_float(up[c]);
        if (bias != nullptr) {
          x = to_float(from_float<scalar_t>(x + to_float(bias[c])));
          y = to_float(from_float<scalar_t>(y + to_float(bias[d + c])));
        }
        const float g = to_float(from_float<scalar_t>(std::min(x, limit)));
        const float u = to_float(from_float<scalar_t>(std::min(std::max(y, -limit), limit)));
        const float s = to_float(from_float<scalar_t>(g * alpha));
        const float sig = to_float(from_float<scalar_t>(1.f / (1.f + std::exp(-s))));
        const float glu = to_float(from_float<scalar_t>(g * sig));
        dst[c] = from_float<scalar_t>(to_float(from_float<scalar_t>(u + 1.f)) * glu);
      }
#endif
    }
  });
}

// act(gate_up(x) + bias) of `rows` rows into act [rows, I]: SwiGLU in the AMX store where the
// projection is one AMX weight without bias (the same bits), else in two steps.
void expert_activation(const MoeLayer& layer, const Projection& gate_up, const void* bias, DType dtype,
                       const void* x, void* act, int64_t rows, int64_t intermediate, Buffer& projected,
                       ProjectionScratch& scratch) {
  const LinearPart& first = gate_up.parts[0];
  if (layer.activation == kSiluAndMul && bias == nullptr && gate_up.parts.size() == 1 && first.kind == kAmx &&
      first.bias == nullptr && first.input_perm == nullptr && first.out_features % 32 == 0) {
    amx_linear(static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(first.packed), nullptr,
               static_cast<BFloat16*>(act), rows, first.in_features, first.out_features, true);
    return;
  }
  void* both = projected.get<char>(rows * 2 * intermediate * (dtype == kFloat32 ? 4 : 2));
  run_projection(gate_up, dtype, x, both, rows, scratch);
  if (layer.activation == kSiluAndMul) {
    if (bias != nullptr) add_bias(dtype, both, bias, rows, 2 * intermediate);
    silu_and_mul(dtype, both, act, rows, intermediate);
  } else if (dtype == kFloat32) {
    clamped_swiglu_rows(static_cast<const float*>(both), static_cast<const float*>(bias), static_cast<float*>(act),
                        rows, intermediate, layer.alpha, layer.limit);
  } else {
    clamped_swiglu_rows(static_cast<const BFloat16*>(both), static_cast<const BFloat16*>(bias),
                        static_cast<BFloat16*>(act), rows, intermediate, layer.alpha, layer.limit);
  }
}

void shared_expert(const MoeLayer& layer, DType dtype, const void* x, float* acc, int64_t tokens, MoeScratch& s) {
  const int64_t es = dtype == kFloat32 ? 4 : 2, hidden = layer.hidden;
  const int64_t width = layer.shared_down.parts[0].in_features;
  void* act = s.shared_act.get<char>(tokens * width * es);
  expert_activation(layer, layer.shared_gate_up, nullptr, dtype, x, act, tokens, width, s.shared_gate_up,
                    s.projection);
  void* y = s.shared_y.get<char>(tokens * hidden * es);
  run_projection(layer.shared_down, dtype, act, y, tokens, s.projection);
  if (!layer.shared_gated) {
    for (int64_t i = 0; i < tokens * hidden; ++i) acc[i] = rounded(acc[i] + load(y, dtype, i), dtype);
    return;
  }
  void* gate = s.shared_gate.get<char>(tokens * es);
  run_projection(layer.shared_gate, dtype, x, gate, tokens, s.projection);
  sigmoid(dtype, gate, gate, tokens);
  for (int64_t t = 0; t < tokens; ++t) {
    const float g = load(gate, dtype, t);
    for (int64_t h = 0; h < hidden; ++h)
      acc[t * hidden + h] = rounded(acc[t * hidden + h] + rounded(g * load(y, dtype, t * hidden + h), dtype), dtype);
  }
}

// The experts and the shared expert of routed tokens (weights, ids: the scratch's, [T, k]).
void run_experts(const MoeLayer& layer, DType dtype, const void* x, float* weights, const int32_t* ids, void* out,
                 int64_t tokens, MoeScratch& s) {
  const int64_t E = layer.num_experts, k = layer.top_k, hidden = layer.hidden, es = dtype == kFloat32 ? 4 : 2;
  if (!layer.weights_float32)
    for (int64_t i = 0; i < tokens * k; ++i) weights[i] = rounded(weights[i], dtype);
  // (token, slot) pairs grouped by expert, each expert's in increasing token order.
  std::vector<int64_t> start(static_cast<size_t>(E) + 1, 0);
  for (int64_t i = 0; i < tokens * k; ++i) ++start[ids[i] + 1];
  for (int64_t e = 0; e < E; ++e) start[e + 1] += start[e];
  int64_t* order = s.order.get<int64_t>(tokens * k);
  std::vector<int64_t> fill(start.begin(), start.end() - 1);
  for (int64_t i = 0; i < tokens * k; ++i) order[fill[ids[i]]++] = i;
  float* acc = s.acc.get<float>(tokens * hidden);
  std::fill(acc, acc + tokens * hidden, 0.f);
  int64_t* rows = s.rows.get<int64_t>(tokens * k);
  std::vector<float> w(static_cast<size_t>(tokens * k));
  for (int64_t e = layer.first_expert; e < layer.first_expert + layer.local_experts; ++e) {
    const int64_t count = start[e + 1] - start[e];
    if (count == 0) continue;
    const int64_t local = e - layer.first_expert;
    char* gathered = s.gathered.get<char>(count * hidden * es);
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pair = order[start[e] + i];
      rows[i] = pair / k;
      w[i] = weights[pair];
      std::memcpy(gathered + i * hidden * es, static_cast<const char*>(x) + rows[i] * hidden * es, hidden * es);
    }
    void* act = s.act.get<char>(count * layer.intermediate * es);
    const bool biased = !layer.gate_up_bias.empty();
    expert_activation(layer, layer.gate_up[local], biased ? layer.gate_up_bias[local] : nullptr, dtype, gathered, act,
                      count, layer.intermediate, s.gate_up, s.projection);
    void* y = s.y.get<char>(count * hidden * es);
    run_projection(layer.down[local], dtype, act, y, count, s.projection);
    accumulate(acc, y, biased ? layer.down_bias[local] : nullptr, dtype, rows, w.data(), count, hidden);
  }
  if (layer.shared) shared_expert(layer, dtype, x, acc, tokens, s);
  if (dtype == kFloat32) {
    std::memcpy(out, acc, tokens * hidden * sizeof(float));
  } else {
    BFloat16* o = static_cast<BFloat16*>(out);
    for (int64_t i = 0; i < tokens * hidden; ++i) o[i] = from_float<BFloat16>(acc[i]);
  }
}

}  // namespace

void moe_forward(const MoeLayer& layer, DType dtype, const void* x, void* out, int64_t tokens, MoeScratch& s) {
  check(layer.routing != kExternal, "moe: this layer's routing is the caller's (moe_forward_routed)");
  const int64_t E = layer.num_experts, k = layer.top_k, es = dtype == kFloat32 ? 4 : 2;
  void* logits = s.logits.get<char>(tokens * E * es);
  run_projection(layer.router, dtype, x, logits, tokens, s.projection);
  float* weights = s.weights.get<float>(tokens * k);
  int32_t* ids = s.ids.get<int32_t>(tokens * k);
  moe_route(dtype, logits, tokens, E, k, layer.normalize, layer.routing, weights, ids);
  run_experts(layer, dtype, x, weights, ids, out, tokens, s);
}

void moe_forward_routed(const MoeLayer& layer, DType dtype, const void* x, const float* weights, const int32_t* ids,
                        void* out, int64_t tokens, MoeScratch& s) {
  const int64_t k = layer.top_k;
  for (int64_t i = 0; i < tokens * k; ++i)
    check(ids[i] >= 0 && ids[i] < layer.num_experts, "moe: an expert id outside [0, num_experts)");
  float* w = s.weights.get<float>(tokens * k);
  int32_t* routed = s.ids.get<int32_t>(tokens * k);
  std::memcpy(w, weights, tokens * k * sizeof(float));
  std::memcpy(routed, ids, tokens * k * sizeof(int32_t));
  run_experts(layer, dtype, x, w, routed, out, tokens, s);
}

}  // namespace kvserve

#pragma GCC pop_options
