// Fused elementwise steps of the decoder layer (kvserve.model.layers), one pass each instead of
// torch's several (each a separate operator call with its own dispatch, allocation and pass):
//
// - silu_and_mul: SwiGLU's silu(gate) * up over x = [gate | up], float32 or bfloat16. In bfloat16
//   the rounding steps are torch's (silu computed in float32 and rounded to bfloat16, then the
//   product of two bfloat16 values computed in float32 and rounded); silu's exp (simd.h:
//   range reduction and a degree-6 polynomial) and reciprocal (an estimate and one Newton step)
//   are kvserve's, each within a few float32 ulp, so an output can differ from torch's in the
//   last place.
// - rotary_embedding: the "rotate half" rotary embedding of bfloat16 q or k,
//   x * cos + rotate_half(x) * sin with every product and the sum rounded to bfloat16 as torch
//   rounds them: the same bits as RotaryEmbedding.apply's torch ops.
// - sigmoid: elementwise, float32 or bfloat16 (Qwen2-MoE's shared-expert gate): torch's vector
//   and scalar tails compute exp differently, so a value's bits depended on how many there were.
// - softmax_prefix_rows: each float32 row's softmax over its first `length` values, zeros after
//   them (multi-head latent attention's scores, kvserve.attention.latent): the max, exp(x - max)
//   with simd.h's exp (std::exp without AVX-512), their sum in 16 lanes and the quotients;
//   a value's bits depend only on its row's first `length` values, not on how long the row is.
// - rms_norm: RMSNorm of float32 or bfloat16 rows, optionally after a residual add (h = x + r
//   rounded to the dtype, as torch's add rounds): statistics in float32, x * rsqrt(mean(x^2) +
//   eps) rounded to the dtype, then times the weight and rounded, transformers' steps; the sum of
//   squares runs in 16 float32 lanes (torch's reduction order differs), so the mean can differ
//   from torch's in the last place.
//
// Every element depends only on its own row, so a row's result never depends on the batch.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"
#include "simd.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

#include "bf16_convert.h"

#if defined(__AVX512F__)
using kvserve::load16;
using kvserve::round_to;
using kvserve::store16;
#endif

template <typename scalar_t>
void silu_and_mul_rows(const scalar_t* x, scalar_t* out, int64_t rows, int64_t d) {
  for (int64_t t = 0; t < rows; ++t) {
    const scalar_t* gate = x + t * 2 * d;
    const scalar_t* up = gate + d;
    scalar_t* dst = out + t * d;
#if defined(__AVX512F__)
    for (int64_t i = 0; i < d; i += 16) {
      const __mmask16 m = kvserve::lanes(d - i);
      const __m512 silu = kvserve::silu16(load16(gate + i, m));
      store16(dst + i, _mm512_mul_ps(round_to(scalar_t{}, silu), load16(up + i, m)), m);
    }
#else
    for (int64_t i = 0; i < d; ++i) {
      const float g = to_float(gate[i]);
      const float silu = to_float(from_float<scalar_t>(g / (1.f + std::exp(-g))));
      dst[i] = from_float<scalar_t>(silu * to_float(up[i]));
    }
#endif
  }
}

// sigmoid(x) = 1 / (1 + exp(-x)) of n values, in float32, rounded to the dtype: the same vector
// code (a masked last vector) for every element, so a value's bits never depend on n.
template <typename scalar_t>
void sigmoid_values(const scalar_t* x, scalar_t* out, int64_t n) {
#if defined(__AVX512F__)
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = kvserve::lanes(n - i);
    store16(out + i, kvserve::sigmoid16(load16(x + i, m)), m);
  }
#else
  for (int64_t i = 0; i < n; ++i) out[i] = from_float<scalar_t>(1.f / (1.f + std::exp(-to_float(x[i]))));
#endif
}

// One bfloat16 row of `heads` heads (row stride `head_stride` elements) rotated into dst.
void rotary_row(const kvserve::BFloat16* x, int64_t heads, int64_t head_stride, const kvserve::BFloat16* cos,
                const kvserve::BFloat16* sin, kvserve::BFloat16* dst, int64_t dim) {
  const int64_t half = dim / 2;
  for (int64_t h = 0; h < heads; ++h) {
    const kvserve::BFloat16* src = x + h * head_stride;
    kvserve::BFloat16* o = dst + h * dim;
#if defined(__AVX512F__)
    for (int64_t i = 0; i < dim; i += 16) {
      const __mmask16 m = kvserve::lanes(dim - i);
      // lanes i .. i + 15 lie in one half when half % 16 == 0 (checked by the caller)
      const bool first = i < half;
      __m512 rot = load16(src + (first ? i + half : i - half), m);
      if (first) rot = _mm512_sub_ps(_mm512_setzero_ps(), rot);
      const __m512 a = round_to(kvserve::BFloat16{}, _mm512_mul_ps(load16(src + i, m), load16(cos + i, m)));
      const __m512 b = round_to(kvserve::BFloat16{}, _mm512_mul_ps(rot, load16(sin + i, m)));
      store16(o + i, _mm512_add_ps(a, b), m);
    }
#else
    for (int64_t i = 0; i < dim; ++i) {
      const float rot = i < half ? -to_float(src[i + half]) : to_float(src[i - half]);
      const float a = to_float(from_float<kvserve::BFloat16>(to_float(src[i]) * to_float(cos[i])));
      const float b = to_float(from_float<kvserve::BFloat16>(rot * to_float(sin[i])));
      o[i] = from_float<kvserve::BFloat16>(a + b);
    }
#endif
  }
}

// Rows of RMSNorm(x [+ res]); when res is given, the sums x + res are written to sum_out.
template <typename scalar_t>
void rms_norm_rows(const scalar_t* x, int64_t x_stride, const scalar_t* res, scalar_t* sum_out, const scalar_t* w,
                   scalar_t* out, int64_t rows, int64_t n, float eps) {
  for (int64_t t = 0; t < rows; ++t) {
    const scalar_t* src = x + t * x_stride;
    if (res != nullptr) {
      const scalar_t* r = res + t * n;
      scalar_t* h = sum_out + t * n;
#if defined(__AVX512F__)
      for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = kvserve::lanes(n - i);
        store16(h + i, _mm512_add_ps(load16(src + i, m), load16(r + i, m)), m);
      }
#else
      for (int64_t i = 0; i < n; ++i) h[i] = from_float<scalar_t>(to_float(src[i]) + to_float(r[i]));
#endif
      src = h;
    }
    scalar_t* dst = out + t * n;
#if defined(__AVX512F__)
    __m512 ss = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = kvserve::lanes(n - i);
      const __m512 v = load16(src + i, m);
      ss = _mm512_fmadd_ps(v, v, ss);
    }
    const float inv = 1.f / std::sqrt(_mm512_reduce_add_ps(ss) / static_cast<float>(n) + eps);
    const __m512 inv_v = _mm512_set1_ps(inv);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 m = kvserve::lanes(n - i);
      const __m512 y = round_to(scalar_t{}, _mm512_mul_ps(load16(src + i, m), inv_v));
      store16(dst + i, _mm512_mul_ps(load16(w + i, m), y), m);
    }
#else
    float ss = 0.f;
    for (int64_t i = 0; i < n; ++i) ss += to_float(src[i]) * to_float(src[i]);
    const float inv = 1.f / std::sqrt(ss / static_cast<float>(n) + eps);
    for (int64_t i = 0; i < n; ++i)
      dst[i] = from_float<scalar_t>(to_float(w[i]) * to_float(from_float<scalar_t>(to_float(src[i]) * inv)));
#endif
  }
}

}  // namespace

namespace kvserve {

// Row x[0, cols) in place: softmax of x[0, n), zeros in x[n, cols).
void softmax_prefix_row(float* x, int64_t n, int64_t cols) {
#if defined(__AVX512F__)
  __m512 mv = _mm512_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = kvserve::lanes(n - i);
    mv = _mm512_mask_max_ps(mv, m, mv, load16(x + i, m));
  }
  const __m512 top = _mm512_set1_ps(_mm512_reduce_max_ps(mv));
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = kvserve::lanes(n - i);
    const __m512 e = _mm512_maskz_mov_ps(m, kvserve::exp16(_mm512_sub_ps(load16(x + i, m), top)));
    store16(x + i, e, m);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 total = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = kvserve::lanes(n - i);
    store16(x + i, _mm512_div_ps(load16(x + i, m), total), m);
  }
#else
  float top = -INFINITY;
  for (int64_t i = 0; i < n; ++i) top = x[i] > top ? x[i] : top;
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - top);
    sum += x[i];
  }
  for (int64_t i = 0; i < n; ++i) x[i] /= sum;
#endif
  for (int64_t i = n; i < cols; ++i) x[i] = 0.f;
}

// x: [T, 2 * d] contiguous, float32 or bfloat16 -> out [T, d] = silu(x[:, :d]) * x[:, d:].
void silu_and_mul(DType dtype, const void* x, void* out, int64_t rows, int64_t d) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(d, 1));
  auto run = [&](const auto* src, auto* dst) {
    parallel_for(0, rows, grain, [&](int64_t a, int64_t b) { silu_and_mul_rows(src + a * 2 * d, dst + a * d, b - a, d); });
  };
  if (dtype == kFloat32) {
    run(static_cast<const float*>(x), static_cast<float*>(out));
  } else {
    run(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out));
  }
}

// x: bfloat16 [T, H, D] with unit stride in D (a view into the fused qkv output is fine); cos,
// sin: bfloat16 [T, D] contiguous -> out, contiguous [T, H, D], bit-identical to
// x * cos[:, None] + cat(-x[..., D/2:], x[..., :D/2]) * sin[:, None] in torch. D % 32 == 0.
void rotary_embedding(const BFloat16* x, int64_t row_stride, int64_t head_stride, const BFloat16* cos,
                      const BFloat16* sin, BFloat16* out, int64_t rows, int64_t heads, int64_t dim) {
  parallel_for(0, rows, std::max<int64_t>(1, 8192 / (heads * dim)), [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t)
      rotary_row(x + t * row_stride, heads, head_stride, cos + t * dim, sin + t * dim, out + t * heads * dim, dim);
  });
}

// x: [T, n] (row stride x_stride, unit stride in n), weight: [n], residual: [T, n] contiguous or
// nullptr, all one dtype (float32 or bfloat16) -> out = RMSNorm(h) * weight and sum = h, with h =
// x + residual (with no residual h is x itself and sum is not written).
void rms_norm(DType dtype, const void* x, int64_t x_stride, const void* weight, const void* residual, void* out,
              void* sum, int64_t rows, int64_t n, float eps) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(n, 1));
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* src = static_cast<const T*>(x);
    const T* res = static_cast<const T*>(residual);
    T* total = static_cast<T*>(sum);
    parallel_for(0, rows, grain, [&](int64_t a, int64_t b) {
      rms_norm_rows<T>(src + a * x_stride, x_stride, res != nullptr ? res + a * n : nullptr,
                       res != nullptr ? total + a * n : nullptr, static_cast<const T*>(weight),
                       static_cast<T*>(out) + a * n, b - a, n, eps);
    });
  };
  if (dtype == kFloat32) {
    run(float{});
  } else {
    run(BFloat16{});
  }
}

// x: n contiguous float32 or bfloat16 values -> out = sigmoid(x) (Qwen2-MoE's shared-expert gate).
void sigmoid(DType dtype, const void* x, void* out, int64_t n) {
  if (dtype == kFloat32) {
    sigmoid_values(static_cast<const float*>(x), static_cast<float*>(out), n);
  } else {
    sigmoid_values(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), n);
  }
}

// x: float32 [rows, cols] contiguous, in place; lengths[r] in [1, cols]: row r's softmax over its
// first lengths[r] values, zeros after them.
void softmax_prefix_rows(float* x, const int32_t* lengths, int64_t rows, int64_t cols) {
  parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) softmax_prefix_row(x + r * cols, lengths[r], cols);
  });
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int kvserve_softmax_prefix_rows(void* x, const void* lengths, int64_t rows, int64_t cols) {
  return kvserve::guarded([&] {
    kvserve::softmax_prefix_rows(static_cast<float*>(x), static_cast<const int32_t*>(lengths), rows, cols);
  });
}

KVSERVE_EXPORT int kvserve_sigmoid(int32_t dtype, const void* x, void* out, int64_t n) {
  return kvserve::guarded([&] { kvserve::sigmoid(static_cast<kvserve::DType>(dtype), x, out, n); });
}

KVSERVE_EXPORT int kvserve_silu_and_mul(int32_t dtype, const void* x, void* out, int64_t rows, int64_t d) {
  return kvserve::guarded([&] { kvserve::silu_and_mul(static_cast<kvserve::DType>(dtype), x, out, rows, d); });
}

KVSERVE_EXPORT int kvserve_rotary_embedding(const void* x, int64_t row_stride, int64_t head_stride, const void* cos,
                                            const void* sin, void* out, int64_t rows, int64_t heads, int64_t dim) {
  using kvserve::BFloat16;
  return kvserve::guarded([&] {
    kvserve::rotary_embedding(static_cast<const BFloat16*>(x), row_stride, head_stride,
                              static_cast<const BFloat16*>(cos), static_cast<const BFloat16*>(sin),
                              static_cast<BFloat16*>(out), rows, heads, dim);
  });
}

KVSERVE_EXPORT int kvserve_rms_norm(int32_t dtype, const void* x, int64_t x_stride, const void* weight,
                                    const void* residual, void* out, void* sum, int64_t rows, int64_t n, double eps) {
  return kvserve::guarded([&] {
    kvserve::rms_norm(static_cast<kvserve::DType>(dtype), x, x_stride, weight, residual, out, sum, rows, n,
                      static_cast<float>(eps));
  });
}

}  // extern "C"
