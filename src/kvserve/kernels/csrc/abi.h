// What every kernel file shares: the element types, the dtype codes of the C entry points, the
// checks that fail a call, and the wrapper that turns a C++ exception into an error code.
//
// The kernels are plain C++ on raw pointers and sizes, built without any PyTorch header into one
// shared library per instruction set (kvserve/kernels/build.py) that Python calls through ctypes
// (kvserve/kernels/library.py declares every entry point). An entry point is
//
//     extern "C" KVSERVE_EXPORT int kvserve_NAME(...) { return kvserve::guarded([&] { ... }); }
//
// returning 0, or 1 with the message left for kvserve_last_error() (Python raises RuntimeError
// with it). Shapes and dtypes are checked by the Python caller (kvserve/kernels/ops_*.py); what
// only the data can tell (a slot out of range, a top_p outside (0, 1)) is checked here.
#pragma once

#include <cstdint>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>

#define KVSERVE_EXPORT __attribute__((visibility("default")))

namespace kvserve {

// dtype codes of the C entry points (kvserve/kernels/library.py: DTYPE_CODES).
enum DType : int32_t { kFloat32 = 0, kBFloat16 = 1, kFloat16 = 2, kInt8 = 3, kFp8E4M3 = 4, kFp8E5M2 = 5 };

// bfloat16 storage: the upper half of a float32. Conversions as PyTorch's kvserve::BFloat16 does them
// (exact widening; rounding to nearest even, NaN -> 0x7fc0).
struct BFloat16 {
  uint16_t x;
  BFloat16() = default;
  explicit BFloat16(float v) {
    uint32_t word;
    std::memcpy(&word, &v, sizeof(word));
    x = v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
  }
  explicit operator float() const {
    const uint32_t word = static_cast<uint32_t>(x) << 16;
    float f;
    std::memcpy(&f, &word, sizeof(f));
    return f;
  }
};

// IEEE binary16 storage, converted as kvserve::Half does: exact widening, rounding to nearest even.
// Integer operations only, so -ffast-math cannot change them.
struct Half {
  uint16_t x;
  Half() = default;
  explicit Half(float v) : x(from_float(v)) {}
  explicit operator float() const { return to_float(x); }

  static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu, bits;
    if (exponent == 0x1f) {
      bits = sign | 0x7f800000u | (mantissa << 13);  // infinity, NaN (payload kept)
    } else if (exponent != 0) {
      bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: mantissa * 2^-24, normalised
      exponent = 113;
      while (!(mantissa & 0x400u)) {
        mantissa <<= 1;
        --exponent;
      }
      bits = sign | (exponent << 23) | ((mantissa & 0x3ffu) << 13);
    }
    float f;
    std::memcpy(&f, &bits, sizeof(f));
    return f;
  }

  static uint16_t from_float(float f) {
    uint32_t x;
    std::memcpy(&x, &f, sizeof(x));
    const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x > 0x7f800000u) return sign | 0x7e00u;  // NaN
    if (x >= 0x477ff000u) return sign | 0x7c00u;  // 65520 and up round to infinity
    if (x >= 0x38800000u) {                       // normal: 2^-14 and up
      x -= 112u << 23;
      return sign | static_cast<uint16_t>((x + 0xfffu + ((x >> 13) & 1u)) >> 13);
    }
    if (x < 0x33000000u) return sign;  // below 2^-25: zero (2^-25 itself ties to even zero)
    const uint32_t mantissa = (x & 0x7fffffu) | 0x800000u, shift = 126 - (x >> 23);
    const uint32_t rest = mantissa & ((1u << shift) - 1), half = 1u << (shift - 1);
    uint32_t q = mantissa >> shift;
    if (rest > half || (rest == half && (q & 1u))) ++q;
    return sign | static_cast<uint16_t>(q);
  }
};

// The error of a call that failed: raised in Python as RuntimeError(message).
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Fails the call with `message` unless `condition` holds.
inline void check(bool condition, const char* message) {
  if (!condition) throw Error(message);
}
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

// The message of this thread's last failed call (abi.cpp).
void set_last_error(const char* message);

// Runs body(); 0 when it returned, 1 (message kept for kvserve_last_error) when it threw.
template <class F>
int guarded(const F& body) noexcept {
  try {
    body();
    return 0;
  } catch (const std::exception& error) {
    set_last_error(error.what());
  } catch (...) {
    set_last_error("unknown C++ exception");
  }
  return 1;
}

}  // namespace kvserve
