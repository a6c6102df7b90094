// The walk every paged-attention kernel takes over a tile's context, written once: the online
// softmax (Milakov & Gimelshein 2018; FlashAttention's chunk-wise rescaling, Dao et al. 2022) in
// float32 for every query row of the tile and every query head of the KV head's group:
//
//     for chunk c = 0, 1, ...:  s = q . K[c] * scale      (valid positions of the chunk only)
//                               m' = max(m, max s);  a = exp(m - m')
//                               l  = l * a + sum exp(s - m');  acc = acc * a + sum exp(s - m') V[c]
//     out = acc / l
//
// Two variants of the softmax, per layer: soft-capped scores (Gemma 2: s = cap * tanh(s / cap),
// after the scale) and attention sinks (GPT-OSS: one learned logit per query head that joins
// every row's softmax denominator and contributes no value: m starts at the sink, l at 1).
//
// attend_tile below: rows start (sinks, acc = 0); chunks aligned to absolute positions (multiples
// of the kernel's kChunk) from the first row's first position to the last row's last, each one:
// the next chunk's K/V rows queued for prefetching, the chunk's K/V made ready, then per block of
// tile rows: scores, and per query row with positions in the chunk, its valid range [a, b)
// (causality, sliding window), soft-cap, running max, rescale factor, P and its sum; then P.V into
// the accumulators; at the end acc / l stored in the query's dtype. A kernel (a struct; its
// member functions are inlined into the walk) supplies only what differs between instruction sets:
//   using scalar_t, cache_t, Queue          query/cache types; PrefetchQueue<kChunk> or NoPrefetch
//   kChunk, kBlockRows, kRowAlign, kMaxRows positions per chunk; tile rows scored together (1: row
//                                           by row); a KV head's rows padded to a multiple of kRowAlign
//                                           (r = j * padded + i * group + h); state rows at most
//   start()                                 before the first chunk (q in the kernel's form)
//   load(chunk, pf)                         the chunk's K/V rows ready for every row of the tile
//   score(i0, i1, block, pf)                scaled scores of tile rows [i0, i1) over block [a, b)
//   scores(r, row), row_max(r, row)         row r's score of position row.a; the largest in [a, b)
//   exponentiate(r, row, m')                P = exp(s - m') over [a, b) in the kernel's form; sum P
//   skip(r)                                 row r has no position in this chunk (other rows of its block have)
//   accumulate(i0, i1, block, alpha, pf)    acc = acc * alpha + P.V for tile rows [i0, i1)
//   acc(r), lane(d)                         row r's float32 accumulator; the lane of dimension d
// A row's chunks, their valid ranges and the order of every sum depend only on its position and
// the K/V values, never on the tile, the chunking of the prompt or the rest of the batch, so a
// row's result is bit-identical alone, in a prefill chunk or in any batch (batch invariance).
//
// Everything here has internal linkage: each kernel's unit compiles its own copy (the AMX unit
// includes this header under its target pragma, so that the walk can inline the tile code).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "paged_attention.h"

namespace kvserve::attention {
namespace {

// exp(x) for x <= 0 (softmax arguments), branch-free so loops over it vectorize: 2^n * p(r) with
// x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 Taylor polynomial (relative error < 3e-7);
// exp(x) underflows to exactly 0 below -87. n = round(x / ln2), halves away from zero, written as
// GCC expands roundf under -ffast-math (trunc(y + copysign(0.5 - 2^-25, y)), exact for every y) so
// that it is inlined everywhere: GCC calls roundf instead in code it estimates to be cold (the
// scalar ends of the vectorized loops).
inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float y = x * 1.44269504088896341f;
  const float n = __builtin_truncf(y + __builtin_copysignf(0x1.fffffep-2f, y));
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187045e-06f;
  float p = 1.f / 720.f;
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const int32_t exponent = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &exponent, sizeof(scale));
  return x <= -87.f ? 0.f : p * scale;
}

// A row's softmax state before its first chunk: (m, l) = (-inf, 0), or (sink, 1) for a query
// head with a sink (exp(sink - m) = 1 counted in l, no value in acc).
inline void start_row(const Shape& sh, int64_t head, float& m, float& l) {
  if (sh.sinks != nullptr) {
    m = sh.sinks[head];
    l = 1.f;
  } else {
    m = -std::numeric_limits<float>::infinity();
    l = 0.f;
  }
}

// Soft-capping of n scaled scores in place (every path the same formula).
inline void soft_cap(float* s, int64_t n, float cap) {
  if (cap <= 0.f) return;
  const float inv = 1.f / cap;
  for (int64_t t = 0; t < n; ++t) s[t] = cap * std::tanh(s[t] * inv);
}

// P = exp(s - new_max) of n scores in place, in float32 (the portable and AVX512-BF16 kernels);
// returns their sum.
inline float exp_row(float* row, int64_t n, float new_max) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t t = 0; t < n; ++t) { row[t] = exp_nonpositive(row[t] - new_max); sum += row[t]; }
  return sum;
}

// The cache lines of the next chunk's K/V rows, prefetched into L2 a few at a time between pieces
// of the current chunk's work: hundreds of prefetches at once fill the core's miss buffers and
// stall it until memory answers; spread out, the transfers overlap the arithmetic. A block's rows
// are contiguous but blocks are scattered, each one a new page where the hardware prefetchers
// stop; asking for the next chunk's rows while the current one is computed (and for the next
// task's first chunk while this task runs) hides the latency that otherwise stalls every chunk.
template <int64_t kPositions>
struct PrefetchQueue {
  const char* rows_[2 * kPositions];
  int64_t count = 0, next = 0, offset = 0, bytes = 64;
  void issue(int64_t n) {
    for (; n > 0 && next < count; --n) {
      __builtin_prefetch(rows_[next] + offset, 0, 2);
      offset += 64;
      if (offset >= bytes) { offset = 0; ++next; }
    }
  }
  void issue_all() { issue(1 << 30); }
  // Queue the rows of `rows` (at most kPositions positions).
  template <typename cache_t>
  void fill(const cache_t* key_cache, const cache_t* value_cache, const Upcoming& rows, const Shape& sh) {
    const int64_t token_stride = sh.num_kv_heads * sh.row;
    bytes = rows.heads * sh.row * static_cast<int64_t>(sizeof(cache_t));
    count = next = offset = 0;
    for (int64_t t = rows.from; t < rows.to;) {
      const int64_t b = t / sh.block_size, off = t - b * sh.block_size, n = std::min(rows.to - t, sh.block_size - off);
      const int64_t base = (static_cast<int64_t>(rows.block_table[b]) * sh.block_size + off) * token_stride + rows.head * sh.row;
      for (int64_t j = 0; j < n; ++j) {
        rows_[count++] = reinterpret_cast<const char*>(key_cache + base + j * token_stride);
        rows_[count++] = reinterpret_cast<const char*>(value_cache + base + j * token_stride);
      }
      t += n;
    }
  }
};

// The queue of a kernel that prefetches nothing while it walks (the portable one).
struct NoPrefetch {
  void issue(int64_t) {}
  void issue_all() {}
  template <typename cache_t>
  void fill(const cache_t*, const cache_t*, const Upcoming&, const Shape&) {}
};

constexpr int64_t kSoftmaxIssue = 16;  // prefetched cache lines per query row's softmax

// Positions [a, b) of the chunk starting at `start`: attended by a query row, by a block of tile
// rows, or (load) by any row of the tile.
struct Span {
  int64_t start, a, b;
};

// KV heads [first, first + count) of a tile walked at once (count > 1: the AMX kernel only).
struct HeadRange {
  int64_t first, count;
};

// Prefetching while the walk runs: the next chunk's rows of KV heads [first, first + heads) (0:
// none), and in the last chunk the rows of `after` (the thread's next task or pass), if any.
struct Lookahead {
  int64_t heads;
  const Upcoming* after;
};

// One chunk of the online softmax for query row r over its positions [a, b): m' = max(m, max s),
// l = l * alpha + sum P, m = m'. Returns alpha = exp(m - m'), the factor of the row's acc.
template <typename Kernel>
inline float online_softmax(Kernel& k, int64_t r, const Span& row, float softcap, float& m, float& l) {
  soft_cap(k.scores(r, row), row.b - row.a, softcap);
  const float new_max = std::max(m, k.row_max(r, row));
  const float alpha = exp_nonpositive(m - new_max);
  const float sum = k.exponentiate(r, row, new_max);
  l = l * alpha + sum;
  m = new_max;
  return alpha;
}

// out = acc / l for one query row, dimension d from acc lane Kernel::lane(d), in the query's dtype
// (restrict: the compiler vectorizes the loop only when told the row and the accumulator are apart).
template <typename Kernel>
inline void store_row(typename Kernel::scalar_t* __restrict dst, const float* __restrict acc, float inv, int64_t dim) {
  for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<typename Kernel::scalar_t>(acc[Kernel::lane(d)] * inv);
}

// The tile's query rows of KV heads `kv` (see the top of this file), written to io.out.
template <typename Kernel>
inline void attend_tile(Kernel& k, const Tile& tile, HeadRange kv, const Shape& sh,
                        const Operands<typename Kernel::scalar_t, typename Kernel::cache_t>& io, Lookahead ahead) {
  constexpr int64_t C = Kernel::kChunk;
  const int64_t G = sh.group, D = sh.head_dim, R = tile.rows;
  const int64_t padded = (R * G + Kernel::kRowAlign - 1) / Kernel::kRowAlign * Kernel::kRowAlign;
  float m[Kernel::kMaxRows], l[Kernel::kMaxRows], alpha[Kernel::kMaxRows];
  int64_t lo[kTileRows], hi[kTileRows];  // tile row i attends positions [lo[i], hi[i])
  for (int64_t i = 0; i < R; ++i) {
    const int64_t position = tile.position0 + i;
    lo[i] = sh.window > 0 ? std::max<int64_t>(0, position - sh.window + 1) : 0;
    hi[i] = position + 1;  // exclusive
  }
  // f(r, j, i, h) for the query rows of tile rows [i0, i1): KV head j, tile row i, head h.
  auto for_rows = [&](int64_t i0, int64_t i1, auto&& f) {
    for (int64_t j = 0; j < kv.count; ++j)
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t h = 0; h < G; ++h) f(j * padded + i * G + h, j, i, h);
  };
  k.start();
  for_rows(0, R, [&](int64_t r, int64_t j, int64_t, int64_t h) {
    start_row(sh, (kv.first + j) * G + h, m[r], l[r]);
    float* acc = k.acc(r);
    for (int64_t d = 0; d < D; ++d) acc[d] = 0.f;
  });
  // Chunks are aligned to absolute positions (multiples of kChunk): the reduction order of a
  // request depends only on its own length.
  for (int64_t cs = lo[0] / C * C; cs < hi[R - 1]; cs += C) {
    const Span chunk{cs, std::max(lo[0], cs), std::min(hi[R - 1], cs + C)};
    typename Kernel::Queue pf;
    if (ahead.heads > 0 && cs + C < hi[R - 1])  // this tile's next chunk
      pf.fill(io.key_cache, io.value_cache, {io.block_table, cs + C, std::min(hi[R - 1], cs + 2 * C), kv.first, ahead.heads}, sh);
    else if (ahead.after != nullptr && cs + C >= hi[R - 1])  // the last chunk: the next task's first rows
      pf.fill(io.key_cache, io.value_cache, *ahead.after, sh);
    k.load(chunk, pf);
    for (int64_t i0 = 0; i0 < R; i0 += Kernel::kBlockRows) {
      const int64_t i1 = std::min(R, i0 + Kernel::kBlockRows);
      // Consecutive rows' ranges touch or overlap: the block's rows attend [lo[i0], hi[i1 - 1]).
      const Span block{cs, std::max(lo[i0], cs), std::min(hi[i1 - 1], cs + C)};
      if (block.a >= block.b) continue;
      k.score(i0, i1, block, pf);
      for_rows(i0, i1, [&](int64_t r, int64_t, int64_t i, int64_t) {
        const Span row{cs, std::max(lo[i], cs), std::min(hi[i], cs + C)};
        if (row.a < row.b) alpha[r] = online_softmax(k, r, row, sh.softcap, m[r], l[r]);
        else k.skip(r);
        pf.issue(kSoftmaxIssue);
      });
      k.accumulate(i0, i1, block, alpha, pf);
    }
    pf.issue_all();
  }
  for_rows(0, R, [&](int64_t r, int64_t j, int64_t i, int64_t h) {
    store_row<Kernel>(io.out + ((tile.row0 + i) * sh.num_heads + (kv.first + j) * G + h) * D, k.acc(r), 1.f / l[r], D);
  });
}

}  // namespace
}  // namespace kvserve::attention
