"""The Triton kernels of the GPU path compile for an H100 (sm_90), no GPU needed: Triton's own
compiler lowers each kernel to a binary here. The interpreter, which the other tests run, accepts
what the compiler may refuse (a loop variable that changes type, a pointer cast, an early return,
an operation without a GPU lowering). The sampling kernels have the same check in
tests/sample/test_triton_sample.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

_COMPILE = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kvserve.attention import triton_paged
from kvserve.kernels import triton_elementwise_kernels as e, triton_moe_kernels as m, triton_quant_linear_kernels as q

def sig(names, types):
    return dict(zip(names.split(), types.split()))

write_kv, attention = triton_paged._kernels()
kernels = [
    (write_kv, sig("key_ptr value_ptr cache_ptr slots_ptr stride_kt stride_kh stride_vt stride_vh stride_c stride_cs "
                   "stride_ch", "*bf16 *bf16 *bf16 *i64 i32 i32 i32 i32 i32 i32 i32"),
     {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128}),
    (attention, sig("q_ptr cache_ptr out_ptr block_tables_ptr seq_lens_ptr query_start_ptr token_request_ptr sinks_ptr "
                    "scale softcap window stride_qt stride_qh stride_ot stride_oh stride_c stride_cb stride_cs stride_ch "
                    "stride_bt", "*bf16 *bf16 *bf16 *i32 *i32 *i32 *i32 *fp32 fp32 fp32 i32 i32 i32 i32 i32 i32 i32 i32 "
                    "i32 i32"),
     {"GROUP": 4, "BLOCK_SIZE": 16, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128, "HAS_SOFTCAP": True, "HAS_SINKS": True,
      "HAS_WINDOW": True}),
    (e.rms_norm_kernel, sig("x_ptr residual_ptr weight_ptr out_ptr total_ptr stride_x n eps",
                            "*bf16 *bf16 *bf16 *bf16 *bf16 i32 i32 fp32"), {"HAS_RESIDUAL": True, "BLOCK": 4096}),
    (e.silu_and_mul_kernel, sig("x_ptr out_ptr d", "*bf16 *bf16 i32"), {"BLOCK": 1024}),
    (e.rotary_kernel, sig("x_ptr cos_ptr sin_ptr out_ptr stride_xt stride_xh num_heads", "*bf16 *bf16 *bf16 *bf16 i32 i32 i32"),
     {"HALF": 64, "HALF_PAD": 64}),
]
for dtype, bits, e2m1, offsets in (("bf16", 4, False, True), ("bf16", 4, True, False), ("fp32", 8, False, False)):
    codes = "*i8" if bits == 8 else "*u8"
    kernels.append((q.quant_linear_kernel, sig(
        "x_ptr w_ptr scales_ptr offsets_ptr bias_ptr out_ptr m n k_packed stride_x group_size",
        f"*{dtype} {codes} *fp32 *fp32 *fp32 *{dtype} i32 i32 i32 i32 i32"),
        {"BITS": bits, "E2M1": e2m1, "HAS_OFFSETS": offsets, "HAS_BIAS": True,
         "PRECISION": "ieee" if dtype == "fp32" else None, "INTERPRETED": False, "BLOCK_M": 64, "BLOCK_N": 64,
         "BLOCK_K": 64}))
for bits, e2m1, gather in ((16, False, True), (4, True, False), (8, False, True)):
    kernels.append((m.moe_gemm_kernel, sig(
        "a_ptr pair_ptr block_expert_ptr weight_table scales_table offsets_table bias_table out_ptr n k_in k_steps "
        "stride_a group_size", "*bf16 *i64 *i32 *i64 *i64 *i64 *i64 *bf16 i32 i32 i32 i32 i32"),
        {"TOP_K": 4, "GATHER": gather, "BITS": bits, "E2M1": e2m1, "HAS_OFFSETS": False, "HAS_BIAS": True,
         "PRECISION": None, "INTERPRETED": False, "BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64}))
for fn, signature, constants in kernels:
    signature.update({name: "constexpr" for name in constants})
    triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants), target=GPUTarget("cuda", 90, 32))
print(len(kernels))
"""


@pytest.mark.slow
def test_the_gpu_kernels_compile_for_an_h100():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "11"
