// Paged attention for short queries (decode), reading K/V in place from the block cache.
//
// For every query row of a request with q_len <= max_q_len and every KV head, one task walks the
// request's context in chunks of kChunk positions aligned to absolute position (K/V rows found
// through the block table) and keeps an online softmax (Milakov & Gimelshein 2018;
// FlashAttention's chunk-wise rescaling) in float32:
//
//     for chunk c = 0, 1, ...:  s = q . K[c] * scale      (valid positions of the chunk only)
//                               m' = max(m, max s);  a = exp(m - m')
//                               l  = l * a + sum exp(s - m');  acc = acc * a + sum exp(s - m') V[c]
//     out = acc / l
//
// A task reads only its own request's blocks and its reduction order is fixed by block position,
// so a request's result never depends on the rest of the batch (batch invariance). Padded or
// masked tokens are never read. Grouped-query heads sharing one KV head are done in one task so
// each K/V row is converted to float once.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#include <cmath>
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
inline void to_float<c10::BFloat16>(const c10::BFloat16* src, float* dst, int64_t n) {
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
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
}
inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
#endif

struct Task {
  int64_t row;       // query row in the flat batch
  int64_t request;   // request index
  int64_t position;  // absolute position of the query token
};

struct Shape {
  int64_t num_heads, group, head_dim, block_size, num_kv_heads, window;
  float scale;
};

// Scores of positions [start, end) for every head of the group: s[h][t - start] = q_h . k_t.
template <typename scalar_t>
void score_chunk(const float (*q)[kMaxHeadDim], float (*s)[kChunk], const scalar_t* key_cache,
                 const int32_t* block_table, int64_t kv_head, int64_t start, int64_t end, const Shape& sh) {
  float kf[kMaxHeadDim];
  const int64_t token_stride = sh.num_kv_heads * sh.head_dim;
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<scalar_t, double>) if (sh.head_dim % 16 == 0) {
    const int64_t nvec = sh.head_dim / 16;
    __m512 k[kMaxHeadDim / 16];
    for (int64_t t = start; t < end; ++t) {
      const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
      const scalar_t* row = key_cache + slot * token_stride + kv_head * sh.head_dim;
      for (int64_t j = 0; j < nvec; ++j) k[j] = load16(row + 16 * j);
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
    to_float(key_cache + slot * token_stride + kv_head * sh.head_dim, kf, sh.head_dim);
    for (int64_t h = 0; h < sh.group; ++h) s[h][t - start] = dot(q[h], kf, sh.head_dim);
  }
}

// acc[h] += sum over positions [start, end) of s[h][t - start] * V_t.
template <typename scalar_t>
void accumulate_chunk(const float (*s)[kChunk], float (*acc)[kMaxHeadDim], const scalar_t* value_cache,
                      const int32_t* block_table, int64_t kv_head, int64_t start, int64_t end, const Shape& sh) {
  const int64_t token_stride = sh.num_kv_heads * sh.head_dim, dim = sh.head_dim;
#if defined(__AVX512F__)
  if constexpr (!std::is_same_v<scalar_t, double>) if (dim % 16 == 0) {
    const int64_t nvec = dim / 16;
    __m512 v[kMaxHeadDim / 16];
    for (int64_t t = start; t < end; ++t) {
      const int64_t slot = static_cast<int64_t>(block_table[t / sh.block_size]) * sh.block_size + t % sh.block_size;
      const scalar_t* row = value_cache + slot * token_stride + kv_head * dim;
      for (int64_t j = 0; j < nvec; ++j) v[j] = load16(row + 16 * j);
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
    to_float(value_cache + slot * token_stride + kv_head * dim, vf, dim);
    for (int64_t h = 0; h < sh.group; ++h) {
      const float p = s[h][t - start];
      float* a = acc[h];
#pragma omp simd
      for (int64_t d = 0; d < dim; ++d) a[d] += p * vf[d];
    }
  }
}

template <typename scalar_t>
void attend_one(const Task& task, int64_t kv_head, const scalar_t* query, scalar_t* out, const scalar_t* key_cache,
                const scalar_t* value_cache, const int32_t* block_table, const Shape& sh) {
  float q[kMaxGroup][kMaxHeadDim], acc[kMaxGroup][kMaxHeadDim], s[kMaxGroup][kChunk];
  float m[kMaxGroup], l[kMaxGroup];
  const int64_t first_head = kv_head * sh.group, dim = sh.head_dim;
  for (int64_t h = 0; h < sh.group; ++h) {
    to_float(query + (task.row * sh.num_heads + first_head + h) * dim, q[h], dim);
    for (int64_t d = 0; d < dim; ++d) { q[h][d] *= sh.scale; acc[h][d] = 0.f; }
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.f;
  }
  const int64_t lo = sh.window > 0 ? std::max<int64_t>(0, task.position - sh.window + 1) : 0;
  const int64_t hi = task.position + 1;  // exclusive
  // Chunks are aligned to absolute positions (multiples of kChunk): the reduction order of a
  // request depends only on its own length.
  for (int64_t c = lo / kChunk; c * kChunk < hi; ++c) {
    const int64_t start = std::max(lo, c * kChunk), end = std::min(hi, (c + 1) * kChunk), n = end - start;
    score_chunk(q, s, key_cache, block_table, kv_head, start, end, sh);
    for (int64_t h = 0; h < sh.group; ++h) {
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

std::vector<Task> make_tasks(const torch::Tensor& query_start_loc, const torch::Tensor& seq_lens, int64_t max_q_len) {
  auto qsl = query_start_loc.accessor<int32_t, 1>();
  auto lens = seq_lens.accessor<int32_t, 1>();
  std::vector<Task> tasks;
  for (int64_t r = 0; r + 1 < qsl.size(0); ++r) {
    const int64_t q_len = qsl[r + 1] - qsl[r];
    if (q_len == 0 || q_len > max_q_len) continue;
    for (int64_t i = 0; i < q_len; ++i) tasks.push_back({qsl[r] + i, r, lens[r] - q_len + i});
  }
  return tasks;
}

}  // namespace

// out/query: [T, H, D]; kv_cache: [2, num_blocks, block_size, H_kv, D] (same dtype as query);
// block_tables: int32 [B, W]; seq_lens: int32 [B] and query_start_loc: int32 [B + 1], both on the
// CPU. Writes the rows of requests with 1 <= q_len <= max_q_len; other rows are left untouched.
void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache, torch::Tensor block_tables,
                     torch::Tensor seq_lens, torch::Tensor query_start_loc, double scale, int64_t window,
                     int64_t max_q_len) {
  TORCH_CHECK(query.is_contiguous() && out.is_contiguous() && kv_cache.is_contiguous() && block_tables.is_contiguous());
  TORCH_CHECK(query.scalar_type() == kv_cache.scalar_type() && out.scalar_type() == query.scalar_type());
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && seq_lens.scalar_type() == torch::kInt32 &&
              query_start_loc.scalar_type() == torch::kInt32);
  const int64_t num_heads = query.size(1), head_dim = query.size(2);
  const int64_t block_size = kv_cache.size(2), num_kv_heads = kv_cache.size(3);
  const int64_t group = num_heads / num_kv_heads;
  TORCH_CHECK(group * num_kv_heads == num_heads && group <= kMaxGroup && head_dim <= kMaxHeadDim &&
              kv_cache.size(4) == head_dim);
  const Shape shape{num_heads, group, head_dim, block_size, num_kv_heads, window, static_cast<float>(scale)};
  const std::vector<Task> tasks = make_tasks(query_start_loc, seq_lens, max_q_len);
  const int64_t width = block_tables.size(1);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, query.scalar_type(), "paged_attention", [&] {
    const scalar_t* q = query.data_ptr<scalar_t>();
    scalar_t* o = out.data_ptr<scalar_t>();
    const scalar_t* keys = kv_cache.data_ptr<scalar_t>();
    const scalar_t* values = keys + kv_cache.stride(0);
    const int32_t* tables = block_tables.data_ptr<int32_t>();
    const int64_t num_tasks = static_cast<int64_t>(tasks.size()) * num_kv_heads;
    at::parallel_for(0, num_tasks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const Task& task = tasks[i / num_kv_heads];
        attend_one<scalar_t>(task, i % num_kv_heads, q, o, keys, values, tables + task.request * width, shape);
      }
    });
  });
}
