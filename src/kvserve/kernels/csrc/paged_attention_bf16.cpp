// The bfloat16 paged-attention kernel on AVX512-BF16 (head_dim % 32 == 0; avx512_bf16 builds):
// q.K with vdpbf16ps on the raw bf16 values (products exact, float32 accumulation) against K
// transposed per 16-position group, so one instruction scores 16 positions for a pair of
// dimensions; P rounded to bf16 for the P.V product (as FlashAttention-2 does) with V rows
// interleaved in pairs of positions, so that P.V is vdpbf16ps too. The K/V rows of a chunk are read
// and rearranged once for every row and head of the tile. Chunks of kChunkBf16 positions aligned
// to absolute positions; the walk (paged_attention_walk.h) goes row by row through the tile, and
// every operation a row sees (its chunks, their valid ranges, the order of each sum) depends only
// on its own position and K/V, never on the tile or the batch, so the result of a row is the same
// alone, in a prefill tile or in any batch. The next chunk's K/V rows (and, in a task's last
// chunk, the first rows of the thread's next task) are prefetched a few lines at a time while a
// chunk is computed.
#include "abi.h"
#include "paged_attention.h"
#include "paged_attention_walk.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#if defined(__AVX512BF16__)
#include <immintrin.h>

namespace kvserve::attention {
namespace {

alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

inline __m512bh load_bh(const void* p) { return (__m512bh)_mm512_loadu_si512(p); }

// s_h[0..16) = scale * (q_h . K) for NH heads over one 16-position group of transposed K; each
// head's sum runs over the dimension pairs in order (fixed, whatever else is computed with it).
template <int NH>
inline void score_heads_n(const __m512i* kg, const uint32_t* q, int64_t pairs, __m512 scale, float* const* out) {
  __m512 dot[NH];
  for (int h = 0; h < NH; ++h) dot[h] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh k = (__m512bh)_mm512_load_si512(kg + p);
    for (int h = 0; h < NH; ++h)
      dot[h] = _mm512_dpbf16_ps(dot[h], k, (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(q[h * pairs + p])));
  }
  for (int h = 0; h < NH; ++h) _mm512_store_ps(out[h], _mm512_mul_ps(dot[h], scale));
}

// The same for two consecutive 16-position groups (kg[p] and kg[kStride + p]) at once: each q
// broadcast serves both groups; every lane's sum is still the same chain over the dimension pairs
// in order, so the scores are bit-identical to two calls of score_heads_n.
template <int NH, int64_t kStride>
inline void score_heads2_n(const __m512i* kg, const uint32_t* q, int64_t pairs, __m512 scale, float* const* out) {
  __m512 dot0[NH], dot1[NH];
  for (int h = 0; h < NH; ++h) dot0[h] = dot1[h] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh k0 = (__m512bh)_mm512_load_si512(kg + p), k1 = (__m512bh)_mm512_load_si512(kg + kStride + p);
    for (int h = 0; h < NH; ++h) {
      const __m512bh b = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(q[h * pairs + p]));
      dot0[h] = _mm512_dpbf16_ps(dot0[h], k0, b);
      dot1[h] = _mm512_dpbf16_ps(dot1[h], k1, b);
    }
  }
  for (int h = 0; h < NH; ++h) {
    _mm512_store_ps(out[h], _mm512_mul_ps(dot0[h], scale));
    _mm512_store_ps(out[h] + 16, _mm512_mul_ps(dot1[h], scale));
  }
}

template <int64_t kStride>
inline void score_heads2(int64_t nh, const __m512i* kg, const uint32_t* q, int64_t pairs, __m512 scale,
                         float* const* out) {
  switch (nh) {
    case 1: score_heads2_n<1, kStride>(kg, q, pairs, scale, out); break;
    case 2: score_heads2_n<2, kStride>(kg, q, pairs, scale, out); break;
    case 3: score_heads2_n<3, kStride>(kg, q, pairs, scale, out); break;
    case 4: score_heads2_n<4, kStride>(kg, q, pairs, scale, out); break;
    case 5: score_heads2_n<5, kStride>(kg, q, pairs, scale, out); break;
    case 6: score_heads2_n<6, kStride>(kg, q, pairs, scale, out); break;
    case 7: score_heads2_n<7, kStride>(kg, q, pairs, scale, out); break;
    default: score_heads2_n<8, kStride>(kg, q, pairs, scale, out); break;
  }
}

inline void score_heads(int64_t nh, const __m512i* kg, const uint32_t* q, int64_t pairs, __m512 scale,
                        float* const* out) {
  switch (nh) {
    case 1: score_heads_n<1>(kg, q, pairs, scale, out); break;
    case 2: score_heads_n<2>(kg, q, pairs, scale, out); break;
    case 3: score_heads_n<3>(kg, q, pairs, scale, out); break;
    case 4: score_heads_n<4>(kg, q, pairs, scale, out); break;
    case 5: score_heads_n<5>(kg, q, pairs, scale, out); break;
    case 6: score_heads_n<6>(kg, q, pairs, scale, out); break;
    case 7: score_heads_n<7>(kg, q, pairs, scale, out); break;
    default: score_heads_n<8>(kg, q, pairs, scale, out); break;
  }
}

// acc[h] = acc[h] * alpha[h] + sum over pairs k in [k0, k1) of ppairs[h][k] . vpairs[k] (NV
// vectors of 16 dims) for NH heads: each V pair is loaded once for all of them, and every
// accumulator's chain (scaling, then the pairs in order) is the same as head by head.
template <int NV, int NH>
inline void pv_heads(float* acc, const float* alpha, const uint32_t (*pp)[kChunkBf16 / 2 + 16],
                     const uint16_t (*vpairs)[2 * kMaxHeadDim], int64_t k0, int64_t k1) {
  __m512 av[NH][NV];
  for (int h = 0; h < NH; ++h) {
    const __m512 a = _mm512_set1_ps(alpha[h]);
    for (int j = 0; j < NV; ++j) av[h][j] = _mm512_mul_ps(_mm512_load_ps(acc + h * kMaxHeadDim + 16 * j), a);
  }
  for (int64_t k = k0; k < k1; ++k) {
    __m512bh v[NV];
    for (int j = 0; j < NV; ++j) v[j] = load_bh(vpairs[k] + 32 * j);
    for (int h = 0; h < NH; ++h) {
      const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pp[h][k]));
      for (int j = 0; j < NV; ++j) av[h][j] = _mm512_dpbf16_ps(av[h][j], v[j], p);
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int j = 0; j < NV; ++j) _mm512_store_ps(acc + h * kMaxHeadDim + 16 * j, av[h][j]);
}

// At most about 24 accumulator registers: heads per pass for NV vectors of 16 dims.
template <int NV>
constexpr int kPvHeads = NV <= 2 ? 6 : NV <= 4 ? 4 : NV <= 8 ? 3 : 1;

template <int NV, int NH = kPvHeads<NV>>
inline void pv_pass(int64_t nh, float* acc, const float* alpha, const uint32_t (*pp)[kChunkBf16 / 2 + 16],
                    const uint16_t (*vpairs)[2 * kMaxHeadDim], int64_t k0, int64_t k1) {
  if constexpr (NH > 1) {
    if (nh < NH) {
      pv_pass<NV, NH - 1>(nh, acc, alpha, pp, vpairs, k0, k1);
      return;
    }
  }
  pv_heads<NV, NH>(acc, alpha, pp, vpairs, k0, k1);
}

template <typename Prefetch>
inline void accumulate_pv(int64_t nv, int64_t G, float* acc, const float* alpha, const uint32_t (*pp)[kChunkBf16 / 2 + 16],
                          const uint16_t (*vpairs)[2 * kMaxHeadDim], int64_t k0, int64_t k1, Prefetch& pf) {
  const int64_t max_heads = nv == 2 ? kPvHeads<2> : nv == 4 ? kPvHeads<4> : nv == 8 ? kPvHeads<8> : 1;
  const int64_t passes = (G + max_heads - 1) / max_heads;
  for (int64_t h0 = 0, pass = 0; pass < passes; ++pass) {
    const int64_t nh = (G - h0 + (passes - pass) - 1) / (passes - pass);  // even split of what is left
    float* a = acc + h0 * kMaxHeadDim;
    switch (nv) {
      case 2: pv_pass<2>(nh, a, alpha + h0, pp + h0, vpairs, k0, k1); break;
      case 4: pv_pass<4>(nh, a, alpha + h0, pp + h0, vpairs, k0, k1); break;
      case 8: pv_pass<8>(nh, a, alpha + h0, pp + h0, vpairs, k0, k1); break;
      case 16: pv_pass<16>(nh, a, alpha + h0, pp + h0, vpairs, k0, k1); break;
      default:  // head_dim 32 * odd: one head at a time over any number of vectors
        for (int64_t h = h0; h < h0 + nh; ++h) {
          float* ah = acc + h * kMaxHeadDim;
          __m512 av[kMaxHeadDim / 16];
          const __m512 alpha_v = _mm512_set1_ps(alpha[h]);
          for (int64_t j = 0; j < nv; ++j) av[j] = _mm512_mul_ps(_mm512_load_ps(ah + 16 * j), alpha_v);
          for (int64_t k = k0; k < k1; ++k) {
            const __m512bh p = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pp[h][k]));
            for (int64_t j = 0; j < nv; ++j) av[j] = _mm512_dpbf16_ps(av[j], load_bh(vpairs[k] + 32 * j), p);
          }
          for (int64_t j = 0; j < nv; ++j) _mm512_store_ps(ah + 16 * j, av[j]);
        }
    }
    h0 += nh;
    pf.issue(64);
  }
}

// paged_attention_walk.h's kernel for a tile of up to kTileRows rows and one KV head: query row
// r = i * G + h (tile row i, head h); s[r][t - cs] holds the score of position t of the chunk cs.
struct Bf16Kernel {
  using scalar_t = BFloat16;
  using cache_t = BFloat16;
  static constexpr int64_t kChunk = kChunkBf16, kBlockRows = 1, kRowAlign = 1, kMaxRows = kTileRows * kMaxGroup;
  using Queue = PrefetchQueue<kChunk>;
  static constexpr int64_t C = kChunk;

  const Tile& tile;
  int64_t kv_head;
  const Operands<BFloat16, BFloat16>& io;
  const Shape& sh;
  // (a constructor, not aggregate initialization, which would zero every buffer below)
  Bf16Kernel(const Tile& tile, int64_t kv_head, const Operands<BFloat16, BFloat16>& io, const Shape& sh)
      : tile(tile), kv_head(kv_head), io(io), sh(sh) {}
  alignas(64) float s[kMaxRows][C];
  // acc lanes follow the interleaved V layout (see below); un-permuted when written out (lane).
  alignas(64) float acc_[kMaxRows][kMaxHeadDim];
  // V rows of positions (2k, 2k + 1) of the chunk interleaved per dimension, as vdpbf16ps pairs:
  // for each 32-dim block, 32 bf16 pairs of unpacklo then 32 of unpackhi.
  alignas(64) uint16_t vpairs[C / 2][2 * kMaxHeadDim];
  alignas(64) uint32_t ppairs[kMaxGroup][C / 2 + 16];  // + one vector of slack for the last group
  // K of the chunk transposed per 16-position group: kt[group][p] holds the bf16 pair (2p, 2p + 1)
  // of the 16 positions, so q.K is one vdpbf16ps per pair of dimensions with q broadcast.
  alignas(64) __m512i kt[C / 16][kMaxHeadDim / 2];
  const void* kptr[C];
  const void* vptr[C];

  float* acc(int64_t r) { return acc_[r]; }
  // acc lane order per 32-dim block: [unpacklo | unpackhi]; unpacklo holds dims 8L + 0..3 of each
  // 128-bit lane L, unpackhi dims 8L + 4..7.
  static int64_t lane(int64_t d) {
    const int64_t block = d / 32, lane = (d % 32) / 8, e = d % 8;
    return 32 * block + (e < 4 ? 0 : 16) + 4 * lane + e % 4;
  }
  void start() {}

  // Row addresses of the chunk, one block-table lookup per block (zeros outside [first, last)),
  // then V interleaved in pairs of positions and K transposed per 16-position group.
  void load(const Span& chunk, Queue& pf) {
    const int64_t D = sh.head_dim, nq = D / 32, token_stride = sh.num_kv_heads * D;
    const int64_t cs = chunk.start, first = chunk.a, last = chunk.b;
    for (int64_t t = cs; t < first; ++t) kptr[t - cs] = vptr[t - cs] = kZeroRow;
    for (int64_t t = last; t < cs + C; ++t) kptr[t - cs] = vptr[t - cs] = kZeroRow;
    for (int64_t t = first; t < last;) {
      const int64_t b = t / sh.block_size, off = t - b * sh.block_size, n = std::min(last - t, sh.block_size - off);
      const int64_t base = (static_cast<int64_t>(io.block_table[b]) * sh.block_size + off) * token_stride + kv_head * D;
      for (int64_t j = 0; j < n; ++j) {
        kptr[t - cs + j] = io.key_cache + base + j * token_stride;
        vptr[t - cs + j] = io.value_cache + base + j * token_stride;
      }
      t += n;
    }
    for (int64_t k = (first - cs) / 2; k < (last - cs + 1) / 2; ++k) {
      const uint16_t* r0 = static_cast<const uint16_t*>(vptr[2 * k]);
      const uint16_t* r1 = static_cast<const uint16_t*>(vptr[2 * k + 1]);
      for (int64_t j = 0; j < nq; ++j) {
        const __m512i a = _mm512_loadu_si512(r0 + 32 * j), b = _mm512_loadu_si512(r1 + 32 * j);
        _mm512_store_si512(vpairs[k] + 64 * j, _mm512_unpacklo_epi16(a, b));
        _mm512_store_si512(vpairs[k] + 64 * j + 32, _mm512_unpackhi_epi16(a, b));
      }
      pf.issue(4);
    }
    for (int64_t g = (first - cs) / 16; g * 16 < last - cs; ++g) {
      for (int64_t z = 0; z < nq; ++z) {  // dims 32z .. 32z + 31 = dword pairs 16z .. 16z + 15
        __m512i rows[16], cols[16];
        for (int j = 0; j < 16; ++j) rows[j] = _mm512_loadu_si512(static_cast<const BFloat16*>(kptr[16 * g + j]) + 32 * z);
        kvserve::transpose16x16(rows, cols);
        for (int j = 0; j < 16; ++j) kt[g][16 * z + j] = cols[j];
        pf.issue(8);
      }
    }
  }

  // Scores of every head of tile row i for the 16-position groups covering [a, b) (positions
  // outside are computed on K rows or zeros and never used): one accumulation per head, over the
  // dimension pairs in order, up to 8 heads at once.
  void score(int64_t i, int64_t, const Span& row, Queue& pf) {
    const int64_t G = sh.group, D = sh.head_dim, cs = row.start;
    const int64_t g_begin = (row.a - cs) / 16 * 16, g_end = (row.b - cs + 15) / 16 * 16;  // 16-aligned cover
    const __m512 scale = _mm512_set1_ps(sh.scale);
    const uint32_t* qrow = reinterpret_cast<const uint32_t*>(io.query + ((tile.row0 + i) * sh.num_heads + kv_head * G) * D);
    for (int64_t g = g_begin; g < g_end; g += 32) {
      const __m512i* kg = kt[g / 16];
      for (int64_t h0 = 0; h0 < G; h0 += 8) {
        float* out_rows[8];
        const int64_t nh = std::min<int64_t>(8, G - h0);
        for (int64_t h = 0; h < nh; ++h) out_rows[h] = s[i * G + h0 + h] + g;
        if (g + 16 < g_end)
          score_heads2<kMaxHeadDim / 2>(nh, kg, qrow + h0 * (D / 2), D / 2, scale, out_rows);
        else
          score_heads(nh, kg, qrow + h0 * (D / 2), D / 2, scale, out_rows);
        pf.issue(16);
      }
    }
  }

  float* scores(int64_t r, const Span& row) { return s[r] + (row.a - row.start); }
  // The maximum 16 lanes at a time (exact, so the same value as a scalar scan).
  float row_max(int64_t r, const Span& row) {
    const float* p = scores(r, row);
    const int64_t n = row.b - row.a;
    __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t t = 0; t < n; t += 16) {
      const __mmask16 mask = kvserve::lanes(n - t);
      vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, mask, p + t));
    }
    return _mm512_reduce_max_ps(vmax);
  }
  // P over [a, b), 0 elsewhere in the 16-aligned cover, then as bf16 pairs of positions
  // (2k, 2k + 1), as flash attention rounds P for the PV product.
  float exponentiate(int64_t r, const Span& row, float new_max) {
    const int64_t cs = row.start, h = r % sh.group;
    const int64_t g_begin = (row.a - cs) / 16 * 16, g_end = (row.b - cs + 15) / 16 * 16;
    const float sum = exp_row(scores(r, row), row.b - row.a, new_max);
    for (int64_t t = g_begin; t < row.a - cs; ++t) s[r][t] = 0.f;
    for (int64_t t = row.b - cs; t < g_end; ++t) s[r][t] = 0.f;
    for (int64_t g = g_begin; g < g_end; g += 32) {
      const __m512 p0 = _mm512_load_ps(s[r] + g);
      const __m512 p1 = g + 16 < g_end ? _mm512_load_ps(s[r] + g + 16) : _mm512_setzero_ps();
      _mm512_storeu_si512(ppairs[h] + g / 2, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    return sum;
  }
  void skip(int64_t) {}  // not reached: a block is one tile row, skipped whole
  // acc = acc * alpha + sum over pairs of (p_2k V_2k + p_2k+1 V_2k+1), in registers, for several
  // heads per V load.
  void accumulate(int64_t i, int64_t, const Span& row, const float* alpha, Queue& pf) {
    const int64_t G = sh.group, cs = row.start;
    accumulate_pv(sh.head_dim / 16, G, acc_[i * G], alpha + i * G, ppairs, vpairs, (row.a - cs) / 2,
                  (row.b - cs + 1) / 2, pf);
  }
};

}  // namespace

void attend_tile_bf16(const Tile& tile, int64_t kv_head, const Operands<BFloat16, BFloat16>& io, const Shape& sh,
                      int64_t prefetch_heads, const Upcoming* after) {
  Bf16Kernel kernel{tile, kv_head, io, sh};
  attend_tile(kernel, tile, {kv_head, 1}, sh, io, {prefetch_heads, after});
}

}  // namespace kvserve::attention
#endif  // __AVX512BF16__
