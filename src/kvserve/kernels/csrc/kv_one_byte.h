// The rows of a one-byte KV cache (--kv-cache-dtype int8 / fp8_e4m3 / fp8_e5m2,
// kvserve/attention/kv_quant.py): each (token, KV head) row is head_dim one-byte codes followed by
// its float32 scale; a value is float32(code) * scale, fp8 codes decoded through a table of the
// 256 values. paged_attention_portable.cpp widens the rows in registers with these, the product the
// reference backend's dequantization computes; no dequantized copy is made.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace kvserve::attention {

// fp8 cache codes: one byte each, decoded through a table of the 256 values.
struct Fp8E4M3 { uint8_t bits; };
struct Fp8E5M2 { uint8_t bits; };

// float8_e4m3fn (no infinities; S.1111.111 is NaN) and float8_e5m2 (the upper byte of a float16).
inline float decode_e4m3(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 3) & 15, mantissa = b & 7;
  float v = exponent == 0 ? std::ldexp(mantissa / 8.f, -6)
            : (exponent == 15 && mantissa == 7) ? std::numeric_limits<float>::quiet_NaN()
                                                 : std::ldexp(1.f + mantissa / 8.f, exponent - 7);
  return sign ? -v : v;
}
inline float decode_e5m2(uint8_t b) {
  const int sign = b >> 7, exponent = (b >> 2) & 31, mantissa = b & 3;
  float v = exponent == 0 ? std::ldexp(mantissa / 4.f, -14)
            : exponent == 31 ? (mantissa ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity())
                             : std::ldexp(1.f + mantissa / 4.f, exponent - 15);
  return sign ? -v : v;
}

template <typename code_t>
struct Fp8Table {
  float value[256];
  Fp8Table() {
    for (int b = 0; b < 256; ++b)
      value[b] = std::is_same_v<code_t, Fp8E4M3> ? decode_e4m3(static_cast<uint8_t>(b)) : decode_e5m2(static_cast<uint8_t>(b));
  }
};
template <typename code_t>
const float* fp8_table() {
  static const Fp8Table<code_t> table;
  return table.value;
}

template <typename cache_t>
constexpr bool is_one_byte_v = std::is_same_v<cache_t, int8_t> || std::is_same_v<cache_t, Fp8E4M3> ||
                               std::is_same_v<cache_t, Fp8E5M2>;

// The float32 scale stored after the head_dim codes of a one-byte cache row (1 for float caches).
template <typename cache_t>
inline float row_scale(const cache_t* row, int64_t dim) {
  if constexpr (is_one_byte_v<cache_t>) {
    float s;
    __builtin_memcpy(&s, reinterpret_cast<const uint8_t*>(row) + dim, sizeof(s));
    return s;
  } else {
    return 1.f;
  }
}

}  // namespace kvserve::attention
