// Python bindings of the CPU kernels (one extension module, built by kvserve.kernels).
#include <torch/extension.h>

#include "kernels.h"
#include "thread_pool.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "paged attention over the block cache (see paged_attention.cpp)",
        py::arg("out"), py::arg("query"), py::arg("kv_cache"), py::arg("block_tables"), py::arg("seq_lens"),
        py::arg("query_start_loc"), py::arg("scale"), py::arg("window"), py::arg("max_q_len"), py::arg("amx") = -1);
  m.def("write_kv_cache", &write_kv_cache, "K/V rows into their cache slots (see paged_attention.cpp)");
  m.def("argmax_rows", &argmax_rows, "index of the largest value of each row (see argmax.cpp)");
  m.def("sample_rows", &sample_rows, "a token per row drawn from softmax(logits / T) by its uniform (see sample.cpp)");
  m.def("top_p_rows", &top_p_rows, "top-p of the given float32 rows in place, without a sort (see top_p.cpp)");
  m.def("rms_norm", &rms_norm, "RMSNorm of rows, optionally after a residual add (see elementwise.cpp)");
  m.def("silu_and_mul", &silu_and_mul, "silu(gate) * up over [gate | up] rows (see elementwise.cpp)");
  m.def("rotary_embedding", &rotary_embedding, "rotate-half rotary embedding of bfloat16 q or k (see elementwise.cpp)");
  m.def("pack_linear_weight", &pack_linear_weight, "weight [N, K] into the panels of invariant_linear (see linear.cpp)");
  m.def("invariant_linear", &invariant_linear, "batch-invariant x W^T + b over packed weights (see linear.cpp)");
  m.def("linear_panel_width", &linear_panel_width, "output columns per packed weight panel");
  m.def("amx_linear_available", &amx_linear_available, "AMX-BF16 tiles usable here (KVSERVE_AMX=0: never)");
  m.def("amx_linear", &amx_linear, "batch-invariant bfloat16 x W^T + b on AMX tiles (see amx_linear.cpp)");
  m.def("amx_linear_silu_mul", &amx_linear_silu_mul, "silu_and_mul(amx_linear(x, [gate; up])) in one pass, the same bits");
  m.def("lora_apply", &lora_apply, "y[t] += B_s A_s x[t], each token with its adapter slot (see lora.cpp)");
  m.def("quant_linear", &quant_linear, "batch-invariant x W^T + b over int8/int4 weights (see quant_linear.cpp)");
  m.def("amx_quant_linear", &amx_quant_linear,
        "batch-invariant bfloat16 x W^T + b over int8/int4 weights on AMX tiles (see amx_quant_linear.cpp)");
  m.def("quant_linear_layout", &quant_linear_layout, "(vector width, vectors per panel) of the quantized panels of an ISA");
  m.def("quant_linear_isa", &quant_linear_isa, "instruction set of quant_linear here: 1 portable, 2 AVX2, 3 AVX-512");
  m.def("set_pool_enabled", &kvserve::set_pool_enabled,
        "run the kernels' parallel regions on kvserve's worker pool (true) or OpenMP's (false; see thread_pool.h)");
  m.def("pool_enabled", &kvserve::pool_enabled, "whether the kernels run on kvserve's worker pool");
  m.def("set_pool_spin_us", &kvserve::set_pool_spin_us,
        "how long (us) idle kernel worker threads wait for the next region before sleeping (see thread_pool.h)");
  m.def("pool_spin_us", &kvserve::pool_spin_us, "the kernel worker threads' spin window in microseconds");
  m.def("pool_self_check", &kvserve::pool_self_check, py::call_guard<py::gil_scoped_release>(),
        "the worker pool's self-check for the tests: faults in random regions (see thread_pool.h)");
  bind_decoder(m);
  m.def("apply_token_bitmask", &apply_token_bitmask, "logits[r, t] = -inf where the token bitmask bans t (see bitmask.cpp)");
}
