// The kernels' entry points, defined in their own files (paged_attention.cpp, argmax.cpp, ...):
// declared once for bindings.cpp, which exposes them to Python, and decoder.cpp, which calls them.
#pragma once
#include <torch/extension.h>

#include <vector>

void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache, torch::Tensor block_tables,
                     torch::Tensor seq_lens, torch::Tensor query_start_loc, double scale, int64_t window,
                     int64_t max_q_len, int64_t amx);
void write_kv_cache(torch::Tensor key, torch::Tensor value, torch::Tensor kv_cache, torch::Tensor slot_mapping);
torch::Tensor argmax_rows(torch::Tensor logits);
torch::Tensor silu_and_mul(torch::Tensor x);
std::vector<torch::Tensor> rms_norm(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> residual,
                                    double eps);
torch::Tensor rotary_embedding(torch::Tensor x, torch::Tensor cos, torch::Tensor sin);
torch::Tensor pack_linear_weight(torch::Tensor weight);
torch::Tensor invariant_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                               int64_t out_features);
int64_t linear_panel_width();
bool amx_linear_available();
torch::Tensor amx_linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias, int64_t out_features);
torch::Tensor amx_linear_silu_mul(torch::Tensor x, torch::Tensor packed, int64_t out_features);
torch::Tensor quant_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales,
                           c10::optional<torch::Tensor> neg_offsets, c10::optional<torch::Tensor> bias,
                           int64_t out_features, int64_t group_size, int64_t bits, int64_t isa);
torch::Tensor amx_quant_linear(torch::Tensor x, torch::Tensor packed, torch::Tensor scales,
                               c10::optional<torch::Tensor> neg_offsets, c10::optional<torch::Tensor> bias,
                               int64_t out_features, int64_t group_size, int64_t bits);
std::vector<int64_t> quant_linear_layout(int64_t isa);
int64_t quant_linear_isa();
void apply_token_bitmask(torch::Tensor logits, torch::Tensor bitmask, torch::Tensor rows);
void lora_apply(torch::Tensor x, torch::Tensor y, torch::Tensor a, torch::Tensor b, torch::Tensor order,
                torch::Tensor seg_starts, torch::Tensor seg_slots, torch::Tensor shard_offsets, int64_t rank);
void bind_decoder(pybind11::module& m);
torch::Tensor sample_rows(torch::Tensor logits, torch::Tensor rows, torch::Tensor temperature, torch::Tensor uniforms);
void top_p_rows(torch::Tensor logits, torch::Tensor rows, torch::Tensor top_p, c10::optional<torch::Tensor> temperature);
