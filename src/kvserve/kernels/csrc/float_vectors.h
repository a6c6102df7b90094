// The float32 vectors the GEMM kernels are written in (linear.cpp, quant_vector.h): vfloat of kW
// lanes (a GCC vector), a broadcast, a fused multiply-add with one rounding, and unaligned loads
// and stores. No include guard, on purpose: each kernel includes this inside its own namespace and
// optimisation pragmas, after defining kW (floats per vector) and KVSERVE_VECTOR_ISA: 16 for
// AVX-512 intrinsics, 8 for AVX2+FMA, 0 for portable GCC vectors (any width).
typedef float vfloat __attribute__((vector_size(kW * sizeof(float))));

inline vfloat broadcast(float value) {
#if KVSERVE_VECTOR_ISA == 16
  return _mm512_set1_ps(value);
#elif KVSERVE_VECTOR_ISA == 8
  return _mm256_set1_ps(value);
#else
  vfloat v;
  for (int i = 0; i < kW; ++i) v[i] = value;
  return v;
#endif
}

// a * b + c with one rounding.
inline vfloat fmadd(vfloat a, vfloat b, vfloat c) {
#if KVSERVE_VECTOR_ISA == 16
  return _mm512_fmadd_ps(a, b, c);
#elif KVSERVE_VECTOR_ISA == 8
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

// By value: taking an accumulator's address would keep the tile in memory instead of registers.
inline void store_vector(float* p, vfloat v) { std::memcpy(p, &v, sizeof(v)); }
