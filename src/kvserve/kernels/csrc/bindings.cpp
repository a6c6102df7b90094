// Python bindings of the CPU kernels (one extension module, built by kvserve.kernels).
#include <torch/extension.h>

void paged_attention(torch::Tensor out, torch::Tensor query, torch::Tensor kv_cache, torch::Tensor block_tables,
                     torch::Tensor seq_lens, torch::Tensor query_start_loc, double scale, int64_t window,
                     int64_t max_q_len);
torch::Tensor argmax_rows(torch::Tensor logits);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "paged attention over the block cache (see paged_attention.cpp)");
  m.def("argmax_rows", &argmax_rows, "index of the largest value of each row (see argmax.cpp)");
}
