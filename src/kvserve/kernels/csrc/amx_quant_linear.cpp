// Batch-invariant linear y = x W^T + b over weight-only int8/int4 weights on AMX tiles, for
// bfloat16 activations on hosts that have them (quant_linear.cpp's vector kernel everywhere else,
// and for float32 activations).
//
// The weight's integers (int8 q; int4 q - 8 when symmetric, q with offsets) are exact in bfloat16,
// so a chunk of them is widened to a bfloat16 B tile in L1 and multiplied on the tiles like
// amx_linear.cpp's weights; each group's scale (and offset) enters once per group, as in
// quant_linear.cpp's sequence (its header), with the group's partial sum p made by the tiles:
//
//     acc = 0
//     for each group g (G inputs, a multiple of 32, or all of K):
//         p = tile sums of x[m][k] * v[n][k] over the group's 32-input chunks, in increasing k
//         acc = fma(p, s[n][g], acc)
//         with offsets:  acc = fma(-m[n][g], xsum[m][g], acc)   xsum = ((x_k0 + x_k1) + ...) in k order
//     y[m][n] = round(acc + b[n])        (float32, then once to bfloat16)
//
// all with denormal inputs read as zero and denormal results flushed (DAZ, FTZ), as the tiles do.
//
// MXFP4 (the E2M1 codebook) has power-of-two scales, so a weight times its scale is exact in
// float32 (and in bfloat16: two significant bits): each chunk's weights enter the tiles already
// scaled, w = fl32(v[n][k] * s[n][g]), and the tiles accumulate the whole K with no per-group merge:
//
//     y[m][n] = round(tile sums of x[m][k] * w[n][k] over all chunks + b[n])
//
// (the merge per 32-input group cost more than the tile products at 4-64 rows).
// p depends only on row m of x, column n of the weight and the chunk order (amx_linear.cpp's
// argument), so every element is one fixed sequence whatever the number of rows, the row's place
// among them and the thread count. A lone row (decode at batch 1) runs the same operations on
// vector FMAs instead (row_kernel, below: the tiles' arithmetic is two fma chains per chunk), since
// widening whole tiles for one row costs more than the tiles save, and where the row and a chunk's
// MXFP4 scales keep every partial value normal and finite it multiplies the chunk's two chains
// by the power-of-two scale instead of each weight (ScaleFields: the same bits, two fewer
// instructions per 32 weights); the layer takes this path for every M once it has it
// (kvserve.model.quant_linear). Its bits differ in the last place from
// quant_linear.cpp's single fma chain per group, as amx_linear's differ from linear.cpp's.
//
// Layout (kvserve.model.quant_linear.pack_quantized_amx): blocks of output columns, N and K padded
// with zeros to a block and to 32; int8 [N/16][K][16] (a row: input k of one panel's 16 columns),
// int4 [N/64][K/2][64] (a row: input 2r of four panels in the low nibbles, 2r + 1 in the high
// ones). Widening turns a panel's 32-input chunk (16 bytes of each of 32 or 16 rows) into the B
// tile's pair-interleaved form; the one-row kernel reads the rows as they are. scales float32
// [blocks][K/G][block columns]; negated offsets the same (int4 with offsets only).
//
// Files: amx_quant.h (what the paths share), amx_quant_tiles.cpp (the tiles, and the work split
// between threads), amx_quant_widen.h (chunks widened to B tiles), amx_quant_row.cpp (a lone row),
// and here the input sums and the entry point. AMX code runs where amx_linear_available() (the
// AMX rule: amx_tiles.h).
#include <cstdint>
#include <cstring>
#include <vector>

#include "abi.h"
#include "amx_quant.h"
#include "kernels.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace {

#include "bf16_convert.h"

}  // namespace

namespace kvserve {

// x: contiguous [M, K] bfloat16; w.packed: uint8 [N/16, K', 16] (int8) or [N/64, K'/2, 64] (int4),
// K' = K rounded up to 32; w.scales (and neg_offsets, int4 only): float32 [blocks, K / group_size,
// block columns]; bias float32 [N] or nullptr; group_size: K, or a multiple of 32 that divides K;
// bits 8 or 4 (int4 without offsets is symmetric: q - 8) -> out [M, N] bfloat16.
void amx_quant_linear(const BFloat16* x, BFloat16* out, int64_t M, int64_t K, const QuantWeight& w) {
  check(amx_linear_available(), "amx_quant_linear: no AMX-BF16 tiles on this CPU / process");
  check(w.codebook == kIntegers || (w.codebook == kE2M1 && w.bits == 4 && w.neg_offsets == nullptr),
        "amx_quant_linear: the E2M1 codebook is for 4-bit weights without offsets");
#if defined(KVSERVE_AMX_BUILD)
  using namespace kvserve_amx_quant;
  const int64_t N = w.N, group_size = w.group_size;
  if (M == 0 || N == 0) return;
  const int64_t chunks = (K + kTileK - 1) / kTileK, groups = K / group_size;
  const bool has_offsets = w.neg_offsets != nullptr;
  // Each row's input sum per group, a plain float32 sum in increasing k (offsets only).
  const FlushDenormals flush;
  std::vector<float> xsum(has_offsets ? M * groups : 0);
  for (int64_t r = 0; r < M && has_offsets; ++r) {
    for (int64_t g = 0; g < groups; ++g) {
      float s = 0.f;
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) s += to_float(x[r * K + k]);
      xsum[r * groups + g] = s;
    }
  }
  const uint16_t* xs = reinterpret_cast<const uint16_t*>(x);
  const Layer layer{w.packed, w.scales, w.neg_offsets, w.bias, has_offsets ? xsum.data() : nullptr, M, K, N, chunks,
                    groups, group_size == K ? chunks : group_size / kTileK, !has_offsets, w.codebook};
  uint16_t* o = reinterpret_cast<uint16_t*>(out);
  const bool scaled = w.codebook == kE2M1;  // power-of-two scales, folded into the weights
  if (M == 1) run_row(x, o, layer, w.bits, scaled);
  else run_tiles(xs, o, layer, w.bits, scaled);
#endif
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_amx_quant_linear(const void* x, void* out, int64_t M, int64_t K,
                                                       const uint8_t* packed, const float* scales,
                                                       const float* neg_offsets, const float* bias, int64_t N,
                                                       int64_t group_size, int64_t bits, int64_t codebook) {
  using kvserve::BFloat16;
  return kvserve::guarded([&] {
    kvserve::amx_quant_linear(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), M, K,
                              kvserve::QuantWeight{packed, scales, neg_offsets, bias, N, group_size, bits, codebook});
  });
}

#pragma GCC pop_options
