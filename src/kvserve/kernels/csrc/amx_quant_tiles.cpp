// The AMX quantized linear's tile kernel (amx_quant_linear.cpp has the sequence and the layout):
// rows of bfloat16 activations as A tiles, each 32-input chunk of weights widened once to a B tile
// (amx_quant_widen.h) and used by every row of a work item; per group the tiles' sums merged into
// a float32 accumulator with the group's scale (and offset), then the bias and the store.
//
// Work: items of up to 64 rows x four (up to 16 rows) or two 16-column panels, split between
// threads (never K). Each chunk is widened one chunk ahead of its tile loads into 1-4 KB of L1
// (micro_kernel) and used by all the item's rows: up to 16 rows take four panels at once and up
// to 32 two (4 C tiles of 16 x 16), up to 64 one panel at a time.
#include <algorithm>
#include <cstdint>

#include "amx_quant.h"
#include "amx_quant_widen.h"
#include "amx_tiles.h"
#include "thread_pool.h"

#if defined(KVSERVE_AMX_BUILD)

KVSERVE_AMX_QUANT_BEGIN

namespace kvserve_amx_quant {
namespace {

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

template <int kBits, bool kScaled>
void run_tile_kernel(const uint16_t* x, uint16_t* out, const Layer& L) {
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

}  // namespace

void run_tiles(const uint16_t* x, uint16_t* out, const Layer& L, int64_t bits, bool scaled) {
  if (bits == 8) run_tile_kernel<8, false>(x, out, L);
  else if (scaled) run_tile_kernel<4, true>(x, out, L);
  else run_tile_kernel<4, false>(x, out, L);
}

}  // namespace kvserve_amx_quant

KVSERVE_AMX_QUANT_END

#endif  // KVSERVE_AMX_BUILD
