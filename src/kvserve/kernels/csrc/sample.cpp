// Random sampling of logits rows in one pass each, without [N, V] float32 temporaries
// (kvserve.sample.sampler).
//
// The torch path upcasts the logits, divides them by the temperature, takes a softmax and a
// cumulative sum (each a new N x V float32 tensor: 39 MB at 64 x 151,936, whose pages the kernel
// zeroes on every allocation) and searches the CDF; at 64 rows that was ~30 ms of a ~170 ms served
// step. Here one thread draws one row, reading the logits (float32 or bfloat16) in place:
//
//   y_i = x_i / T            (float32 division, as torch's div_; skipped when T == 1: x / 1 == x)
//   m   = max_i y_i
//   e_i = exp(y_i - m)       (float32, simd.h's exp16 on AVX-512; std::exp elsewhere)
//   s_b = the sum of e over block b of 256 positions (16 vectors added lane-wise in order, then
//         the 16 lanes in _mm512_reduce_add_ps's fixed tree)
//   total = sum of s_b in block order, in double;  target = u * total
//   block: the first whose running double sum (through it) exceeds target
//   token: in that block, the first position with e_j > 0 whose running sum (the blocks before
//          plus e_0 .. e_j of the block, in double) exceeds target, else the block's last
//          position with e_j > 0; if no block exceeds target (u * total rounded to total), the
//          row's last position with e_j > 0.
//
// A token with e_j == 0 (a -inf logit, e.g. after top-k) is never drawn. A row with a NaN or +inf
// logit, or only -inf logits, has no distribution: its result is V, and the caller takes the
// argmax as the torch path does. Each row's token depends only on its logits, T and u: the same
// alone or in any batch, with any thread count.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"
#include "simd.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kBlock = 256;

inline float widen(float v) { return v; }
inline float widen(kvserve::BFloat16 v) { return static_cast<float>(v); }

#if defined(__AVX512F__)
using kvserve::lanes;
using kvserve::load16;
#endif

// e_j of the positions [begin, end) into out (float32), from y = x / T - m.
template <typename scalar_t>
void block_exps(const scalar_t* x, int64_t begin, int64_t end, float temperature, float m, float* out) {
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(temperature), mv = _mm512_set1_ps(m);
  for (int64_t i = begin; i < end; i += 16) {
    const __mmask16 mask = lanes(end - i);
    __m512 y = load16(x + i, mask);
    if (temperature != 1.f) y = _mm512_div_ps(y, t);
    _mm512_mask_storeu_ps(out + (i - begin), mask, kvserve::exp16(_mm512_sub_ps(y, mv)));
  }
#else
  for (int64_t i = begin; i < end; ++i) {
    const float y = temperature != 1.f ? widen(x[i]) / temperature : widen(x[i]);
    out[i - begin] = std::exp(y - m);
  }
#endif
}

// The largest y = x / T of the row, or NaN when the row has a NaN: the largest x divided once
// (rounding is monotonic, so fl(max x / T) = max fl(x / T)).
template <typename scalar_t>
float row_max(const scalar_t* x, int64_t n, float temperature) {
  float best = -std::numeric_limits<float>::infinity();
  bool nan = false;
#if defined(__AVX512F__)
  __m512 vbest = _mm512_set1_ps(best);
  __mmask16 nans = 0;
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 mask = lanes(n - i);
    const __m512 v = load16(x + i, mask);
    nans |= _mm512_mask_cmp_ps_mask(mask, v, v, _CMP_UNORD_Q);
    vbest = _mm512_mask_max_ps(vbest, mask, vbest, v);
  }
  best = _mm512_reduce_max_ps(vbest);
  nan = nans != 0;
#else
  for (int64_t i = 0; i < n; ++i) {
    const float v = widen(x[i]);
    nan = nan || std::isnan(v);
    best = std::max(best, v);
  }
#endif
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return temperature != 1.f ? best / temperature : best;
}

// Sum of a block's e (the fixed order of the file header).
float block_sum(const float* e, int64_t len) {
#if defined(__AVX512F__)
  __m512 acc = _mm512_setzero_ps();
  for (int64_t i = 0; i < len; i += 16) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(lanes(len - i), e + i));
  return _mm512_reduce_add_ps(acc);
#else
  float lanes[16] = {};
  for (int64_t i = 0; i < len; ++i) lanes[i % 16] += e[i];
  float sum = 0.f;
  for (float v : lanes) sum += v;
  return sum;
#endif
}

template <typename scalar_t>
int64_t sample_row(const scalar_t* x, int64_t n, float temperature, double u, std::vector<float>& sums) {
  const float m = row_max(x, n, temperature);
  if (!std::isfinite(m)) return n;  // NaN, +inf, or every logit -inf: no distribution
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  alignas(64) float e[kBlock];
  sums.resize(blocks);
  double total = 0.0;
  int64_t last_positive = -1;
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    block_exps(x, begin, begin + len, temperature, m, e);
    sums[b] = block_sum(e, len);
    total += sums[b];
    if (sums[b] > 0.f)
      for (int64_t j = len - 1; j >= 0; --j)
        if (e[j] > 0.f) { last_positive = begin + j; break; }
  }
  const double target = u * total;
  double running = 0.0;
  for (int64_t b = 0; b < blocks; ++b) {
    if (running + sums[b] <= target) { running += sums[b]; continue; }
    const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    block_exps(x, begin, begin + len, temperature, m, e);
    int64_t last = -1;
    for (int64_t j = 0; j < len; ++j) {
      if (e[j] <= 0.f) continue;
      running += e[j];
      last = j;
      if (running > target) return begin + j;
    }
    return begin + last;
  }
  return last_positive;
}

}  // namespace

namespace kvserve {

// logits: contiguous [N, V] float32 or bfloat16; rows: int64 [R] (rows to draw); temperature:
// float32 [R] (> 0); uniforms: float64 [R] in [0, 1) -> tokens int64 [R] (V: the row has no
// distribution).
void sample_rows(DType dtype, const void* logits, int64_t num_rows, int64_t vocab, const int64_t* rows, int64_t count,
                 const float* temperature, const double* uniforms, int64_t* tokens) {
  for (int64_t i = 0; i < count; ++i)
    check(rows[i] >= 0 && rows[i] < num_rows, "sample_rows: row " + std::to_string(rows[i]) + " out of range");
  auto run = [&](const auto* x) {
    parallel_for(0, count, 1, [&](int64_t a, int64_t b) {
      std::vector<float> sums;
      for (int64_t i = a; i < b; ++i) tokens[i] = sample_row(x + rows[i] * vocab, vocab, temperature[i], uniforms[i], sums);
    });
  };
  if (dtype == kFloat32) {
    run(static_cast<const float*>(logits));
  } else {
    run(static_cast<const BFloat16*>(logits));
  }
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_sample_rows(int32_t dtype, const void* logits, int64_t num_rows, int64_t vocab,
                                                  const int64_t* rows, int64_t count, const float* temperature,
                                                  const double* uniforms, int64_t* tokens) {
  return kvserve::guarded([&] {
    kvserve::sample_rows(static_cast<kvserve::DType>(dtype), logits, num_rows, vocab, rows, count, temperature,
                         uniforms, tokens);
  });
}
