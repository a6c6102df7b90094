// The float32-FMA sequence of the quantized GEMM (quant_linear.cpp's header: per group
// p = fma(x, v, p) in increasing k, then the merges): the kMR-row microkernel, the one-row kernel
// of a lone row (decode at batch 1), the group merge, the activations packed as float32 row
// groups, the store, and FmaSteps, which hands them to quant_linear.cpp's kernel(). Every
// instruction set runs this sequence (quant_vector.h); AVX512-BF16 adds quant_pairs.h's.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "abi.h"
#include "quant_vector.h"

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace kvserve_quant {

// The kMR-row microkernel over one panel: p[i][:] (+)= sum over k < kc of a[k][i] * W[k][:], one
// FMA per k in increasing k; `accumulate` continues the sums stored in p.
template <int kBits, int kTable>
inline void micro_kernel(int64_t kc, const float* __restrict a, const uint8_t* __restrict b, float* __restrict p,
                         bool accumulate) {
  vfloat acc[kMR][kNV];
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) acc[i][v] = accumulate ? load_vector<vfloat>(p + i * kNR + v * kW) : vfloat{};
  constexpr int64_t rb = row_bytes(kBits);
#pragma GCC unroll 2
  for (int64_t k = 0; k < kc; ++k) {
    prefetch(b + k * rb + kPrefetchBytes);
    vfloat w[kNV];
    load_weights<kBits, kTable>(b + k * rb, w);
    for (int i = 0; i < kMR; ++i) {
      const vfloat x = broadcast(a[k * kMR + i]);
      for (int v = 0; v < kNV; ++v) acc[i][v] = fmadd(x, w[v], acc[i][v]);
    }
  }
  for (int i = 0; i < kMR; ++i)
    for (int v = 0; v < kNV; ++v) store_vector(p + i * kNR + v * kW, acc[i][v]);
}

// The one-row kernel: np <= kNP panels at once (each `panel_stride` bytes after the previous),
// row 0 of a ([k][kMR]); sums p[j][kNR] of panel j. Same per-element sequence as micro_kernel.
template <int kBits, int kTable>
inline void row_kernel(int64_t kc, const float* __restrict a, const uint8_t* __restrict b, int64_t panel_stride,
                       int np, float* __restrict p, bool accumulate) {
  constexpr int64_t rb = row_bytes(kBits);
  if (np == kNP) {
    vfloat acc[kNP][kNV];
    for (int j = 0; j < kNP; ++j)
      for (int v = 0; v < kNV; ++v) acc[j][v] = accumulate ? load_vector<vfloat>(p + j * kNR + v * kW) : vfloat{};
    for (int64_t k = 0; k < kc; ++k) {
      const vfloat x = broadcast(a[k * kMR]);
      for (int j = 0; j < kNP; ++j) {
        const uint8_t* row = b + j * panel_stride + k * rb;
        prefetch(row + kPrefetchBytes);
        vfloat w[kNV];
        load_weights<kBits, kTable>(row, w);
        for (int v = 0; v < kNV; ++v) acc[j][v] = fmadd(x, w[v], acc[j][v]);
      }
    }
    for (int j = 0; j < kNP; ++j)
      for (int v = 0; v < kNV; ++v) store_vector(p + j * kNR + v * kW, acc[j][v]);
    return;
  }
  for (int j = 0; j < np; ++j) {  // a block's last panels: one at a time
    vfloat acc[kNV];
    for (int v = 0; v < kNV; ++v) acc[v] = accumulate ? load_vector<vfloat>(p + j * kNR + v * kW) : vfloat{};
    for (int64_t k = 0; k < kc; ++k) {
      const vfloat x = broadcast(a[k * kMR]);
      const uint8_t* row = b + j * panel_stride + k * rb;
      prefetch(row + kPrefetchBytes);
      vfloat w[kNV];
      load_weights<kBits, kTable>(row, w);
      for (int v = 0; v < kNV; ++v) acc[v] = fmadd(x, w[v], acc[v]);
    }
    for (int v = 0; v < kNV; ++v) store_vector(p + j * kNR + v * kW, acc[v]);
  }
}

// Group end: acc[r][:] = fma(p[r][:], s, acc[r][:]) (from zero at the first group), then with
// offsets acc[r][:] = fma(-m, xsum[r], acc[r][:]).
inline void merge_group(int rows, const float* p, const float* scale, const float* neg_offset, const float* xsum,
                        float* acc, bool first) {
  for (int r = 0; r < rows; ++r) {
    for (int v = 0; v < kNV; ++v) {
      vfloat a = first ? vfloat{} : load_vector<vfloat>(acc + r * kNR + v * kW);
      a = fmadd(load_vector<vfloat>(p + r * kNR + v * kW), load_vector<vfloat>(scale + v * kW), a);
      if (neg_offset != nullptr) a = fmadd(load_vector<vfloat>(neg_offset + v * kW), broadcast(xsum[r]), a);
      store_vector(acc + r * kNR + v * kW, a);
    }
  }
}

#include "bf16_convert.h"

// Rows [row0, row0 + rows) x inputs [k0, k0 + kc) of x [M][K] as float32 groups of kMR rows,
// [row group][k][kMR] (rows past `rows` are zero); with `sums`, each row's input sum over every
// quantization group of the block, xsum[(row group * qgroups + q) * kMR + r] (k0 and kc are
// multiples of G then), a plain float32 sum in increasing k.
template <typename act_t>
void pack_rows(const act_t* x, int64_t K, int64_t row0, int64_t rows, int64_t k0, int64_t kc, int64_t G, bool sums,
               float* out, float* xsum) {
  const int64_t groups = (rows + kMR - 1) / kMR, qgroups = (kc + G - 1) / G;
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
      if (!sums) continue;
      for (int64_t q = 0; q < qgroups; ++q) {
        float s = 0.f;
        for (int64_t k = q * G; k < std::min(kc, (q + 1) * G); ++k) s += dst[k * kMR + r];
        xsum[(g * qgroups + q) * kMR + r] = s;
      }
    }
  }
}

template <typename out_t>
void store_tile(const float* tile, const float* bias, out_t* out, int64_t N, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    out_t* dst = out + r * N;
    const float* src = tile + r * kNR;
    for (int64_t c = 0; c < cols; ++c) dst[c] = from_float<out_t>(bias != nullptr ? src[c] + bias[c] : src[c]);
  }
}

// The float32-FMA sequence's steps for kernel(): activations as float32 [row group][k][kMR]; for
// more than one row group a panel's K block widened once to float32 rows (kWideBytes per k).
template <int kBits_, int kTable, typename act_t>
struct FmaSteps {
  using lane_t = float;
  static constexpr int kBits = kBits_;
  static constexpr int64_t kStep = 1;  // inputs per activation lane
  static constexpr int64_t kWideBytes = kNR * 4;
  static void pack(const act_t* x, int64_t K, int64_t row0, int64_t rows, int64_t k0, int64_t kc, int64_t G, bool sums,
                   lane_t* out, float* xsum) {
    pack_rows(x, K, row0, rows, k0, kc, G, sums, out, xsum);
  }
  static void widen(int64_t kc, const uint8_t* b, uint8_t* out) {
    widen_rows<kBits, kTable>(kc, b, reinterpret_cast<float*>(out));
  }
  static void one_row(int64_t kc, const lane_t* a, const uint8_t* b, int64_t stride, int np, float* p, bool cont) {
    row_kernel<kBits, kTable>(kc, a, b, stride, np, p, cont);
  }
  static void small(int64_t kc, const lane_t* a, const uint8_t* b, float* p, bool cont) {
    micro_kernel<kBits, kTable>(kc, a, b, p, cont);
  }
  static void widened(int64_t kc, const lane_t* a, const uint8_t* w, float* p, bool cont) {
    micro_kernel<32, false>(kc, a, w, p, cont);
  }
};

}  // namespace kvserve_quant

#pragma GCC pop_options
