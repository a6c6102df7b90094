// Apply a token bitmask to float32 logits in place: logits[r, t] = -inf where bit t of
// bitmask[r] is 0 (xgrammar's and llguidance's layout: int32 [N, W], bit j of word k allows
// token 32*k + j; tokens at or past 32*W are banned too).
//
// A grammar usually allows a few structural tokens (most words are 0: the row becomes -inf in
// 32-float runs) or nearly everything inside a string (most words are -1: nothing to write), so
// the kernel branches per word: whole runs for 0, skip for -1, a per-bit select otherwise. Rows
// are independent (OpenMP over rows); one pass over the words and at most one over the logits.
#include "abi.h"
#include "kernels.h"
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

namespace kvserve {

// logits: float32 [N, V] (contiguous rows, row stride `stride`); bitmask: int32 [mask_rows, W];
// rows: int64 [count], the rows to mask (each row r is masked by bitmask[r]).
void apply_token_bitmask(float* logits, int64_t num_rows, int64_t vocab, int64_t stride, const int32_t* bitmask,
                         int64_t mask_rows, int64_t width, const int64_t* rows, int64_t count) {
  for (int64_t i = 0; i < count; ++i)
    check(rows[i] >= 0 && rows[i] < num_rows && rows[i] < mask_rows, "row index out of range");
  parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = rows[i];
      apply_row(logits + r * stride, bitmask + r * width, vocab, width);
    }
  });
}

}  // namespace kvserve

extern "C" KVSERVE_EXPORT int kvserve_apply_token_bitmask(float* logits, int64_t num_rows, int64_t vocab,
                                                          int64_t stride, const int32_t* bitmask, int64_t mask_rows,
                                                          int64_t width, const int64_t* rows, int64_t count) {
  return kvserve::guarded(
      [&] { kvserve::apply_token_bitmask(logits, num_rows, vocab, stride, bitmask, mask_rows, width, rows, count); });
}
