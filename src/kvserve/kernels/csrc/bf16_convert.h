// float32 <-> bfloat16 conversions of the kernels (linear.cpp, quant_fma.h, lora.cpp, the AMX
// quantized kernel, elementwise.cpp, the MoE files), written here rather than taken from c10:
// functions from headers compiled under other optimisation options are not inlined into the
// kernels (a call per element). No include guard and no includes, on purpose: each kernel includes
// this inside its own namespace and optimisation pragmas, after abi.h and <cstring>.
inline float to_float(float v) { return v; }
inline float to_float(kvserve::BFloat16 v) {  // exact: the bfloat16 bits are the float's upper half
  const uint32_t word = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &word, sizeof(f));
  return f;
}

template <typename out_t>
inline out_t from_float(float v);
template <>
inline float from_float<float>(float v) { return v; }
template <>
inline kvserve::BFloat16 from_float<kvserve::BFloat16>(float v) {  // round to nearest even, as c10 does
  uint32_t word;
  std::memcpy(&word, &v, sizeof(word));
  const uint16_t bits = v != v ? uint16_t{0x7fc0} : static_cast<uint16_t>((word + 0x7fffu + ((word >> 16) & 1u)) >> 16);
  kvserve::BFloat16 out;
  out.x = bits;
  return out;
}

// Element i of a float32 or bfloat16 tensor, as float32; and v rounded to the dtype.
inline float load(const void* p, kvserve::DType dtype, int64_t i) {
  return dtype == kvserve::kFloat32 ? static_cast<const float*>(p)[i] : to_float(static_cast<const kvserve::BFloat16*>(p)[i]);
}
inline float rounded(float v, kvserve::DType dtype) {
  return dtype == kvserve::kFloat32 ? v : to_float(from_float<kvserve::BFloat16>(v));
}
