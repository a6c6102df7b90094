// The AMX quantized linear's one-row path (amx_quant_linear.cpp): the tiles' sequence on vector
// FMAs, for a lone row (decode at batch 1), where widening whole tiles for one row costs more than
// the tiles save. TDPBF16PS, measured on Sapphire Rapids (tests/model/test_amx_quant_linear.py
// checks the claim), computes each element of a 32-input chunk as two fma chains from zero, one
// over the even inputs and one over the odd ones, in increasing k, adds them, and adds that to the
// tile's value:
//     e = fma(x[k0+30], w[k0+30], ... fma(x[k0], w[k0], 0)),  o = the same over k0+1, ..., k0+31
//     c = c + (e + o)
// with input denormals treated as zero and denormal results flushed (DAZ, FTZ: FlushDenormals,
// for the whole kernel on both paths). The same operations give the same bits: a row's result does
// not depend on which path ran.
//
// Here: the kernel over up to four panels at once (kRowPanels), each chunk's two chains per panel,
// and for MXFP4 the exponent range within which a chunk's scale may multiply its chains' sum
// instead of each weight (ScaleFields).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "amx_quant.h"
#include "amx_tiles.h"
#include "thread_pool.h"

#if defined(KVSERVE_AMX_BUILD)

KVSERVE_AMX_QUANT_BEGIN

namespace kvserve_amx_quant {
namespace {

#include "bf16_convert.h"

constexpr int kRowPanels = 4;  // panels per pass of the one-row kernel

// Packed weight bytes prefetched ahead of the one-row kernel's reads, into L2, per stream: int8
// four chunks of its panel, int4 64 rows of its block (the best of 1-16 KB, measured).
constexpr int64_t ahead(int64_t bits) { return bits == 8 ? 2048 : 4096; }

template <int kBits>
inline void prefetch_line(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + ahead(kBits), _MM_HINT_T2); }

// A panel's 16 weights of inputs 2r (even) and 2r + 1 (odd) as float32, from its 16 bytes of
// packed row 2r and 2r + 1 (int8) or of row r (int4).
template <int kBits>
inline void pair_weights(const uint8_t* row, __m512 table, __m512& even, __m512& odd) {
  if constexpr (kBits == 8) {
    even = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row))));
    odd = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + block_cols(8)))));
  } else {
    // vpermps reads the low 4 bits of each lane: the low nibble needs no mask.
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
    even = _mm512_permutexvar_ps(b, table);
    odd = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
  }
}

// The two chains of chunk ch for np panels (their packed rows at base[j]): e over the even inputs,
// o over the odd ones, each weight first multiplied by its column's scale when kMul (MXFP4).
template <int kBits, int np, bool kMul>
inline void chunk_chains(const uint8_t* const* base, const float* x, int64_t ch, __m512 table4, const __m512* scale,
                         __m512* e, __m512* o) {
  // Bytes between input pairs: int8 two rows, int4 one.
  constexpr int64_t pair_bytes = kBits == 8 ? 2 * block_cols(8) : block_cols(4);
  for (int j = 0; j < np; ++j) e[j] = o[j] = _mm512_setzero_ps();
  if constexpr (kBits == 8) {  // a stream per panel: its chunk's 512 bytes
    for (int j = 0; j < np; ++j)
      for (int line = 0; line < 8; ++line) prefetch_line<8>(base[j] + line * 64);
  }
  for (int r = 0; r < 16; ++r) {
    if constexpr (kBits == 4) prefetch_line<4>(base[0] + r * pair_bytes);  // one stream per four panels
    const __m512 xe = _mm512_set1_ps(x[ch * 32 + 2 * r]), xo = _mm512_set1_ps(x[ch * 32 + 2 * r + 1]);
#pragma GCC unroll 4
    for (int j = 0; j < np; ++j) {
      __m512 we, wo;
      pair_weights<kBits>(base[j] + r * pair_bytes, table4, we, wo);
      if constexpr (kMul) {
        we = _mm512_mul_ps(we, scale[j]);
        wo = _mm512_mul_ps(wo, scale[j]);
      }
      e[j] = _mm512_fmadd_ps(xe, we, e[j]);
      o[j] = _mm512_fmadd_ps(xo, wo, o[j]);
    }
  }
}

// The exponent fields (of the float32 scales the one-row kernel multiplies: MXFP4's power of two,
// halved) for which a chunk's scale may multiply its two chains' sum instead of each weight, with
// the same bits: for a scale 2^k, s * round(a) = round(s * a) for every partial value a of the
// chains when neither it nor s * a is below the normal range or overflows. x is a bfloat16 row
// (read as float32), so each x is a multiple of 2^(E_lo - 7) (E_lo: the smallest exponent of its
// nonzero normal values; denormal ones read as zero on both ways) and each weight an integer of at
// most 12: every partial value is zero or at least that quantum, and below 32 x 12 x 2^(E_hi + 1)
// < 2^(E_hi + 10) (E_hi: the largest exponent, 128 for infinities and NaN). Hence, with f = k + 127:
//   unscaled chains normal and finite:  E_lo - 7 >= -126 and E_hi + 10 <= 125
//   scaled:                             f >= 8 - E_lo and f <= 242 - E_hi
//   weights times the scale normal, as the tiles read them (DAZ):  1 <= f <= 250
// An empty range (lo > hi) where the row allows none.
struct ScaleFields {
  int lo, hi;
};

inline ScaleFields exact_scale_fields(const float* x, int64_t K) {
  int e_lo = 127, e_hi = -127;
  for (int64_t k = 0; k < K; ++k) {
    uint32_t bits;
    std::memcpy(&bits, &x[k], sizeof(bits));
    const int field = static_cast<int>((bits >> 23) & 0xFF);
    if (field == 0) continue;  // zero, or denormal (read as zero)
    e_lo = std::min(e_lo, field - 127);
    e_hi = std::max(e_hi, field - 127);
  }
  if (e_lo - 7 < -126 || e_hi + 10 > 125) return {1, 0};
  return {std::max(1, 8 - e_lo), std::min(250, 242 - e_hi)};
}

template <int kBits, int np, bool kScaled>
void row_kernel(const Layer& L, const float* x, int64_t p0, uint16_t* out, ScaleFields fields) {
  alignas(64) float values[16] = {};
  for (int i = 0; i < 16 && kBits == 4; ++i) values[i] = kvserve::nibble_value(i, L.minus8, L.codebook);
  const __m512 table4 = _mm512_load_ps(values);
  const __m512i field_lo = _mm512_set1_epi32(fields.lo), field_hi = _mm512_set1_epi32(fields.hi);
  __m512 acc[np], c[np];
  for (int64_t g = 0; g < L.groups; ++g) {
    __m512 scale[np];
    bool after = kScaled;  // scaled: the scale multiplies the chains' sum (ScaleFields), else each weight
    for (int j = 0; j < np; ++j) {
      if (!kScaled || g == 0) c[j] = _mm512_setzero_ps();  // scaled weights: one sum over the whole K
      if constexpr (kScaled) {
        scale[j] = _mm512_loadu_ps(L.scales + L.param<kBits>(p0 + j, g));
        const __m512i field = _mm512_srli_epi32(_mm512_castps_si512(scale[j]), 23);  // scales are positive
        after = after && _mm512_cmpge_epi32_mask(field, field_lo) == 0xFFFF &&
                _mm512_cmple_epi32_mask(field, field_hi) == 0xFFFF;
      }
    }
    const int64_t c1 = std::min(L.chunks, (g + 1) * L.chunks_per_group);
    for (int64_t ch = g * L.chunks_per_group; ch < c1; ++ch) {
      __m512 e[np], o[np];
      const uint8_t* base[np];
      for (int j = 0; j < np; ++j) base[j] = L.chunk<kBits>(p0 + j, ch);
      if (after) {
        chunk_chains<kBits, np, false>(base, x, ch, table4, scale, e, o);
        for (int j = 0; j < np; ++j)
          c[j] = _mm512_add_ps(c[j], _mm512_mul_ps(_mm512_add_ps(e[j], o[j]), scale[j]));
      } else {
        chunk_chains<kBits, np, kScaled>(base, x, ch, table4, scale, e, o);
        for (int j = 0; j < np; ++j) c[j] = _mm512_add_ps(c[j], _mm512_add_ps(e[j], o[j]));
      }
    }
    for (int j = 0; j < np && !kScaled; ++j) {
      const int64_t at = L.param<kBits>(p0 + j, g);
      __m512 v = _mm512_fmadd_ps(c[j], _mm512_loadu_ps(L.scales + at), g == 0 ? _mm512_setzero_ps() : acc[j]);
      if (L.neg_offsets != nullptr) v = _mm512_fmadd_ps(_mm512_loadu_ps(L.neg_offsets + at), _mm512_set1_ps(L.xsum[g]), v);
      acc[j] = v;
    }
  }
  for (int j = 0; j < np; ++j) {
    const int64_t col0 = (p0 + j) * kTileN, cj = std::min<int64_t>(kTileN, L.N - col0);
    const __mmask16 valid = static_cast<__mmask16>((1u << cj) - 1);
    __m512 v = kScaled ? c[j] : acc[j];
    if (L.bias != nullptr) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(valid, L.bias + col0));
    _mm256_mask_storeu_epi16(out + col0, valid, round_to_bf16(v));
  }
}

template <int kBits, bool kScaled>
void run_row_kernel(const kvserve::BFloat16* x, uint16_t* out, const Layer& L) {
  const int64_t panels = (L.N + kTileN - 1) / kTileN;
  std::vector<float> row(static_cast<size_t>(L.chunks * kTileK), 0.f);  // as float32, zero-padded to whole chunks
  for (int64_t k = 0; k < L.K; ++k) row[k] = to_float(x[k]);
  const ScaleFields fields = kScaled ? exact_scale_fields(row.data(), L.K) : ScaleFields{1, 0};
  const int64_t items = (panels + kRowPanels - 1) / kRowPanels;
  kvserve::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t p0 = item * kRowPanels;
      if (panels - p0 >= kRowPanels) {
        row_kernel<kBits, kRowPanels, kScaled>(L, row.data(), p0, out, fields);
      } else {
        for (int64_t p = p0; p < panels; ++p) row_kernel<kBits, 1, kScaled>(L, row.data(), p, out, fields);
      }
    }
  });
}

}  // namespace

void run_row(const kvserve::BFloat16* x, uint16_t* out, const Layer& L, int64_t bits, bool scaled) {
  if (bits == 8) run_row_kernel<8, false>(x, out, L);
  else if (scaled) run_row_kernel<4, true>(x, out, L);
  else run_row_kernel<4, false>(x, out, L);
}

}  // namespace kvserve_amx_quant

KVSERVE_AMX_QUANT_END

#endif  // KVSERVE_AMX_BUILD
