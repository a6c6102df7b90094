// Multi-LoRA apply for CPUs: y[t] += B_s (A_s x[t]) for each token t with its adapter slot s, all
// adapters of a batch in one call (the segmented "shrink" and "expand" of Punica's SGMV / S-LoRA,
// written for a CPU). Used by kvserve.lora.layers.LoRALinear.
//
//   x      [T, K]           activations (float32 or bfloat16), contiguous
//   y      [T, N]           the projection's output (x's dtype), updated in place
//   a      [slots, K, R]    A^T of every slot, R = shards * rank (shard j's columns j*rank ..)
//   b      [slots, rank, N] B^T of every slot (scaling folded in); output column n belongs to the
//                           shard j with shard_offsets[j] <= n < shard_offsets[j+1] and reads h[j*rank ..]
//   order  [Ta]             the adapted tokens, grouped by slot (segment i = order[seg_starts[i] ..
//                           seg_starts[i+1]) runs with slot seg_slots[i])
//
// Tokens sharing an adapter are computed together, so each adapter's weights are read once per
// call; tokens of the base model are not touched. Every value is one fixed sequence of float32
// operations whatever the batch, the token's place in it and the thread count:
//
//   h[t][q] = round(sum_k x[t][k] * A^T_s[k][q])            k increasing, one multiply and one add per k
//   d       = round(sum_k h[t][j*rank + k] * B^T_s[k][n])   k increasing
//   y[t][n] = round(y[t][n] + d)                             (round: to x's dtype)
//
// so a request gets the same bits alone and in any mixed batch (the batch-invariance argument of
// linear.cpp). The loops vectorize across outputs (q, n), never across k; work is split by
// (segment, token block) for the shrink and (segment, column block) for the expand only.
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace {

#include "bf16_convert.h"

template <typename T>
inline void to_float_row(const T* __restrict src, float* __restrict dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

// 16 floats; GCC lowers it to one AVX-512 register, two AVX2 registers or portable code.
constexpr int64_t kV = 16;
typedef float vf __attribute__((vector_size(kV * sizeof(float))));
typedef uint32_t vu __attribute__((vector_size(kV * sizeof(uint32_t))));
typedef int32_t vi __attribute__((vector_size(kV * sizeof(int32_t))));
typedef uint16_t vh __attribute__((vector_size(kV * sizeof(uint16_t))));

inline vf load_v(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline vf load_v(const kvserve::BFloat16* p) {  // exact: a bfloat16 is the upper half of a float
  vh raw;
  std::memcpy(&raw, p, sizeof(raw));
  const vu word = __builtin_convertvector(raw, vu) << 16;
  vf v;
  std::memcpy(&v, &word, sizeof(v));
  return v;
}
inline void store_v(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }
inline void store_v(kvserve::BFloat16* p, vf v) {  // round to nearest even (NaN -> 0x7fc0), as from_float
  vu word;
  std::memcpy(&word, &v, sizeof(word));
  vu rounded = (word + 0x7fffu + ((word >> 16) & 1u)) >> 16;
  const vu nan = (vu)(v != v);
  rounded = (rounded & ~nan) | (0x7fc0u & nan);
  const vh bits = __builtin_convertvector(rounded, vh);
  std::memcpy(p, &bits, sizeof(bits));
}
// x rounded to act_t and widened back (the value an act_t tensor would hold).
template <typename act_t>
inline vf round_v(vf v) {
  if constexpr (std::is_same_v<act_t, float>) {
    return v;
  } else {
    kvserve::BFloat16 tmp[kV];
    store_v(tmp, v);
    return load_v(tmp);
  }
}

constexpr int64_t kTokenBlock = 8;     // tokens of one shrink work item
constexpr int64_t kColumnBlock = 256;  // output columns of one expand work item
constexpr int64_t kMaxRV = 16;         // most vectors of h per token (R <= 256)

// h rows [i0, i0 + count) of one segment: h[i][q] = round(sum_k x[i][k] * At[k][q]).
template <typename act_t, typename weight_t>
void shrink_block(const act_t* x, const weight_t* at, const int64_t* order, int64_t i0, int64_t count, int64_t K,
                  int64_t R, float* h, std::vector<float>& xs) {
  for (int64_t i = 0; i < count; ++i) to_float_row(x + order[i0 + i] * K, xs.data() + i * K, K);
  if (R % kV == 0 && R / kV <= kMaxRV) {
    const int64_t nv = R / kV;
    vf acc[kTokenBlock][kMaxRV];
    for (int64_t i = 0; i < count; ++i)
      for (int64_t v = 0; v < nv; ++v) acc[i][v] = vf{};
    for (int64_t k = 0; k < K; ++k) {
      vf w[kMaxRV];
      for (int64_t v = 0; v < nv; ++v) w[v] = load_v(at + k * R + v * kV);
      for (int64_t i = 0; i < count; ++i) {
        const vf xk = vf{} + xs[i * K + k];
        for (int64_t v = 0; v < nv; ++v) acc[i][v] = acc[i][v] + xk * w[v];
      }
    }
    for (int64_t i = 0; i < count; ++i)
      for (int64_t v = 0; v < nv; ++v) store_v(h + (i0 + i) * R + v * kV, round_v<act_t>(acc[i][v]));
    return;
  }
  std::vector<float> acc(static_cast<size_t>(count * R), 0.f);  // any R: the same sequence, scalar
  for (int64_t k = 0; k < K; ++k)
    for (int64_t i = 0; i < count; ++i)
      for (int64_t q = 0; q < R; ++q) acc[i * R + q] = acc[i * R + q] + xs[i * K + k] * to_float(at[k * R + q]);
  for (int64_t i = 0; i < count; ++i)
    for (int64_t q = 0; q < R; ++q) h[(i0 + i) * R + q] = to_float(from_float<act_t>(acc[i * R + q]));
}

// Columns [n0, n0 + cols) of one shard for the tokens of one segment: y += round(h_j Bt).
template <typename act_t, typename weight_t>
void expand_block(act_t* y, const weight_t* bt, const float* h, const int64_t* order, int64_t i_begin,
                  int64_t i_end, int64_t n0, int64_t cols, int64_t N, int64_t R, int64_t rank, int64_t shard_col,
                  std::vector<float>& w) {
  for (int64_t k = 0; k < rank; ++k) to_float_row(bt + k * N + n0, w.data() + k * kColumnBlock, cols);
  const int64_t full = cols / kV;
  for (int64_t i = i_begin; i < i_end; ++i) {
    const float* hi = h + i * R + shard_col;
    act_t* out = y + order[i] * N + n0;
    vf acc[kColumnBlock / kV];
    for (int64_t v = 0; v < full; ++v) acc[v] = vf{};
    for (int64_t k = 0; k < rank; ++k) {
      const vf hk = vf{} + hi[k];
      for (int64_t v = 0; v < full; ++v) acc[v] = acc[v] + hk * load_v(w.data() + k * kColumnBlock + v * kV);
    }
    for (int64_t v = 0; v < full; ++v) store_v(out + v * kV, round_v<act_t>(load_v(out + v * kV) + round_v<act_t>(acc[v])));
    for (int64_t c = full * kV; c < cols; ++c) {  // the tail, the same sequence per element
      float a = 0.f;
      for (int64_t k = 0; k < rank; ++k) a = a + hi[k] * w[k * kColumnBlock + c];
      out[c] = from_float<act_t>(to_float(out[c]) + to_float(from_float<act_t>(a)));
    }
  }
}

template <typename act_t, typename weight_t>
void lora_kernel(const act_t* x, act_t* y, const weight_t* a, const weight_t* b, const int64_t* order,
                 const int64_t* seg_starts, const int64_t* seg_slots, int64_t num_segments,
                 const int64_t* shard_offsets, int64_t num_shards, int64_t K, int64_t N, int64_t R, int64_t rank) {
  const int64_t num_adapted = seg_starts[num_segments];
  std::vector<float> h(static_cast<size_t>(num_adapted * R));
  // Shrink: items (segment, block of its tokens); A^T_s is streamed once per item.
  std::vector<int64_t> shrink_seg, shrink_first;
  for (int64_t seg = 0; seg < num_segments; ++seg)
    for (int64_t i = seg_starts[seg]; i < seg_starts[seg + 1]; i += kTokenBlock) {
      shrink_seg.push_back(seg);
      shrink_first.push_back(i);
    }
  const int64_t shrink_items = static_cast<int64_t>(shrink_seg.size());
  const int64_t shrink_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, K * R));
  kvserve::parallel_for(0, shrink_items, shrink_grain, [&](int64_t begin, int64_t end) {
    std::vector<float> xs(static_cast<size_t>(kTokenBlock * K));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seg = shrink_seg[item], i0 = shrink_first[item];
      shrink_block<act_t, weight_t>(x, a + seg_slots[seg] * K * R, order, i0,
                                    std::min(kTokenBlock, seg_starts[seg + 1] - i0), K, R, h.data(), xs);
    }
  });
  // Expand: items (segment, block of output columns within one shard).
  std::vector<int64_t> col_start, col_shard;
  for (int64_t j = 0; j < num_shards; ++j)
    for (int64_t n = shard_offsets[j]; n < shard_offsets[j + 1]; n += kColumnBlock) {
      col_start.push_back(n);
      col_shard.push_back(j);
    }
  const int64_t blocks = static_cast<int64_t>(col_start.size());
  const int64_t per_segment = std::max<int64_t>(1, num_adapted / num_segments);
  const int64_t expand_grain = std::max<int64_t>(1, 65536 / std::max<int64_t>(1, kColumnBlock * rank * per_segment));
  kvserve::parallel_for(0, num_segments * blocks, expand_grain, [&](int64_t begin, int64_t end) {
    std::vector<float> w(static_cast<size_t>(rank * kColumnBlock));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t seg = item / blocks, block = item % blocks, j = col_shard[block];
      const int64_t n0 = col_start[block], cols = std::min(kColumnBlock, shard_offsets[j + 1] - n0);
      expand_block<act_t, weight_t>(y, b + seg_slots[seg] * rank * N, h.data(), order, seg_starts[seg],
                                    seg_starts[seg + 1], n0, cols, N, R, rank, j * rank, w);
    }
  });
}

}  // namespace

#pragma GCC pop_options

namespace kvserve {

// See the file comment. x, y: float32 or bfloat16 (act_dtype); a, b: float32 or bfloat16
// (weight_dtype); order, seg_starts, seg_slots, shard_offsets: int64.
void lora_apply(DType act_dtype, DType weight_dtype, const LoraArgs& p) {
  if (p.num_segments == 0) return;
  // The index tensors come from the runner; a bad one must fail the call, not write elsewhere.
  check(p.seg_starts[0] >= 0 && p.seg_starts[p.num_segments] <= p.order_len, "lora_apply: seg_starts outside order");
  for (int64_t i = 0; i < p.num_segments; ++i) {
    check(p.seg_starts[i] <= p.seg_starts[i + 1], "lora_apply: seg_starts must not decrease");
    check(p.seg_slots[i] >= 0 && p.seg_slots[i] < p.num_slots, "lora_apply: a segment's slot is out of range");
  }
  for (int64_t i = p.seg_starts[0]; i < p.seg_starts[p.num_segments]; ++i)
    check(p.order[i] >= 0 && p.order[i] < p.tokens, "lora_apply: a token in order is out of range");
  check(p.shard_offsets[0] >= 0 && p.shard_offsets[p.num_shards] <= p.N, "lora_apply: shard_offsets outside N");
  for (int64_t j = 0; j < p.num_shards; ++j)
    check(p.shard_offsets[j] <= p.shard_offsets[j + 1], "lora_apply: shard_offsets must not decrease");
  auto run = [&](auto act_tag, auto weight_tag) {
    using act_t = decltype(act_tag);
    using weight_t = decltype(weight_tag);
    lora_kernel<act_t, weight_t>(static_cast<const act_t*>(p.x), static_cast<act_t*>(p.y),
                                 static_cast<const weight_t*>(p.a), static_cast<const weight_t*>(p.b), p.order,
                                 p.seg_starts, p.seg_slots, p.num_segments, p.shard_offsets, p.num_shards, p.K, p.N,
                                 p.R, p.rank);
  };
  const bool act_bf16 = act_dtype == kBFloat16, weight_bf16 = weight_dtype == kBFloat16;
  if (act_bf16 && weight_bf16) run(BFloat16{}, BFloat16{});
  else if (act_bf16) run(BFloat16{}, float{});
  else if (weight_bf16) run(float{}, BFloat16{});
  else run(float{}, float{});
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_lora_apply(int32_t act_dtype, int32_t weight_dtype, const void* x, void* y,
                                                 const void* a, const void* b, const int64_t* order,
                                                 const int64_t* seg_starts, const int64_t* seg_slots,
                                                 const int64_t* shard_offsets, int64_t num_segments,
                                                 int64_t num_shards, int64_t K, int64_t N, int64_t R, int64_t rank,
                                                 int64_t tokens, int64_t order_len, int64_t num_slots) {
  return kvserve::guarded([&] {
    kvserve::lora_apply(static_cast<kvserve::DType>(act_dtype), static_cast<kvserve::DType>(weight_dtype),
                        kvserve::LoraArgs{x, y, a, b, order, seg_starts, seg_slots, shard_offsets, num_segments,
                                          num_shards, K, N, R, rank, tokens, order_len, num_slots});
  });
}
