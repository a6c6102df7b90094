// Top-p (nucleus) truncation of a float32 logits row in place, without sorting the vocabulary
// (kvserve.sample.top_k_top_p, every top-p row on CPU; the torch path takes a softmax and the top
// 256 candidates, and sorts all 151,936 logits (~10 ms a row) for a wider nucleus).
//
// For one row of temperature-scaled logits l (some may be -inf after top-k) and top_p = p:
//
//   m = max_i l_i;  e_i = exp(l_i - m)  (float32, simd.h's exp16 on AVX-512, std::exp else)
//   S = sum_i e_i;  target = p * S      (sums of e in 64 float32 partial sums by position, then
//                                        added in order: fixed for a row)
//   f(v) = sum of e_i over l_i > v      (the mass of the tokens strictly more likely than v)
//   u    = the smallest logit with f(u) < target (bisection over v; f only changes at a logit):
//          the boundary value, the least likely value that stays
//   kept: every l_i > u; of the tokens with l_i == u, in index order, those whose mass before
//         them, f(u) + t * e(u) for the t-th, is < target; every other token becomes -inf.
//
// That is the rule of the sorted path (a token stays when the mass of the tokens before it in
// most-likely-first order is below p; Holtzman et al. 2019) with ties ordered by index, the mass
// summed in index order instead of the sorted order (the two can differ in the last place at the
// boundary). The most likely token always stays (f(m) = 0 < target). A row with a NaN or +inf
// logit, or only -inf logits, is left unchanged (the sampler takes its argmax). Each row depends
// only on its own logits and p: the same alone or in any batch, with any thread count.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"
#include "simd.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

// A float32 as an integer in the same order (-inf < ... < -0 < +0 < ... < +inf), and back.
inline int64_t order_key(float v) {
  int32_t bits;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits >= 0 ? static_cast<int64_t>(bits) : -static_cast<int64_t>(bits & 0x7fffffff) - 1;
}
inline float from_order_key(int64_t key) {
  const int32_t bits = key >= 0 ? static_cast<int32_t>(key) : static_cast<int32_t>((-(key + 1)) | 0x80000000u);
  float v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
}

// Sum of e_i over the positions with l_i > v: 64 float32 partial sums (position i into partial
// i mod 64), then added in a fixed order. `all_positions` sums every e_i.
float mass_above(const float* l, const float* e, int64_t n, float v, bool all_positions) {
  alignas(64) float lanes[64] = {0.f};
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  const __m512 vv = _mm512_set1_ps(v);
  for (; i + 64 <= n; i += 64) {
    for (int a = 0; a < 4; ++a) {
      const __mmask16 above = all_positions ? static_cast<__mmask16>(0xFFFF)
                                            : _mm512_cmp_ps_mask(_mm512_loadu_ps(l + i + 16 * a), vv, _CMP_GT_OQ);
      acc[a] = _mm512_mask_add_ps(acc[a], above, acc[a], _mm512_loadu_ps(e + i + 16 * a));
    }
  }
  for (int a = 0; a < 4; ++a) _mm512_store_ps(lanes + 16 * a, acc[a]);
#endif
  for (int64_t j = 0; i < n; ++i, j = (j + 1) % 64) {
    if (all_positions || l[i] > v) lanes[j] += e[i];
  }
  float total = 0.f;
  for (float lane : lanes) total += lane;
  return total;
}

// The row's maximum and least finite logit; false when a NaN or +inf leaves it without a
// distribution, or when every logit is -inf.
bool row_range(const float* l, int64_t n, float* largest, float* least) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  float hi = -kInf, lo = kInf;
  bool bad = false;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 vhi = _mm512_set1_ps(-kInf), vlo = _mm512_set1_ps(kInf);
  const __m512 inf = _mm512_set1_ps(kInf), neg_inf = _mm512_set1_ps(-kInf);
  __mmask16 invalid = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(l + i);
    invalid |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x, inf, _CMP_EQ_OQ);
    vhi = _mm512_max_ps(vhi, x);
    vlo = _mm512_mask_min_ps(vlo, _mm512_cmp_ps_mask(x, neg_inf, _CMP_NEQ_OQ), vlo, x);
  }
  bad = invalid != 0;
  hi = _mm512_reduce_max_ps(vhi);
  lo = _mm512_reduce_min_ps(vlo);
#endif
  for (; i < n; ++i) {
    const float x = l[i];
    if (std::isnan(x) || x == kInf) bad = true;
    if (x == -kInf) continue;
    hi = std::max(hi, x);
    lo = std::min(lo, x);
  }
  *largest = hi;
  *least = lo;
  return !bad && hi != -kInf;
}

// How many l_i lie in (lo, hi].
int64_t count_between(const float* l, int64_t n, float lo, float hi) {
  int64_t count = 0, i = 0;
#if defined(__AVX512F__)
  const __m512 vlo = _mm512_set1_ps(lo), vhi = _mm512_set1_ps(hi);
  for (; i + 16 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(l + i);
    count += __builtin_popcount(_mm512_mask_cmp_ps_mask(_mm512_cmp_ps_mask(x, vlo, _CMP_GT_OQ), x, vhi, _CMP_LE_OQ));
  }
#endif
  for (; i < n; ++i) count += l[i] > lo && l[i] <= hi;
  return count;
}

// exp(l_i - m) of a row into e.
void row_exps(const float* l, int64_t n, float m, float* e) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 mv = _mm512_set1_ps(m);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(e + i, kvserve::exp16(_mm512_sub_ps(_mm512_loadu_ps(l + i), mv)));
#endif
  for (; i < n; ++i) e[i] = std::exp(l[i] - m);
}

// Working arrays of one thread: the row's scaled logits y and e, and the positions still in the
// search.
struct Scratch {
  std::vector<float> y, e, cand_l, cand_e;
};

// y = x / temperature in float32 (as torch's `x.float().div_(T)`: a correctly rounded division
// per value), or x itself for temperature 0.
template <typename scalar_t>
void scaled_row(const scalar_t* x, int64_t n, float temperature, float* y) {
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 t = _mm512_set1_ps(temperature);
  for (; i + 16 <= n; i += 16) {
    __m512 v;
    if constexpr (std::is_same_v<scalar_t, float>) {
      v = _mm512_loadu_ps(x + i);
    } else {
      v = kvserve::widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
    }
    _mm512_storeu_ps(y + i, temperature > 0.f ? _mm512_div_ps(v, t) : v);
  }
#endif
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    y[i] = temperature > 0.f ? v / temperature : v;
  }
}

#if defined(__AVX512F__)
inline void drop16(float* x, __mmask16 m) {
  _mm512_mask_storeu_ps(x, m, _mm512_set1_ps(-std::numeric_limits<float>::infinity()));
}
inline void drop16(kvserve::BFloat16* x, __mmask16 m) {
  _mm256_mask_storeu_epi16(x, m, _mm256_set1_epi16(static_cast<int16_t>(0xFF80)));  // bfloat16 -inf
}
#endif

template <typename scalar_t>
void top_p_row(scalar_t* x, int64_t n, float p, float temperature, Scratch& s) {
  s.y.resize(n);
  scaled_row(x, n, temperature, s.y.data());
  const float* l = s.y.data();
  float m, lowest;
  if (!row_range(l, n, &m, &lowest)) return;
  s.e.resize(n);
  row_exps(l, n, m, s.e.data());
  const float target = p * mass_above(l, s.e.data(), n, 0.f, true);
  // Bisection: f(lo) >= target > f(hi), lo just below the least finite logit, hi the largest;
  // midpoints by value (the positions between lo and hi shrink about geometrically) until lo and
  // hi are too close for that, then by the float order. Once few positions lie in (lo, hi], they
  // are copied out (in index order) and f(v) becomes f(hi) + their mass above v: a fixed formula
  // of the row, like the full pass it replaces.
  float lo = std::nextafter(lowest, -std::numeric_limits<float>::infinity()), hi = m;
  float before = 0.f;  // f(hi): no logit is above the largest
  const float* cl = l;
  const float* ce = s.e.data();
  int64_t cn = n;
  float base = 0.f;
  bool compacted = false;
  while (order_key(hi) - order_key(lo) > 1) {
    float mid = lo + (hi - lo) * 0.5f;
    if (!(mid > lo && mid < hi)) mid = from_order_key(order_key(lo) + (order_key(hi) - order_key(lo)) / 2);
    const float f = base + mass_above(cl, ce, cn, mid, false);
    if (f < target) {
      hi = mid;
      before = f;
    } else {
      lo = mid;
    }
    if (!compacted && order_key(hi) - order_key(lo) > 1) {
      const int64_t inside = count_between(l, n, lo, hi);
      if (inside * 16 < n) {
        s.cand_l.clear();
        s.cand_e.clear();
        for (int64_t i = 0; i < n; ++i) {
          if (l[i] > lo && l[i] <= hi) {
            s.cand_l.push_back(l[i]);
            s.cand_e.push_back(s.e[i]);
          }
        }
        base = before;  // f(hi) over every position, as computed when hi was set
        cl = s.cand_l.data();
        ce = s.cand_e.data();
        cn = inside;
        compacted = true;
      }
    }
  }
  const float boundary = hi;
  // Drop every l_i < boundary; of the ties at the boundary (index order), keep the t-th while
  // before = f(boundary), plus t * e(boundary), is < target.
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  float tie_e = 0.f;
  int64_t ties_seen = 0;
  auto tie = [&](int64_t i) {
    if (ties_seen == 0) tie_e = s.e[i];
    if (!(before + static_cast<float>(ties_seen) * tie_e < target)) x[i] = static_cast<scalar_t>(kNegInf);
    ++ties_seen;
  };
  int64_t i = 0;
#if defined(__AVX512F__)
  const __m512 b = _mm512_set1_ps(boundary);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(l + i);
    drop16(x + i, _mm512_cmp_ps_mask(v, b, _CMP_LT_OQ));
    __mmask16 equal = _mm512_cmp_ps_mask(v, b, _CMP_EQ_OQ);
    for (; equal != 0; equal &= equal - 1) tie(i + __builtin_ctz(equal));
  }
#endif
  for (; i < n; ++i) {
    if (l[i] < boundary) x[i] = static_cast<scalar_t>(kNegInf);
    else if (l[i] == boundary) tie(i);
  }
}

template <typename scalar_t>
void run_rows(scalar_t* base, const int64_t* row_ids, const float* ps, const float* ts, int64_t count, int64_t vocab) {
  kvserve::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    // Kept by each thread across calls: fresh 600 KB arrays each call were page faults (~0.5 ms a row).
    thread_local Scratch scratch;
    for (int64_t r = begin; r < end; ++r) top_p_row(base + row_ids[r] * vocab, vocab, ps[r], ts == nullptr ? 0.f : ts[r], scratch);
  });
}

}  // namespace

namespace kvserve {

// logits: contiguous float32 or bfloat16 [N, V], modified in place (dropped tokens become -inf);
// rows: int64 [R] (the rows to truncate); top_p: float32 [R], each in (0, 1); temperature: nullptr
// (the logits are already scaled) or float32 [R] > 0: the decisions are taken on logits / T (as
// torch's float32 division), the raw logits masked, as the sampling kernel (sample.cpp) expects.
void top_p_rows(DType dtype, void* logits, int64_t num_rows, int64_t vocab, const int64_t* rows, int64_t count,
                const float* top_p, const float* temperature) {
  for (int64_t r = 0; r < count; ++r) {
    check(rows[r] >= 0 && rows[r] < num_rows, "top_p_rows: row " + std::to_string(rows[r]) + " outside [0, " +
                                                  std::to_string(num_rows) + ")");
    check(top_p[r] > 0.f && top_p[r] < 1.f, "top_p_rows: top_p must be in (0, 1), got " + std::to_string(top_p[r]));
    check(temperature == nullptr || temperature[r] > 0.f,
          "top_p_rows: temperature must be > 0, got " + std::to_string(temperature == nullptr ? 0.f : temperature[r]));
  }
  if (dtype == kFloat32) {
    run_rows(static_cast<float*>(logits), rows, top_p, temperature, count, vocab);
  } else {
    run_rows(static_cast<BFloat16*>(logits), rows, top_p, temperature, count, vocab);
  }
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_top_p_rows(int32_t dtype, void* logits, int64_t num_rows, int64_t vocab,
                                                 const int64_t* rows, int64_t count, const float* top_p,
                                                 const float* temperature) {
  return kvserve::guarded([&] {
    kvserve::top_p_rows(static_cast<kvserve::DType>(dtype), logits, num_rows, vocab, rows, count, top_p, temperature);
  });
}
