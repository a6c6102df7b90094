// The quantized GEMM of quant_linear.cpp for one instruction set, included once per ISA inside its
// own namespace and `#pragma GCC target` region, with QL_ISA set to 1 (portable vectors), 2 (AVX2 +
// FMA), 3 (AVX-512F) or 4 (AVX-512F with AVX512-BF16: ISA 3's layout and float32 kernels, and the
// pair kernels for bfloat16 activations at the end of this file). Nothing here includes system headers: quant_linear.cpp includes them first
// (bf16_convert.h, ours, is included inside each namespace).
// The sequence of operations per output element, the layout and the kernels are described at the
// top of quant_linear.cpp; this file only makes them fast.

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

typedef float vfloat __attribute__((vector_size(kW * sizeof(float))));
typedef int32_t vint __attribute__((vector_size(kW * sizeof(int32_t))));

inline vfloat broadcast(float value) {
#if QL_ISA >= 3
  return _mm512_set1_ps(value);
#elif QL_ISA == 2
  return _mm256_set1_ps(value);
#else
  vfloat v;
  for (int i = 0; i < kW; ++i) v[i] = value;
  return v;
#endif
}

// a * b + c with one rounding.
inline vfloat fmadd(vfloat a, vfloat b, vfloat c) {
#if QL_ISA >= 3
  return _mm512_fmadd_ps(a, b, c);
#elif QL_ISA == 2
  return _mm256_fmadd_ps(a, b, c);
#else
  vfloat r;
  for (int i = 0; i < kW; ++i) r[i] = __builtin_fmaf(a[i], b[i], c[i]);
  return r;
#endif
}

template <typename T>
inline T load_vector(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

inline void store_vector(float* p, vfloat v) { std::memcpy(p, &v, sizeof(v)); }

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

// The GEMM of one sequence (Steps: FmaSteps, or PairSteps below): work items of row blocks x
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
// ---- bfloat16 activations on AVX512-BF16: pair products (quant_linear.cpp's second sequence) ----

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

void quant_linear(const void* x, void* out, bool bf16, const QuantArgs& q) {
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
