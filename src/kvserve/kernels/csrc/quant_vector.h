// The quantized GEMM's vectors (quant_linear.cpp): the instruction set this library was compiled
// for, the panel shape it gives, and the vector operations the kernels are written in.
//
// The instruction set is the compiler's (the library's variant, kvserve/kernels/build.py), read
// from its predefined macros, never probed at run time:
//   QL_ISA 4  __AVX512F__ and __AVX512BF16__ (avx512_bf16): 16-float vectors, 64-column panels,
//             and the bfloat16 pair kernels (quant_pairs.h)
//   QL_ISA 3  __AVX512F__ (avx512): the same vectors and panels, float32 FMAs only
//   QL_ISA 2  __AVX2__ and __FMA__ (avx2): 8-float vectors, 16-column panels
//   QL_ISA 1  otherwise (x86_64, other architectures): portable GCC vectors of 4 floats
// The packed layout is therefore the library's (quant_linear_layout); every instruction set
// computes the same sequence (ISA 4's bfloat16 pairs aside), so all give the same bits.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "abi.h"
#include "kernels.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define QL_ISA 4
#elif defined(__AVX512F__)
#define QL_ISA 3
#elif defined(__AVX2__) && defined(__FMA__)
#define QL_ISA 2
#else
#define QL_ISA 1
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve_quant {

#if QL_ISA >= 3
constexpr int kW = 16;  // floats per vector
constexpr int kNV = 4;  // vectors per panel row
#elif QL_ISA == 2
constexpr int kW = 8;
constexpr int kNV = 2;
#else
constexpr int kW = 4;
constexpr int kNV = 2;
#endif
constexpr int kMR = 4;               // rows per microkernel
constexpr int kNR = kNV * kW;        // output columns per panel
constexpr int kNP = 8 / kNV;         // panels of the one-row kernel (8 independent accumulators)

#define KVSERVE_VECTOR_ISA (QL_ISA >= 3 ? 16 : QL_ISA == 2 ? 8 : 0)
#include "float_vectors.h"

typedef int32_t vint __attribute__((vector_size(kW * sizeof(int32_t))));

// kW consecutive bytes widened to int32 lanes: sign-extended (int8) or zero-extended (int4 pairs).
template <bool kSigned>
inline vint widen(const uint8_t* p) {
#if QL_ISA >= 3
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return (vint)(kSigned ? _mm512_cvtepi8_epi32(bytes) : _mm512_cvtepu8_epi32(bytes));
#elif QL_ISA == 2
  const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return (vint)(kSigned ? _mm256_cvtepi8_epi32(bytes) : _mm256_cvtepu8_epi32(bytes));
#else
  vint v;
  for (int i = 0; i < kW; ++i) v[i] = kSigned ? static_cast<int32_t>(static_cast<int8_t>(p[i])) : p[i];
  return v;
#endif
}

inline vfloat to_vfloat(vint v) {  // exact: |v| < 2^24
#if QL_ISA >= 3
  return _mm512_cvtepi32_ps((__m512i)v);
#elif QL_ISA == 2
  return _mm256_cvtepi32_ps((__m256i)v);
#else
  return __builtin_convertvector(v, vfloat);
#endif
}

// Bytes of one packed panel row; "32 bits" is a row of already widened float32 values (below).
constexpr int64_t row_bytes(int bits) { return bits == 32 ? kNR * 4 : bits == 8 ? kNR : kNR / 2; }

// One packed weight row (kNR columns) as kNV float vectors holding the integers the sequence
// multiplies by: q (int8); for int4, kTable 0: q (with offsets), 1: q - 8 (symmetric), 2: the
// doubled E2M1 value of q (MXFP4; kvserve::nibble_value).
template <int kBits, int kTable>
inline void load_weights(const uint8_t* b, vfloat (&out)[kNV]) {
  if constexpr (kBits == 32) {
    for (int v = 0; v < kNV; ++v) out[v] = load_vector<vfloat>(b + v * kW * sizeof(float));
  } else if constexpr (kBits == 8) {
    for (int v = 0; v < kNV; ++v) out[v] = to_vfloat(widen<true>(b + v * kW));
  } else {
#if QL_ISA >= 3
    // A 16-entry table lookup gives the float of each nibble in one instruction: vpermps reads
    // only the low 4 bits of each index lane, so the low nibbles need no mask.
    const __m512 table = kTable == 1 ? _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7)
                         : kTable == 2 ? _mm512_load_ps(kvserve::kE2M1Doubled)
                                       : _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int g = 0; g < kNV / 2; ++g) {
      const __m512i bytes = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + g * kW)));
      out[2 * g] = (vfloat)_mm512_permutexvar_ps(bytes, table);
      out[2 * g + 1] = (vfloat)_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table);
    }
    return;
#endif
    for (int g = 0; g < kNV / 2; ++g) {
      const vint bytes = widen<false>(b + g * kW);
      vint low = bytes & 15, high = bytes >> 4;
      if constexpr (kTable == 2) {
        for (int i = 0; i < kW; ++i) {
          out[2 * g][i] = kvserve::nibble_value(low[i], false, kvserve::kE2M1);
          out[2 * g + 1][i] = kvserve::nibble_value(high[i], false, kvserve::kE2M1);
        }
        continue;
      }
      if constexpr (kTable == 1) {
        low -= 8;
        high -= 8;
      }
      out[2 * g] = to_vfloat(low);
      out[2 * g + 1] = to_vfloat(high);
    }
  }
}

// Rows [0, kc) of a panel widened once into float32 rows (kNR floats each) of `out`, for the row
// groups of a larger M to share: the values are the integers the sequence multiplies by, exact,
// so the FMAs that read them are the same operations on the same numbers.
template <int kBits, int kTable>
inline void widen_rows(int64_t kc, const uint8_t* __restrict b, float* __restrict out) {
  constexpr int64_t rb = row_bytes(kBits);
  for (int64_t k = 0; k < kc; ++k) {
    vfloat w[kNV];
    load_weights<kBits, kTable>(b + k * rb, w);
    for (int v = 0; v < kNV; ++v) store_vector(out + k * kNR + v * kW, w[v]);
  }
}

// Weight bytes requested ahead of the reads, into L2 (prefetcht2): on the AMX Xeon a non-temporal
// prefetch (prefetchnta) left the one-row kernel at about half the read bandwidth (int8 gate_up
// 13 GB/s vs 25 GB/s, docs/benchmarks.md "Quantized weights").
constexpr int64_t kPrefetchBytes = 4096;
inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 1); }

}  // namespace kvserve_quant

#pragma GCC pop_options
