// The batch-invariant bfloat16 linear y = x W^T + b on AMX tiles (Intel AMX-BF16: Sapphire Rapids
// and later), for hosts that have them; linear.cpp's vector-FMA GEMM everywhere else.
//
// One tile instruction, TDPBF16PS, adds to each float32 element C[m][n] of a 16 x 16 tile the 32
// products of row m of A (32 bfloat16 inputs) and column n of B (32 bfloat16 weights). Measured on
// Sapphire Rapids (tests/model/test_amx_quant_linear.py): it forms two fma chains from zero, one
// over the even inputs and one over the odd ones in increasing k (a product of two bfloat16 values
// is exact in float32), adds them, and adds that to C, with denormal inputs and results flushed to
// zero; not the single chain of linear.cpp, so the two paths differ in the last place. Each element
// depends only on its own row of x, its own column of W and its own accumulator, and the K chunks
// are accumulated in increasing order into a tile that stays in its register for the whole K, so
// every output element is one fixed sequence of operations whatever the number of rows, the row's
// position among them and the thread count: the path is batch-invariant, and it is used for every
// M on a host where it is used (tests/model/test_invariant_linear_rows.py).
//
// Layout: the weight [N][K] is packed once (kvserve.model.invariant_linear.pack_amx_weight) into
// panels of 16 output columns and chunks of 32 inputs, [N/16][K/32][16][32] bfloat16, each chunk
// one B tile in AMX's pair-interleaved ("VNNI") form: tile row r holds, for each column j, the pair
// (W[n0+j][k0+2r], W[n0+j][k0+2r+1]). N and K are padded with zeros. Activations are read in place
// as A tiles (16 rows, 64 bytes each, stride K) when K is a multiple of 32 and the rows fill the
// tile; a row tail (and any row when K is not) goes through a zero-padded copy. Padding adds exact
// zeros: it never changes a valid element.
//
// Work: a microkernel of up to 32 rows x 32 columns (2 A tiles, 2 B tiles, 4 C tiles); threads
// split the column panels (and, for many rows, row blocks), never K. No software prefetch: with
// the weights in huge pages the hardware prefetchers stream them as well alone, and 16 prefetch
// instructions per 1 KB tile cost the tile loads more than they gave (4 KB ahead into L2, against
// none, 2 threads: 64 rows 0.92-0.96x the time without, 2,048 rows 0.87-0.93x, 32 rows
// 0.98-1.02x; docs/benchmarks.md section 3.3). The tile registers must be enabled per process
// (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA) and configured per thread.
#include "abi.h"
#include "kernels.h"
#include "amx_tiles.h"
#include "thread_pool.h"
#include "simd.h"

namespace {

using namespace kvserve_amx;

#if defined(KVSERVE_AMX_BUILD)

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

// C tile (16 x 16 float32, row-major in `tile`) + bias -> out rows [0, rows) x columns [0, cols),
// each rounded to bfloat16, 16 at a time.
void store_tile(const float* tile, const float* bias, uint16_t* out, int64_t N, int64_t rows, int64_t cols) {
  const __mmask16 valid = static_cast<__mmask16>((1u << cols) - 1);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(valid, bias) : _mm512_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    __m512 v = _mm512_load_ps(tile + r * kTileN);
    if (bias != nullptr) v = _mm512_add_ps(v, b);
    _mm256_mask_storeu_epi16(out + r * N, valid, round_to_bf16(v));
  }
}

// A gate-up micro_kernel's store, left for the next one to do between its tile instructions, two
// rows per K chunk: the vector work of SiLU then runs beside the tiles' instead of after them
// (gate-up + SiLU at 512-2,048 rows: 1.3-1.4 -> 1.5-1.8 TFLOP/s; the plain store, deferred the
// same way, gained nothing and slowed the LM head at 64 rows). Its gate and up C tiles of the same
// 16 columns (tiles[i * 2]: gate rows 16i.., tiles[i * 2 + 1]: up) -> silu(gate) * up in bfloat16,
// rows [0, rows) of `out` (row stride N), each value rounded to bfloat16 where the separate steps
// round it (the projection's output, silu, the product): the same bits as amx_linear then
// silu_and_mul.
struct PendingSwiglu {
  alignas(64) float tiles[4][kTileRows * kTileN];
  uint16_t* out = nullptr;
  int64_t N = 0, rows = 0, next = 0;

  void store_row() {
    const int64_t r = next++, i = r / kTileRows, t = (r % kTileRows) * kTileN;
    const __m512 g = kvserve::widen_bf16(round_to_bf16(_mm512_load_ps(tiles[i * 2] + t)));
    const __m512 u = kvserve::widen_bf16(round_to_bf16(_mm512_load_ps(tiles[i * 2 + 1] + t)));
    const __m512 silu = kvserve::widen_bf16(round_to_bf16(kvserve::silu16(g)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + r * N), round_to_bf16(_mm512_mul_ps(silu, u)));
  }
  void finish() {
    while (next < rows) store_row();
  }
};

// rt A tiles (16 rows each, `a` with row stride `lda` bytes) x pt panels of B (`panel_bytes`
// apart): C over all K chunks, then stored through `out` (row0's row, column col0). With swiglu,
// the two panels are a gate panel and its up panel, stored as silu(gate) * up (16 columns) by the
// next call (`pending`, whose previous C this call stores during its chunks) or by finish().
template <int rt, int pt, bool swiglu = false>
void micro_kernel(const uint8_t* a, int64_t lda, const uint8_t* b, int64_t panel_bytes, int64_t chunks,
                  const float* bias, uint16_t* out, int64_t N, int64_t rows, int64_t cols,
                  PendingSwiglu* pending = nullptr) {
  _tile_zero(0);
  if constexpr (pt == 2) _tile_zero(1);
  if constexpr (rt == 2) _tile_zero(2);
  if constexpr (rt == 2 && pt == 2) _tile_zero(3);
  const uint8_t* a1 = a + kTileRows * lda;
  for (int64_t c = 0; c < chunks; ++c) {
    const uint8_t* b0 = b + c * 1024;
    _tile_loadd(4, a + c * 64, lda);
    _tile_loadd(6, b0, 64);
    if constexpr (pt == 2) {
      _tile_loadd(7, b0 + panel_bytes, 64);
    }
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (pt == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (rt == 2) {
      _tile_loadd(5, a1 + c * 64, lda);
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (pt == 2) _tile_dpbf16ps(3, 5, 7);
    }
    if constexpr (swiglu) {
      if (pending->next < pending->rows) pending->store_row();
      if (pending->next < pending->rows) pending->store_row();
    }
  }
  if constexpr (swiglu) {
    static_assert(pt == 2);
    pending->finish();
    _tile_stored(0, pending->tiles[0], 64);
    _tile_stored(1, pending->tiles[1], 64);
    if constexpr (rt == 2) {
      _tile_stored(2, pending->tiles[2], 64);
      _tile_stored(3, pending->tiles[3], 64);
    }
    pending->out = out;
    pending->N = N;
    pending->rows = rows;
    pending->next = 0;
    return;
  }
  alignas(64) float tile[kTileRows * kTileN];
  for (int i = 0; i < rt; ++i) {
    const int64_t r = std::min<int64_t>(kTileRows, rows - i * kTileRows);
    if (r <= 0) break;
    for (int j = 0; j < pt; ++j) {
      const int64_t cj = std::min<int64_t>(kTileN, cols - j * kTileN);
      if (cj <= 0) break;
      const int index = i * 2 + j;
      if (index == 0) _tile_stored(0, tile, 64);
      else if (index == 1) _tile_stored(1, tile, 64);
      else if (index == 2) _tile_stored(2, tile, 64);
      else _tile_stored(3, tile, 64);
      store_tile(tile, bias == nullptr ? nullptr : bias + j * kTileN, out + i * kTileRows * N + j * kTileN, N, r, cj);
    }
  }
}

// swiglu: the weight is [gate; up] (N = 2d, d a multiple of 16) and out is [M, d] = silu(x gate^T)
// * (x up^T); a work unit is then gate panel p with up panel p + d/16, no bias.
void amx_kernel(const uint16_t* x, const uint16_t* packed, const float* bias, uint16_t* out, int64_t M, int64_t K,
                int64_t N, bool swiglu = false) {
  const int64_t chunks = (K + kTileK - 1) / kTileK;
  const int64_t panels = (N + kTileN - 1) / kTileN;
  const int64_t panel_bytes = chunks * 1024;
  const int64_t pairs = (panels + 1) / 2;                     // work unit: two panels (32 columns)
  const int64_t out_stride = swiglu ? N / 2 : N;
  const int64_t row_groups = (M + 2 * kTileRows - 1) / (2 * kTileRows);  // 32 rows each
  const int64_t threads = std::max<int64_t>(1, kvserve::num_threads());
  // Row blocks only when there are many rows: columns first, so a panel pair's weights are read
  // once per row block and stay in L2 across its row groups, and a block's activations stay in L2
  // across the pairs: up to 8 groups, within half of L2 (the down projection's K = 4,864 takes 3
  // groups, 934 KB: 1.2-1.3 -> 1.5-1.6 TFLOP/s at 2,048 rows; 8 groups read A from L3).
  const int64_t block_budget = l2_cache_bytes() / 2;
  const int64_t groups_per_block =
      std::clamp<int64_t>(block_budget / (2 * kTileRows * K * 2), 1, std::min<int64_t>(row_groups, 8));
  const int64_t row_blocks = (row_groups + groups_per_block - 1) / groups_per_block;
  const int64_t items = row_blocks * pairs;
  const int64_t grain = std::max<int64_t>(1, items / (threads * 4));
  const ActivationTiles tiles(x, M, K);
  kvserve::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    configure_tiles(M);
    PendingSwiglu pending;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t pair = item % pairs, block = item / pairs;
      const int64_t p = swiglu ? pair : pair * 2, pt = swiglu ? 2 : std::min<int64_t>(2, panels - p);
      const int64_t col0 = p * kTileN, cols = std::min<int64_t>(2 * kTileN, N - col0);
      const uint8_t* b = reinterpret_cast<const uint8_t*>(packed) + p * panel_bytes;
      const int64_t g1 = std::min(row_groups, (block + 1) * groups_per_block);
      for (int64_t g = block * groups_per_block; g < g1; ++g) {
        const int64_t row0 = g * 2 * kTileRows, rows = std::min<int64_t>(2 * kTileRows, M - row0);
        const int rt = rows > kTileRows ? 2 : 1;
        int64_t lda = 0;
        const uint8_t* a = tiles.group(g, &lda);
        uint16_t* o = out + row0 * out_stride + col0;
        const float* bs = bias == nullptr ? nullptr : bias + col0;
        if (swiglu && rt == 2) micro_kernel<2, 2, true>(a, lda, b, pairs * panel_bytes, chunks, nullptr, o, out_stride, rows, cols, &pending);
        else if (swiglu) micro_kernel<1, 2, true>(a, lda, b, pairs * panel_bytes, chunks, nullptr, o, out_stride, rows, cols, &pending);
        else if (rt == 2 && pt == 2) micro_kernel<2, 2>(a, lda, b, panel_bytes, chunks, bs, o, N, rows, cols);
        else if (rt == 2) micro_kernel<2, 1>(a, lda, b, panel_bytes, chunks, bs, o, N, rows, cols);
        else if (pt == 2) micro_kernel<1, 2>(a, lda, b, panel_bytes, chunks, bs, o, N, rows, cols);
        else micro_kernel<1, 1>(a, lda, b, panel_bytes, chunks, bs, o, N, rows, cols);
      }
    }
    pending.finish();
    _tile_release();
  });
}

#pragma GCC pop_options

#endif  // KVSERVE_AMX_BUILD

}  // namespace

namespace kvserve {

// x: contiguous [M, K] bfloat16; packed: the weight's B tiles (kvserve.model.invariant_linear.
// pack_amx_weight); bias float32 [N] or nullptr; out [M, N] (swiglu: [M, N / 2], N = 2d with d a
// multiple of 16: silu_and_mul of the projection in one pass, the same bits, the gate-up
// projection's two halves meeting in the store, so the [M, 2d] projection is never written).
void amx_linear(const BFloat16* x, const BFloat16* packed, const float* bias, BFloat16* out, int64_t M, int64_t K,
                int64_t N, bool swiglu) {
  check(amx_linear_available(), "amx_linear: no AMX-BF16 tiles on this CPU / process");
#if defined(KVSERVE_AMX_BUILD)
  if (M > 0 && N > 0) {
    amx_kernel(reinterpret_cast<const uint16_t*>(x), reinterpret_cast<const uint16_t*>(packed), bias,
               reinterpret_cast<uint16_t*>(out), M, K, N, swiglu);
  }
#endif
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int kvserve_amx_linear(const void* x, const void* packed, const float* bias, void* out, int64_t M,
                                      int64_t K, int64_t N, int32_t swiglu) {
  using kvserve::BFloat16;
  return kvserve::guarded([&] {
    kvserve::amx_linear(static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(packed), bias,
                        static_cast<BFloat16*>(out), M, K, N, swiglu != 0);
  });
}

}  // extern "C"
