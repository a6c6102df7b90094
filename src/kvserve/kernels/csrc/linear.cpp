// Batch-invariant linear layer y = x W^T + b for CPUs (float32 and bfloat16).
//
// Every output element y[m][n] is computed by one fixed sequence of floating-point operations,
//
//     acc = 0;  for k = 0 .. K-1:  acc = fma(x[m][k], W[n][k], acc);   y[m][n] = round(acc + b[n])
//
// (float32 accumulation, one fused multiply-add per k in increasing k, the bias added last,
// then one rounding to the output dtype), whatever the number of rows M, the row's position in
// the batch and the thread count, and whatever the vector width the file was built for (AVX-512,
// AVX2, portable vectors: the same bits on every host). That is the whole batch-invariance
// argument; the rest is how it is made fast without changing that sequence:
//
// - Weights are packed once (pack_linear_weight) into panels of kNR output columns, each panel
//   [K][kNR] contiguous, in the weight's own dtype (bfloat16 stays 2 bytes: the decode step
//   reads half the bytes). The last panel is padded with zero columns, which are never stored.
//
//       panel p:  k=0: W[pNR+0][0] W[pNR+1][0] ... W[pNR+NR-1][0]    (float32 order)
//                 k=1: W[pNR+0][1] ...
//
//   bfloat16 panels interleave each group of 2*kW columns as (c, c+kW) pairs, so that one vector
//   load of 2*kW bfloat16 gives both float32 vectors with one shift and one mask (bf16 -> fp32 is
//   the upper half of the float32 word):
//
//       32-bit word j of a group = W[c0+j] (low half) | W[c0+kW+j] (high half)
//       word << 16   -> columns c0 .. c0+kW-1;   word & 0xffff0000 -> columns c0+kW .. c0+2kW-1
//
// - An outer-product microkernel keeps a kMR x kNR tile of accumulators in registers; per k it
//   loads one packed weight row, broadcasts each of kMR activations and does kMR * kNV FMAs
//   (explicit FMA intrinsics, never a separate multiply and add). Every accumulator sees its k in
//   increasing order.
// - Rows are packed kMR at a time (float32, interleaved [k][kMR]); a last partial group is padded
//   with zero rows, so an M tail runs through the same microkernel as full groups and a row alone
//   is computed exactly as inside a batch of 2,048.
// - K may be split into blocks for the caches; partial sums then stay float32 in a scratch tile
//   and the next block loads them and continues its FMAs, so the sequence above is unchanged.
// - Threads split work by row blocks and column blocks only, never by K.
//
// The file is compiled without -ffast-math's licences (see the pragma below): no reassociation,
// no contraction other than the explicit FMAs. tests/model/test_invariant_linear.py checks the
// result bit for bit against the sequence above emulated in float64.
//
// A wider instruction (e.g. AVX512-BF16 vdpbf16ps, which sums two products per lane, or AMX
// tiles) changes the sequence and therefore the bits; it stays batch-invariant as long as it is
// the only kernel used on that host for every M. amx_linear.cpp is such a kernel for bfloat16 on
// AMX hosts (kvserve.model.invariant_linear picks it).
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace {

// Vector width (floats) and tile shape, fixed at compile time for the CPU the extension is built
// for (-march=native): 4 x 64 on AVX-512, 4 x 16 on AVX2+FMA, 4 x 8 with portable vectors
// elsewhere. kMR rows x kNV vectors of accumulators must fit the register file with kNV weight
// vectors and one broadcast (AVX2: 8 + 2 + 1 of 16); kMR is also the padding a lone decode row
// pays (kMR FMAs per weight element, hidden under the weight reads on these machines, see
// docs/benchmarks.md). KVSERVE_LINEAR_WIDTH forces the portable path at a given width (tests of
// the layout for other widths on this machine).
#if defined(KVSERVE_LINEAR_WIDTH)
#define KVSERVE_VECTOR_ISA 0
constexpr int kW = KVSERVE_LINEAR_WIDTH;
#elif defined(__AVX512F__)
#define KVSERVE_VECTOR_ISA 16
constexpr int kW = 16;
#elif defined(__AVX2__) && defined(__FMA__)
#define KVSERVE_VECTOR_ISA 8
constexpr int kW = 8;
#else
#define KVSERVE_VECTOR_ISA 0
constexpr int kW = 4;
#endif
#ifndef KVSERVE_LINEAR_MR
#define KVSERVE_LINEAR_MR 4
#endif
#ifndef KVSERVE_LINEAR_NV
#define KVSERVE_LINEAR_NV (kW == 16 ? 4 : 2)
#endif
constexpr int kMR = KVSERVE_LINEAR_MR;  // rows per microkernel
constexpr int kNV = KVSERVE_LINEAR_NV;  // vectors per row of the tile
constexpr int kNR = kNV * kW;           // output columns per panel
static_assert(kNV % 2 == 0, "bfloat16 panels are read two vectors at a time");

typedef uint32_t vuint __attribute__((vector_size(kW * sizeof(uint32_t))));

#include "float_vectors.h"

// One packed weight row (kNR columns) as kNV float32 vectors.
inline void load_weights(const float* b, vfloat (&out)[kNV]) {
  for (int v = 0; v < kNV; ++v) out[v] = load_vector<vfloat>(b + v * kW);
}

inline void load_weights(const kvserve::BFloat16* b, vfloat (&out)[kNV]) {
  for (int g = 0; g < kNV / 2; ++g) {
    const vuint words = load_vector<vuint>(b + g * 2 * kW);
    out[2 * g] = (vfloat)(words << 16);
    out[2 * g + 1] = (vfloat)(words & 0xffff0000u);
  }
}

// Weight bytes requested ahead of the microkernel's reads, into L2 (prefetcht2). At a few rows per
// call the kernel streams the weights from memory once; the hardware prefetcher alone left it at
// 60-75% of the bandwidth MKL reached (Qwen2.5-0.5B shapes, one thread, AMD EPYC), and a
// non-temporal prefetch (prefetchnta) at 12 GB/s where prefetcht2 reads 19 GB/s (AMX Xeon, one
// row, two threads; docs/benchmarks.md).
constexpr int64_t kPrefetchBytes = 4096;
// A weight micro-panel (kc x kNR) of one K block fills half of a 32 KiB L1d.
constexpr int64_t kMicroPanelBytes = 16384;

// The microkernel: c[kMR][kNR] (+)= a[kc][kMR] * b[kc][kNR], one FMA per k, in increasing k.
// accumulate=false starts from zero, true continues the partial sums stored in c.
template <typename weight_t>
inline void micro_kernel(int64_t kc, const float* __restrict a, const weight_t* __restrict b, float* __restrict c,
                         bool accumulate) {
  vfloat acc[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = accumulate ? load_vector<vfloat>(c + i * kNR + v * kW) : vfloat{};
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    __builtin_prefetch(reinterpret_cast<const char*>(b + k * kNR) + kPrefetchBytes, 0, 1);
    vfloat w[kNV];
    load_weights(b + k * kNR, w);
    for (int i = 0; i < kMR; ++i) {
      const vfloat x = broadcast(a[k * kMR + i]);
      for (int v = 0; v < kNV; ++v) acc[i][v] = fmadd(x, w[v], acc[i][v]);
    }
  }
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) store_vector(c + i * kNR + v * kW, acc[i][v]);
}

#include "bf16_convert.h"

// Rows [row0, row0 + rows) x columns [k0, k0 + kc) of x [M][K] into groups of kMR rows, float32,
// [group][k][kMR]; rows past `rows` are zero.
template <typename act_t>
void pack_rows(const act_t* x, int64_t K, int64_t row0, int64_t rows, int64_t k0, int64_t kc, float* out) {
  const int64_t groups = (rows + kMR - 1) / kMR;
  for (int64_t g = 0; g < groups; ++g) {
    float* dst = out + g * kc * kMR;
    for (int r = 0; r < kMR; ++r) {
      const int64_t row = g * kMR + r;
      if (row < rows) {
        const act_t* src = x + (row0 + row) * K + k0;
        for (int64_t k = 0; k < kc; ++k) dst[k * kMR + r] = to_float(src[k]);
      } else {
        for (int64_t k = 0; k < kc; ++k) dst[k * kMR + r] = 0.f;
      }
    }
  }
}

// The valid part of a finished tile: out[row][col] = round(tile + bias).
template <typename out_t>
void store_tile(const float* tile, const float* bias, out_t* out, int64_t N, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    out_t* dst = out + r * N;
    const float* src = tile + r * kNR;
    if (bias != nullptr) {
      for (int64_t c = 0; c < cols; ++c) dst[c] = from_float<out_t>(src[c] + bias[c]);
    } else {
      for (int64_t c = 0; c < cols; ++c) dst[c] = from_float<out_t>(src[c]);
    }
  }
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Scratch = std::unique_ptr<float[], FreeDeleter>;

Scratch scratch(int64_t floats) {
  const size_t bytes = (static_cast<size_t>(floats) * sizeof(float) + 63) / 64 * 64;
  return Scratch(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// Work split (any choice gives the same bits; these only decide speed).
struct Blocking {
  int64_t row_block;    // rows per work item (a multiple of kMR)
  int64_t panel_block;  // panels per work item
  int64_t k_block;      // K per pass over a work item
};

Blocking choose_blocking(int64_t M, int64_t K, int64_t panels, int64_t threads, int64_t weight_size) {
  Blocking b;
  const int64_t row_groups = (M + kMR - 1) / kMR;
  b.row_block = std::min<int64_t>(row_groups, 12) * kMR;
  const int64_t row_blocks = (M + b.row_block - 1) / b.row_block;
  // Enough items for every thread (several each, for balance), at most 16 panels per item.
  const int64_t wanted_items = threads * 8;
  const int64_t per_item = std::max<int64_t>(1, (panels * row_blocks + wanted_items - 1) / wanted_items);
  b.panel_block = std::clamp<int64_t>(per_item, 1, 16);
  // One row group reuses nothing: stream each panel whole.
  b.k_block = std::max<int64_t>(1, M <= kMR ? K : std::min<int64_t>(K, kMicroPanelBytes / (kNR * weight_size)));
  return b;
}

template <typename act_t, typename weight_t>
void linear_kernel(const act_t* x, const weight_t* packed, const float* bias, act_t* out, int64_t M, int64_t K,
                   int64_t N) {
  const int64_t panels = (N + kNR - 1) / kNR;
  const int64_t threads = std::max<int64_t>(1, kvserve::num_threads());
  const Blocking blk = choose_blocking(M, K, panels, threads, sizeof(weight_t));
  const int64_t row_blocks = (M + blk.row_block - 1) / blk.row_block;
  const int64_t panel_blocks = (panels + blk.panel_block - 1) / blk.panel_block;
  const int64_t k_blocks = std::max<int64_t>(1, (K + blk.k_block - 1) / blk.k_block);
  const int64_t tile = kMR * kNR;
  kvserve::parallel_for(0, row_blocks * panel_blocks, 1, [&](int64_t begin, int64_t end) {
    Scratch rows_packed = scratch(blk.row_block * blk.k_block);
    // Partial sums of every tile of an item when K is split; one tile otherwise.
    const int64_t tiles = k_blocks > 1 ? blk.row_block / kMR * blk.panel_block : 1;
    Scratch partial = scratch(tiles * tile);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row0 = item % row_blocks * blk.row_block;
      const int64_t rows = std::min(blk.row_block, M - row0);
      const int64_t groups = (rows + kMR - 1) / kMR;
      const int64_t p0 = item / row_blocks * blk.panel_block;
      const int64_t p1 = std::min(panels, p0 + blk.panel_block);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * blk.k_block;
        const int64_t kc = std::min(blk.k_block, K - k0);
        const bool last = kb == k_blocks - 1;
        pack_rows(x, K, row0, rows, k0, kc, rows_packed.get());
        for (int64_t p = p0; p < p1; ++p) {
          const weight_t* b = packed + p * K * kNR + k0 * kNR;
          const int64_t col0 = p * kNR;
          const int64_t cols = std::min<int64_t>(kNR, N - col0);
          for (int64_t g = 0; g < groups; ++g) {
            float* c = partial.get() + (tiles > 1 ? ((p - p0) * groups + g) * tile : 0);
            micro_kernel(kc, rows_packed.get() + g * kc * kMR, b, c, kb > 0);
            if (last) {
              store_tile(c, bias == nullptr ? nullptr : bias + col0, out + (row0 + g * kMR) * N + col0, N,
                         std::min<int64_t>(kMR, rows - g * kMR), cols);
            }
          }
        }
      }
    }
  });
}

// W [N][K] -> panels [P][K][kNR] (see the file comment), zero-padded to P * kNR columns.
template <typename weight_t>
void pack_panels(const weight_t* w, weight_t* out, int64_t N, int64_t K) {
  const int64_t panels = (N + kNR - 1) / kNR;
  kvserve::parallel_for(0, panels, 1, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      for (int64_t j = 0; j < kNR; ++j) {
        // Position of column j of the panel within a packed row.
        int64_t slot = j;
        if constexpr (std::is_same_v<weight_t, kvserve::BFloat16>) {
          const int64_t group = j / (2 * kW), in_group = j % (2 * kW);
          slot = group * 2 * kW + (in_group % kW) * 2 + in_group / kW;
        }
        const int64_t n = p * kNR + j;
        weight_t* dst = out + p * K * kNR + slot;
        for (int64_t k = 0; k < K; ++k) dst[k * kNR] = n < N ? w[n * K + k] : weight_t{};
      }
    }
  });
}

}  // namespace

#pragma GCC pop_options

namespace kvserve {

int64_t linear_panel_width() { return kNR; }

// weight: contiguous [N, K] float32 or bfloat16 -> packed [ceil(N / kNR), K, kNR] (same dtype).
void pack_linear_weight(DType dtype, const void* weight, void* packed, int64_t N, int64_t K) {
  if (dtype == kFloat32) {
    pack_panels(static_cast<const float*>(weight), static_cast<float*>(packed), N, K);
  } else {
    pack_panels(static_cast<const BFloat16*>(weight), static_cast<BFloat16*>(packed), N, K);
  }
}

// x: contiguous [M, K] float32 or bfloat16; packed: from pack_linear_weight (float32 or bfloat16);
// bias: float32 [N] or nullptr -> out [M, N] in x's dtype.
void invariant_linear(DType dtype, const void* x, DType weight_dtype, const void* packed, const float* bias, void* out,
                      int64_t M, int64_t K, int64_t N) {
  if (M == 0 || N == 0) return;
  auto run = [&](const auto* act, auto* dst) {
    if (weight_dtype == kFloat32) {
      linear_kernel(act, static_cast<const float*>(packed), bias, dst, M, K, N);
    } else {
      linear_kernel(act, static_cast<const BFloat16*>(packed), bias, dst, M, K, N);
    }
  };
  if (dtype == kFloat32) {
    run(static_cast<const float*>(x), static_cast<float*>(out));
  } else {
    run(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out));
  }
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int64_t kvserve_linear_panel_width() { return kvserve::linear_panel_width(); }

KVSERVE_EXPORT int kvserve_pack_linear_weight(int32_t dtype, const void* weight, void* packed, int64_t N, int64_t K) {
  return kvserve::guarded([&] { kvserve::pack_linear_weight(static_cast<kvserve::DType>(dtype), weight, packed, N, K); });
}

KVSERVE_EXPORT int kvserve_invariant_linear(int32_t dtype, const void* x, int32_t weight_dtype, const void* packed,
                                            const float* bias, void* out, int64_t M, int64_t K, int64_t N) {
  return kvserve::guarded([&] {
    kvserve::invariant_linear(static_cast<kvserve::DType>(dtype), x, static_cast<kvserve::DType>(weight_dtype), packed,
                              bias, out, M, K, N);
  });
}

}  // extern "C"
