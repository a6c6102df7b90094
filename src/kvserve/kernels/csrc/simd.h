// The kernels' SIMD helpers: 16-lane float32 (AVX-512) operations of elementwise.cpp, moe.cpp,
// sample.cpp, argmax.cpp, latent_attention.cpp, the paged_attention_*.cpp kernels, top_p.cpp and
// the AMX kernels (amx_tiles.h): the bfloat16 widening, whole loads of float32, bfloat16, float16
// or scaled int8, masked loads and stores of float32 or bfloat16 with rounding to the dtype, the
// rounding to bfloat16 bits; exp: x = n ln2 + r,
// |r| <= ln2 / 2, 2^n * p(r) with p the degree-6 Taylor polynomial (within a few float32 ulp),
// scalef giving 0 below about -104 and infinity above about 88.7; SiLU and sigmoid; a 16 x 16
// transpose of 32-bit elements. AVX-512F builds only (the avx512 and avx512_bf16 variants: the
// compiler's __AVX512F__).
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include "abi.h"

namespace kvserve {

// 16 bfloat16 bit patterns -> float32 (exact: a bfloat16 is a float32's upper half).
inline __m512 widen_bf16(__m256i bits) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16)); }

// The lanes of a vector starting `left` values before the end of a row: all 16, or the first few.
inline __mmask16 lanes(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1);
}

// Whole 16-value loads widened to float32: float32, bfloat16, float16, and int8 times a scale
// (float32(q) * s, one rounding).
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const BFloat16* p) { return widen_bf16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const Half* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
inline __m512 load16(const int8_t* p, __m512 scale) {
  return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))),
                       scale);
}

// Masked loads and stores only for a row's last, partial vector.
inline __m512 load16(const float* p, __mmask16 m) {
  return m == 0xFFFF ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(m, p);
}
inline __m512 load16(const BFloat16* p, __mmask16 m) {
  const __m256i raw = m == 0xFFFF ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)) : _mm256_maskz_loadu_epi16(m, p);
  return widen_bf16(raw);
}
// float32 rounded to the nearest bfloat16 (ties to even) with c10's arithmetic, kept as float32
// (low 16 bits zero); NaN -> 0x7fc0. No flushing of subnormals, unlike vcvtneps2bf16.
inline __m512i round_bf16_word(__m512 v) {
  const __m512i w = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(w, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(_mm512_add_epi32(w, _mm512_set1_epi32(0x7fff)), lsb),
                                     _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u)));
  return _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7fc00000));
}
inline __m512 round_to(float, __m512 v) { return v; }
inline __m512 round_to(BFloat16, __m512 v) { return _mm512_castsi512_ps(round_bf16_word(v)); }
inline void store16(float* p, __m512 v, __mmask16 m) {
  if (m == 0xFFFF) _mm512_storeu_ps(p, v); else _mm512_mask_storeu_ps(p, m, v);
}
// 16 float32 -> 16 bfloat16 bit patterns, rounded as round_bf16_word.
inline __m256i round_to_bf16(__m512 v) { return _mm512_cvtepi32_epi16(_mm512_srli_epi32(round_bf16_word(v), 16)); }
inline void store16(BFloat16* p, __m512 v, __mmask16 m) {
  const __m256i bits = round_to_bf16(v);
  if (m == 0xFFFF) _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits); else _mm256_mask_storeu_epi16(p, m, bits);
}

// In-register transpose of a 16 x 16 matrix of 32-bit elements: rows in, columns out
// (unpack 32-bit, unpack 64-bit, then two rounds of 128-bit lane shuffles).
inline void transpose16x16(const __m512i (&in)[16], __m512i (&out)[16]) {
  __m512i b[16], c[16];
  for (int i = 0; i < 8; ++i) {
    b[2 * i] = _mm512_unpacklo_epi32(in[2 * i], in[2 * i + 1]);
    b[2 * i + 1] = _mm512_unpackhi_epi32(in[2 * i], in[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // c[4i + e], 128-bit lane L: column 4L + e of rows 4i .. 4i + 3
    c[4 * i + 0] = _mm512_unpacklo_epi64(b[4 * i], b[4 * i + 2]);
    c[4 * i + 1] = _mm512_unpackhi_epi64(b[4 * i], b[4 * i + 2]);
    c[4 * i + 2] = _mm512_unpacklo_epi64(b[4 * i + 1], b[4 * i + 3]);
    c[4 * i + 3] = _mm512_unpackhi_epi64(b[4 * i + 1], b[4 * i + 3]);
  }
  for (int e = 0; e < 4; ++e) {
    const __m512i d0 = _mm512_shuffle_i32x4(c[e], c[4 + e], 0x44), d1 = _mm512_shuffle_i32x4(c[e], c[4 + e], 0xEE);
    const __m512i d2 = _mm512_shuffle_i32x4(c[8 + e], c[12 + e], 0x44), d3 = _mm512_shuffle_i32x4(c[8 + e], c[12 + e], 0xEE);
    out[0 + e] = _mm512_shuffle_i32x4(d0, d2, 0x88);
    out[4 + e] = _mm512_shuffle_i32x4(d0, d2, 0xDD);
    out[8 + e] = _mm512_shuffle_i32x4(d1, d3, 0x88);
    out[12 + e] = _mm512_shuffle_i32x4(d1, d3, 0xDD);
  }
}

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

// sigmoid(x) = 1 / (1 + exp(-x)) in float32 (a division: elementwise.cpp's sigmoid and GPT-OSS's
// gate in moe.cpp, the same bits).
inline __m512 sigmoid16(__m512 x) {
  const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
  return _mm512_div_ps(_mm512_set1_ps(1.f), _mm512_add_ps(_mm512_set1_ps(1.f), e));
}

}  // namespace kvserve
#endif
