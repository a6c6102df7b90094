// Batch-invariant linear layer y = x W^T + b over weight-only quantized weights: int8 per output
// channel, int4 group-wise (symmetric or with offsets).
//
// A quantized weight holds integers q[n][k] and, per output column n and group g of G consecutive
// inputs (G = K: one group per column, "per channel"), a scale s[n][g] and, for int4 with zero
// points, an offset m[n][g]:
//
//   int8:                 w[n][k] = s[n][g] * q[n][k]          q in [-127, 127]
//   int4, symmetric:      w[n][k] = s[n][g] * (q[n][k] - 8)    q in [0, 15]
//   int4, with offsets:   w[n][k] = s[n][g] * q[n][k] - m[n][g]  q in [0, 15]
//
// Every output element y[m][n] is one fixed sequence of float32 operations, whatever the number
// of rows M, the row's position in the batch, the thread count and the library's instruction set:
//
//     acc = 0
//     for each group g, in increasing k:
//         p = 0;   for k in g, increasing:  p = fma(x[m][k], v[n][k], p)     v = q, or q - 8 (exact)
//         acc = fma(p, s[n][g], acc)
//         with offsets:  acc = fma(-m[n][g], xsum[m][g], acc)   xsum = ((x_k0 + x_k1) + ...) in k order
//     y[m][n] = round(acc + b[n])        (float32, then once to the activation dtype)
//
// In the avx512_bf16 library (instruction set 4) bfloat16 activations take a second sequence, when
// K and G are even: the partial sum of a group runs over pairs of inputs with vdpbf16ps,
//
//         p = 0;   for k = k0, k0 + 2, ... in g:  p = round(p + x[m][k+1] * v[n][k+1]);
//                                                 p = round(p + x[m][k] * v[n][k])
//
// (the instruction's order; each product is exact in float32, each sum rounded to nearest even
// and flushed to zero below the normal range), then the same merges. It does half the
// instructions of the float32 FMAs (two products per lane per instruction, the integers widened to
// bfloat16 pairs rather than floats) and, the products having few significant bits, sums a group
// exactly as often as the FMAs do; its bits may differ in the last place from the other ISAs',
// never between batches.
//
// The weights are never dequantized to memory: the integers are widened in registers
// (vpmovsxbd / vpmovzxbd, and/shift for the two nibbles, vcvtdq2ps) and each scale (and offset)
// enters once per group. tests/model/test_quant_linear.py checks the bits against the sequence
// emulated in float64, for every variant library this CPU runs.
//
// Instruction set: the library's (build.py's variant, chosen once when Python loads the library),
// read from the compiler's macros in quant_vector.h: AVX-512F with AVX512-BF16 (4, the avx512_bf16
// library) or without (3, avx512) (16-float vectors, 64-column panels), AVX2 + FMA (2, avx2;
// 8-float vectors, 16-column panels), else portable GCC vectors (1, x86_64; 4 floats). All compute
// the same sequence (ISA 4's bfloat16 pairs aside), so they give the same bits; the tests load
// every variant library this CPU runs to check each. Integer dot products (VNNI, AMX-INT8) would
// need int8 activations: another sequence and lower quality; they are not used.
//
// Layout (packed by kvserve/model/quant_linear.py for the layout quant_linear_layout reports,
// the library's):
// - panels of kNR = kNV * kW output columns, [P][K][row bytes], the last panel padded with zero
//   columns (computed, never stored);
//       int8: a row is kNR bytes, column j at byte j;
//       int4: a row is kNR / 2 bytes; for each pair of vectors (2g, 2g + 1), byte g * kW + i holds
//             column 2g * kW + i in its low nibble and column (2g + 1) * kW + i in its high one,
//             so one load of kW bytes gives both vectors with a mask and a shift.
// - scales float32 [P][K / G][kNR]; negated offsets (-m) the same (int4 with offsets only).
//
// Kernels: a kMR-row microkernel (one panel, kMR x kNV accumulators) for row groups of 2 or more
// rows, and a one-row kernel over kNP panels at once (kNP x kNV accumulators) for a lone row
// (decode at batch 1), which would otherwise pay kMR times the FMAs of a padded group on top of
// the widening. Both compute each element with the sequence above, so which one runs never changes
// a bit. A group's partial sums and the running acc live in a float32 scratch tile between groups
// and K blocks. Threads split rows and columns only, never K.
//
// Files: quant_vector.h (the instruction set, vectors, weight widening), quant_fma.h (the float32
// FMA sequence's kernels), quant_pairs.h (the bfloat16 pair sequence, ISA 4), and here the work
// split over threads and the entry points.
#include "abi.h"
#include "kernels.h"
#include "quant_fma.h"
#include "quant_pairs.h"
#include "quant_vector.h"
#include "thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve_quant {
namespace {

struct QuantArgs {
  const uint8_t* packed;
  const float* scales;
  const float* neg_offsets;  // nullptr: no offsets (int8, symmetric int4)
  const float* bias;         // nullptr: no bias
  int64_t M, K, N, G, bits;
  int64_t codebook;  // kvserve::Codebook of a 4-bit weight
};

struct Blocking {
  int64_t row_block;    // rows per work item (a multiple of kMR)
  int64_t panel_block;  // panels per work item
  int64_t k_block;      // K per pass (a multiple of G when there are offsets)
};

// Any blocking gives the same bits; this only decides speed. Work items are row blocks x panel
// blocks (at::parallel_for gives each thread a contiguous run of items). A lone row group (decode)
// splits the panels evenly over the threads, at most 16 per item; more rows make about 8 items
// per thread (row blocks are uneven: 64 rows are a block of 48 and one of 16).
Blocking choose_blocking(int64_t M, int64_t K, int64_t G, int64_t panels, int64_t threads, int64_t rb, bool sums) {
  Blocking b;
  const int64_t row_groups = (M + kMR - 1) / kMR;
  b.row_block = std::min<int64_t>(row_groups, 12) * kMR;
  const int64_t row_blocks = (M + b.row_block - 1) / b.row_block;
  if (M <= kMR) {
    const int64_t per_thread = std::max<int64_t>(1, (panels + threads - 1) / threads);
    const int64_t rounds = (per_thread + 15) / 16;
    b.panel_block = std::max<int64_t>(1, (panels + threads * rounds - 1) / (threads * rounds));
  } else {
    const int64_t wanted_items = threads * 8;
    b.panel_block = std::clamp<int64_t>((panels * row_blocks + wanted_items - 1) / wanted_items, 1, 16);
  }
  b.panel_block = std::min(b.panel_block, panels);
  // A lone row group streams each panel whole; larger M reuses a K block (about half of L1d).
  const int64_t target = std::max<int64_t>(1, 16384 / rb);
  if (M <= kMR) {
    b.k_block = K;
  } else if (sums) {
    b.k_block = std::min(K, std::max<int64_t>(G, target / G * G));
  } else {
    b.k_block = std::min(K, target);
  }
  return b;
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using Scratch = std::unique_ptr<float[], FreeDeleter>;

inline Scratch scratch(int64_t floats) {
  const size_t bytes = (static_cast<size_t>(std::max<int64_t>(floats, 1)) * sizeof(float) + 63) / 64 * 64;
  return Scratch(static_cast<float*>(std::aligned_alloc(64, bytes)));
}

// The GEMM of one sequence (Steps: FmaSteps, or PairSteps of quant_pairs.h): work items of row blocks x
// panel blocks; per K block the rows packed once, per quantization group each row group's
// partial sums merged into its running acc, stored after the last K block.
template <class Steps, typename act_t>
void kernel(const act_t* x, act_t* out, const QuantArgs& q) {
  using lane_t = typename Steps::lane_t;
  constexpr int64_t step_k = Steps::kStep;
  const int64_t M = q.M, K = q.K, N = q.N, G = q.G;
  const int64_t panels = (N + kNR - 1) / kNR, ngroups = K / G;
  constexpr int64_t rb = row_bytes(Steps::kBits);
  const int64_t panel_bytes = K * rb;
  const bool sums = q.neg_offsets != nullptr;
  const int64_t threads = std::max<int64_t>(1, kvserve::num_threads());
  // More than one row group: each K block of a panel is widened once and shared.
  Blocking blk = choose_blocking(M, K, G, panels, threads, M <= kMR ? rb : Steps::kWideBytes, sums);
  blk.k_block = std::max(step_k, blk.k_block - blk.k_block % step_k);
  const int64_t row_blocks = (M + blk.row_block - 1) / blk.row_block;
  const int64_t panel_blocks = (panels + blk.panel_block - 1) / blk.panel_block;
  const int64_t k_blocks = (K + blk.k_block - 1) / blk.k_block;
  const int64_t tile = kMR * kNR;
  kvserve::parallel_for(0, row_blocks * panel_blocks, 1, [&](int64_t begin, int64_t end) {
    const int64_t row_groups = blk.row_block / kMR;
    Scratch rows_packed = scratch(blk.row_block * blk.k_block / step_k);  // lanes are 4 bytes
    Scratch xsum = scratch(sums ? row_groups * ((blk.k_block + G - 1) / G) * kMR : 1);
    Scratch widened = scratch(M <= kMR ? 1 : std::min(blk.k_block, G) * Steps::kWideBytes / 4);
    // Per (row group, panel) of an item: the current group's partial sums and the running acc
    // (a one-row item keeps panel j's at j * kNR of its first panel's tile: kNP * kNR <= tile).
    Scratch partial = scratch(row_groups * blk.panel_block * tile);
    Scratch running = scratch(row_groups * blk.panel_block * tile);
    lane_t* lanes = reinterpret_cast<lane_t*>(rows_packed.get());
    uint8_t* wide = reinterpret_cast<uint8_t*>(widened.get());
    for (int64_t item = begin; item < end; ++item) {
      const int64_t row0 = item % row_blocks * blk.row_block;
      const int64_t rows = std::min(blk.row_block, M - row0);
      const int64_t groups = (rows + kMR - 1) / kMR;
      const int64_t p0 = item / row_blocks * blk.panel_block;
      const int64_t p1 = std::min(panels, p0 + blk.panel_block);
      for (int64_t kb = 0; kb < k_blocks; ++kb) {
        const int64_t k0 = kb * blk.k_block, kc = std::min(blk.k_block, K - k0);
        const int64_t qgroups = (kc + G - 1) / G;
        Steps::pack(x, K, row0, rows, k0, kc, G, sums, lanes, xsum.get());
        const int64_t step = M == 1 ? kNP : 1;
        for (int64_t p = p0; p < p1; p += step) {
          const int np = static_cast<int>(std::min<int64_t>(step, p1 - p));
          // Segments of one quantization group within this K block: [k0 + s0, k0 + s1).
          for (int64_t s0 = 0; s0 < kc;) {
            const int64_t kabs = k0 + s0, group = kabs / G;
            const int64_t s1 = std::min(kc, (group + 1) * G - k0);
            const bool cont = kabs % G != 0, ends = k0 + s1 == (group + 1) * G;
            const uint8_t* b = q.packed + p * panel_bytes + kabs * rb;
            if (M > kMR) Steps::widen(s1 - s0, b, wide);
            for (int64_t g = 0; g < groups; ++g) {
              const int64_t grows = std::min<int64_t>(kMR, rows - g * kMR);
              const lane_t* a = lanes + g * (kc / step_k) * kMR + s0 / step_k * kMR;
              float* part = partial.get() + (g * blk.panel_block + (p - p0)) * tile;
              float* run = running.get() + (g * blk.panel_block + (p - p0)) * tile;
              if (M == 1) {
                Steps::one_row(s1 - s0, a, b, panel_bytes, np, part, cont);
              } else if (M <= kMR) {
                Steps::small(s1 - s0, a, b, part, cont);
              } else {
                Steps::widened(s1 - s0, a, wide, part, cont);
              }
              if (!ends) continue;
              const float* xs = sums ? xsum.get() + (g * qgroups + s0 / G) * kMR : nullptr;
              for (int j = 0; j < np; ++j) {
                const int64_t at = ((p + j) * ngroups + group) * kNR;
                const int64_t off = M == 1 ? j * kNR : 0;
                merge_group(static_cast<int>(grows), part + off, q.scales + at, sums ? q.neg_offsets + at : nullptr,
                            xs, run + off, group == 0);
              }
            }
            s0 = s1;
          }
          if (kb < k_blocks - 1) continue;
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t grows = std::min<int64_t>(kMR, rows - g * kMR);
            const float* run = running.get() + (g * blk.panel_block + (p - p0)) * tile;
            for (int j = 0; j < np; ++j) {
              const int64_t col0 = (p + j) * kNR, cols = std::min<int64_t>(kNR, N - col0);
              store_tile(run + (M == 1 ? j * kNR : 0), q.bias == nullptr ? nullptr : q.bias + col0,
                         out + (row0 + g * kMR) * N + col0, N, grows, cols);
            }
          }
        }
      }
    }
  });
}

#if QL_ISA == 4
// bfloat16 activations with K and the group size even take the pair sequence.
inline bool takes_pairs(const QuantArgs& q) { return q.K % 2 == 0 && q.G % 2 == 0; }
#endif

// The kernel of q's codes (int8, MXFP4, symmetric int4, int4 with offsets) in Steps' sequence.
template <template <int, int, typename> class Steps, typename act_t>
void run(const act_t* x, act_t* out, const QuantArgs& q) {
  if (q.bits == 8) kernel<Steps<8, 0, act_t>>(x, out, q);
  else if (q.codebook == kvserve::kE2M1) kernel<Steps<4, 2, act_t>>(x, out, q);
  else if (q.neg_offsets == nullptr) kernel<Steps<4, 1, act_t>>(x, out, q);
  else kernel<Steps<4, 0, act_t>>(x, out, q);
}

void run_quant_linear(const void* x, void* out, bool bf16, const QuantArgs& q) {
  using kvserve::BFloat16;
#if QL_ISA == 4
  if (bf16 && takes_pairs(q)) {
    run<PairSteps>(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), q);
    return;
  }
#endif
  if (bf16) run<FmaSteps>(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), q);
  else run<FmaSteps>(static_cast<const float*>(x), static_cast<float*>(out), q);
}

}  // namespace
}  // namespace kvserve_quant

#pragma GCC pop_options

namespace kvserve {

// This library's instruction set (quant_vector.h): 1 portable, 2 AVX2 + FMA, 3 AVX-512F, 4 AVX-512F
// + AVX512-BF16.
int64_t quant_linear_isa() { return QL_ISA; }

// (vector width in floats, vectors per panel) of this library's panels.
void quant_linear_layout(int64_t* width, int64_t* vectors) {
  *width = kvserve_quant::kW;
  *vectors = kvserve_quant::kNV;
}

// x: contiguous [M, K] float32 or bfloat16; w.packed: uint8 [P, K, row bytes] in this library's
// layout; w.scales (and neg_offsets, int4 only): float32 [P, K / group_size, kNR]; bias: float32
// [N] or nullptr; bits 8 or 4 (int4 without offsets is symmetric: q - 8; codebook kE2M1: MXFP4's
// values) -> out [M, N] in x's dtype.
void quant_linear(DType dtype, const void* x, void* out, int64_t M, int64_t K, const QuantWeight& w) {
  if (M == 0 || w.N == 0) return;
  check(w.codebook == kIntegers || (w.codebook == kE2M1 && w.bits == 4 && w.neg_offsets == nullptr),
        "quant_linear: the E2M1 codebook is for 4-bit weights without offsets");
  const kvserve_quant::QuantArgs q{w.packed, w.scales, w.neg_offsets, w.bias, M, K, w.N, w.group_size, w.bits,
                                   w.codebook};
  kvserve_quant::run_quant_linear(x, out, dtype == kBFloat16, q);
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int64_t kvserve_quant_linear_isa() { return kvserve::quant_linear_isa(); }

// layout: int64 [2] <- (vector width in floats, vectors per panel).
KVSERVE_EXPORT int kvserve_quant_linear_layout(int64_t* layout) {
  return kvserve::guarded([&] { kvserve::quant_linear_layout(layout, layout + 1); });
}

KVSERVE_EXPORT int kvserve_quant_linear(int32_t dtype, const void* x, void* out, int64_t M, int64_t K,
                                        const uint8_t* packed, const float* scales, const float* neg_offsets,
                                        const float* bias, int64_t N, int64_t group_size, int64_t bits,
                                        int64_t codebook) {
  return kvserve::guarded([&] {
    kvserve::quant_linear(static_cast<kvserve::DType>(dtype), x, out, M, K,
                          kvserve::QuantWeight{packed, scales, neg_offsets, bias, N, group_size, bits, codebook});
  });
}

}  // extern "C"
