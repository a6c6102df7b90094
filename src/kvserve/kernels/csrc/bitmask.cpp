// Apply a token bitmask to float32 logits in place: logits[r, t] = -inf where bit t of
// bitmask[r] is 0 (xgrammar's and llguidance's layout: int32 [N, W], bit j of word k allows
// token 32*k + j; tokens at or past 32*W are banned too).
//
// A grammar usually allows a few structural tokens (most words are 0: the row becomes -inf in
// 32-float runs) or nearly everything inside a string (most words are -1: nothing to write), so
// the kernel branches per word: whole runs for 0, skip for -1, a per-bit select otherwise. Rows
// are independent (OpenMP over rows); one pass over the words and at most one over the logits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include "thread_pool.h"

#include <cstdint>
#include <limits>

namespace {

void apply_row(float* row, const int32_t* words, int64_t vocab, int64_t width) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  const int64_t full_words = std::min(width, vocab / 32);
  for (int64_t k = 0; k < full_words; ++k) {
    const uint32_t word = static_cast<uint32_t>(words[k]);
    float* out = row + 32 * k;
    if (word == 0xFFFFFFFFu) continue;
    if (word == 0u) {
      for (int j = 0; j < 32; ++j) out[j] = neg_inf;
      continue;
    }
    for (int j = 0; j < 32; ++j) out[j] = ((word >> j) & 1u) ? out[j] : neg_inf;
  }
  for (int64_t t = 32 * full_words; t < vocab; ++t) {  // a last partial word, and past the mask
    const int64_t k = t / 32;
    const bool allowed = k < width && ((static_cast<uint32_t>(words[k]) >> (t % 32)) & 1u);
    if (!allowed) row[t] = neg_inf;
  }
}

}  // namespace

// logits: float32 [N, V] (contiguous rows); bitmask: int32 [N, W]; rows: int64 [M], the rows
// to mask (each row r is masked by bitmask[r]).
void apply_token_bitmask(torch::Tensor logits, torch::Tensor bitmask, torch::Tensor rows) {
  TORCH_CHECK(logits.dim() == 2 && logits.scalar_type() == torch::kFloat32 && logits.stride(1) == 1,
              "logits must be float32 [N, V] with contiguous rows");
  TORCH_CHECK(bitmask.dim() == 2 && bitmask.scalar_type() == torch::kInt32 && bitmask.is_contiguous(),
              "bitmask must be contiguous int32 [N, W]");
  TORCH_CHECK(rows.dim() == 1 && rows.scalar_type() == torch::kInt64, "rows must be int64 [M]");
  const int64_t vocab = logits.size(1), width = bitmask.size(1), stride = logits.stride(0);
  float* base = logits.data_ptr<float>();
  const int32_t* masks = bitmask.data_ptr<int32_t>();
  const int64_t* row_ids = rows.data_ptr<int64_t>();
  const int64_t count = rows.size(0);
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(row_ids[i] >= 0 && row_ids[i] < logits.size(0) && row_ids[i] < bitmask.size(0),
                "row index out of range");
  }
  kvserve::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = row_ids[i];
      apply_row(base + r * stride, masks + r * width, vocab, width);
    }
  });
}
