// What the AMX quantized linear's files share (amx_quant_linear.cpp has the sequence): the packed
// layout's constants, the Layer a call describes, the denormal flushing both paths run under, and
// the two paths: the tile kernel (amx_quant_tiles.cpp, widening: amx_quant_widen.h) and the one-row
// vector kernel (amx_quant_row.cpp). Everything here is compiled under the kernels' no-fast-math
// region, as the functions that call it (GCC inlines only between equal optimisation options).
#pragma once

#include <cstdint>

#include "abi.h"
#include "amx_tiles.h"
#include "kernels.h"

// The region the AMX quantized kernels are compiled in (amx_quant_row.cpp, amx_quant_tiles.cpp,
// amx_quant_widen.h): no fast math, no contraction, and the AMX + AVX-512 BF16 target, whatever
// the file's own flags (run-time dispatch: amx_linear_available() in abi.cpp decides whether it runs).
#define KVSERVE_AMX_QUANT_BEGIN                                        \
  _Pragma("GCC push_options")                                          \
  _Pragma("GCC optimize(\"no-fast-math\", \"fp-contract=off\")")      \
  _Pragma("GCC push_options")                                          \
  _Pragma("GCC target(\"amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16\")")
#define KVSERVE_AMX_QUANT_END _Pragma("GCC pop_options") _Pragma("GCC pop_options")

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve_amx_quant {

using namespace kvserve_amx;

constexpr int64_t kChunkWeights = kTileK * kTileN;  // 512 weights per chunk

// Output columns per block of the packed layout: int8 rows are one panel wide (16 bytes per
// input), int4 rows four panels (one 64-byte line per input pair), which is what the one-row
// kernel reads fastest from memory (measured: int8 in 64-column blocks was 5% slower per step,
// int4 in 16-column panels 15% slower).
constexpr int64_t block_cols(int64_t bits) { return bits == 8 ? kTileN : 4 * kTileN; }

// Packed rows per 32-input chunk: one per input (int8) or per input pair (int4).
constexpr int64_t chunk_rows(int64_t bits) { return bits == 8 ? kTileK : kTileK / 2; }

struct Layer {
  const uint8_t* packed;
  const float* scales;
  const float* neg_offsets;  // nullptr: none
  const float* bias;         // nullptr: none
  const float* xsum;         // [M][groups] with offsets, else nullptr
  int64_t M, K, N, chunks, groups, chunks_per_group;
  bool minus8;               // int4 symmetric: q - 8
  int64_t codebook;          // kvserve::Codebook (bits 4)

  // Panel p's first packed byte of chunk c (rows block_cols bytes apart), and the index of its
  // scales (and offsets) of group g (16 floats).
  template <int kBits>
  const uint8_t* chunk(int64_t p, int64_t c) const {
    constexpr int64_t bc = block_cols(kBits), bp = bc / kTileN;
    return packed + ((p / bp * chunks + c) * chunk_rows(kBits)) * bc + p % bp * kTileN;
  }
  template <int kBits>
  int64_t param(int64_t p, int64_t g) const {
    constexpr int64_t bc = block_cols(kBits), bp = bc / kTileN;
    return (p / bp * groups + g) * bc + p % bp * kTileN;
  }
};

#if defined(KVSERVE_AMX_BUILD)

// Denormal inputs treated as zero and denormal results flushed (MXCSR DAZ and FTZ) while it
// lives, in this thread: the tiles do so, and the vector code around them (group merges, input
// sums, bias) does the same, so that the one-row kernel's vector FMAs give the tiles' bits.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// The layer's rows on the tiles (x [M][K] bfloat16 bits, M >= 2) and a lone row on vector FMAs
// with the tiles' arithmetic; bits 8 or 4; scaled: MXFP4 (power-of-two scales folded into the
// weights). out: [M][N] bfloat16 bits.
void run_tiles(const uint16_t* x, uint16_t* out, const Layer& L, int64_t bits, bool scaled);
void run_row(const kvserve::BFloat16* x, uint16_t* out, const Layer& L, int64_t bits, bool scaled);

#endif  // KVSERVE_AMX_BUILD

}  // namespace kvserve_amx_quant

#pragma GCC pop_options
