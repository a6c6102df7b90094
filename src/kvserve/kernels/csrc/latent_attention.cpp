// Multi-head latent attention over the compressed paged cache (DeepSeek-V2/V3;
// kvserve/attention/latent.py is the caller and documents the cache and the absorbed form).
//
// For every query token t of request r (position p = seq_len - q_len + i, so n = p + 1 visible
// rows) and head h, with q the absorbed query already times the softmax scale [H, W] and row_j the
// cached row j [W] (its first L values the latent, the values):
//
//     s[h][j]  = fma chain over k = 0 .. W-1 of q[h][k] * row_j[k]      (acc = 0; acc = fma(q, row, acc))
//     p[h]     = softmax_prefix_row(s[h], n)                            (elementwise.cpp)
//     out[h][c] = fma chain over j = 0 .. n-1 of p[h][j] * row_j[c]     (c < L)
//
// in float32 (a bfloat16 row widened exactly). These are the sequences of kvserve's invariant
// GEMM (linear.cpp) with the rows as its weight, followed by softmax_prefix_rows: the same bits as
// that composition (tests/model/test_deepseek.py checks them against it), without packing each
// request's rows as a weight per layer. A value depends only on its query, position and the cached
// rows it sees, never on the batch, the prompt's chunking or the thread count (batch invariance).
//
// Work: one task per query token (its heads together), rows read in place through the block table.
// Scores take kPositions rows at a time against 16 heads per vector (the query transposed to
// [W][heads]); the weighted sums take kHeadGroup heads against 16 latent columns per vector.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "simd.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve {
namespace {

#include "bf16_convert.h"

constexpr int64_t kLanes = 16;      // heads per score vector, latent columns per value vector
constexpr int64_t kPositions = 8;   // cached rows scored at once
constexpr int64_t kHeadGroup = 8;   // heads summed at once

struct Scratch {
  std::vector<float> query_t, rows, scores;
  std::vector<const char*> row_ptrs;
};

void widen(const char* row, DType dtype, float* dst, int64_t n) {
  if (dtype == kFloat32) {
    std::memcpy(dst, row, n * sizeof(float));
    return;
  }
  const BFloat16* src = reinterpret_cast<const BFloat16*>(row);
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

// scores[h * stride + j0 + jj] for the 16 heads from h0 and the kPositions widened rows in `rows`
// ([kPositions][W]); only the first `count` positions are stored.
void score_block(const float* query_t, int64_t heads_padded, int64_t h0, const float* rows, int64_t width,
                 int64_t count, int64_t heads, float* scores, int64_t stride, int64_t j0) {
  float lanes[kPositions][kLanes];
#if defined(__AVX512F__)
  __m512 acc[kPositions];
  for (int64_t jj = 0; jj < kPositions; ++jj) acc[jj] = _mm512_setzero_ps();
  for (int64_t k = 0; k < width; ++k) {
    const __m512 q = _mm512_loadu_ps(query_t + k * heads_padded + h0);
    for (int64_t jj = 0; jj < kPositions; ++jj) acc[jj] = _mm512_fmadd_ps(q, _mm512_set1_ps(rows[jj * width + k]), acc[jj]);
  }
  for (int64_t jj = 0; jj < kPositions; ++jj) _mm512_storeu_ps(lanes[jj], acc[jj]);
#else
  for (int64_t jj = 0; jj < kPositions; ++jj)
    for (int64_t l = 0; l < kLanes; ++l) lanes[jj][l] = 0.f;
  for (int64_t k = 0; k < width; ++k)
    for (int64_t jj = 0; jj < kPositions; ++jj) {
      const float r = rows[jj * width + k];
      for (int64_t l = 0; l < kLanes; ++l)
        lanes[jj][l] = std::fma(query_t[k * heads_padded + h0 + l], r, lanes[jj][l]);
    }
#endif
  const int64_t lanes_used = std::min(kLanes, heads - h0);
  for (int64_t jj = 0; jj < count; ++jj)
    for (int64_t l = 0; l < lanes_used; ++l) scores[(h0 + l) * stride + j0 + jj] = lanes[jj][l];
}

// out[(h0 + hh) * L + c0 ..] for NH heads and 16 columns from c0 (fewer where the latent ends):
// fma chains over the n rows in increasing j.
template <int64_t NH>
void value_block(const char* const* row_ptrs, DType dtype, int64_t n, const float* probs, int64_t stride, int64_t h0,
                 int64_t c0, int64_t latent, float* out) {
  const int64_t cols = std::min(kLanes, latent - c0);
#if defined(__AVX512F__)
  const __mmask16 mask = lanes(cols);
  __m512 acc[NH];
  for (int64_t hh = 0; hh < NH; ++hh) acc[hh] = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m512 v = dtype == kFloat32 ? load16(reinterpret_cast<const float*>(row_ptrs[j]) + c0, mask)
                                       : load16(reinterpret_cast<const BFloat16*>(row_ptrs[j]) + c0, mask);
    for (int64_t hh = 0; hh < NH; ++hh) acc[hh] = _mm512_fmadd_ps(_mm512_set1_ps(probs[(h0 + hh) * stride + j]), v, acc[hh]);
  }
  for (int64_t hh = 0; hh < NH; ++hh) _mm512_mask_storeu_ps(out + (h0 + hh) * latent + c0, mask, acc[hh]);
#else
  float acc[NH][kLanes] = {};
  float v[kLanes];
  for (int64_t j = 0; j < n; ++j) {
    widen(row_ptrs[j] + c0 * (dtype == kFloat32 ? 4 : 2), dtype, v, cols);
    for (int64_t hh = 0; hh < NH; ++hh) {
      const float p = probs[(h0 + hh) * stride + j];
      for (int64_t l = 0; l < cols; ++l) acc[hh][l] = std::fma(p, v[l], acc[hh][l]);
    }
  }
  for (int64_t hh = 0; hh < NH; ++hh)
    for (int64_t l = 0; l < cols; ++l) out[(h0 + hh) * latent + c0 + l] = acc[hh][l];
#endif
}

using ValueBlock = void (*)(const char* const*, DType, int64_t, const float*, int64_t, int64_t, int64_t, int64_t, float*);
constexpr ValueBlock kValueBlocks[kHeadGroup] = {value_block<1>, value_block<2>, value_block<3>, value_block<4>,
                                                 value_block<5>, value_block<6>, value_block<7>, value_block<8>};

// One query token: query [H, W] (scaled) -> out [H, L]; rows [0, n) of the request.
void attend_token(const float* query, const char* const* row_ptrs, int64_t n, DType dtype, int64_t heads,
                  int64_t width, int64_t latent, float* out, Scratch& s) {
  const int64_t heads_padded = (heads + kLanes - 1) / kLanes * kLanes;
  s.query_t.assign(static_cast<size_t>(width * heads_padded), 0.f);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t k = 0; k < width; ++k) s.query_t[k * heads_padded + h] = query[h * width + k];
  s.rows.resize(static_cast<size_t>(kPositions * width));
  s.scores.resize(static_cast<size_t>(heads * n));
  for (int64_t j0 = 0; j0 < n; j0 += kPositions) {
    const int64_t count = std::min(kPositions, n - j0);
    for (int64_t jj = 0; jj < kPositions; ++jj) {
      if (jj < count) {
        widen(row_ptrs[j0 + jj], dtype, s.rows.data() + jj * width, width);
      } else {
        std::fill_n(s.rows.data() + jj * width, width, 0.f);  // scored, never stored
      }
    }
    for (int64_t h0 = 0; h0 < heads; h0 += kLanes)
      score_block(s.query_t.data(), heads_padded, h0, s.rows.data(), width, count, heads, s.scores.data(), n, j0);
  }
  for (int64_t h = 0; h < heads; ++h) softmax_prefix_row(s.scores.data() + h * n, n, n);
  for (int64_t h0 = 0; h0 < heads; h0 += kHeadGroup) {
    const ValueBlock block = kValueBlocks[std::min(kHeadGroup, heads - h0) - 1];
    for (int64_t c0 = 0; c0 < latent; c0 += kLanes) block(row_ptrs, dtype, n, s.scores.data(), n, h0, c0, latent, out);
  }
}

}  // namespace

void latent_attention(float* out, const float* query, DType cache_dtype, const void* kv_cache,
                      const int32_t* block_tables, const int32_t* seq_lens, const int32_t* query_start_loc,
                      const LatentShape& shape) {
  const int64_t tokens = query_start_loc[shape.num_seqs], heads = shape.num_heads, width = shape.width;
  const int64_t row_bytes = width * (cache_dtype == kFloat32 ? 4 : 2);
  check(tokens <= shape.num_tokens, "latent_attention: query_start_loc runs past the query's tokens");
  std::vector<int32_t> request_of(static_cast<size_t>(tokens));
  for (int64_t r = 0; r < shape.num_seqs; ++r) {
    const int64_t q_len = query_start_loc[r + 1] - query_start_loc[r];
    check(q_len >= 0 && q_len <= seq_lens[r] && seq_lens[r] <= shape.table_width * shape.block_size,
          "latent_attention: each request needs 0 <= q_len <= seq_len <= its block table's positions");
    for (int64_t t = query_start_loc[r]; t < query_start_loc[r + 1]; ++t) request_of[t] = static_cast<int32_t>(r);
  }
  parallel_for(0, tokens, 1, [&](int64_t begin, int64_t end) {
    thread_local Scratch s;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t r = request_of[t];
      const int64_t n = seq_lens[r] - (query_start_loc[r + 1] - t) + 1;  // this token's position + 1
      const int32_t* table = block_tables + r * shape.table_width;
      s.row_ptrs.resize(static_cast<size_t>(n));
      for (int64_t j = 0; j < n; ++j) {
        const int64_t block = table[j / shape.block_size];
        check(block >= 0 && block < shape.num_blocks, "latent_attention: a block id outside the cache");
        s.row_ptrs[j] = static_cast<const char*>(kv_cache) + (block * shape.block_size + j % shape.block_size) * row_bytes;
      }
      attend_token(query + t * heads * width, s.row_ptrs.data(), n, cache_dtype, heads, width, shape.value_width,
                   out + t * heads * shape.value_width, s);
    }
  });
}

}  // namespace kvserve

#pragma GCC pop_options

extern "C" {

KVSERVE_EXPORT int kvserve_latent_attention(float* out, const float* query, int32_t cache_dtype, const void* kv_cache,
                                            const int32_t* block_tables, const int32_t* seq_lens,
                                            const int32_t* query_start_loc, int64_t num_tokens, int64_t num_heads,
                                            int64_t width, int64_t value_width, int64_t block_size, int64_t num_blocks,
                                            int64_t num_seqs, int64_t table_width) {
  return kvserve::guarded([&] {
    const kvserve::LatentShape shape{num_tokens, num_heads, width, value_width, block_size, num_blocks, num_seqs,
                                     table_width};
    kvserve::latent_attention(out, query, static_cast<kvserve::DType>(cache_dtype), kv_cache, block_tables, seq_lens,
                              query_start_loc, shape);
  });
}

}  // extern "C"
