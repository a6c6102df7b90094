// Paged attention, reading K/V in place from the block cache (decode rows and prefill chunks).
//
// Work is split into tasks of (tile, KV heads): a tile is up to kTileRows consecutive query rows of
// one request (a decode row is a tile of one); a task covers every KV head of its tile when there
// are tiles enough for the threads (a decode step at batch), else one. A task walks the request's context in chunks
// aligned to absolute positions (K/V rows found through the block table) and keeps an online
// softmax (Milakov & Gimelshein 2018; FlashAttention's chunk-wise rescaling, Dao et al. 2022) in
// float32 for every query head of the KV head's group:
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
// Three implementations of the same loop:
// - attend_tile_amx (bfloat16, head_dim % 32 == 0, CPUs with AMX-BF16 tiles where the process may
//   use them; KVSERVE_AMX=0: never): q.K and P.V on tiles with K and V read in place, every query
//   row of the tile (and of the task's KV heads) at once; see its section below;
// - attend_tile_bf16 (bfloat16, head_dim % 32 == 0, CPUs with AVX512-BF16): q.K with vdpbf16ps on
//   the raw bf16 values against K transposed per 16 positions, P rounded to bf16 for the P.V
//   product (as FlashAttention-2 does) with V rows interleaved in pairs of positions; the K/V
//   rows of a chunk are read and rearranged once for every row and head of the tile;
// - attend_one (any dtype and shape): one row at a time, K/V converted to float32.
// The AMX and vector paths round differently (bits differ in the last place between hosts with
// and without AMX, as for the linears); on one host each row takes one path whatever the batch.
// A row's chunks, their valid ranges and the order of every sum depend only on its position and
// the K/V values, never on the tile, the chunking of the prompt or the rest of the batch, so a
// row's result is bit-identical alone, in a prefill chunk or in any batch (batch invariance).
// A one-byte cache (--kv-cache-dtype int8 / fp8_e4m3 / fp8_e5m2, kvserve/attention/kv_quant.py)
// stores each (token, KV head) row as head_dim one-byte codes followed by its float32 scale;
// attend_one (generic and AVX-512 loops) widens a row in registers as float32(code) * scale (fp8
// codes through a 256-entry table), the product the reference backend's dequantization
// computes; no dequantized copy is made.
// Padded, masked and other requests' tokens are never read. Tasks are taken from a shared queue,
// costliest first, so causal prefill rows of uneven cost keep every thread busy. The bf16 path
// prefetches the next chunk's K/V rows (and, in a task's last chunk, the first rows of the
// thread's next task) a few lines at a time while it computes: blocks are scattered pages, where
// the hardware prefetchers stop, and the loads otherwise stalled on memory each chunk.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"
#include "amx_tiles.h"
#include "vector_exp.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int kMaxGroup = 16;    // query heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr int kChunk = 256;      // positions scored at once (a multiple of the block size)

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

// fp8 cache codes: one byte each, decoded through a table of the 256 values.
struct Fp8E4M3 { uint8_t bits; };
struct Fp8E5M2 { uint8_t bits; };

// float8_e4m3fn (no infinities; S.1111.111 is NaN) and float8_e5m2 (the upper byte of a float16).
inline float decode_e4m3(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 3) & 15, mantissa = b & 7;
  float v = exponent == 0 ? std::ldexp(mantissa / 8.f, -6)
            : (exponent == 15 && mantissa == 7) ? std::numeric_limits<float>::quiet_NaN()
                                                 : std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  return sign ? -v : v;
}
inline float decode_e5m2(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 2) & 31, mantissa = b & 3;
  float v = exponent == 0 ? std::ldexp(mantissa / 4.f, -14)
            : exponent == 31 ? (mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity())
                             : std::ldexp(1.f + mantissa / 4.f, exponent - 15);
  return sign ? -v : v;
}

template <typename code_t>
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int b = 0; b < 256; ++b)
      value[b] = std::is_same_v<code_t, Fp8E4M3> ? decode_e4m3(static_cast<uint8_t>(b)) : decode_e5m2(static_cast<uint8_t>(b));
  }
};
template <typename code_t>
const float* fp8_table() {
  static const Fp8Table<code_t> table;
  return table.value;
}

template <typename cache_t>
constexpr bool is_one_byte_v = std::is_same_v<cache_t, int8_t> || std::is_same_v<cache_t, Fp8E4M3> ||
                               std::is_same_v<cache_t, Fp8E5M2>;

// The float32 scale stored after the head_dim codes of a one-byte cache row (1 for float caches).
template <typename cache_t>
inline float row_scale(const cache_t* row, int64_t dim) {
  if constexpr (is_one_byte_v<cache_t>) {
    float s;
    __builtin_memcpy(&s, reinterpret_cast<const uint8_t*>(row) + dim, sizeof(s));
    return s;
  } else {
    return 1.f;
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

// exp(x) for x <= 0 (softmax arguments), branch-free so loops over it vectorize: 2^n * p(r) with
// x = n ln2 + r, |r| <= ln2 / 2, p a degree-6 Taylor polynomial (relative error < 3e-7);
// exp(x) underflows to exactly 0 below -87.
inline float exp_nonpositive(float x) {
  x = x < -87.f ? -87.f : x;
  const float n = __builtin_roundf(x * 1.44269504088896341f);
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

struct Task {
  int64_t row;       // query row in the flat batch
  int64_t request;   // request index
  int64_t position;  // absolute position of the query token
};

// Consecutive query rows of one request (a decode row alone, or up to kTileRows rows of a
// prefill chunk), attended together so that K/V rows read from the cache serve every row.
struct Tile {
  int64_t row0;       // first query row in the flat batch
  int64_t rows;       // 1 .. kTileRows
  int64_t request;    // request index
  int64_t position0;  // absolute position of row0 (row i sits at position0 + i)
};

constexpr int64_t kTileRows = 8;

struct Shape {
  int64_t num_heads, group, head_dim, block_size, num_kv_heads, window;
  float scale;
  int64_t row;  // cache elements per (token, KV head) row: head_dim, or head_dim + 4 (int8 + scale)
  bool amx;     // bfloat16 q and cache, head_dim % 32 == 0, on AMX tiles (attend_tile_amx)
  float softcap;       // > 0: scores soft-capped at softcap * tanh(s / softcap)
  const float* sinks;  // [num_heads] float32 sink logits, or nullptr
};

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

// Software prefetch into L2 of the K and V rows of KV heads [head, head + heads) at positions
// [from, to) of a request. A block's rows are contiguous but blocks are scattered, each one a new
// page where the hardware prefetchers stop; asking for the next chunk's rows while the current
// one is computed (and for the next task's first chunk while this task runs) hides the memory
// latency that otherwise stalls the K/V loads of every chunk.
// K/V rows a task asks for ahead of use: positions [from, to) of a request (its block table), KV
// heads [head, head + heads).
struct Upcoming {
  const int32_t* block_table;
  int64_t from, to, head, heads;
};

template <typename cache_t>
inline void prefetch_positions(const cache_t* key_cache, const cache_t* value_cache, const int32_t* block_table,
                               int64_t from, int64_t to, int64_t head, int64_t heads, const Shape& sh) {
  const int64_t token_bytes = sh.num_kv_heads * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const int64_t offset = head * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const int64_t bytes = heads * sh.row * static_cast<int64_t>(sizeof(cache_t));
  const char* keys = reinterpret_cast<const char*>(key_cache) + offset;
  const char* values = reinterpret_cast<const char*>(value_cache) + offset;
  for (int64_t t = from; t < to;) {
    const int64_t b = t / sh.block_size, off = t - b * sh.block_size, n = std::min(to - t, sh.block_size - off);
    const int64_t start = (static_cast<int64_t>(block_table[b]) * sh.block_size + off) * token_bytes;
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

template <typename scalar_t, typename cache_t>
void attend_one(const Task& task, int64_t kv_head, const scalar_t* query, scalar_t* out, const cache_t* key_cache,
                const cache_t* value_cache, const int32_t* block_table, const Shape& sh) {
  float q[kMaxGroup][kMaxHeadDim], acc[kMaxGroup][kMaxHeadDim], s[kMaxGroup][kChunk];
  float m[kMaxGroup], l[kMaxGroup];
  const int64_t first_head = kv_head * sh.group, dim = sh.head_dim;
  for (int64_t h = 0; h < sh.group; ++h) {
    to_float(query + (task.row * sh.num_heads + first_head + h) * dim, q[h], dim);
    for (int64_t d = 0; d < dim; ++d) { q[h][d] *= sh.scale; acc[h][d] = 0.f; }
    start_row(sh, first_head + h, m[h], l[h]);
  }
  const int64_t lo = sh.window > 0 ? std::max<int64_t>(0, task.position - sh.window + 1) : 0;
  const int64_t hi = task.position + 1;  // exclusive
  // Chunks are aligned to absolute positions (multiples of kChunk): the reduction order of a
  // request depends only on its own length.
  for (int64_t c = lo / kChunk; c * kChunk < hi; ++c) {
    const int64_t start = std::max(lo, c * kChunk), end = std::min(hi, (c + 1) * kChunk), n = end - start;
    score_chunk(q, s, key_cache, block_table, kv_head, start, end, sh);
    for (int64_t h = 0; h < sh.group; ++h) {
      soft_cap(s[h], n, sh.softcap);
      float chunk_max = s[h][0];
      for (int64_t t = 1; t < n; ++t) chunk_max = std::max(chunk_max, s[h][t]);
      const float new_max = std::max(m[h], chunk_max);
      const float alpha = exp_nonpositive(m[h] - new_max);
      float sum = 0.f;
      float* sh_row = s[h];
#pragma omp simd reduction(+ : sum)
      for (int64_t t = 0; t < n; ++t) { sh_row[t] = exp_nonpositive(sh_row[t] - new_max); sum += sh_row[t]; }
      l[h] = l[h] * alpha + sum;
      m[h] = new_max;
      for (int64_t d = 0; d < dim; ++d) acc[h][d] *= alpha;
    }
    accumulate_chunk(s, acc, value_cache, block_table, kv_head, start, end, sh);
  }
  for (int64_t h = 0; h < sh.group; ++h) {
    scalar_t* dst = out + (task.row * sh.num_heads + first_head + h) * dim;
    const float inv = 1.f / l[h];
    for (int64_t d = 0; d < dim; ++d) dst[d] = static_cast<scalar_t>(acc[h][d] * inv);
  }
}


#if defined(__AVX512BF16__)
// ---------------------------------------------------------------------------------------------
// bfloat16 fast path (AVX512-BF16, head_dim % 32 == 0): q.K with vdpbf16ps on the raw bf16 values
// (products exact, float32 accumulation) against K transposed per 16-position group, so one
// instruction scores 16 positions for a pair of dimensions; P.V with vdpbf16ps on V rows
// interleaved in pairs of positions. Chunks of kChunkBf16 positions aligned to
// absolute positions; every operation a row sees (its chunks, their valid ranges, the order of
// each sum) depends only on its own position and K/V, never on the tile or the batch, so the
// result of a row is the same alone, in a prefill tile or in any batch.

constexpr int64_t kChunkBf16 = 64;

// The cache lines of the next chunk's K/V rows, prefetched into L2 a few at a time between pieces
// of the current chunk's work: hundreds of prefetches at once fill the core's miss buffers and
// stall it until memory answers; spread out, the transfers overlap the arithmetic.
struct PrefetchQueue {
  const char* rows_[2 * kChunkBf16];
  int64_t count = 0, next = 0, offset = 0, bytes = 64;
  void issue(int64_t n) {
    for (; n > 0 && next < count; --n) {
      __builtin_prefetch(rows_[next] + offset, 0, 2);
      offset += 64;
      if (offset >= bytes) { offset = 0; ++next; }
    }
  }
  void issue_all() { issue(1 << 30); }
  // Queue the rows of `rows` (at most kChunkBf16 positions).
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

alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

inline __m512bh load_bh(const void* p) { return (__m512bh)_mm512_loadu_si512(p); }

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

// prefetch_heads: KV heads [kv_head, kv_head + prefetch_heads) whose rows of the next chunk are
// prefetched while a chunk is computed (0: none, the task's first head asked for them already);
// after: rows prefetched during the last chunk (the thread's next task), or nullptr.
void attend_tile_bf16(const Tile& tile, int64_t kv_head, const kvserve::BFloat16* query, kvserve::BFloat16* out,
                      const kvserve::BFloat16* key_cache, const kvserve::BFloat16* value_cache, const int32_t* block_table,
                      const Shape& sh, int64_t prefetch_heads, const Upcoming* after) {
  constexpr int64_t C = kChunkBf16;
  const int64_t G = sh.group, D = sh.head_dim, nq = D / 32, nv = D / 16, R = tile.rows;
  const int64_t token_stride = sh.num_kv_heads * D;
  alignas(64) float s[kTileRows * kMaxGroup][C];
  // acc lanes follow the interleaved V layout (see below); un-permuted when written out.
  alignas(64) float acc[kTileRows * kMaxGroup][kMaxHeadDim];
  // V rows of positions (2k, 2k + 1) of the chunk interleaved per dimension, as vdpbf16ps pairs:
  // for each 32-dim block, 32 bf16 pairs of unpacklo then 32 of unpackhi.
  alignas(64) uint16_t vpairs[C / 2][2 * kMaxHeadDim];
  alignas(64) uint32_t ppairs[kMaxGroup][C / 2 + 16];  // + one vector of slack for the last group
  float alphas[kMaxGroup];
  // K of the chunk transposed per 16-position group: kt[group][p] holds the bf16 pair (2p, 2p + 1)
  // of the 16 positions, so q.K is one vdpbf16ps per pair of dimensions with q broadcast.
  alignas(64) __m512i kt[C / 16][kMaxHeadDim / 2];
  float m[kTileRows * kMaxGroup], l[kTileRows * kMaxGroup];
  const void* kptr[C];
  const void* vptr[C];
  int64_t lo[kTileRows], hi[kTileRows];
  for (int64_t i = 0; i < R; ++i) {
    const int64_t position = tile.position0 + i;
    lo[i] = sh.window > 0 ? std::max<int64_t>(0, position - sh.window + 1) : 0;
    hi[i] = position + 1;  // exclusive
  }
  for (int64_t r = 0; r < R * G; ++r) {
    start_row(sh, kv_head * G + r % G, m[r], l[r]);
    for (int64_t d = 0; d < D; ++d) acc[r][d] = 0.f;
  }
  const __m512 scale = _mm512_set1_ps(sh.scale);
  for (int64_t c = lo[0] / C; c * C < hi[R - 1]; ++c) {
    const int64_t cs = c * C, first = std::max(lo[0], cs), last = std::min(hi[R - 1], cs + C);  // [first, last)
    PrefetchQueue pf;
    if (prefetch_heads > 0 && cs + C < hi[R - 1])  // this tile's next chunk, heads [kv_head, kv_head + prefetch_heads)
      pf.fill(key_cache, value_cache, {block_table, cs + C, std::min(hi[R - 1], cs + 2 * C), kv_head, prefetch_heads}, sh);
    else if (after != nullptr && cs + C >= hi[R - 1])  // the last chunk: the next task's first rows
      pf.fill(key_cache, value_cache, *after, sh);
    // Row addresses of the chunk, one block-table lookup per block; zeros outside [first, last).
    for (int64_t t = cs; t < first; ++t) kptr[t - cs] = vptr[t - cs] = kZeroRow;
    for (int64_t t = last; t < cs + C; ++t) kptr[t - cs] = vptr[t - cs] = kZeroRow;
    for (int64_t t = first; t < last;) {
      const int64_t b = t / sh.block_size, off = t - b * sh.block_size, n = std::min(last - t, sh.block_size - off);
      const int64_t base = (static_cast<int64_t>(block_table[b]) * sh.block_size + off) * token_stride + kv_head * D;
      for (int64_t j = 0; j < n; ++j) {
        kptr[t - cs + j] = key_cache + base + j * token_stride;
        vptr[t - cs + j] = value_cache + base + j * token_stride;
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
        for (int j = 0; j < 16; ++j) rows[j] = _mm512_loadu_si512(static_cast<const kvserve::BFloat16*>(kptr[16 * g + j]) + 32 * z);
        transpose16x16(rows, cols);
        for (int j = 0; j < 16; ++j) kt[g][16 * z + j] = cols[j];
        pf.issue(8);
      }
    }
    for (int64_t i = 0; i < R; ++i) {
      const int64_t a = std::max(lo[i], cs), b = std::min(hi[i], cs + C);
      if (a >= b) continue;
      const int64_t g_begin = (a - cs) / 16 * 16, g_end = (b - cs + 15) / 16 * 16;  // 16-aligned cover of [a, b)
      // Scores of every head of row i for the 16-position groups covering [a, b) (positions
      // outside are computed on K rows or zeros and never used): one accumulation per head, over
      // the dimension pairs in order, up to 8 heads at once.
      const uint32_t* qrow = reinterpret_cast<const uint32_t*>(query + ((tile.row0 + i) * sh.num_heads + kv_head * G) * D);
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
      for (int64_t h = 0; h < G; ++h) {
        const int64_t r = i * G + h;
        // Online softmax over this chunk's valid scores; probabilities outside [a, b) set to 0.
        float* row = s[r] + (a - cs);
        const int64_t n = b - a;
        soft_cap(row, n, sh.softcap);
        // The maximum 16 lanes at a time (exact, so the same value as a scalar scan).
        __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
        for (int64_t t = 0; t < n; t += 16) {
          const __mmask16 mask = kvserve::lanes(n - t);
          vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(vmax, mask, row + t));
        }
        const float chunk_max = _mm512_reduce_max_ps(vmax);
        const float new_max = std::max(m[r], chunk_max);
        const float alpha = exp_nonpositive(m[r] - new_max);
        float sum = 0.f;
#pragma omp simd reduction(+ : sum)
        for (int64_t t = 0; t < n; ++t) { row[t] = exp_nonpositive(row[t] - new_max); sum += row[t]; }
        l[r] = l[r] * alpha + sum;
        m[r] = new_max;
        for (int64_t t = g_begin; t < a - cs; ++t) s[r][t] = 0.f;
        for (int64_t t = b - cs; t < g_end; ++t) s[r][t] = 0.f;
        // P as bf16 pairs of positions (2k, 2k + 1), as flash attention rounds P for the PV product.
        for (int64_t g = g_begin; g < g_end; g += 32) {
          const __m512 p0 = _mm512_load_ps(s[r] + g);
          const __m512 p1 = g + 16 < g_end ? _mm512_load_ps(s[r] + g + 16) : _mm512_setzero_ps();
          _mm512_storeu_si512(ppairs[h] + g / 2, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
        }
        alphas[h] = alpha;
        pf.issue(16);
      }
      // acc = acc * alpha + sum over pairs of (p_2k V_2k + p_2k+1 V_2k+1), in registers, for
      // several heads per V load.
      accumulate_pv(nv, G, acc[i * G], alphas, ppairs, vpairs, (a - cs) / 2, (b - cs + 1) / 2, pf);
    }
    pf.issue_all();
  }
  // acc lane order per 32-dim block: [unpacklo | unpackhi]; unpacklo holds dims 8L + 0..3 of each
  // 128-bit lane L, unpackhi dims 8L + 4..7.
  for (int64_t i = 0; i < R; ++i) {
    for (int64_t h = 0; h < G; ++h) {
      const int64_t r = i * G + h;
      kvserve::BFloat16* dst = out + ((tile.row0 + i) * sh.num_heads + kv_head * G + h) * D;
      const float inv = 1.f / l[r];
      for (int64_t d = 0; d < D; ++d) {
        const int64_t block = d / 32, lane = (d % 32) / 8, e = d % 8;
        const int64_t src = 32 * block + (e < 4 ? 0 : 16) + 4 * lane + e % 4;
        dst[d] = static_cast<kvserve::BFloat16>(acc[r][src] * inv);
      }
    }
  }
}

#if defined(KVSERVE_AMX_BUILD)
// ---------------------------------------------------------------------------------------------
// The same loop on AMX tiles (hosts where amx_linear_available(); amx_tiles.h), for every query
// row of the tile at once (row r = i * G + h: tile row i, head h of the KV head's group; R * G
// rows, in tiles of 16), with K and V read in place from the cache (a 16-position group of one
// block is 16 rows at the token stride: one tile):
//   scores   S^T[16 positions][16 rows] = K Q^T: A = the group's K rows (32 dims per tile), B = q
//            in AMX's pair form (qt, built once per task); each score sums its dims in TDPBF16PS
//            chunks of 32, in order, from zero; transposed in registers to S[row][position];
//   softmax  in float32 per row, 16 positions per vector (amx_softmax); P rounded to bfloat16;
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
// The bits differ from the vector path's (TDPBF16PS sums a 32-element chunk as two chains,
// even and odd elements, and the chunk's P.V is formed before it is scaled into acc).

constexpr int64_t kAmxRowsMax = kTileRows * kMaxGroup;  // query rows of a tile and KV head
constexpr int64_t kGroups = kChunkBf16 / 16;            // 16-position groups per chunk

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16")

// This thread's tiles: 16 rows of 64 bytes each (kvserve_amx::configure_tiles), and their
// release at the end of a parallel region.
void amx_configure() { kvserve_amx::configure_tiles(16); }
void amx_release() { _tile_release(); }

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

// The K and V rows of a 16-position group: 16 rows `stride` bytes apart.
struct GroupRows {
  const uint16_t* k;
  const uint16_t* v;
  int64_t stride;
};

// Scores of query rows [16 nt, 16 nt + rows) for the groups [g0, g1) of the chunk (at most 4):
// s[16 nt + n][16 g + j] = q_n . K_j, unscaled.
inline void amx_scores(const uint32_t* qt, int64_t nt, int64_t rows, int64_t nq, const GroupRows* grp, int64_t g0,
                       int64_t g1, float (*s)[kChunkBf16], PrefetchQueue& pf) {
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
    transpose16x16(in, out);
    for (int64_t n = 0; n < rows; ++n) _mm512_store_si512(s[16 * nt + n] + 16 * (g0 + g), out[n]);
    pf.issue(kIssue);
  }
}

// acc[16 nt + n] = fma(acc, alpha, P_n V) for the tile's rows n < rows that attend this chunk
// (valid), over the groups [g0, g1); acc lanes per 32-dim block: 16 even dims, then 16 odd.
inline void amx_pv(const uint32_t (*pe)[kChunkBf16], const uint32_t (*po)[kChunkBf16], int64_t nt, int64_t rows,
                   const GroupRows* grp, int64_t g0, int64_t g1, int64_t nq, const float* alpha, const bool* valid,
                   float (*acc)[kMaxHeadDim], PrefetchQueue& pf) {
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

// One chunk of the online softmax for one query row on the AMX path, in 16 lanes: the row's
// unscaled scores s[t - cs] for its valid positions [a, b) of the chunk (cs); m' = max(m, max of
// the chunk's scaled scores), l = l * alpha + sum of P; P = exp(scale * s - m') in bfloat16,
// widened to the pair forms pe (P, 0) and po (0, P) for the groups [g0, g1) (zeros outside
// [a, b)). Lane j of every vector holds the positions = j mod 16 and the groups are visited in
// order, so the sums run in one fixed order for a given (a, b). Returns alpha = exp(m - m').
inline float amx_softmax(const float* s, int64_t cs, int64_t a, int64_t b, int64_t g0, int64_t g1, float scale,
                         float softcap, float& m, float& l, uint32_t* pe, uint32_t* po) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i va = _mm512_set1_epi32(static_cast<int32_t>(a)), vb = _mm512_set1_epi32(static_cast<int32_t>(b));
  const __m512 vscale = _mm512_set1_ps(scale);
  __m512 v[kGroups];
  __mmask16 mask[kGroups];
  __m512 vmax = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t g = g0; g < g1; ++g) {
    const __m512i t = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(cs + 16 * g)), lane);
    mask[g] = _mm512_cmpge_epi32_mask(t, va) & _mm512_cmplt_epi32_mask(t, vb);
    v[g] = _mm512_mul_ps(_mm512_load_ps(s + 16 * g), vscale);
    if (softcap > 0.f) {
      alignas(64) float capped[16];
      _mm512_store_ps(capped, v[g]);
      soft_cap(capped, 16, softcap);
      v[g] = _mm512_load_ps(capped);
    }
    vmax = _mm512_mask_max_ps(vmax, mask[g], vmax, v[g]);
  }
  const float new_max = std::max(m, _mm512_reduce_max_ps(vmax));
  const float alpha = exp_nonpositive(m - new_max);
  const __m512 vnew = _mm512_set1_ps(new_max);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t g = g0; g < g1; ++g) {
    const __m512 p = _mm512_maskz_mov_ps(mask[g], kvserve::exp16(_mm512_sub_ps(v[g], vnew)));
    sum = _mm512_add_ps(sum, p);
    const __m512i bits = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(p));
    _mm512_store_si512(pe + 16 * g, bits);
    _mm512_store_si512(po + 16 * g, _mm512_slli_epi32(bits, 16));
  }
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = new_max;
  return alpha;
}

// Whether attend_tile_amx can take `heads` KV heads of a tile of `rows` query rows in one pass
// (its buffers: up to kAmxRowsMax query rows in whole tiles of 16 per head, kMaxHeadDim elements
// of K/V per token).
inline bool amx_heads_fit(int64_t heads, int64_t rows, const Shape& sh) {
  return heads * ((rows * sh.group + 15) / 16 * 16) <= kAmxRowsMax && heads * sh.head_dim <= kMaxHeadDim;
}

// attend_tile_bf16's loop on AMX tiles (see above) for KV heads [kv_head, kv_head + heads) at once
// (amx_heads_fit), so that a chunk's K and V token rows are read whole, each block's once; the
// rows of KV head j are the query rows [j * M16, j * M16 + R * G). prefetch: the next chunk's rows
// of these heads are prefetched while a chunk is computed; after: rows prefetched during the last
// chunk, or nullptr. The caller configured this thread's tiles (amx_configure).
void attend_tile_amx(const Tile& tile, int64_t kv_head, int64_t heads, const kvserve::BFloat16* query, kvserve::BFloat16* out,
                     const kvserve::BFloat16* key_cache, const kvserve::BFloat16* value_cache, const int32_t* block_table,
                     const Shape& sh, bool prefetch, const Upcoming* after) {
  constexpr int64_t C = kChunkBf16;
  const int64_t G = sh.group, D = sh.head_dim, nq = D / 32, R = tile.rows, M = R * G;
  const int64_t M16 = (M + 15) / 16 * 16, rows = heads * M16, NT = rows / 16, tiles_per_head = M16 / 16;
  const int64_t token_stride = sh.num_kv_heads * D, width = heads * D;  // width: K/V elements read per token
  alignas(64) float s[kAmxRowsMax][C];
  alignas(64) float acc[kAmxRowsMax][kMaxHeadDim];
  // q in AMX's pair form per tile of 16 rows: qt[nt][p][n] = dims (2p, 2p + 1) of row 16 nt + n.
  alignas(64) uint32_t qt[kAmxRowsMax * kMaxHeadDim / 2];
  // P of the chunk in bfloat16, widened to 32 bits: pe = (P, 0) pairs, po = (0, P) pairs.
  alignas(64) uint32_t pe[kAmxRowsMax][C];
  alignas(64) uint32_t po[kAmxRowsMax][C];
  alignas(64) uint16_t kcopy[kGroups][16 * kMaxHeadDim];  // groups that are not read in place
  alignas(64) uint16_t vcopy[kGroups][16 * kMaxHeadDim];
  GroupRows grp[kMaxHeadDim / 32][kGroups];  // [head][group]: heads * D <= kMaxHeadDim
  float m[kAmxRowsMax], l[kAmxRowsMax], alpha[kAmxRowsMax];
  bool valid[kAmxRowsMax];
  int64_t lo[kTileRows], hi[kTileRows];
  for (int64_t i = 0; i < R; ++i) {
    const int64_t position = tile.position0 + i;
    lo[i] = sh.window > 0 ? std::max<int64_t>(0, position - sh.window + 1) : 0;
    hi[i] = position + 1;  // exclusive
  }
  std::memset(qt, 0, rows * (D / 2) * 4);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = r / M16, local = r % M16;
    valid[r] = false;
    if (local >= M) {  // padding rows of a head's last tile: P = 0
      for (int64_t t = 0; t < C; ++t) pe[r][t] = po[r][t] = 0;
      continue;
    }
    const int64_t i = local / G, h = local % G;
    const uint32_t* q =
        reinterpret_cast<const uint32_t*>(query + ((tile.row0 + i) * sh.num_heads + (kv_head + j) * G + h) * D);
    uint32_t* dst = qt + (r / 16) * (D / 2) * 16 + r % 16;
    for (int64_t p = 0; p < D / 2; ++p) dst[16 * p] = q[p];
    start_row(sh, (kv_head + j) * G + h, m[r], l[r]);
    for (int64_t d = 0; d < D; ++d) acc[r][d] = 0.f;
  }
  for (int64_t c = lo[0] / C; c * C < hi[R - 1]; ++c) {
    const int64_t cs = c * C, first = std::max(lo[0], cs), last = std::min(hi[R - 1], cs + C);  // [first, last)
    const int64_t g0 = (first - cs) / 16, g1 = (last - cs + 15) / 16;
    PrefetchQueue pf;
    if (prefetch && cs + C < hi[R - 1])  // the next chunk
      pf.fill(key_cache, value_cache, {block_table, cs + C, std::min(hi[R - 1], cs + 2 * C), kv_head, heads}, sh);
    else if (after != nullptr && cs + C >= hi[R - 1])  // the last chunk: the next task's (or head's) first rows
      pf.fill(key_cache, value_cache, *after, sh);
    // Where each group's rows are: in place, or copied with zeros outside [first, last).
    for (int64_t g = g0; g < g1; ++g) {
      const int64_t p0 = cs + 16 * g, u = std::max(first, p0), v = std::min(last, p0 + 16);
      if (u == p0 && v == p0 + 16 && sh.block_size % 16 == 0) {
        const int64_t base = (static_cast<int64_t>(block_table[p0 / sh.block_size]) * sh.block_size + p0 % sh.block_size) *
                                 token_stride + kv_head * D;
        for (int64_t j = 0; j < heads; ++j)
          grp[j][g] = {reinterpret_cast<const uint16_t*>(key_cache + base + j * D),
                       reinterpret_cast<const uint16_t*>(value_cache + base + j * D), token_stride * 2};
        continue;
      }
      std::memset(kcopy[g], 0, 16 * width * 2);
      std::memset(vcopy[g], 0, 16 * width * 2);
      for (int64_t t = u; t < v; ++t) {
        const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
        std::memcpy(kcopy[g] + (t - p0) * width, key_cache + slot * token_stride + kv_head * D, width * 2);
        std::memcpy(vcopy[g] + (t - p0) * width, value_cache + slot * token_stride + kv_head * D, width * 2);
      }
      for (int64_t j = 0; j < heads; ++j) grp[j][g] = {kcopy[g] + j * D, vcopy[g] + j * D, width * 2};
    }
    for (int64_t nt = 0; nt < NT; ++nt) {
      const int64_t local0 = (nt % tiles_per_head) * 16;
      amx_scores(qt, nt, std::min<int64_t>(16, M - local0), nq, grp[nt / tiles_per_head], g0, g1, s, pf);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t local = r % M16;
      if (local >= M) continue;
      const int64_t i = local / G, a = std::max(lo[i], cs), b = std::min(hi[i], cs + C);
      valid[r] = a < b;
      if (valid[r]) alpha[r] = amx_softmax(s[r], cs, a, b, g0, g1, sh.scale, sh.softcap, m[r], l[r], pe[r], po[r]);
      else for (int64_t g = g0; g < g1; ++g) {
        _mm512_store_si512(pe[r] + 16 * g, _mm512_setzero_si512());
        _mm512_store_si512(po[r] + 16 * g, _mm512_setzero_si512());
      }
      pf.issue(kIssue);
    }
    for (int64_t nt = 0; nt < NT; ++nt) {
      const int64_t local0 = (nt % tiles_per_head) * 16;
      amx_pv(pe, po, nt, std::min<int64_t>(16, M - local0), grp[nt / tiles_per_head], g0, g1, nq, alpha, valid, acc, pf);
    }
    pf.issue_all();
  }
  // acc lanes per 32-dim block: the 16 even dims, then the 16 odd ones.
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t j = r / M16, local = r % M16;
    if (local >= M) continue;
    const int64_t i = local / G, h = local % G;
    kvserve::BFloat16* dst = out + ((tile.row0 + i) * sh.num_heads + (kv_head + j) * G + h) * D;
    const float inv = 1.f / l[r];
    for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<kvserve::BFloat16>(acc[r][32 * (d / 32) + 16 * (d % 2) + (d % 32) / 2] * inv);
  }
}

#pragma GCC pop_options
#endif  // KVSERVE_AMX_BUILD
#endif  // __AVX512BF16__

// Tiles of up to kTileRows consecutive rows per request with 1 <= q_len <= max_q_len, costliest
// (most positions to attend) first so the work queue ends with small tasks.
// The metadata comes from the runner; a bad one must fail the call, not read or write elsewhere:
// query_start_loc non-decreasing within [0, tokens], and no request with more query rows than tokens.
std::vector<Tile> make_tiles(const int32_t* qsl, const int32_t* lens, int64_t num_seqs, int64_t tokens,
                             int64_t max_q_len) {
  kvserve::check(num_seqs == 0 || (qsl[0] >= 0 && qsl[num_seqs] <= tokens),
                 "paged_attention: query_start_loc outside the " + std::to_string(tokens) + " query rows");
  std::vector<Tile> tiles;
  for (int64_t r = 0; r < num_seqs; ++r) {
    const int64_t q_len = qsl[r + 1] - qsl[r];
    kvserve::check(q_len >= 0 && lens[r] >= q_len, "paged_attention: request " + std::to_string(r) + " has " +
                                                       std::to_string(q_len) + " query rows and seq_len " +
                                                       std::to_string(lens[r]));
    if (q_len == 0 || q_len > max_q_len) continue;
    for (int64_t i = 0; i < q_len; i += kTileRows)
      tiles.push_back({qsl[r] + i, std::min(kTileRows, q_len - i), r, lens[r] - q_len + i});
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) {
    return x.rows * (x.position0 + x.rows) > y.rows * (y.position0 + y.rows);
  });
  return tiles;
}

// A bad block table (a scheduler or runner bug) raises here instead of reading outside the cache:
// every request with a tile must have seq_len <= W * block_size and block ids in [0, num_blocks)
// over its first ceil(seq_len / block_size) entries.
void check_block_tables(const std::vector<Tile>& tiles, const int32_t* tables, const int32_t* lens, int64_t width,
                        int64_t block_size, int64_t num_blocks) {
  using std::to_string;
  int64_t checked = -1;
  for (const Tile& tile : tiles) {
    if (tile.request == checked) continue;
    checked = tile.request;
    const int64_t used = (static_cast<int64_t>(lens[tile.request]) + block_size - 1) / block_size;
    kvserve::check(lens[tile.request] >= 0 && used <= width,
                   "paged_attention: request " + to_string(tile.request) + " has " + to_string(lens[tile.request]) +
                       " tokens, its block table holds " + to_string(width * block_size));
    const int32_t* table = tables + tile.request * width;
    for (int64_t j = 0; j < used; ++j)
      kvserve::check(table[j] >= 0 && table[j] < num_blocks,
                     "paged_attention: request " + to_string(tile.request) + " block " + to_string(j) + " is " +
                         to_string(table[j]) + ", not in [0, " + to_string(num_blocks) + ")");
  }
}

// One tile for one KV head: the bfloat16 fast path where it applies, else row by row.
template <typename scalar_t, typename cache_t>
void run_tile(const Tile& tile, int64_t kv_head, const scalar_t* query, scalar_t* out, const cache_t* key_cache,
              const cache_t* value_cache, const int32_t* block_table, const Shape& sh, int64_t prefetch_heads,
              const Upcoming* after) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, kvserve::BFloat16> && std::is_same_v<cache_t, kvserve::BFloat16>) {
    if (sh.head_dim % 32 == 0) {
      attend_tile_bf16(tile, kv_head, query, out, key_cache, value_cache, block_table, sh, prefetch_heads, after);
      return;
    }
  }
#endif
  if (after != nullptr)
    prefetch_positions(key_cache, value_cache, after->block_table, after->from, after->to, after->head, after->heads, sh);
  for (int64_t r = 0; r < tile.rows; ++r)
    attend_one<scalar_t, cache_t>({tile.row0 + r, tile.request, tile.position0 + r}, kv_head, query, out, key_cache,
                                  value_cache, block_table, sh);
}


// A task's KV heads [first, first + heads) on AMX tiles (bfloat16 only; see attend_tile_amx): in one
// pass where they fit, else one head at a time. Each pass prefetches its own next chunk as it
// goes, and in its last chunk the first rows of the next pass (or of the thread's next task,
// `upcoming`): its arithmetic is short, so the requests are spread over all of the work.
template <typename scalar_t, typename cache_t>
void run_tile_amx(const Tile& tile, int64_t first, int64_t heads, const scalar_t* query, scalar_t* out,
                  const cache_t* key_cache, const cache_t* value_cache, const int32_t* block_table, const Shape& sh,
                  const Upcoming* upcoming) {
#if defined(KVSERVE_AMX_BUILD) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, kvserve::BFloat16> && std::is_same_v<cache_t, kvserve::BFloat16>) {
    const int64_t per_pass = amx_heads_fit(heads, tile.rows, sh) ? heads : 1;
    const int64_t lo = sh.window > 0 ? std::max<int64_t>(0, tile.position0 - sh.window + 1) : 0;
    for (int64_t h = first; h < first + heads; h += per_pass) {
      const Upcoming next{block_table, lo, std::min(tile.position0 + tile.rows, (lo / kChunkBf16 + 1) * kChunkBf16),
                          h + per_pass, per_pass};
      const Upcoming* after = h + per_pass < first + heads ? &next : upcoming;
      attend_tile_amx(tile, h, per_pass, query, out, key_cache, value_cache, block_table, sh, true, after);
    }
    return;
  }
#endif
  // Not reached: Shape::amx is set for bfloat16 queries and caches only.
}

// A task is one tile for a run of KV heads: every KV head of the tile when there are tiles enough
// to keep the threads busy (a decode step at batch), so a task streams its request's blocks, whole
// token rows, once; else one KV head (a lone request still uses every thread). A row's result
// does not depend on which task computed it.
template <typename scalar_t, typename cache_t>
void run_tasks(const void* query, void* out, const void* kv_cache, int64_t cache_half, const int32_t* tables,
               int64_t width, const std::vector<Tile>& tiles, const Shape& shape) {
  const int64_t num_kv_heads = shape.num_kv_heads;
  const int64_t max_threads = kvserve::num_threads();
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  const int64_t heads_per_task = num_tiles >= 4 * max_threads ? num_kv_heads : 1;
  const int64_t tasks_per_tile = num_kv_heads / heads_per_task;
  const int64_t num_tasks = num_tiles * tasks_per_tile;
  // A shared work queue: tasks differ in cost (context lengths, causal prefill rows), so each
  // thread takes the next one when it is free instead of a fixed contiguous share. A thread
  // claims its next task before running the current one and prefetches that task's first chunk.
  std::atomic<int64_t> next{0};
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(max_threads, num_tasks));
  const scalar_t* q = static_cast<const scalar_t*>(query);
  scalar_t* o = static_cast<scalar_t*>(out);
  const cache_t* keys = static_cast<const cache_t*>(kv_cache);
  const cache_t* values = keys + cache_half;
  // The first rows of task i (up to the end of its first 64-position chunk).
  auto first_rows = [&](int64_t i) -> Upcoming {
    const Tile& tile = tiles[i / tasks_per_tile];
    const int64_t lo = shape.window > 0 ? std::max<int64_t>(0, tile.position0 - shape.window + 1) : 0;
    const int64_t hi = std::min(tile.position0 + tile.rows, (lo / 64 + 1) * 64);
    return {tables + tile.request * width, lo, hi, (i % tasks_per_tile) * heads_per_task, heads_per_task};
  };
  kvserve::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    int64_t i = next.fetch_add(1);
    bool tiles_configured = false;  // this thread's AMX tiles (amx_configure)
    while (i < num_tasks) {
      const int64_t j = next.fetch_add(1);
      const Upcoming upcoming = j < num_tasks ? first_rows(j) : Upcoming{};
      const Tile& tile = tiles[i / tasks_per_tile];
#if defined(KVSERVE_AMX_BUILD) && defined(__AVX512BF16__)
      if (shape.amx && !tiles_configured) {
        amx_configure();
        tiles_configured = true;
      }
#endif
      const int64_t first_head = (i % tasks_per_tile) * heads_per_task, last_head = first_head + heads_per_task - 1;
      if (shape.amx) {
        run_tile_amx(tile, first_head, heads_per_task, q, o, keys, values, tables + tile.request * width, shape,
                     j < num_tasks ? &upcoming : nullptr);
      } else {
        for (int64_t h = first_head; h <= last_head; ++h)
          run_tile<scalar_t, cache_t>(tile, h, q, o, keys, values, tables + tile.request * width, shape,
                                      h == first_head ? heads_per_task : 0,
                                      h == last_head && j < num_tasks ? &upcoming : nullptr);
      }
      i = j;
    }
#if defined(KVSERVE_AMX_BUILD) && defined(__AVX512BF16__)
    if (tiles_configured) amx_release();
#endif
  });
}

}  // namespace

namespace kvserve {

// out/query: [T, H, D]; kv_cache: [2, num_blocks, block_size, H_kv, D] in query's dtype, or int8 /
// fp8 [..., D + 4] (each row's float32 scale after its values); block_tables: int32 [B, W];
// seq_lens: int32 [B] and query_start_loc: int32 [B + 1]. Writes the rows of requests with
// 1 <= q_len <= max_q_len; other rows are left untouched.
void paged_attention(void* out, const void* query, DType dtype, const void* kv_cache, DType cache_dtype,
                     const int32_t* block_tables, const int32_t* seq_lens, const int32_t* query_start_loc,
                     const AttentionShape& s, double scale, int64_t window, int64_t max_q_len, int64_t amx,
                     double softcap, const float* sinks) {
  const bool one_byte = cache_dtype == kInt8 || cache_dtype == kFp8E4M3 || cache_dtype == kFp8E5M2;
  check(one_byte || cache_dtype == dtype, "paged_attention: the cache holds another dtype than the query");
  const int64_t group = s.num_heads / s.num_kv_heads;
  const int64_t row = one_byte ? s.head_dim + 4 : s.head_dim;
  check(group * s.num_kv_heads == s.num_heads && group <= kMaxGroup && s.head_dim <= kMaxHeadDim,
        "paged_attention: unsupported heads / head_dim");
  // AMX tiles for bfloat16 (amx: -1 where this host has them, 0 never, 1 required).
  const bool amx_shape = dtype == kBFloat16 && cache_dtype == kBFloat16 && s.head_dim % 32 == 0;
  check(amx != 1 || amx_linear_available(), "paged_attention: amx=1 but this CPU / process has no AMX-BF16 tiles");
  bool use_amx = amx != 0 && amx_shape && amx_linear_available();
#if !defined(__AVX512BF16__)
  use_amx = false;  // built without AVX512-BF16: the AMX path is not compiled
#endif
  check(softcap >= 0.0, "paged_attention: softcap must be >= 0");
  const Shape shape{s.num_heads, group, s.head_dim, s.block_size, s.num_kv_heads, window, static_cast<float>(scale),
                    row, use_amx, static_cast<float>(softcap), sinks};
  const std::vector<Tile> tiles = make_tiles(query_start_loc, seq_lens, s.num_seqs, s.num_tokens, max_q_len);
  check_block_tables(tiles, block_tables, seq_lens, s.table_width, s.block_size, s.num_blocks);
  const int64_t half = s.num_blocks * s.block_size * s.num_kv_heads * row;  // K to V, in cache elements
  auto run = [&](auto tag) {
    using scalar_t = decltype(tag);
    if (cache_dtype == kInt8) {
      run_tasks<scalar_t, int8_t>(query, out, kv_cache, half, block_tables, s.table_width, tiles, shape);
    } else if (cache_dtype == kFp8E4M3) {
      run_tasks<scalar_t, Fp8E4M3>(query, out, kv_cache, half, block_tables, s.table_width, tiles, shape);
    } else if (cache_dtype == kFp8E5M2) {
      run_tasks<scalar_t, Fp8E5M2>(query, out, kv_cache, half, block_tables, s.table_width, tiles, shape);
    } else {
      run_tasks<scalar_t, scalar_t>(query, out, kv_cache, half, block_tables, s.table_width, tiles, shape);
    }
  };
  if (dtype == kFloat32) {
    run(float{});
  } else if (dtype == kBFloat16) {
    run(BFloat16{});
  } else {
    run(Half{});
  }
}

// key/value: [T, H_kv, D] (strides per token and head, unit stride in D; a view into the fused qkv
// output is fine) stored at slot_mapping (int64 [T]) of kv_cache [2, num_slots, H_kv, D] of the
// same dtype: the rows copied as they are (torch's index_copy_ did the same in two calls of ~30 us
// each at 64 rows, mostly fixed cost).
void write_kv_cache(const void* key, int64_t key_token_stride, int64_t key_head_stride, const void* value,
                    int64_t value_token_stride, int64_t value_head_stride, int64_t tokens, int64_t heads, int64_t dim,
                    int64_t element_size, void* kv_cache, int64_t num_slots, const int64_t* slot) {
  for (int64_t t = 0; t < tokens; ++t) check(slot[t] >= 0 && slot[t] < num_slots, "slot out of range");
  const int64_t es = element_size, bytes = dim * es, row = heads * bytes;
  char* keys = static_cast<char*>(kv_cache);
  char* values = keys + num_slots * row;
  const char* k = static_cast<const char*>(key);
  const char* v = static_cast<const char*>(value);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      std::memcpy(keys + slot[t] * row + h * bytes, k + (t * key_token_stride + h * key_head_stride) * es, bytes);
      std::memcpy(values + slot[t] * row + h * bytes, v + (t * value_token_stride + h * value_head_stride) * es, bytes);
    }
  }
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int kvserve_paged_attention(void* out, const void* query, int32_t dtype, const void* kv_cache,
                                           int32_t cache_dtype, const int32_t* block_tables, const int32_t* seq_lens,
                                           const int32_t* query_start_loc, int64_t num_tokens, int64_t num_heads,
                                           int64_t head_dim,
                                           int64_t num_kv_heads, int64_t block_size, int64_t num_blocks,
                                           int64_t num_seqs, int64_t table_width, double scale, int64_t window,
                                           int64_t max_q_len, int64_t amx, double softcap, const float* sinks) {
  return kvserve::guarded([&] {
    const kvserve::AttentionShape shape{num_tokens, num_heads, head_dim, num_kv_heads, block_size, num_blocks, num_seqs,
                                        table_width};
    kvserve::paged_attention(out, query, static_cast<kvserve::DType>(dtype), kv_cache,
                             static_cast<kvserve::DType>(cache_dtype), block_tables, seq_lens, query_start_loc, shape,
                             scale, window, max_q_len, amx, softcap, sinks);
  });
}

KVSERVE_EXPORT int kvserve_write_kv_cache(const void* key, int64_t key_token_stride, int64_t key_head_stride,
                                          const void* value, int64_t value_token_stride, int64_t value_head_stride,
                                          int64_t tokens, int64_t heads, int64_t dim, int64_t element_size,
                                          void* kv_cache, int64_t num_slots, const int64_t* slot_mapping) {
  return kvserve::guarded([&] {
    kvserve::write_kv_cache(key, key_token_stride, key_head_stride, value, value_token_stride, value_head_stride,
                            tokens, heads, dim, element_size, kv_cache, num_slots, slot_mapping);
  });
}

}  // extern "C"
