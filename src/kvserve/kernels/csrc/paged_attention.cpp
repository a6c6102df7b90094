// Paged attention, reading K/V in place from the block cache (decode rows and prefill chunks):
// the work split into tasks, the choice of kernel, and the library's entry points.
//
// Work is split into tasks of (tile, KV heads): a tile is up to kTileRows consecutive query rows of
// one request (a decode row is a tile of one); a task covers every KV head of its tile when there
// are tiles enough for the threads (a decode step at batch), else one. A task walks the request's
// context in chunks aligned to absolute positions (K/V rows found through the block table) and
// keeps an online softmax in float32 for every query head of the KV head's group, with soft-capped
// scores and attention sinks where the layer has them (paged_attention_walk.h: the walk, written
// once for the three kernels).
//
// Three kernels supply how a chunk is scored and how P.V is accumulated:
// - AMX (paged_attention_amx.cpp; bfloat16, head_dim % 32 == 0, CPUs with AMX-BF16 tiles where the
//   process may use them; KVSERVE_AMX=0: never): q.K and P.V on tiles with K and V read in place,
//   every query row of the tile (and of the task's KV heads) at once;
// - AVX512-BF16 (paged_attention_bf16.cpp; bfloat16, head_dim % 32 == 0, CPUs with AVX512-BF16):
//   q.K with vdpbf16ps on the raw bf16 values against K transposed per 16 positions, P rounded to
//   bf16 for the P.V product (as FlashAttention-2 does) with V rows interleaved in pairs of
//   positions; the K/V rows of a chunk are read and rearranged once for every row and head of the tile;
// - portable (paged_attention_portable.cpp; any dtype and shape): one row at a time, K/V converted
//   to float32, int8 / fp8 caches (kv_one_byte.h) widened in registers.
// The AMX and vector paths round differently (bits differ in the last place between hosts with
// and without AMX, as for the linears); on one host each row takes one path whatever the batch.
// A row's result is bit-identical alone, in a prefill chunk or in any batch (batch invariance).
// Padded, masked and other requests' tokens are never read. Tasks are taken from a shared queue,
// costliest first, so causal prefill rows of uneven cost keep every thread busy. The bfloat16
// kernels prefetch the next chunk's K/V rows (and, in a task's last chunk, the first rows of the
// thread's next task) a few lines at a time while they compute: blocks are scattered pages, where
// the hardware prefetchers stop, and the loads otherwise stalled on memory each chunk.
#include "abi.h"
#include "amx_tiles.h"
#include "kernels.h"
#include "kv_one_byte.h"
#include "paged_attention.h"
#include "thread_pool.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace kvserve::attention {
namespace {

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

// One tile for one KV head: the AVX512-BF16 kernel where it applies, else row by row.
template <typename scalar_t, typename cache_t>
void run_tile(const Tile& tile, int64_t kv_head, const Operands<scalar_t, cache_t>& io, const Shape& sh,
              int64_t prefetch_heads, const Upcoming* after) {
#if defined(__AVX512BF16__)
  if constexpr (std::is_same_v<scalar_t, BFloat16> && std::is_same_v<cache_t, BFloat16>) {
    if (sh.head_dim % 32 == 0) {
      attend_tile_bf16(tile, kv_head, io, sh, prefetch_heads, after);
      return;
    }
  }
#endif
  attend_rows(tile, kv_head, io, sh, after);
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
    const int64_t hi = std::min(tile.position0 + tile.rows, (lo / kChunkBf16 + 1) * kChunkBf16);
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
      const Operands<scalar_t, cache_t> io{q, o, keys, values, tables + tile.request * width};
      if (shape.amx) {
#if defined(KVSERVE_AMX_BUILD) && defined(__AVX512BF16__)
        if constexpr (std::is_same_v<scalar_t, BFloat16> && std::is_same_v<cache_t, BFloat16>)  // Shape::amx: bfloat16 only
          attend_task_amx(tile, first_head, heads_per_task, io, shape, j < num_tasks ? &upcoming : nullptr);
#endif
      } else {
        for (int64_t h = first_head; h <= last_head; ++h)
          run_tile(tile, h, io, shape, h == first_head ? heads_per_task : 0,
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
}  // namespace kvserve::attention

namespace kvserve {

// out/query: [T, H, D]; kv_cache: [2, num_blocks, block_size, H_kv, D] in query's dtype, or int8 /
// fp8 [..., D + 4] (each row's float32 scale after its values); block_tables: int32 [B, W];
// seq_lens: int32 [B] and query_start_loc: int32 [B + 1]. Writes the rows of requests with
// 1 <= q_len <= max_q_len; other rows are left untouched.
void paged_attention(void* out, const void* query, DType dtype, const void* kv_cache, DType cache_dtype,
                     const int32_t* block_tables, const int32_t* seq_lens, const int32_t* query_start_loc,
                     const AttentionShape& s, double scale, int64_t window, int64_t max_q_len, int64_t amx,
                     double softcap, const float* sinks) {
  using namespace attention;
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
