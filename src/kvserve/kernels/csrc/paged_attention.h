// What the units of paged attention share: the limits, a layer's shape, a tile of query rows, the
// K/V rows a task prefetches ahead, the operands of a call, and the entry point of each kernel.
//   paged_attention.cpp           tiles, tasks, the choice of kernel, the library's entry points
//   paged_attention_walk.h        the online-softmax walk the three kernels share
//   paged_attention_portable.cpp  any dtype and shape, one query row at a time, K/V widened to float32
//   paged_attention_bf16.cpp      bfloat16 on AVX512-BF16 dot products, a tile of rows at a time
//   paged_attention_amx.cpp       bfloat16 on AMX tiles, a tile of rows (and KV heads) at a time
//   kv_fp8.h                      the fp8 cache codes and their decoding
// Plain data and declarations only: each kernel's code stays in its own unit (the AMX one compiled
// under its own target pragma).
#pragma once
#include <cstdint>

#include "abi.h"

namespace kvserve::attention {

constexpr int kMaxGroup = 16;    // query heads per KV head
constexpr int kMaxHeadDim = 256;
constexpr int64_t kTileRows = 8;  // query rows per tile
constexpr int64_t kChunkBf16 = 64;  // positions per chunk of the bfloat16 kernels (AVX512-BF16 and AMX)

struct Shape {
  int64_t num_heads, group, head_dim, block_size, num_kv_heads, window;
  float scale;
  int64_t row;  // cache elements per (token, KV head) row: head_dim, or head_dim + 4 (int8 + scale)
  bool amx;     // bfloat16 q and cache, head_dim % 32 == 0, on AMX tiles (paged_attention_amx.cpp)
  float softcap;       // > 0: scores soft-capped at softcap * tanh(s / softcap)
  const float* sinks;  // [num_heads] float32 sink logits, or nullptr
};

// Consecutive query rows of one request (a decode row alone, or up to kTileRows rows of a
// prefill chunk), attended together so that K/V rows read from the cache serve every row.
struct Tile {
  int64_t row0;       // first query row in the flat batch
  int64_t rows;       // 1 .. kTileRows
  int64_t request;    // request index
  int64_t position0;  // absolute position of row0 (row i sits at position0 + i)
};

// K/V rows a task asks for ahead of use: positions [from, to) of a request (its block table), KV
// heads [head, head + heads).
struct Upcoming {
  const int32_t* block_table;
  int64_t from, to, head, heads;
};

// The tensors of a call as one tile's kernel sees them.
template <typename scalar_t, typename cache_t>
struct Operands {
  const scalar_t* query;        // [T, H, D]
  scalar_t* out;                // [T, H, D]
  const cache_t* key_cache;     // [num_blocks, block_size, H_kv, row]
  const cache_t* value_cache;   // the same, for V
  const int32_t* block_table;   // the tile's request's block ids
};

// paged_attention_portable.cpp: the tile's rows one at a time for KV head kv_head (any dtype,
// float or one-byte cache); after: rows the thread's next task reads first, prefetched up front.
template <typename scalar_t, typename cache_t>
void attend_rows(const Tile& tile, int64_t kv_head, const Operands<scalar_t, cache_t>& io, const Shape& sh,
                 const Upcoming* after);

// paged_attention_bf16.cpp (AVX512-BF16 builds; bfloat16, head_dim % 32 == 0): the tile for KV
// head kv_head. prefetch_heads: KV heads [kv_head, kv_head + prefetch_heads) whose rows of the next
// chunk are prefetched while a chunk is computed (0: none, the task's first head asked for them
// already); after: rows prefetched during the last chunk (the thread's next task), or nullptr.
void attend_tile_bf16(const Tile& tile, int64_t kv_head, const Operands<BFloat16, BFloat16>& io, const Shape& sh,
                      int64_t prefetch_heads, const Upcoming* after);

// paged_attention_amx.cpp (AVX512-BF16 builds with AMX code; Shape::amx): a task's KV heads
// [first, first + heads) of the tile on AMX tiles; upcoming: the thread's next task's first rows,
// or nullptr. The thread's tiles are configured once (amx_configure) and released at the end of
// its parallel region (amx_release).
void attend_task_amx(const Tile& tile, int64_t first, int64_t heads, const Operands<BFloat16, BFloat16>& io,
                     const Shape& sh, const Upcoming* upcoming);
void amx_configure();
void amx_release();

}  // namespace kvserve::attention
