// LinearPart, Projection and the scratch buffers of the C++ loops (see projection.h).
#include "projection.h"

#include <cstring>

#include "kernels.h"

namespace kvserve {

void check_part(const LinearPart& part) {
  check(part.kind >= kVector && part.kind <= kQuantAmx, "LinearPart: unknown kind " + std::to_string(part.kind));
  check(part.kind < kQuantVector || part.scales != nullptr, "LinearPart: a quantized kind needs scales");
}

void* Buffer::bytes(size_t size) {
  if (size > capacity_) {
    capacity_ = (size + 63) / 64 * 64;
    data_.reset(static_cast<char*>(std::aligned_alloc(64, capacity_)));
    check(data_ != nullptr, "out of memory for a " + std::to_string(capacity_) + "-byte scratch buffer");
  }
  return data_.get();
}

Projection make_projection(const LinearPart* parts, int64_t count) {
  Projection projection;
  projection.parts.assign(parts, parts + count);
  for (const LinearPart& part : projection.parts) {
    check_part(part);
    projection.out_features += part.out_features;
  }
  return projection;
}

void run_linear(const LinearPart& part, DType dtype, const void* x, void* out, int64_t rows,
                ProjectionScratch& scratch) {
  const int64_t K = part.in_features, es = dtype == kFloat32 ? 4 : 2;
  if (part.input_perm != nullptr) {
    char* gathered = scratch.gathered.get<char>(rows * K * es);
    const char* src = static_cast<const char*>(x);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t k = 0; k < K; ++k) std::memcpy(gathered + (r * K + k) * es, src + (r * K + part.input_perm[k]) * es, es);
    x = gathered;
  }
  const QuantWeight quant{static_cast<const uint8_t*>(part.packed), part.scales, part.neg_offsets, part.bias,
                          part.out_features, part.group_size, part.bits, part.codebook};
  switch (part.kind) {
    case kVector:
      invariant_linear(dtype, x, static_cast<DType>(part.weight_dtype), part.packed, part.bias, out, rows, K,
                       part.out_features);
      return;
    case kAmx:
      amx_linear(static_cast<const BFloat16*>(x), static_cast<const BFloat16*>(part.packed), part.bias,
                 static_cast<BFloat16*>(out), rows, K, part.out_features, false);
      return;
    case kQuantVector:
      quant_linear(dtype, x, out, rows, K, quant);
      return;
    default:
      amx_quant_linear(static_cast<const BFloat16*>(x), static_cast<BFloat16*>(out), rows, K, quant);
  }
}

void run_projection(const Projection& projection, DType dtype, const void* x, void* out, int64_t rows,
                    ProjectionScratch& scratch) {
  if (projection.parts.size() == 1) {
    run_linear(projection.parts[0], dtype, x, out, rows, scratch);
    return;
  }
  const int64_t es = dtype == kFloat32 ? 4 : 2, width = projection.out_features;
  int64_t column = 0;
  for (const LinearPart& part : projection.parts) {
    char* part_out = scratch.part_out.get<char>(rows * part.out_features * es);
    run_linear(part, dtype, x, part_out, rows, scratch);
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(static_cast<char*>(out) + (r * width + column) * es, part_out + r * part.out_features * es,
                  part.out_features * es);
    column += part.out_features;
  }
}

}  // namespace kvserve
