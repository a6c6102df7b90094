// The bfloat16 paged-attention kernel on AMX tiles (head_dim % 32 == 0; hosts where
// amx_linear_available(), amx_tiles.h; KVSERVE_AMX=0: never), for every query row of the tile at
// once (row r = j * M16 + i * G + h: KV head j of the task's pass, tile row i, head h of the group;
// R * G rows per KV head, padded to tiles of 16), with K and V read in place from the cache (a
// 16-position group of one block is 16 rows at the token stride: one tile):
//   scores   S^T[16 positions][16 rows] = K Q^T: A = the group's K rows (32 dims per tile), B = q
//            in AMX's pair form (qt, built once per task); each score sums its dims in TDPBF16PS
//            chunks of 32, in order, from zero; transposed in registers to S[row][position] and
//            multiplied by the softmax scale;
//   softmax  the walk's (paged_attention_walk.h), in float32 per row, 16 positions per vector
//            (row_max, exponentiate: positions outside the row's range masked); P rounded to bfloat16;
//   P.V      O[16 rows][16 dims] = P V: B = the group's V rows as they are (32 dims: 16 pairs of
//            adjacent dims), A = P widened to pairs (P, 0) for the even dims and (0, P) for the odd
//            ones; the chunk's product starts from zero, then acc = fma(acc, alpha, O).
// Nothing is transposed or interleaved in memory but the 16 x 16 scores. A group with positions
// outside [first, last) of the chunk (the context's ends, a window's start) or across blocks
// (block sizes that are not a multiple of 16) is copied with zero rows instead.
// What a row's result depends on: its chunks (aligned to absolute positions), its valid range in
// each and the K/V values, as on the vector path. A tile computes for every row the 16-position
// groups that any of its rows needs; a group outside a row's range has P = 0 there and adds an
// exact +0 to its accumulator (TDPBF16PS flushes denormal results, so a tile never holds a value
// that + 0 would change), so a row gives the same bits alone, in a prefill tile or in any batch.
// The bits differ from the vector path's (TDPBF16PS sums a 32-element chunk as two chains, even
// and odd elements, the chunk's P.V is formed before it is scaled into acc, and exp is exp16), as
// for the linears: on one host each row takes one path whatever the batch.
#include "abi.h"
#include "amx_tiles.h"
#include "paged_attention.h"
#include "simd.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(KVSERVE_AMX_BUILD)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")
// The walk under this unit's target, so that it inlines the tile code below.
#include "paged_attention_walk.h"

namespace kvserve::attention {
namespace {

constexpr int64_t kAmxRowsMax = kTileRows * kMaxGroup;  // query rows of a tile and KV head
constexpr int64_t kGroups = kChunkBf16 / 16;            // 16-position groups per chunk
using Queue = PrefetchQueue<kChunkBf16>;

// C tile `c` (0-3) += A tile `a` (4-5) x B tile `b` (6-7); the tile numbers are immediates (the
// intrinsic names its registers in the instruction text).
inline void tile_dot(int c, int a, int b) {
  switch (c * 4 + (a - 4) * 2 + (b - 6)) {
    case 0: _tile_dpbf16ps(0, 4, 6); break;
    case 1: _tile_dpbf16ps(0, 4, 7); break;
    case 2: _tile_dpbf16ps(0, 5, 6); break;
    case 3: _tile_dpbf16ps(0, 5, 7); break;
    case 4: _tile_dpbf16ps(1, 4, 6); break;
    case 5: _tile_dpbf16ps(1, 4, 7); break;
    case 6: _tile_dpbf16ps(1, 5, 6); break;
    case 7: _tile_dpbf16ps(1, 5, 7); break;
    case 8: _tile_dpbf16ps(2, 4, 6); break;
    case 9: _tile_dpbf16ps(2, 4, 7); break;
    case 10: _tile_dpbf16ps(2, 5, 6); break;
    case 11: _tile_dpbf16ps(2, 5, 7); break;
    case 12: _tile_dpbf16ps(3, 4, 6); break;
    case 13: _tile_dpbf16ps(3, 4, 7); break;
    case 14: _tile_dpbf16ps(3, 5, 6); break;
    case 15: _tile_dpbf16ps(3, 5, 7); break;
    default: break;
  }
}
inline void tile_load_b(int b, const void* p, int64_t stride) {
  if (b == 6) _tile_loadd(6, p, stride);
  else _tile_loadd(7, p, stride);
}
inline void tile_zero_c(int c) {
  switch (c) {
    case 0: _tile_zero(0); break;
    case 1: _tile_zero(1); break;
    case 2: _tile_zero(2); break;
    default: _tile_zero(3); break;
  }
}
inline void tile_store_c(int c, void* p, int64_t stride) {
  switch (c) {
    case 0: _tile_stored(0, p, stride); break;
    case 1: _tile_stored(1, p, stride); break;
    case 2: _tile_stored(2, p, stride); break;
    default: _tile_stored(3, p, stride); break;
  }
}

// Prefetched cache lines per piece of work (a group's scores, a row's softmax, a group's P.V):
// about a chunk's K/V lines of one head over the chunk's work, so that the requests stay spread.
constexpr int64_t kIssue = 16;
static_assert(kIssue == kSoftmaxIssue, "the walk issues kSoftmaxIssue lines per row's softmax");

// The K and V rows of a 16-position group: 16 rows `stride` bytes apart.
struct GroupRows {
  const uint16_t* k;
  const uint16_t* v;
  int64_t stride;
};

// Scores of query rows [16 nt, 16 nt + rows) for the groups [g0, g1) of the chunk (at most 4):
// s[16 nt + n][16 g + j] = scale * (q_n . K_j).
inline void amx_scores(const uint32_t* qt, int64_t nt, int64_t rows, int64_t nq, const GroupRows* grp, int64_t g0,
                       int64_t g1, __m512 scale, float (*s)[kChunkBf16], Queue& pf) {
  const int64_t ng = g1 - g0;
  for (int64_t g = 0; g < ng; ++g) tile_zero_c(static_cast<int>(g));
  for (int64_t z = 0; z < nq; ++z) {
    _tile_loadd(6, qt + (nt * nq * 16 + 16 * z) * 16, 64);
    for (int64_t g = 0; g < ng; ++g) {
      if (g % 2 == 0) _tile_loadd(4, grp[g0 + g].k + 32 * z, grp[g0 + g].stride);
      else _tile_loadd(5, grp[g0 + g].k + 32 * z, grp[g0 + g].stride);
      tile_dot(static_cast<int>(g), g % 2 == 0 ? 4 : 5, 6);
    }
  }
  alignas(64) float st[16][16];
  for (int64_t g = 0; g < ng; ++g) {
    tile_store_c(static_cast<int>(g), st, 64);
    __m512i in[16], out[16];
    for (int j = 0; j < 16; ++j) in[j] = _mm512_load_si512(st[j]);
    kvserve::transpose16x16(in, out);
    for (int64_t n = 0; n < rows; ++n)
      _mm512_store_ps(s[16 * nt + n] + 16 * (g0 + g), _mm512_mul_ps(_mm512_castsi512_ps(out[n]), scale));
    pf.issue(kIssue);
  }
}

// acc[16 nt + n] = fma(acc, alpha, P_n V) for the tile's rows n < rows that attend this chunk
// (valid), over the groups [g0, g1); acc lanes per 32-dim block: 16 even dims, then 16 odd.
inline void amx_pv(const uint32_t (*pe)[kChunkBf16], const uint32_t (*po)[kChunkBf16], int64_t nt, int64_t rows,
                   const GroupRows* grp, int64_t g0, int64_t g1, int64_t nq, const float* alpha, const bool* valid,
                   float (*acc)[kMaxHeadDim], Queue& pf) {
  alignas(64) float o[16][16];
  for (int64_t z0 = 0; z0 < nq; z0 += 2) {  // two 32-dim blocks per pass: 4 C tiles
    const int64_t nz = std::min<int64_t>(2, nq - z0);
    for (int64_t c = 0; c < 2 * nz; ++c) tile_zero_c(static_cast<int>(c));
    for (int64_t g = g0; g < g1; ++g) {
      _tile_loadd(4, &pe[16 * nt][16 * g], kChunkBf16 * 4);
      _tile_loadd(5, &po[16 * nt][16 * g], kChunkBf16 * 4);
      for (int64_t z = 0; z < nz; ++z) {
        const int b = z == 0 ? 6 : 7;
        tile_load_b(b, grp[g].v + 32 * (z0 + z), grp[g].stride);
        tile_dot(static_cast<int>(2 * z), 4, b);
        tile_dot(static_cast<int>(2 * z + 1), 5, b);
      }
      pf.issue(kIssue);
    }
    for (int64_t c = 0; c < 2 * nz; ++c) {
      tile_store_c(static_cast<int>(c), o, 64);
      const int64_t lane0 = 32 * z0 + 16 * c;  // block z0 + c / 2, even (c even) or odd dims
      for (int64_t n = 0; n < rows; ++n) {
        if (!valid[16 * nt + n]) continue;
        float* a = acc[16 * nt + n] + lane0;
        _mm512_store_ps(a, _mm512_fmadd_ps(_mm512_load_ps(a), _mm512_set1_ps(alpha[16 * nt + n]), _mm512_load_ps(o[n])));
      }
    }
  }
}

// The lanes of 16-position group g of the chunk at cs that fall in [a, b).
inline __mmask16 group_lanes(int64_t cs, int64_t g, int64_t a, int64_t b) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i t = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(cs + 16 * g)), lane);
  return _mm512_cmpge_epi32_mask(t, _mm512_set1_epi32(static_cast<int32_t>(a))) &
         _mm512_cmplt_epi32_mask(t, _mm512_set1_epi32(static_cast<int32_t>(b)));
}

// paged_attention_walk.h's kernel for a tile and `heads` KV heads at once (amx_heads_fit), so that
// a chunk's K and V token rows are read whole, each block's once; the rows of KV head j are the
// query rows [j * M16, j * M16 + R * G).
struct AmxKernel {
  using scalar_t = BFloat16;
  using cache_t = BFloat16;
  using Queue = attention::Queue;
  static constexpr int64_t kChunk = kChunkBf16, kBlockRows = kTileRows, kRowAlign = 16, kMaxRows = kAmxRowsMax;
  static constexpr int64_t C = kChunk;

  const Tile& tile;
  int64_t kv_head, heads;
  const Operands<BFloat16, BFloat16>& io;
  const Shape& sh;
  int64_t G, D, nq, M, M16, rows, NT, tiles_per_head, token_stride, width;  // width: K/V elements read per token
  int64_t g0 = 0, g1 = 0;  // the chunk's 16-position groups with positions in [first, last)
  // (a constructor, not aggregate initialization, which would zero every buffer below)
  AmxKernel(const Tile& tile, int64_t kv_head, int64_t heads, const Operands<BFloat16, BFloat16>& io, const Shape& sh)
      : tile(tile), kv_head(kv_head), heads(heads), io(io), sh(sh), G(sh.group), D(sh.head_dim), nq(D / 32),
        M(tile.rows * G), M16((M + 15) / 16 * 16), rows(heads * M16), NT(rows / 16), tiles_per_head(M16 / 16),
        token_stride(sh.num_kv_heads * D), width(heads * D) {}
  alignas(64) float s[kAmxRowsMax][C];
  alignas(64) float acc_[kAmxRowsMax][kMaxHeadDim];
  // q in AMX's pair form per tile of 16 rows: qt[nt][p][n] = dims (2p, 2p + 1) of row 16 nt + n.
  alignas(64) uint32_t qt[kAmxRowsMax * kMaxHeadDim / 2];
  // P of the chunk in bfloat16, widened to 32 bits: pe = (P, 0) pairs, po = (0, P) pairs.
  alignas(64) uint32_t pe[kAmxRowsMax][C];
  alignas(64) uint32_t po[kAmxRowsMax][C];
  alignas(64) uint16_t kcopy[kGroups][16 * kMaxHeadDim];  // groups that are not read in place
  alignas(64) uint16_t vcopy[kGroups][16 * kMaxHeadDim];
  GroupRows grp[kMaxHeadDim / 32][kGroups];  // [head][group]: heads * D <= kMaxHeadDim
  bool valid[kAmxRowsMax];                   // the row attends a position of the chunk

  float* acc(int64_t r) { return acc_[r]; }
  // acc lanes per 32-dim block: the 16 even dims, then the 16 odd ones.
  static int64_t lane(int64_t d) { return 32 * (d / 32) + 16 * (d % 2) + (d % 32) / 2; }

  // q in pair form; the padding rows of a head's last tile have P = 0.
  void start() {
    std::memset(qt, 0, rows * (D / 2) * 4);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t j = r / M16, local = r % M16;
      valid[r] = false;
      if (local >= M) {
        for (int64_t t = 0; t < C; ++t) pe[r][t] = po[r][t] = 0;
        continue;
      }
      const int64_t i = local / G, h = local % G;
      const uint32_t* q =
          reinterpret_cast<const uint32_t*>(io.query + ((tile.row0 + i) * sh.num_heads + (kv_head + j) * G + h) * D);
      uint32_t* dst = qt + (r / 16) * (D / 2) * 16 + r % 16;
      for (int64_t p = 0; p < D / 2; ++p) dst[16 * p] = q[p];
    }
  }

  // Where each group's rows are: in place, or copied with zeros outside [first, last).
  void load(const Span& chunk, Queue&) {
    const int64_t cs = chunk.start, first = chunk.a, last = chunk.b;
    g0 = (first - cs) / 16;
    g1 = (last - cs + 15) / 16;
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = cs + 16 * g, u = std::max(first, p0), v = std::min(last, p0 + 16);
      if (u == p0 && v == p0 + 16 && sh.block_size % 16 == 0) {
        const int64_t base = (static_cast<int64_t>(io.block_table[p0 / sh.block_size]) * sh.block_size + p0 % sh.block_size) *
                                 token_stride + kv_head * D;
        for (int64_t j = 0; j < heads; ++j)
          grp[j][g] = {reinterpret_cast<const uint16_t*>(io.key_cache + base + j * D),
                       reinterpret_cast<const uint16_t*>(io.value_cache + base + j * D), token_stride * 2};
        continue;
      }
      std::memset(kcopy[g], 0, 16 * width * 2);
      std::memset(vcopy[g], 0, 16 * width * 2);
      for (int64_t t = u; t < v; ++t) {
        const int64_t slot = static_cast<int64_t>(io.block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
        std::memcpy(kcopy[g] + (t - p0) * width, io.key_cache + slot * token_stride + kv_head * D, width * 2);
        std::memcpy(vcopy[g] + (t - p0) * width, io.value_cache + slot * token_stride + kv_head * D, width * 2);
      }
      for (int64_t j = 0; j < heads; ++j) grp[j][g] = {kcopy[g] + j * D, vcopy[g] + j * D, width * 2};
    }
  }

  void score(int64_t, int64_t, const Span&, Queue& pf) {
    const __m512 scale = _mm512_set1_ps(sh.scale);
    for (int64_t nt = 0; nt < NT; ++nt) {
      const int64_t local0 = (nt % tiles_per_head) * 16;
      amx_scores(qt, nt, std::min<int64_t>(16, M - local0), nq, grp[nt / tiles_per_head], g0, g1, scale, s, pf);
    }
  }

  float* scores(int64_t r, const Span& row) { return s[r] + (row.a - row.start); }
  // Lane j of every vector holds the positions = j mod 16 and the groups are visited in order, so
  // the max and the sum run in one fixed order for a given (a, b).
  float row_max(int64_t r, const Span& row) {
    __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t g = g0; g < g1; ++g)
      vmax = _mm512_mask_max_ps(vmax, group_lanes(row.start, g, row.a, row.b), vmax, _mm512_load_ps(s[r] + 16 * g));
    return _mm512_reduce_max_ps(vmax);
  }
  // P = exp(s - m') in bfloat16, widened to the pair forms pe (P, 0) and po (0, P) for the groups
  // [g0, g1) (zeros outside [a, b)).
  float exponentiate(int64_t r, const Span& row, float new_max) {
    const __m512 vnew = _mm512_set1_ps(new_max);
    __m512 sum = _mm512_setzero_ps();
    for (int64_t g = g0; g < g1; ++g) {
      const __mmask16 mask = group_lanes(row.start, g, row.a, row.b);
      const __m512 p = _mm512_maskz_mov_ps(mask, kvserve::exp16(_mm512_sub_ps(_mm512_load_ps(s[r] + 16 * g), vnew)));
      sum = _mm512_add_ps(sum, p);
      const __m512i bits = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p));
      _mm512_store_si512(pe[r] + 16 * g, bits);
      _mm512_store_si512(po[r] + 16 * g, _mm512_slli_epi32(bits, 16));
    }
    valid[r] = true;
    return _mm512_reduce_add_ps(sum);
  }
  void skip(int64_t r) {
    for (int64_t g = g0; g < g1; ++g) {
      _mm512_store_si512(pe[r] + 16 * g, _mm512_setzero_si512());
      _mm512_store_si512(po[r] + 16 * g, _mm512_setzero_si512());
    }
    valid[r] = false;
  }

  void accumulate(int64_t, int64_t, const Span&, const float* alpha, Queue& pf) {
    for (int64_t nt = 0; nt < NT; ++nt) {
      const int64_t local0 = (nt % tiles_per_head) * 16;
      amx_pv(pe, po, nt, std::min<int64_t>(16, M - local0), grp[nt / tiles_per_head], g0, g1, nq, alpha, valid, acc_, pf);
    }
  }
};

// Whether AmxKernel can take `heads` KV heads of a tile of `rows` query rows in one pass (its
// buffers: up to kAmxRowsMax query rows in whole tiles of 16 per head, kMaxHeadDim elements of K/V
// per token).
inline bool amx_heads_fit(int64_t heads, int64_t rows, const Shape& sh) {
  return heads * ((rows * sh.group + 15) / 16 * 16) <= kAmxRowsMax && heads * sh.head_dim <= kMaxHeadDim;
}

}  // namespace

// This thread's tiles: 16 rows of 64 bytes each (kvserve_amx::configure_tiles), and their
// release at the end of a parallel region.
void amx_configure() { kvserve_amx::configure_tiles(16); }
void amx_release() { _tile_release(); }

// The KV heads in one pass where they fit, else one head at a time. Each pass prefetches its own
// next chunk as it goes, and in its last chunk the first rows of the next pass (or of the thread's
// next task, `upcoming`): its arithmetic is short, so the requests are spread over all of the work.
// The caller configured this thread's tiles (amx_configure).
void attend_task_amx(const Tile& tile, int64_t first, int64_t heads, const Operands<BFloat16, BFloat16>& io,
                     const Shape& sh, const Upcoming* upcoming) {
  const int64_t per_pass = amx_heads_fit(heads, tile.rows, sh) ? heads : 1;
  const int64_t lo = sh.window > 0 ? std::max<int64_t>(0, tile.position0 - sh.window + 1) : 0;
  for (int64_t h = first; h < first + heads; h += per_pass) {
    const Upcoming next{io.block_table, lo, std::min(tile.position0 + tile.rows, (lo / kChunkBf16 + 1) * kChunkBf16),
                        h + per_pass, per_pass};
    const Upcoming* after = h + per_pass < first + heads ? &next : upcoming;
    AmxKernel kernel(tile, h, per_pass, io, sh);
    attend_tile(kernel, tile, {h, per_pass}, sh, io, {per_pass, after});
  }
}

}  // namespace kvserve::attention

#pragma GCC pop_options
#endif  // KVSERVE_AMX_BUILD
