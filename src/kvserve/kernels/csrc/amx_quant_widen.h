// The AMX quantized linear's widening (amx_quant_tiles.cpp): a panel's 32-input chunk of packed
// int8 / int4 / MXFP4 weights -> one bfloat16 B tile in AMX's pair-interleaved form, in L1. The
// integers (and MXFP4's values times their power-of-two scale) are exact in bfloat16, so the tiles
// multiply exactly the weights the sequence names (amx_quant_linear.cpp).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "amx_quant.h"

#if defined(KVSERVE_AMX_BUILD)

KVSERVE_AMX_QUANT_BEGIN

namespace kvserve_amx_quant {

// One int8 chunk of a panel (32 rows of 16 bytes: inputs k, k + 1, ... of the panel's 16 columns)
// -> its bfloat16 B tile: tile row r, column j is the pair (q[2r][j], q[2r + 1][j]). Each integer
// goes through float32 exactly; a small integer's float32 has 16 zero low bits, so a pair is one
// shift and one or.
inline void widen_int8(const uint8_t* src, uint16_t* dst) {
  for (int r = 0; r < 16; ++r) {
    const __m512i even = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * r * block_cols(8))))));
    const __m512i odd = _mm512_castps_si512(_mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + (2 * r + 1) * block_cols(8))))));
    _mm512_storeu_si512(dst + r * 32, _mm512_or_si512(odd, _mm512_srli_epi32(even, 16)));
  }
}

// The bfloat16 bits of each nibble's integer (q - 8 or q) in the 16 low words.
inline __m512i nibble_table(bool minus8) {
  alignas(64) uint16_t words[32] = {};
  for (int i = 0; i < 16; ++i) {
    const float value = kvserve::nibble_value(i, minus8, kvserve::kIntegers);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    words[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers
  }
  return _mm512_load_si512(words);
}

// The same for int4 (16 rows, 64 bytes apart, of 16 bytes: byte j of row r holds q[2r][j]
// in its low nibble and q[2r + 1][j] in its high one): each byte's nibbles spread to the two words
// of a 32-bit lane, then one table lookup per 32 weights.
inline void widen_int4(const uint8_t* src, uint16_t* dst, __m512i table) {
  const __m512i low = _mm512_set1_epi32(15);
  for (int r = 0; r < 16; ++r) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * block_cols(4))));
    const __m512i high = _mm512_slli_epi32(_mm512_srli_epi32(b, 4), 16);
    const __m512i words = _mm512_ternarylogic_epi32(b, high, low, 0xEC);  // (b & low) | high
    _mm512_storeu_si512(dst + r * 32, _mm512_permutexvar_epi16(words, table));
  }
}

// MXFP4: the same 16 rows, each nibble's E2M1 value (values: float32, doubled) times its
// column's scale (lane j: column j, a power of two halved) in float32, exact, then its top 16
// bits (exact too: the product has two significant bits).
inline void widen_e2m1(const uint8_t* src, uint16_t* dst, __m512 values, __m512 scale) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int r = 0; r < 16; ++r) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * block_cols(4))));
    const __m512i even = _mm512_castps_si512(_mm512_mul_ps(_mm512_permutexvar_ps(b, values), scale));
    const __m512i odd = _mm512_castps_si512(_mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), values),
                                                          scale));
    _mm512_storeu_si512(dst + r * 32, _mm512_ternarylogic_epi32(odd, high_half, _mm512_srli_epi32(even, 16), 0xEA));
  }
}

// MXFP4 in fewer instructions (six per 32 weights against widen_e2m1's nine): a weight is a
// doubled E2M1 value D (0 .. 12, exponent 0 .. 3) times its column's stored scale S = 2^s, whose
// product has two significant bits, so its bfloat16 bits are D's with s added to the exponent
// field. The table holds the bits of D * 2^kE2M1Bias for each nibble (zero for the codes of 0 and
// -0: +0 and -0 weights give the same sums, which start at +0), and a saturating subtraction of
// d = (kE2M1Bias - s) << 7 per column moves every nonzero one to D * 2^s and leaves zeros at zero.
// Exact, and the same bits as widen_e2m1, when every result is a normal number: 1 <= s + 127 <= 251
// (the stored scale's exponent field; checked per chunk, widen_e2m1 otherwise).
constexpr int kE2M1Bias = 124;  // D * 2^124 <= 1.5 * 2^127: a normal float32

// The table, indexed by the low 5 bits of a word (the 5th ignored: entries 16-31 repeat 0-15).
inline __m512i e2m1_biased_table() {
  alignas(64) uint16_t words[32];
  for (int i = 0; i < 32; ++i) {
    const float value = std::ldexp(kvserve::kE2M1Doubled[i % 16], kE2M1Bias);
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof(bits));
    words[i] = i % 8 == 0 ? 0 : static_cast<uint16_t>(bits >> 16);  // exact: two significant bits
  }
  return _mm512_load_si512(words);
}

// d per column (both words of its 32-bit lane) from the 16 stored scales, and whether all of them
// are in the exact range.
inline bool e2m1_exponent_steps(__m512 scale, __m512i& steps) {
  const __m512i field = _mm512_srli_epi32(_mm512_castps_si512(scale), 23);
  const __mmask16 in_range = _mm512_cmple_epu32_mask(_mm512_sub_epi32(field, _mm512_set1_epi32(1)),
                                                     _mm512_set1_epi32(250));
  const __m512i d = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(251), field), 7);
  steps = _mm512_or_si512(d, _mm512_slli_epi32(d, 16));
  return in_range == 0xFFFF;
}

// The 16 rows of widen_e2m1 through the table: a byte b's low nibble indexes the low word of its
// lane (b | b << 12 keeps b's low 5 bits there) and its high nibble the high word.
inline void widen_e2m1_biased(const uint8_t* src, uint16_t* dst, __m512i table, __m512i steps) {
  for (int r = 0; r < 16; ++r) {
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + r * block_cols(4))));
    const __m512i words = _mm512_or_si512(b, _mm512_slli_epi32(b, 12));
    _mm512_storeu_si512(dst + r * 32, _mm512_subs_epu16(_mm512_permutexvar_epi16(words, table), steps));
  }
}

// Chunk c of panel p widened into dst: integers as they are, or (kScaled) E2M1 values times their
// scale (table: e2m1_biased_table's).
template <int kBits, bool kScaled>
inline void widen_chunk(const Layer& L, int64_t p, int64_t c, uint16_t* dst, __m512i table, __m512 values) {
  if constexpr (kScaled) {
    const __m512 scale = _mm512_loadu_ps(L.scales + L.param<kBits>(p, c / L.chunks_per_group));
    __m512i steps;
    if (e2m1_exponent_steps(scale, steps)) widen_e2m1_biased(L.chunk<kBits>(p, c), dst, table, steps);
    else widen_e2m1(L.chunk<kBits>(p, c), dst, values, scale);
  } else if constexpr (kBits == 8) {
    widen_int8(L.chunk<kBits>(p, c), dst);
  } else {
    widen_int4(L.chunk<kBits>(p, c), dst, table);
  }
}

}  // namespace kvserve_amx_quant

KVSERVE_AMX_QUANT_END

#endif  // KVSERVE_AMX_BUILD
