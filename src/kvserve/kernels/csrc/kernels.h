// The kernels' C++ entry points, defined in their own files (paged_attention.cpp, argmax.cpp,
// ...): declared once for decoder.cpp, which calls them, and for each file's extern "C" wrapper.
// Raw pointers and sizes; every array is contiguous unless a stride is given (in elements).
// Shapes and dtypes are the caller's to check (kvserve/kernels/ops_*.py, decoder.cpp).
#pragma once

#include <cstdint>

#include "abi.h"

namespace kvserve {

// paged_attention.cpp. out/query [T, H, D] (dtype), kv_cache [2, num_blocks, block_size, H_kv,
// row] (cache_dtype; row = D, or D + 4 for one-byte caches), block_tables int32 [B, W], seq_lens
// int32 [B], query_start_loc int32 [B + 1]. amx: -1 where this host has tiles, 0 never, 1 required.
// softcap > 0: scores capped at softcap * tanh(s / softcap); sinks: float32 [H] sink logits or null.
struct AttentionShape {
  int64_t num_tokens, num_heads, head_dim, num_kv_heads, block_size, num_blocks, num_seqs, table_width;
};
void paged_attention(void* out, const void* query, DType dtype, const void* kv_cache, DType cache_dtype,
                     const int32_t* block_tables, const int32_t* seq_lens, const int32_t* query_start_loc,
                     const AttentionShape& shape, double scale, int64_t window, int64_t max_q_len, int64_t amx,
                     double softcap = 0.0, const float* sinks = nullptr);
// key/value [T, H_kv, D] with strides (token, head) and unit stride in D, stored at slot_mapping
// int64 [T] of kv_cache [2, num_slots, H_kv, D] (element_size bytes per value).
void write_kv_cache(const void* key, int64_t key_token_stride, int64_t key_head_stride, const void* value,
                    int64_t value_token_stride, int64_t value_head_stride, int64_t tokens, int64_t heads, int64_t dim,
                    int64_t element_size, void* kv_cache, int64_t num_slots, const int64_t* slot_mapping);

// latent_attention.cpp. out float32 [T, H, value_width]; query float32 [T, H, width] (absorbed and
// scaled); kv_cache [num_blocks, block_size, width] (cache_dtype float32 or bfloat16); block_tables
// int32 [num_seqs, table_width], seq_lens int32 [num_seqs], query_start_loc int32 [num_seqs + 1].
struct LatentShape {
  int64_t num_tokens, num_heads, width, value_width, block_size, num_blocks, num_seqs, table_width;
};
void latent_attention(float* out, const float* query, DType cache_dtype, const void* kv_cache,
                      const int32_t* block_tables, const int32_t* seq_lens, const int32_t* query_start_loc,
                      const LatentShape& shape);

// argmax.cpp: logits [rows, vocab] float32 or bfloat16 -> out int64 [rows].
void argmax_rows(DType dtype, const void* logits, int64_t rows, int64_t vocab, int64_t* out);

// sample.cpp: logits [N, V]; rows int64 [R]; temperature float32 [R]; uniforms float64 [R] ->
// tokens int64 [R].
void sample_rows(DType dtype, const void* logits, int64_t num_rows, int64_t vocab, const int64_t* rows, int64_t count,
                 const float* temperature, const double* uniforms, int64_t* tokens);

// top_p.cpp: logits [N, V] in place; rows int64 [R]; top_p float32 [R]; temperature float32 [R]
// or nullptr.
void top_p_rows(DType dtype, void* logits, int64_t num_rows, int64_t vocab, const int64_t* rows, int64_t count,
                const float* top_p, const float* temperature);

// elementwise.cpp.
void silu_and_mul(DType dtype, const void* x, void* out, int64_t rows, int64_t d);  // x [rows, 2d] -> [rows, d]
void sigmoid(DType dtype, const void* x, void* out, int64_t n);                     // n values, elementwise
// Row x[0, cols) in place: the softmax of x[0, n) (16 float32 lanes; simd.h's exp), zeros after it.
void softmax_prefix_row(float* x, int64_t n, int64_t cols);
// x bfloat16 [T, H, D] with strides (row, head) and unit stride in D; cos, sin [T, D] -> out [T, H, D].
void rotary_embedding(const BFloat16* x, int64_t row_stride, int64_t head_stride, const BFloat16* cos,
                      const BFloat16* sin, BFloat16* out, int64_t rows, int64_t heads, int64_t dim);
// x [rows, n] with row stride x_stride; residual [rows, n] or nullptr; out [rows, n]; sum [rows, n]
// (x + residual; unused without a residual).
void rms_norm(DType dtype, const void* x, int64_t x_stride, const void* weight, const void* residual, void* out,
              void* sum, int64_t rows, int64_t n, float eps);

// linear.cpp: the batch-invariant GEMM over packed float32/bfloat16 panels [P, K, panel width].
int64_t linear_panel_width();
void pack_linear_weight(DType dtype, const void* weight, void* packed, int64_t N, int64_t K);
void invariant_linear(DType dtype, const void* x, DType weight_dtype, const void* packed, const float* bias, void* out,
                      int64_t M, int64_t K, int64_t N);

// abi.cpp: whether the AMX kernels run (amx_tiles.h's probe, once, and the user's switch).
bool amx_linear_available();
void set_amx_enabled(bool enabled);

// amx_linear.cpp: bfloat16 x [M, K] on AMX tiles over B tiles [N/16, K/32, 16, 32]; with swiglu
// out is [M, N/2] = silu_and_mul of the projection.
void amx_linear(const BFloat16* x, const BFloat16* packed, const float* bias, BFloat16* out, int64_t M, int64_t K,
                int64_t N, bool swiglu);

// quant_linear.cpp / amx_quant_linear.cpp: weight-only int8/int4 linears.
// What a 4-bit code stands for: an integer (q, or q - 8 for symmetric int4) or MXFP4's E2M1 value
// doubled (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, as integers 0 .. 12: the group's scale
// carries the half), so every kernel multiplies by small integers, exact in bfloat16 and float32.
enum Codebook : int64_t { kIntegers = 0, kE2M1 = 1 };
// kE2M1's values by code, doubled (codes 8-15 are 0-7 negated).
alignas(64) inline constexpr float kE2M1Doubled[16] = {0.f, 1.f, 2.f, 3.f, 4.f, 6.f, 8.f, 12.f,
                                                       -0.f, -1.f, -2.f, -3.f, -4.f, -6.f, -8.f, -12.f};
// The value of 4-bit code `code` (0 .. 15) in `codebook` (minus8: a symmetric int4 weight's q - 8).
inline float nibble_value(int code, bool minus8, int64_t codebook) {
  if (codebook == kE2M1) return kE2M1Doubled[code];
  return static_cast<float>(code - (minus8 ? 8 : 0));
}

struct QuantWeight {
  const uint8_t* packed;
  const float* scales;
  const float* neg_offsets;  // int4 with zero points, else nullptr
  const float* bias;         // or nullptr
  int64_t N, group_size, bits;
  int64_t codebook = kIntegers;  // bits 4: what the codes stand for
};
// This library's instruction set (its variant's, from the compiler's macros: quant_vector.h):
// 1 portable, 2 AVX2 + FMA, 3 AVX-512F, 4 AVX-512F + AVX512-BF16; and its panel layout.
int64_t quant_linear_isa();
void quant_linear_layout(int64_t* width, int64_t* vectors);
void quant_linear(DType dtype, const void* x, void* out, int64_t M, int64_t K, const QuantWeight& w);
void amx_quant_linear(const BFloat16* x, BFloat16* out, int64_t M, int64_t K, const QuantWeight& w);

// bitmask.cpp: logits float32 [N, V] with row stride; bitmask int32 [N, W]; rows int64 [count].
void apply_token_bitmask(float* logits, int64_t num_rows, int64_t vocab, int64_t stride, const int32_t* bitmask,
                         int64_t mask_rows, int64_t width, const int64_t* rows, int64_t count);

// lora.cpp (see its file comment).
struct LoraArgs {
  const void* x;
  void* y;
  const void* a;
  const void* b;
  const int64_t *order, *seg_starts, *seg_slots, *shard_offsets;
  int64_t num_segments, num_shards, K, N, R, rank;
  int64_t tokens, order_len, num_slots;  // x's rows, order's entries, a's and b's slots (bounds checked)
};
void lora_apply(DType act_dtype, DType weight_dtype, const LoraArgs& args);

}  // namespace kvserve
