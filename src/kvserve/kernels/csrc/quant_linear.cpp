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
// of rows M, the row's position in the batch, the thread count and the instruction set:
//
//     acc = 0
//     for each group g, in increasing k:
//         p = 0;   for k in g, increasing:  p = fma(x[m][k], v[n][k], p)     v = q, or q - 8 (exact)
//         acc = fma(p, s[n][g], acc)
//         with offsets:  acc = fma(-m[n][g], xsum[m][g], acc)   xsum = ((x_k0 + x_k1) + ...) in k order
//     y[m][n] = round(acc + b[n])        (float32, then once to the activation dtype)
//
// On CPUs with AVX512-BF16 (instruction set 4) bfloat16 activations take a second sequence, when K
// and G are even: the partial sum of a group runs over pairs of inputs with vdpbf16ps,
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
// emulated in float64, for every instruction set this CPU runs.
//
// Instruction set, chosen at run time (quant_linear_isa): AVX-512F with AVX512-BF16 (4) or without
// (3) (16-float vectors, 64-column panels) where the CPU has it, else AVX2 + FMA (8-float vectors,
// 16-column panels), else portable GCC vectors (4 floats). Each is this file's quant_linear_impl.h
// compiled in its own namespace under `#pragma GCC target`; all compute the same sequence (ISA 4's
// bfloat16 pairs aside), so they give the same bits. Integer
// dot products (VNNI, AMX-INT8) would need int8 activations: another sequence and lower quality;
// they are not used.
//
// Layout (packed by kvserve/model/quant_linear.py for the layout quant_linear_layout reports):
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
#include "abi.h"
#include "kernels.h"
#include "thread_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#define KVSERVE_QUANT_X86 1
#endif

namespace kvserve_quant {

struct QuantArgs {
  const uint8_t* packed;
  const float* scales;
  const float* neg_offsets;  // nullptr: no offsets (int8, symmetric int4)
  const float* bias;         // nullptr: no bias
  int64_t M, K, N, G, bits;
  int64_t codebook;  // kvserve::Codebook of a 4-bit weight
};

}  // namespace kvserve_quant

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

#if defined(KVSERVE_QUANT_X86)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bf16,avx2,fma")
namespace kvserve_quant_avx512bf16 {
using kvserve_quant::QuantArgs;
#define QL_ISA 4
#include "quant_linear_impl.h"
#undef QL_ISA
}  // namespace kvserve_quant_avx512bf16
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
namespace kvserve_quant_avx512 {
using kvserve_quant::QuantArgs;
#define QL_ISA 3
#include "quant_linear_impl.h"
#undef QL_ISA
}  // namespace kvserve_quant_avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace kvserve_quant_avx2 {
using kvserve_quant::QuantArgs;
#define QL_ISA 2
#include "quant_linear_impl.h"
#undef QL_ISA
}  // namespace kvserve_quant_avx2
#pragma GCC pop_options
#endif

namespace kvserve_quant_portable {
using kvserve_quant::QuantArgs;
#define QL_ISA 1
#include "quant_linear_impl.h"
#undef QL_ISA
}  // namespace kvserve_quant_portable

#pragma GCC pop_options

namespace {

// 1 portable, 2 AVX2 + FMA, 3 AVX-512F, 4 AVX-512F + AVX512-BF16.
int64_t best_isa() {
#if defined(KVSERVE_QUANT_X86)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) return 4;
  if (__builtin_cpu_supports("avx512f")) return 3;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 2;
#endif
  return 1;
}

void layout_of(int64_t isa, int64_t* width, int64_t* vectors) {
  switch (isa) {
#if defined(KVSERVE_QUANT_X86)
    case 4: *width = kvserve_quant_avx512bf16::kW; *vectors = kvserve_quant_avx512bf16::kNV; return;
    case 3: *width = kvserve_quant_avx512::kW; *vectors = kvserve_quant_avx512::kNV; return;
    case 2: *width = kvserve_quant_avx2::kW; *vectors = kvserve_quant_avx2::kNV; return;
#endif
    default: *width = kvserve_quant_portable::kW; *vectors = kvserve_quant_portable::kNV;
  }
}

}  // namespace

namespace kvserve {

int64_t resolve_quant_isa(int64_t isa) {
  static const int64_t best = best_isa();
  if (isa == 0) return best;
  check(isa >= 1 && isa <= best, "instruction set " + std::to_string(isa) + " is not available here (best: " +
                                     std::to_string(best) + ")");
  return isa;
}

// The instruction set used when none is asked for: 1 portable, 2 AVX2 + FMA, 3 AVX-512F, 4 AVX-512F
// + AVX512-BF16.
int64_t quant_linear_isa() { return resolve_quant_isa(0); }

// (vector width in floats, vectors per panel) of instruction set `isa` (0: the best here).
void quant_linear_layout(int64_t isa, int64_t* width, int64_t* vectors) { layout_of(resolve_quant_isa(isa), width, vectors); }

// x: contiguous [M, K] float32 or bfloat16; w.packed: uint8 [P, K, row bytes]; w.scales (and
// neg_offsets, int4 only): float32 [P, K / group_size, kNR]; bias: float32 [N] or nullptr; bits 8
// or 4 (int4 without offsets is symmetric: q - 8; codebook kE2M1: MXFP4's values); isa: 0 (the
// best here) or the instruction set the weights were packed for -> out [M, N] in x's dtype.
void quant_linear(DType dtype, const void* x, void* out, int64_t M, int64_t K, const QuantWeight& w, int64_t isa) {
  isa = resolve_quant_isa(isa);
  if (M == 0 || w.N == 0) return;
  check(w.codebook == kIntegers || (w.codebook == kE2M1 && w.bits == 4 && w.neg_offsets == nullptr),
        "quant_linear: the E2M1 codebook is for 4-bit weights without offsets");
  const kvserve_quant::QuantArgs q{w.packed, w.scales, w.neg_offsets, w.bias, M, K, w.N, w.group_size, w.bits,
                                   w.codebook};
  const bool bf16 = dtype == kBFloat16;
  switch (isa) {
#if defined(KVSERVE_QUANT_X86)
    case 4: kvserve_quant_avx512bf16::quant_linear(x, out, bf16, q); break;
    case 3: kvserve_quant_avx512::quant_linear(x, out, bf16, q); break;
    case 2: kvserve_quant_avx2::quant_linear(x, out, bf16, q); break;
#endif
    default: kvserve_quant_portable::quant_linear(x, out, bf16, q);
  }
}

}  // namespace kvserve

extern "C" {

KVSERVE_EXPORT int64_t kvserve_quant_linear_isa() { return kvserve::quant_linear_isa(); }

// layout: int64 [2] <- (vector width in floats, vectors per panel).
KVSERVE_EXPORT int kvserve_quant_linear_layout(int64_t isa, int64_t* layout) {
  return kvserve::guarded([&] { kvserve::quant_linear_layout(isa, layout, layout + 1); });
}

KVSERVE_EXPORT int kvserve_quant_linear(int32_t dtype, const void* x, void* out, int64_t M, int64_t K,
                                        const uint8_t* packed, const float* scales, const float* neg_offsets,
                                        const float* bias, int64_t N, int64_t group_size, int64_t bits, int64_t isa,
                                        int64_t codebook) {
  return kvserve::guarded([&] {
    kvserve::quant_linear(static_cast<kvserve::DType>(dtype), x, out, M, K,
                          kvserve::QuantWeight{packed, scales, neg_offsets, bias, N, group_size, bits, codebook}, isa);
  });
}

}  // extern "C"
