// What the AMX kernels (amx_linear.cpp: bfloat16 weights; amx_quant_*.cpp: int8/int4 weights
// widened to bfloat16 tiles; paged_attention.cpp) share: the one probe of whether this CPU and OS
// grant the tiles, the tile configuration, the activation rows as A tiles, and the float32 ->
// bfloat16 store of an output.
//
// The AMX rule. AMX is the one instruction set chosen at run time inside a library: the vector
// ISA is the library's (build.py loads the variant the CPU runs; code specialises by the compiler's
// macros only), but tiles also need the OS to grant them to the process, which no build flag can
// tell. So the AMX code is compiled into the avx512_bf16 variant only, under
// `#pragma GCC target("amx-...")`, and runs where kvserve::amx_linear_available() (abi.cpp) says:
// this header's amx_supported(), probed once, and the user's switch, which Python reads
// (KVSERVE_AMX=0, kvserve/kernels/library.py) and passes in through kvserve_set_amx_enabled.
// Nothing here reads the environment or probes the vector ISA.
//
// Tiles: 0-3 C (16 x 16 float32), 4-5 A (16 rows x 32 bfloat16), 6-7 B (16 rows x 64 bytes: 16
// output columns x a pair of inputs each, AMX's "VNNI" form). The tile registers must be enabled per
// process (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA) and configured per thread.
#pragma once
#include "abi.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

// The AMX code is compiled into the avx512_bf16 variant only (kvserve/kernels/build.py): every AMX
// CPU runs that variant, and the vector kernels the tiles' results must match bit for bit (SiLU,
// the attention's softmax) are then the AVX-512 ones.
#if defined(__x86_64__) && defined(__linux__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include "simd.h"
#include <sys/syscall.h>
#include <unistd.h>
#define KVSERVE_AMX_BUILD 1
#endif

namespace kvserve_amx {

constexpr int64_t kTileRows = 16;  // rows of an A or C tile
constexpr int64_t kTileK = 32;     // bfloat16 inputs per A tile row (64 bytes)
constexpr int64_t kTileN = 16;     // output columns per panel (a C tile row: 16 float32)
constexpr int64_t kChunkBytes = kTileRows * 64;  // one bfloat16 B tile: 16 columns x 32 inputs

#if defined(KVSERVE_AMX_BUILD)

// The probe: this CPU has AMX-BF16 tiles and the kernel grants the tile state to this process
// (Linux 5.16+); run once, by amx_linear_available() (abi.cpp), and only while the user's switch
// allows AMX. AVX512-BF16 needs no check: this code is only in the avx512_bf16 library, which is
// only loaded where the CPU has it. GCC's cpu feature names for AMX arrived with GCC 13; the CPUID
// bits are read directly: leaf 7 subleaf 0, EDX bit 22 AMX-BF16, bit 24 AMX-TILE.
inline bool amx_supported() {
  unsigned eax = 7, ebx = 0, ecx = 0, edx = 0;
  __asm__ volatile("cpuid" : "+a"(eax), "=b"(ebx), "+c"(ecx), "=d"(edx));
  const bool bf16 = (edx >> 22) & 1, tile = (edx >> 24) & 1;
  constexpr long kArchReqXcompPerm = 0x1023;
  constexpr long kXfeatureXtiledata = 18;
  return bf16 && tile && syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
}

// This core's L2 size in bytes (2 MB on Sapphire Rapids; 2 MB when the OS does not say).
inline int64_t l2_cache_bytes() {
  static const int64_t bytes = [] {
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return reported > 0 ? static_cast<int64_t>(reported) : int64_t(2) << 20;
  }();
  return bytes;
}

#pragma GCC push_options
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl")

struct TileConfig {
  uint8_t palette_id;
  uint8_t start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

// `rows` (1-16) rows in the A and C tiles: fewer than 16 when the layer has fewer rows, so that a
// decode row does not load and multiply 15 rows of zeros (each row's sums are independent of the
// others', so the count never changes a bit). Tiles from `first_b_tile` on (6: two A tiles, 4-5)
// hold 16-row B tiles.
inline void configure_tiles(int64_t rows, int first_b_tile = 6) {
  TileConfig config;
  std::memset(&config, 0, sizeof(config));
  config.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = t < first_b_tile ? static_cast<uint8_t>(std::min<int64_t>(rows, kTileRows)) : kTileRows;
    config.colsb[t] = 64;
  }
  // ldtilecfg through asm with the configuration as a memory operand: GCC 12's
  // _tile_loadconfig does not tell the optimiser that it reads the bytes, and it dropped the
  // stores of the rows and column widths (-march=x86-64-v4 builds: the tiles kept 0 rows).
  asm volatile("ldtilecfg %0" : : "m"(config));
}

using kvserve::round_to_bf16;  // 16 float32 -> 16 bfloat16 bits, c10's rounding (simd.h)

#pragma GCC pop_options

// The activations x [M][K] (bfloat16) as A tiles, in row groups of 32 rows (two A tiles). Rows are
// read in place (stride K) when K is a multiple of 32 and the group fills its tiles; the others (a
// last group of 1-15 or 17-31 rows, or every row when K is not a multiple of 32) are copied once
// with zero padding to a width of whole chunks. Padding adds exact zeros: it never changes a valid
// element.
class ActivationTiles {
 public:
  ActivationTiles(const uint16_t* x, int64_t M, int64_t K) : x_(x), K_(K) {
    const int64_t chunks = (K + kTileK - 1) / kTileK;
    width_ = chunks * kTileK;
    const int64_t groups = (M + 2 * kTileRows - 1) / (2 * kTileRows);
    const int64_t tail = M % (2 * kTileRows);
    first_padded_ = K % kTileK != 0 ? 0 : (tail == 0 || tail == kTileRows) ? groups : groups - 1;
    const int64_t first_row = first_padded_ * 2 * kTileRows;
    const int64_t padded_rows = (M - first_row + kTileRows - 1) / kTileRows * kTileRows;
    padded_.assign(static_cast<size_t>(std::max<int64_t>(padded_rows, 0) * width_), 0);
    for (int64_t r = first_row; r < M; ++r) std::memcpy(&padded_[(r - first_row) * width_], x + r * K, K * 2);
  }

  // Row group g (rows 32g ...): its first row's bytes and the row stride in bytes.
  const uint8_t* group(int64_t g, int64_t* stride) const {
    if (g < first_padded_) {
      *stride = K_ * 2;
      return reinterpret_cast<const uint8_t*>(x_ + g * 2 * kTileRows * K_);
    }
    *stride = width_ * 2;
    return reinterpret_cast<const uint8_t*>(&padded_[(g - first_padded_) * 2 * kTileRows * width_]);
  }

 private:
  const uint16_t* x_;
  int64_t K_, width_, first_padded_;
  std::vector<uint16_t> padded_;
};

#endif  // KVSERVE_AMX_BUILD

}  // namespace kvserve_amx
