// The second sequence of the quantized GEMM, for bfloat16 activations in the avx512_bf16 library
// (QL_ISA 4, quant_vector.h): a group's partial sum over pairs of inputs with vdpbf16ps
// (quant_linear.cpp's header has the sequence). Rows k and k + 1 of a panel are decoded into
// bfloat16 pairs, the activations packed as pairs, and PairSteps hands the kernels to
// quant_linear.cpp's kernel(). Empty in the other libraries.
#pragma once

#include "quant_fma.h"

#if QL_ISA == 4
#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve_quant {

// Rows k and k + 1 of a packed panel as kNV vectors of bfloat16 pairs: lane j of vector v holds
// (v[k][c], v[k + 1][c]) of column c = v * kW + j, k in the low half. The values are small
// integers (or doubled E2M1 values), whose floats have zero low 16 bits: the halves are exact.
template <int kBits, int kTable>
inline void load_pairs(const uint8_t* b, __m512i (&out)[kNV]) {
  vfloat w0[kNV], w1[kNV];
  load_weights<kBits, kTable>(b, w0);
  load_weights<kBits, kTable>(b + row_bytes(kBits), w1);
  for (int v = 0; v < kNV; ++v) out[v] = _mm512_or_si512(_mm512_srli_epi32((__m512i)w0[v], 16), (__m512i)w1[v]);
}

constexpr int64_t kPairRowBytes = kNR * 4;  // a decoded pair row: kNR lanes of two bfloat16

// Rows [0, kc) of a panel (kc even) decoded once into pair rows for the row groups of a larger M.
template <int kBits, int kTable>
inline void widen_pairs(int64_t kc, const uint8_t* __restrict b, uint8_t* __restrict out) {
  for (int64_t k = 0; k < kc; k += 2) {
    __m512i w[kNV];
    load_pairs<kBits, kTable>(b + k * row_bytes(kBits), w);
    for (int v = 0; v < kNV; ++v) _mm512_storeu_si512(out + k / 2 * kPairRowBytes + v * 64, w[v]);
  }
}

// The kMR-row pair microkernel over one panel: p[i][:] (+)= vdpbf16ps over the pairs k < kc of
// a ([k / 2][kMR] pairs of x) and the panel (packed rows, or decoded pair rows when kDecoded).
template <int kBits, int kTable, bool kDecoded>
inline void pair_micro_kernel(int64_t kc, const uint32_t* __restrict a, const uint8_t* __restrict b,
                              float* __restrict p, bool accumulate) {
  __m512 acc[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = accumulate ? _mm512_loadu_ps(p + i * kNR + v * kW) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k += 2) {
    __m512i w[kNV];
    if constexpr (kDecoded) {
      for (int v = 0; v < kNV; ++v) w[v] = _mm512_loadu_si512(b + k / 2 * kPairRowBytes + v * 64);
    } else {
      prefetch(b + k * row_bytes(kBits) + kPrefetchBytes);
      load_pairs<kBits, kTable>(b + k * row_bytes(kBits), w);
    }
    for (int i = 0; i < kMR; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(a[k / 2 * kMR + i]));
      for (int v = 0; v < kNV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], (__m512bh)w[v], x);
    }
  }
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) _mm512_storeu_ps(p + i * kNR + v * kW, acc[i][v]);
}

// The one-row pair kernel over np <= kNP panels (row_kernel's shape).
template <int kBits, int kTable>
inline void pair_row_kernel(int64_t kc, const uint32_t* __restrict a, const uint8_t* __restrict b,
                            int64_t panel_stride, int np, float* __restrict p, bool accumulate) {
  constexpr int64_t rb = row_bytes(kBits);
  __m512 acc[kNP][kNV];
  for (int j = 0; j < np; ++j)
    for (int v = 0; v < kNV; ++v) acc[j][v] = accumulate ? _mm512_loadu_ps(p + j * kNR + v * kW) : _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; k += 2) {
    const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(a[k / 2 * kMR]));
    for (int j = 0; j < np; ++j) {
      const uint8_t* row = b + j * panel_stride + k * rb;
      prefetch(row + kPrefetchBytes);
      __m512i w[kNV];
      load_pairs<kBits, kTable>(row, w);
      for (int v = 0; v < kNV; ++v) acc[j][v] = _mm512_dpbf16_ps(acc[j][v], (__m512bh)w[v], x);
    }
  }
  for (int j = 0; j < np; ++j)
    for (int v = 0; v < kNV; ++v) _mm512_storeu_ps(p + j * kNR + v * kW, acc[j][v]);
}

// pack_rows for the pair kernels: x's rows as [row group][k / 2][kMR] pairs (x[k] low, x[k + 1]
// high; rows past `rows` zero) and, with `sums`, the float32 input sums of pack_rows.
inline void pack_row_pairs(const kvserve::BFloat16* x, int64_t K, int64_t row0, int64_t rows, int64_t k0, int64_t kc,
                           int64_t G, bool sums, uint32_t* out, float* xsum) {
  const int64_t groups = (rows + kMR - 1) / kMR, qgroups = (kc + G - 1) / G;
  for (int64_t g = 0; g < groups; ++g) {
    uint32_t* dst = out + g * (kc / 2) * kMR;
    for (int r = 0; r < kMR; ++r) {
      const int64_t row = g * kMR + r;
      const kvserve::BFloat16* src = row < rows ? x + (row0 + row) * K + k0 : nullptr;
      for (int64_t k = 0; k < kc; k += 2)
        dst[k / 2 * kMR + r] = src == nullptr ? 0u : static_cast<uint32_t>(src[k].x) | static_cast<uint32_t>(src[k + 1].x) << 16;
      if (!sums) continue;
      for (int64_t q = 0; q < qgroups; ++q) {
        float s = 0.f;
        if (src != nullptr)
          for (int64_t k = q * G; k < std::min(kc, (q + 1) * G); ++k) s += to_float(src[k]);
        xsum[(g * qgroups + q) * kMR + r] = s;
      }
    }
  }
}

// The pair sequence's steps for kernel(): activations as bfloat16 pairs [row group][k / 2][kMR];
// K, G and every K block even (kStep).
template <int kBits_, int kTable, typename act_t>
struct PairSteps {
  using lane_t = uint32_t;
  static constexpr int kBits = kBits_;
  static constexpr int64_t kStep = 2;
  static constexpr int64_t kWideBytes = kPairRowBytes / 2;
  static void pack(const kvserve::BFloat16* x, int64_t K, int64_t row0, int64_t rows, int64_t k0, int64_t kc,
                   int64_t G, bool sums, lane_t* out, float* xsum) {
    pack_row_pairs(x, K, row0, rows, k0, kc, G, sums, out, xsum);
  }
  static void widen(int64_t kc, const uint8_t* b, uint8_t* out) { widen_pairs<kBits, kTable>(kc, b, out); }
  static void one_row(int64_t kc, const lane_t* a, const uint8_t* b, int64_t stride, int np, float* p, bool cont) {
    pair_row_kernel<kBits, kTable>(kc, a, b, stride, np, p, cont);
  }
  static void small(int64_t kc, const lane_t* a, const uint8_t* b, float* p, bool cont) {
    pair_micro_kernel<kBits, kTable, false>(kc, a, b, p, cont);
  }
  static void widened(int64_t kc, const lane_t* a, const uint8_t* w, float* p, bool cont) {
    pair_micro_kernel<kBits, kTable, true>(kc, a, w, p, cont);
  }
};

}  // namespace kvserve_quant

#pragma GCC pop_options
#endif  // QL_ISA == 4
