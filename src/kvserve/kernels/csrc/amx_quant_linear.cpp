// Batch-invariant linear y = x W^T + b over weight-only int8/int4 weights on AMX tiles, for
// bfloat16 activations on hosts that have them (quant_linear.cpp's vector kernel everywhere else,
// and for float32 activations).
//
// The weight's integers (int8 q; int4 q - 8 when symmetric, q with offsets) are exact in bfloat16,
// so a chunk of them is widened to a bfloat16 B tile in L1 and multiplied on the tiles like
// amx_linear.cpp's weights; each group's scale (and offset) enters once per group, as in
// quant_linear.cpp's sequence (its header), with the group's partial sum p made by the tiles:
//
//     acc = 0
//     for each group g (G inputs, a multiple of 32, or all of K):
//         p = tile sums of x[m][k] * v[n][k] over the group's 32-input chunks, in increasing k
//         acc = fma(p, s[n][g], acc)
//         with offsets:  acc = fma(-m[n][g], xsum[m][g], acc)   xsum = ((x_k0 + x_k1) + ...) in k order
//     y[m][n] = round(acc + b[n])        (float32, then once to bfloat16)
//
// all with denormal inputs read as zero and denormal results flushed (DAZ, FTZ), as the tiles do.
//
// MXFP4 (the E2M1 codebook) has power-of-two scales, so a weight times its scale is exact in
// float32 (and in bfloat16: two significant bits): each chunk's weights enter the tiles already
// scaled, w = fl32(v[n][k] * s[n][g]), and the tiles accumulate the whole K with no per-group merge:
//
//     y[m][n] = round(tile sums of x[m][k] * w[n][k] over all chunks + b[n])
//
// (the merge per 32-input group cost more than the tile products at 4-64 rows).
// p depends only on row m of x, column n of the weight and the chunk order (amx_linear.cpp's
// argument), so every element is one fixed sequence whatever the number of rows, the row's place
// among them and the thread count. A lone row (decode at batch 1) runs the same operations on
// vector FMAs instead (row_kernel, below: the tiles' arithmetic is two fma chains per chunk), since
// widening whole tiles for one row costs more than the tiles save, and where the row and a chunk's
// MXFP4 scales keep every partial value normal and finite it multiplies the chunk's two chains
// by the power-of-two scale instead of each weight (ScaleFields: the same bits, two fewer
// instructions per 32 weights); the layer takes this path for every M once it has it
// (kvserve.model.quant_linear). Its bits differ in the last place from
// quant_linear.cpp's single fma chain per group, as amx_linear's differ from linear.cpp's.
//
// Layout (kvserve.model.quant_linear.pack_quantized_amx): blocks of output columns, N and K padded
// with zeros to a block and to 32; int8 [N/16][K][16] (a row: input k of one panel's 16 columns),
// int4 [N/64][K/2][64] (a row: input 2r of four panels in the low nibbles, 2r + 1 in the high
// ones). Widening turns a panel's 32-input chunk (16 bytes of each of 32 or 16 rows) into the B
// tile's pair-interleaved form; the one-row kernel reads the rows as they are. scales float32
// [blocks][K/G][block columns]; negated offsets the same (int4 with offsets only).
//
// Work: items of up to 64 rows x four (up to 16 rows) or two 16-column panels, split between
// threads (never K). Each chunk is widened one chunk ahead of its tile loads into 1-4 KB of L1
// (micro_kernel) and used by all the item's rows: up to 16 rows take four panels at once and up
// to 32 two (4 C tiles of 16 x 16), up to 64 one panel at a time.
#include <cmath>
#include <cstring>

#include "abi.h"
#include "kernels.h"
#include "amx_tiles.h"
#include "thread_pool.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace {

using namespace kvserve_amx;

#include "bf16_convert.h"

constexpr int64_t kChunkWeights = kTileK * kTileN;  // 512 weights per chunk

// Output columns per block of the packed layout: int8 rows are one panel wide (16 bytes per
// input), int4 rows four panels (one 64-byte line per input pair), which is what the one-row
// kernel reads fastest from memory (measured: int8 in 64-column blocks was 5% slower per step,
// int4 in 16-column panels 15% slower).
constexpr int64_t block_cols(int64_t bits) { return bits == 8 ? kTileN : 4 * kTileN; }
constexpr int kRowPanels = 4;  // panels per pass of the one-row kernel

// Packed rows per 32-input chunk: one per input (int8) or per input pair (int4).
constexpr int64_t chunk_rows(int64_t bits) { return bits == 8 ? kTileK : kTileK / 2; }

#if defined(KVSERVE_AMX_BUILD)

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16")

// Packed weight bytes prefetched ahead of the one-row kernel's reads, into L2, per stream: int8
// four chunks of its panel, int4 64 rows of its block (the best of 1-16 KB, measured).
constexpr int64_t ahead(int64_t bits) { return bits == 8 ? 2048 : 4096; }

template <int kBits>
inline void prefetch_line(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p) + ahead(kBits), _MM_HINT_T2); }

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

struct Layer {
  const uint8_t* packed;
  const float* scales;
  const float* neg_offsets;  // nullptr: none
  const float* bias;         // nullptr: none
  const float* xsum;         // [M][groups] with offsets, else nullptr
  int64_t M, K, N, chunks, groups, chunks_per_group;
  bool minus8;               // int4 symmetric: q - 8
  int64_t codebook;          // kvserve::Codebook (bits 4)

  // Panel p's first packed byte of chunk c (rows block_cols bytes apart), and the index of its
  // scales (and offsets) of group g (16 floats).
  template <int kBits>
  const uint8_t* chunk(int64_t p, int64_t c) const {
    constexpr int64_t bc = block_cols(kBits), bp = bc / kTileN;
    return packed + ((p / bp * chunks + c) * chunk_rows(kBits)) * bc + p % bp * kTileN;
  }
  template <int kBits>
  int64_t param(int64_t p, int64_t g) const {
    constexpr int64_t bc = block_cols(kBits), bp = bc / kTileN;
    return (p / bp * groups + g) * bc + p % bp * kTileN;
  }
};

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

// Tile register t of a run-time index (the intrinsics take constants).
inline void store_c_tile(int t, float* tile) {
  if (t == 0) _tile_stored(0, tile, 64);
  else if (t == 1) _tile_stored(1, tile, 64);
  else if (t == 2) _tile_stored(2, tile, 64);
  else _tile_stored(3, tile, 64);
}

// rt A tiles (16 rows each: a[i], row stride lda[i] bytes) x pt panels (p, p + 1, ...) of the
// layer, rt * pt <= 4 C tiles: each chunk is widened into `buf` (two halves of pt x 512 bfloat16,
// in L1) and used by every row; every group's tile sums are merged into acc, then stored with the
// bias through `out` (the first row's row, column 16p). A tiles beyond two reuse registers 4-5;
// one A tile with four panels takes B tiles in 6, 7, 5, 6 (four accumulation chains in flight
// instead of two; with the cheaper MXFP4 widening, 1.1-1.5x on a batch-64 GPT-OSS step,
// docs/benchmarks.md section 6.2).
//
// Chunk c + 1 is widened into the other half, panel by panel between chunk c's tile products: a
// tile load reads only stores that have left the store buffer, which they do in program order
// after the instructions before them retire, so a chunk widened just before its own tile load
// waited for the previous chunk's products, and widening and tiles never overlapped (measured at
// 8 rows: their times added up; ahead, an expert's gate-up at 8 rows took 0.75-1.02 ms instead of
// 1.09-1.24, docs/benchmarks.md section 6.2).
template <int rt, int pt, int kBits, bool kScaled>
void micro_kernel(const Layer& L, __m512i table, __m512 values, int64_t p, int64_t row0, const uint8_t* const* a,
                  const int64_t* lda, uint16_t* buf, uint16_t* out, int64_t rows, int64_t cols) {
  static_assert(rt * pt <= 4 && (pt < 4 || rt == 1), "four C tiles");
  alignas(64) float acc[rt * kTileRows][pt * kTileN];
  alignas(64) float tile[kTileRows * kTileN];
  for (int j = 0; j < pt; ++j) widen_chunk<kBits, kScaled>(L, p + j, 0, buf + j * kChunkWeights, table, values);
  for (int64_t g = 0; g < L.groups; ++g) {
    if (!kScaled || g == 0) {  // scaled weights: the tiles sum the whole K
      _tile_zero(0);
      if constexpr (rt * pt > 1) _tile_zero(1);
      if constexpr (rt * pt > 2) _tile_zero(2);
      if constexpr (rt * pt > 3) _tile_zero(3);
    }
    const int64_t c1 = std::min(L.chunks, (g + 1) * L.chunks_per_group);
    for (int64_t c = g * L.chunks_per_group; c < c1; ++c) {
      const bool ahead = c + 1 < L.chunks;
      const uint16_t* b = buf + (c & 1) * pt * kChunkWeights;
      uint16_t* next = buf + ((c + 1) & 1) * pt * kChunkWeights;
      _tile_loadd(6, b, 64);
      if constexpr (pt >= 2) _tile_loadd(7, b + kChunkWeights, 64);
      _tile_loadd(4, a[0] + c * 64, lda[0]);
      _tile_dpbf16ps(0, 4, 6);
      if (ahead) widen_chunk<kBits, kScaled>(L, p, c + 1, next, table, values);
      if constexpr (pt >= 2) {
        _tile_dpbf16ps(1, 4, 7);
        if (ahead) widen_chunk<kBits, kScaled>(L, p + 1, c + 1, next + kChunkWeights, table, values);
      }
      if constexpr (pt == 4) {
        _tile_loadd(5, b + 2 * kChunkWeights, 64);
        _tile_dpbf16ps(2, 4, 5);
        if (ahead) widen_chunk<kBits, kScaled>(L, p + 2, c + 1, next + 2 * kChunkWeights, table, values);
        _tile_loadd(6, b + 3 * kChunkWeights, 64);
        _tile_dpbf16ps(3, 4, 6);
        if (ahead) widen_chunk<kBits, kScaled>(L, p + 3, c + 1, next + 3 * kChunkWeights, table, values);
      }
      if constexpr (rt >= 2) {
        _tile_loadd(5, a[1] + c * 64, lda[1]);
        if constexpr (pt == 2) {
          _tile_dpbf16ps(2, 5, 6);
          _tile_dpbf16ps(3, 5, 7);
        } else {
          _tile_dpbf16ps(1, 5, 6);
        }
      }
      if constexpr (rt >= 3) {
        _tile_loadd(4, a[2] + c * 64, lda[2]);
        _tile_dpbf16ps(2, 4, 6);
      }
      if constexpr (rt >= 4) {
        _tile_loadd(5, a[3] + c * 64, lda[3]);
        _tile_dpbf16ps(3, 5, 6);
      }
    }
    // acc = fma(p, s, acc) (from zero at the first group), then the offset term; scaled: acc =
    // the tiles, once they hold the whole K.
    if (kScaled && g + 1 < L.groups) continue;
    for (int i = 0; i < rt; ++i) {
      const int64_t r_end = std::min<int64_t>(kTileRows, rows - i * kTileRows);
      for (int j = 0; j < pt; ++j) {
        store_c_tile(i * pt + j, tile);
        const int64_t at = L.param<kBits>(p + j, g);
        const __m512 s = _mm512_loadu_ps(L.scales + at);
        const __m512 m = L.neg_offsets != nullptr ? _mm512_loadu_ps(L.neg_offsets + at) : _mm512_setzero_ps();
        for (int64_t r = 0; r < r_end; ++r) {
          const int64_t row = i * kTileRows + r;
          float* dst = &acc[row][j * kTileN];
          if constexpr (kScaled) {
            _mm512_store_ps(dst, _mm512_load_ps(tile + r * kTileN));
            continue;
          }
          __m512 v = _mm512_fmadd_ps(_mm512_load_ps(tile + r * kTileN), s,
                                     g == 0 ? _mm512_setzero_ps() : _mm512_load_ps(dst));
          if (L.neg_offsets != nullptr)
            v = _mm512_fmadd_ps(m, _mm512_set1_ps(L.xsum[(row0 + row) * L.groups + g]), v);
          _mm512_store_ps(dst, v);
        }
      }
    }
  }
  for (int i = 0; i < rt; ++i) {
    const int64_t r_end = std::min<int64_t>(kTileRows, rows - i * kTileRows);
    for (int j = 0; j < pt; ++j) {
      const int64_t cj = std::min<int64_t>(kTileN, cols - j * kTileN);
      if (cj <= 0) break;
      const __mmask16 valid = static_cast<__mmask16>((1u << cj) - 1);
      const __m512 b = L.bias != nullptr ? _mm512_maskz_loadu_ps(valid, L.bias + (p + j) * kTileN) : _mm512_setzero_ps();
      for (int64_t r = 0; r < r_end; ++r) {
        const int64_t row = i * kTileRows + r;
        __m512 v = _mm512_load_ps(&acc[row][j * kTileN]);
        if (L.bias != nullptr) v = _mm512_add_ps(v, b);
        _mm256_mask_storeu_epi16(out + row * L.N + j * kTileN, valid, round_to_bf16(v));
      }
    }
  }
}

// Rows [row0, row0 + rows) (at most 64) x the pt panels at p (up to four when rows <= 16, else two):
// up to 16 rows take four panels at once, up to 32 two; more take one panel at a time with up to
// four A tiles, so that each chunk is widened once for all 64 rows.
template <int kBits, bool kScaled>
void row_group(const Layer& L, __m512i table, __m512 values, const ActivationTiles& tiles, int64_t p, int64_t pt,
               int64_t row0, int64_t rows, uint16_t* buf, uint16_t* out, int64_t cols) {
  const uint8_t* a[4];
  int64_t lda[4];
  const int64_t rt = (rows + kTileRows - 1) / kTileRows;
  for (int64_t i = 0; i < rt; ++i) {
    a[i] = tiles.group((row0 + i * kTileRows) / (2 * kTileRows), &lda[i]);
    if (i % 2 == 1) a[i] += kTileRows * lda[i];
  }
  if (rt == 1 && pt == 4) {
    micro_kernel<1, 4, kBits, kScaled>(L, table, values, p, row0, a, lda, buf, out, rows, cols);
    return;
  }
  if (rt <= 2 && pt == 2) {
    if (rt == 2) micro_kernel<2, 2, kBits, kScaled>(L, table, values, p, row0, a, lda, buf, out, rows, cols);
    else micro_kernel<1, 2, kBits, kScaled>(L, table, values, p, row0, a, lda, buf, out, rows, cols);
    return;
  }
  for (int64_t j = 0; j < pt; ++j) {
    const int64_t cj = std::min<int64_t>(kTileN, cols - j * kTileN);
    uint16_t* o = out + j * kTileN;
    if (rt == 1) micro_kernel<1, 1, kBits, kScaled>(L, table, values, p + j, row0, a, lda, buf, o, rows, cj);
    else if (rt == 2) micro_kernel<2, 1, kBits, kScaled>(L, table, values, p + j, row0, a, lda, buf, o, rows, cj);
    else if (rt == 3) micro_kernel<3, 1, kBits, kScaled>(L, table, values, p + j, row0, a, lda, buf, o, rows, cj);
    else micro_kernel<4, 1, kBits, kScaled>(L, table, values, p + j, row0, a, lda, buf, o, rows, cj);
  }
}

// Denormal inputs treated as zero and denormal results flushed (MXCSR DAZ and FTZ) while it
// lives, in this thread: the tiles do so, and the vector code around them (group merges, input
// sums, bias) does the same, so that the one-row kernel's vector FMAs give the tiles' bits.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// The tiles' sequence on vector FMAs, for a lone row (decode at batch 1), where widening whole
// tiles for one row costs more than the tiles save. TDPBF16PS, measured on Sapphire Rapids
// (tests/model/test_amx_quant_linear.py checks the claim), computes each element of a 32-input
// chunk as two fma chains from zero, one over the even inputs and one over the odd ones, in
// increasing k, adds them, and adds that to the tile's value:
//     e = fma(x[k0+30], w[k0+30], ... fma(x[k0], w[k0], 0)),  o = the same over k0+1, ..., k0+31
//     c = c + (e + o)
// with input denormals treated as zero and denormal results flushed (DAZ, FTZ: FlushDenormals,
// for the whole kernel on both paths). The same operations give the same bits: a row's result does
// not depend on which path ran.
//
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
void run_row(const kvserve::BFloat16* x, uint16_t* out, const Layer& L) {
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

template <int kBits, bool kScaled>
void run(const uint16_t* x, uint16_t* out, const Layer& L) {
  constexpr int64_t kGroupRows = 4 * kTileRows;
  const int64_t M = L.M, N = L.N;
  const int64_t panels = (N + kTileN - 1) / kTileN;
  const int64_t width = M <= kTileRows ? 4 : 2;  // panels per item (row_group)
  const int64_t spans = (panels + width - 1) / width;
  const int64_t row_groups = (M + kGroupRows - 1) / kGroupRows;
  const int64_t threads = std::max<int64_t>(1, kvserve::num_threads());
  const int64_t items = row_groups * spans;
  const int64_t grain = std::max<int64_t>(1, items / (threads * 4));
  const ActivationTiles tiles(x, M, L.K);
  const __m512i table = kScaled ? e2m1_biased_table() : nibble_table(L.minus8);
  const __m512 values = _mm512_load_ps(kvserve::kE2M1Doubled);
  kvserve::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    const FlushDenormals flush;
    configure_tiles(M, width == 4 ? 5 : 6);  // four panels: tile 5 holds a B tile
    alignas(64) uint16_t buf[2 * 4 * kChunkWeights];  // two chunks of up to four panels
    for (int64_t item = begin; item < end; ++item) {
      const int64_t span = item % spans, g = item / spans;
      const int64_t p = span * width, pt = std::min<int64_t>(width, panels - p);
      const int64_t col0 = p * kTileN, cols = std::min<int64_t>(pt * kTileN, N - col0);
      const int64_t row0 = g * kGroupRows, rows = std::min(kGroupRows, M - row0);
      row_group<kBits, kScaled>(L, table, values, tiles, p, pt, row0, rows, buf, out + row0 * N + col0, cols);
    }
    _tile_release();
  });
}

#pragma GCC pop_options

#endif  // KVSERVE_AMX_BUILD

}  // namespace

namespace kvserve {

// x: contiguous [M, K] bfloat16; w.packed: uint8 [N/16, K', 16] (int8) or [N/64, K'/2, 64] (int4),
// K' = K rounded up to 32; w.scales (and neg_offsets, int4 only): float32 [blocks, K / group_size,
// block columns]; bias float32 [N] or nullptr; group_size: K, or a multiple of 32 that divides K;
// bits 8 or 4 (int4 without offsets is symmetric: q - 8) -> out [M, N] bfloat16.
void amx_quant_linear(const BFloat16* x, BFloat16* out, int64_t M, int64_t K, const QuantWeight& w) {
  check(amx_linear_available(), "amx_quant_linear: no AMX-BF16 tiles on this CPU / process");
  check(w.codebook == kIntegers || (w.codebook == kE2M1 && w.bits == 4 && w.neg_offsets == nullptr),
        "amx_quant_linear: the E2M1 codebook is for 4-bit weights without offsets");
#if defined(KVSERVE_AMX_BUILD)
  const int64_t N = w.N, group_size = w.group_size;
  if (M == 0 || N == 0) return;
  const int64_t chunks = (K + kTileK - 1) / kTileK, groups = K / group_size;
  const bool has_offsets = w.neg_offsets != nullptr;
  // Each row's input sum per group, a plain float32 sum in increasing k (offsets only).
  const FlushDenormals flush;
  std::vector<float> xsum(has_offsets ? M * groups : 0);
  for (int64_t r = 0; r < M && has_offsets; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.f;
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) s += to_float(x[r * K + k]);
      xsum[r * groups + g] = s;
    }
  }
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
  const Layer layer{w.packed, w.scales, w.neg_offsets, w.bias, has_offsets ? xsum.data() : nullptr, M, K, N, chunks,
                    groups, group_size == K ? chunks : group_size / kTileK, !has_offsets, w.codebook};
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  const bool scaled = w.codebook == kE2M1;  // power-of-two scales, folded into the weights
  if (M == 1 && w.bits == 8) run_row<8, false>(x, o, layer);
  else if (M == 1 && scaled) run_row<4, true>(x, o, layer);
  else if (M == 1) run_row<4, false>(x, o, layer);
  else if (w.bits == 8) run<8, false>(xs, o, layer);
  else if (scaled) run<4, true>(xs, o, layer);
  else run<4, false>(xs, o, layer);
#endif
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_amx_quant_linear(const void* x, void* out, int64_t M, int64_t K,
                                                       const uint8_t* packed, const float* scales,
                                                       const float* neg_offsets, const float* bias, int64_t N,
                                                       int64_t group_size, int64_t bits, int64_t codebook) {
  using kvserve::BFloat16;
  return kvserve::guarded([&] {
    kvserve::amx_quant_linear(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), M, K,
                              kvserve::QuantWeight{packed, scales, neg_offsets, bias, N, group_size, bits, codebook});
  });
}

#pragma GCC pop_options
