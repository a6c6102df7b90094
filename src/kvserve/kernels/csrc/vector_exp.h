// 16-lane float32 helpers of the elementwise kernels (elementwise.cpp, sample.cpp, top_p.cpp and
// amx_linear.cpp's gate-up store): the bfloat16 widening; exp: x = n ln2 + r, |r| <= ln2 / 2,
// 2^n * p(r) with p the degree-6 Taylor polynomial (within a few float32 ulp), scalef giving 0
// below about -104 and infinity above about 88.7; and SiLU. AVX-512F builds (or regions) only.
#pragma once
// KVSERVE_AVX512_REGION: the includer is inside a `#pragma GCC target("avx512f...")` region
// (amx_linear.cpp), where the intrinsics are usable on a host whose default flags lack AVX-512.
#if defined(__AVX512F__) || defined(KVSERVE_AVX512_REGION)
#include <immintrin.h>

namespace kvserve {

// 16 bfloat16 bit patterns -> float32 (exact: a bfloat16 is a float32's upper half). The widening
// of elementwise.cpp, sample.cpp, top_p.cpp and amx_linear.cpp.
inline __m512 widen_bf16(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(100.f)), _mm512_set1_ps(-110.f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

// silu(g) = g / (1 + exp(-g)) of 16 float32 lanes, through a reciprocal estimate and one Newton
// step (a division instruction per 16 values was the bottleneck); the reciprocal is within ~1 ulp.
// The one SiLU of silu_and_mul (elementwise.cpp) and of the fused gate-up store (amx_linear.cpp).
inline __m512 silu16(__m512 g) {
  const __m512 den = _mm512_add_ps(_mm512_set1_ps(1.f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), g)));
  __m512 inv = _mm512_rcp14_ps(den);
  inv = _mm512_mul_ps(inv, _mm512_fnmadd_ps(den, inv, _mm512_set1_ps(2.f)));
  return _mm512_mul_ps(g, inv);
}

}  // namespace kvserve
#endif
