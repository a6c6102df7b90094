// The portable paged-attention kernel (any query dtype, float or one-byte cache, any head_dim):
// one query row at a time, chunks of 256 positions, q.K and P.V in float32 on K/V rows widened as
// they are read (bfloat16 by a shift, float16 by conversion; a one-byte cache row as
// float32(code) * scale, kv_one_byte.h), with AVX-512 loops for head_dim % 16 == 0 where the
// build has them. The walk is paged_attention_walk.h's; this file supplies how a chunk is scored
// and how P.V is accumulated.
#include "abi.h"
#include "kv_one_byte.h"
#include "paged_attention.h"
#include "paged_attention_walk.h"
#include "simd.h"

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kvserve::attention {
namespace {

constexpr int kChunk = 256;  // positions scored at once (a multiple of the block size)

template <typename scalar_t>
inline void to_float(const scalar_t* src, float* dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// bfloat16 -> float is a 16-bit shift; written on the raw bits so the loop vectorizes.
template <>
inline void to_float<kvserve::BFloat16>(const kvserve::BFloat16* src, float* dst, int64_t n) {
  // memcpy, not a pointer cast: writing floats through a uint32_t* breaks strict aliasing and
  // -O3 then reads stale values.
  const uint16_t* bits = reinterpret_cast<const uint16_t*>(src);  // char-like read of the raw bits
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t word = static_cast<uint32_t>(bits[i]) << 16;
    float value;
    __builtin_memcpy(&value, &word, sizeof(value));
    dst[i] = value;
  }
}

// One cache row as float32: converted (float caches) or float32(code) * scale (one-byte caches).
template <typename cache_t>
inline void row_to_float(const cache_t* src, float* dst, int64_t n) {
  if constexpr (std::is_same_v<cache_t, int8_t>) {
    const float s = row_scale(src, n);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]) * s;
  } else if constexpr (is_one_byte_v<cache_t>) {
    const float s = row_scale(src, n);
    const float* table = fp8_table<cache_t>();
    for (int64_t i = 0; i < n; ++i) dst[i] = table[src[i].bits] * s;
  } else {
    to_float(src, dst, n);
  }
}

inline float dot(const float* a, const float* b, int64_t n) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) s += a[i] * b[i];
  return s;
}

#if defined(__AVX512F__)
// AVX-512 inner loops for head_dim % 16 == 0 (every model here): one K/V row is head_dim / 16
// registers, converted once and used by every query head of the group.
using kvserve::load16;
template <typename cache_t>
inline void load_row16(const cache_t* row, int64_t nvec, int64_t dim, __m512* out) {
  if constexpr (std::is_same_v<cache_t, int8_t>) {
    const __m512 scale = _mm512_set1_ps(row_scale(row, dim));
    for (int64_t j = 0; j < nvec; ++j) out[j] = load16(row + 16 * j, scale);
  } else if constexpr (is_one_byte_v<cache_t>) {  // fp8: 16 table lookups per vector
    const __m512 scale = _mm512_set1_ps(row_scale(row, dim));
    const float* table = fp8_table<cache_t>();
    for (int64_t j = 0; j < nvec; ++j) {
      const __m512i codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 16 * j)));
      out[j] = _mm512_mul_ps(_mm512_i32gather_ps(codes, table, 4), scale);
    }
  } else {
    for (int64_t j = 0; j < nvec; ++j) out[j] = load16(row + 16 * j);
  }
}
#endif

// Scores of positions [start, end) for every head of the group: s[h][t - start] = q_h . k_t.
template <typename scalar_t>
void score_chunk(const float (*q)[kMaxHeadDim], float (*s)[kChunk], const scalar_t* key_cache,
                 const int32_t* block_table, int64_t kv_head, int64_t start, int64_t end, const Shape& sh) {
  float kf[kMaxHeadDim];
  const int64_t token_stride = sh.num_kv_heads * sh.row;
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<scalar_t, double>) if (sh.head_dim % 16 == 0) {
    const int64_t nvec = sh.head_dim / 16;
    __m512 k[kMaxHeadDim / 16];
    for (int64_t t = start; t < end; ++t) {
      const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
      const scalar_t* row = key_cache + slot * token_stride + kv_head * sh.row;
      load_row16(row, nvec, sh.head_dim, k);
      for (int64_t h = 0; h < sh.group; ++h) {
        __m512 a = _mm512_mul_ps(_mm512_loadu_ps(q[h]), k[0]);
        for (int64_t j = 1; j < nvec; ++j) a = _mm512_fmadd_ps(_mm512_loadu_ps(q[h] + 16 * j), k[j], a);
        s[h][t - start] = _mm512_reduce_add_ps(a);
      }
    }
    return;
  }
#endif
  for (int64_t t = start; t < end; ++t) {
    const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
    row_to_float(key_cache + slot * token_stride + kv_head * sh.row, kf, sh.head_dim);
    for (int64_t h = 0; h < sh.group; ++h) s[h][t - start] = dot(q[h], kf, sh.head_dim);
  }
}

// acc[h] += sum over positions [start, end) of s[h][t - start] * V_t.
template <typename scalar_t>
void accumulate_chunk(const float (*s)[kChunk], float (*acc)[kMaxHeadDim], const scalar_t* value_cache,
                      const int32_t* block_table, int64_t kv_head, int64_t start, int64_t end, const Shape& sh) {
  const int64_t token_stride = sh.num_kv_heads * sh.row, dim = sh.head_dim;
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<scalar_t, double>) if (dim % 16 == 0) {
    const int64_t nvec = dim / 16;
    __m512 v[kMaxHeadDim / 16];
    for (int64_t t = start; t < end; ++t) {
      const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
      const scalar_t* row = value_cache + slot * token_stride + kv_head * sh.row;
      load_row16(row, nvec, dim, v);
      for (int64_t h = 0; h < sh.group; ++h) {
        const __m512 p = _mm512_set1_ps(s[h][t - start]);
        for (int64_t j = 0; j < nvec; ++j)
          _mm512_storeu_ps(acc[h] + 16 * j, _mm512_fmadd_ps(p, v[j], _mm512_loadu_ps(acc[h] + 16 * j)));
      }
    }
    return;
  }
#endif
  float vf[kMaxHeadDim];
  for (int64_t t = start; t < end; ++t) {
    const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
    row_to_float(value_cache + slot * token_stride + kv_head * sh.row, vf, dim);
    for (int64_t h = 0; h < sh.group; ++h) {
      const float p = s[h][t - start];
      float* a = acc[h];
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) a[d] += p * vf[d];
    }
  }
}

// paged_attention_walk.h's kernel for a tile of one query row and one KV head: query row r is head
// r of the group; s[h][t - a] holds the score of position t of the chunk's valid range [a, b).
template <typename scalar_t_, typename cache_t_>
struct PortableKernel {
  using scalar_t = scalar_t_;
  using cache_t = cache_t_;
  using Queue = NoPrefetch;
  static constexpr int64_t kChunk = attention::kChunk, kBlockRows = 1, kRowAlign = 1, kMaxRows = kMaxGroup;

  const Tile& tile;
  int64_t kv_head;
  const Operands<scalar_t, cache_t>& io;
  const Shape& sh;
  // (a constructor, not aggregate initialization, which would zero every buffer below)
  PortableKernel(const Tile& tile, int64_t kv_head, const Operands<scalar_t, cache_t>& io, const Shape& sh)
      : tile(tile), kv_head(kv_head), io(io), sh(sh) {}
  alignas(64) float q[kMaxGroup][kMaxHeadDim];
  alignas(64) float acc_[kMaxGroup][kMaxHeadDim];
  alignas(64) float s[kMaxGroup][kChunk];

  float* acc(int64_t r) { return acc_[r]; }
  static int64_t lane(int64_t d) { return d; }
  void start() {  // q of every head, times the softmax scale
    const int64_t first_head = kv_head * sh.group, dim = sh.head_dim;
    for (int64_t h = 0; h < sh.group; ++h) {
      to_float(io.query + (tile.row0 * sh.num_heads + first_head + h) * dim, q[h], dim);
      for (int64_t d = 0; d < dim; ++d) q[h][d] *= sh.scale;
    }
  }
  void load(const Span&, Queue&) {}
  void score(int64_t, int64_t, const Span& block, Queue&) {
    score_chunk(q, s, io.key_cache, io.block_table, kv_head, block.a, block.b, sh);
  }
  float* scores(int64_t r, const Span&) { return s[r]; }
  float row_max(int64_t r, const Span& row) {
    float chunk_max = s[r][0];
    for (int64_t t = 1; t < row.b - row.a; ++t) chunk_max = std::max(chunk_max, s[r][t]);
    return chunk_max;
  }
  float exponentiate(int64_t r, const Span& row, float new_max) { return exp_row(s[r], row.b - row.a, new_max); }
  void skip(int64_t) {}  // not reached: a tile of one row
  void accumulate(int64_t, int64_t, const Span& block, const float* alpha, Queue&) {
    const int64_t dim = sh.head_dim;
    for (int64_t h = 0; h < sh.group; ++h)
      for (int64_t d = 0; d < dim; ++d) acc_[h][d] *= alpha[h];
    accumulate_chunk(s, acc_, io.value_cache, io.block_table, kv_head, block.a, block.b, sh);
  }
};

// Software prefetch into L2 of the K and V rows of KV heads [head, head + heads) at positions
// [from, to) of a request (the rows the thread's next task reads first).
template <typename cache_t>
inline void prefetch_positions(const cache_t* key_cache, const cache_t* value_cache, const Upcoming& rows,
                               const Shape& sh) {
  const int64_t token_bytes = sh.num_kv_heads * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const int64_t offset = rows.head * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const int64_t bytes = rows.heads * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const char* keys = reinterpret_cast<const char*>(key_cache) + offset;
  const char* values = reinterpret_cast<const char*>(value_cache) + offset;
  for (int64_t t = rows.from; t < rows.to;) {
    const int64_t b = t / sh.block_size, off = t - b * sh.block_size, n = std::min(rows.to - t, sh.block_size - off);
    const int64_t start = (static_cast<int64_t>(rows.block_table[b]) * sh.block_size + off) * token_bytes;
    for (int64_t j = 0; j < n; ++j) {
      const char* k = keys + start + j * token_bytes;
      const char* v = values + start + j * token_bytes;
      for (int64_t x = 0; x < bytes; x += 64) {
        __builtin_prefetch(k + x, 0, 2);
        __builtin_prefetch(v + x, 0, 2);
      }
      __builtin_prefetch(k + bytes - 1, 0, 2);
      __builtin_prefetch(v + bytes - 1, 0, 2);
    }
    t += n;
  }
}

}  // namespace

template <typename scalar_t, typename cache_t>
void attend_rows(const Tile& tile, int64_t kv_head, const Operands<scalar_t, cache_t>& io, const Shape& sh,
                 const Upcoming* after) {
  if (after != nullptr) prefetch_positions(io.key_cache, io.value_cache, *after, sh);
  for (int64_t r = 0; r < tile.rows; ++r) {
    const Tile row{tile.row0 + r, 1, tile.request, tile.position0 + r};
    PortableKernel<scalar_t, cache_t> kernel{row, kv_head, io, sh};
    attend_tile(kernel, row, {kv_head, 1}, sh, io, {0, nullptr});
  }
}

// Every (query dtype, cache dtype) pair paged_attention.cpp dispatches to.
#define KVSERVE_ATTEND_ROWS(scalar_t, cache_t)                                                                   \
  template void attend_rows<scalar_t, cache_t>(const Tile&, int64_t, const Operands<scalar_t, cache_t>&, \
                                               const Shape&, const Upcoming*);
#define KVSERVE_ATTEND_ROWS_ALL_CACHES(scalar_t) \
  KVSERVE_ATTEND_ROWS(scalar_t, scalar_t)        \
  KVSERVE_ATTEND_ROWS(scalar_t, int8_t)          \
  KVSERVE_ATTEND_ROWS(scalar_t, Fp8E4M3)         \
  KVSERVE_ATTEND_ROWS(scalar_t, Fp8E5M2)
KVSERVE_ATTEND_ROWS_ALL_CACHES(float)
KVSERVE_ATTEND_ROWS_ALL_CACHES(BFloat16)
KVSERVE_ATTEND_ROWS_ALL_CACHES(Half)
#undef KVSERVE_ATTEND_ROWS_ALL_CACHES
#undef KVSERVE_ATTEND_ROWS

}  // namespace kvserve::attention
