// The router of a mixture-of-experts layer (moe.cpp; moe.h: moe_route): each token's top k
// experts and their weights from the router's logits, softmax then top k (renormalised or not),
// or top k then softmax (GPT-OSS), the softmax in float32 with kvserve's exp (simd.h) where
// the build has AVX-512. Of equal values the lowest expert comes first.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels.h"
#include "moe.h"
#include "thread_pool.h"
#include "simd.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve {
namespace {

#include "bf16_convert.h"

// exp(v[i] - m) for i < n into out, in 16 lanes where the build has AVX-512 (a masked tail), so
// every value takes the same instructions.
void exp_shifted(const float* v, float m, float* out, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = kvserve::lanes(n - i);
    const __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(mask, v + i), _mm512_set1_ps(m));
    _mm512_mask_storeu_ps(out + i, mask, exp16(x));
  }
#else
  for (int64_t i = 0; i < n; ++i) out[i] = std::exp(v[i] - m);
#endif
}

}  // namespace

void moe_route(DType dtype, const void* logits, int64_t tokens, int64_t experts, int64_t top_k, bool normalize,
               MoeRouting routing, float* weights, int32_t* ids) {
  parallel_for(0, tokens, 16, [&](int64_t begin, int64_t end) {
    std::vector<float> row(static_cast<size_t>(experts)), probs(static_cast<size_t>(experts));
    std::vector<char> taken(static_cast<size_t>(experts));
    for (int64_t t = begin; t < end; ++t) {
      float m = -INFINITY;
      for (int64_t e = 0; e < experts; ++e) {
        row[e] = load(logits, dtype, t * experts + e);
        m = std::max(m, row[e]);
      }
      if (routing == kTopkSoftmax) {
        std::fill(taken.begin(), taken.end(), 0);
        for (int64_t j = 0; j < top_k; ++j) {
          int64_t best = -1;
          for (int64_t e = 0; e < experts; ++e)
            if (!taken[e] && (best < 0 || row[e] > row[best])) best = e;  // strict: the lowest of equals
          taken[best] = 1;
          ids[t * top_k + j] = static_cast<int32_t>(best);
          probs[j] = row[best];
        }
        float* w = weights + t * top_k;
        exp_shifted(probs.data(), probs[0], w, top_k);
        float sum = 0.f;
        for (int64_t j = 0; j < top_k; ++j) sum += w[j];
        for (int64_t j = 0; j < top_k; ++j) w[j] /= sum;
        continue;
      }
      exp_shifted(row.data(), m, probs.data(), experts);
      float sum = 0.f;
      for (int64_t e = 0; e < experts; ++e) sum += probs[e];
      for (int64_t e = 0; e < experts; ++e) probs[e] /= sum;
      std::fill(taken.begin(), taken.end(), 0);
      float chosen = 0.f;
      for (int64_t j = 0; j < top_k; ++j) {
        int64_t best = -1;
        for (int64_t e = 0; e < experts; ++e)
          if (!taken[e] && (best < 0 || probs[e] > probs[best])) best = e;  // strict: the lowest of equals
        taken[best] = 1;
        weights[t * top_k + j] = probs[best];
        ids[t * top_k + j] = static_cast<int32_t>(best);
        chosen += probs[best];
      }
      if (normalize)
        for (int64_t j = 0; j < top_k; ++j) weights[t * top_k + j] /= chosen;
    }
  });
}

}  // namespace kvserve

#pragma GCC pop_options
