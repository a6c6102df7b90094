// A model's linear layers as the C++ loops run them (decoder.cpp, moe.cpp): a LinearPart is one
// layer's packed weight and the kernel that reads it, exactly as InvariantLinear's or
// QuantizedLinear's forward calls it (kvserve/model/invariant_linear.py, quant_linear.py); a
// Projection is one part or several whose outputs are concatenated (StackedLinear).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "abi.h"

namespace kvserve {

enum LinearKind : int64_t { kVector = 0, kAmx = 1, kQuantVector = 2, kQuantAmx = 3 };

// The layout of kvserve/kernels/ops_decoder.py's LinearPart (a ctypes Structure).
struct LinearPart {
  int64_t kind;
  const void* packed;
  int64_t weight_dtype;       // kVector: float32 or bfloat16 panels
  const float* scales;        // quantized kinds
  const float* neg_offsets;   // int4 with zero points, else nullptr
  const float* bias;          // or nullptr
  const int64_t* input_perm;  // GPTQ act-order input order [in_features], or nullptr
  int64_t in_features, out_features, group_size, bits;
  int64_t codebook;           // quantized kinds, bits 4: kvserve::Codebook
};

// Fails the call unless `part` is a kind the loops run (a quantized kind with its scales).
void check_part(const LinearPart& part);

// A grow-only, 64-byte aligned scratch buffer.
class Buffer {
 public:
  template <typename T>
  T* get(int64_t count) {
    return static_cast<T*>(bytes(static_cast<size_t>(count < 1 ? 1 : count) * sizeof(T)));
  }

 private:
  void* bytes(size_t size);
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> data_;
  size_t capacity_ = 0;
};

struct Projection {
  std::vector<LinearPart> parts;
  int64_t out_features = 0;
};

Projection make_projection(const LinearPart* parts, int64_t count);

// The scratch a projection may need: the inputs gathered by input_perm, a part's own output.
struct ProjectionScratch {
  Buffer gathered, part_out;
};

// x [rows, in_features] (dtype) -> out [rows, out_features]: the part's kernel, its inputs
// gathered by input_perm first (x.index_select(-1, input_perm)).
void run_linear(const LinearPart& part, DType dtype, const void* x, void* out, int64_t rows, ProjectionScratch& scratch);

// One part, or the parts' outputs side by side (torch.cat(outs, -1)).
void run_projection(const Projection& projection, DType dtype, const void* x, void* out, int64_t rows,
                    ProjectionScratch& scratch);

}  // namespace kvserve
