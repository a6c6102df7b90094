"""The Triton kernels of the GPU path compile for an H100 (sm_90), no GPU needed: Triton's own
compiler lowers each kernel to a binary here. The interpreter, which the other tests run, accepts
what the compiler may refuse (a loop variable that changes type, a pointer cast, an early return,
an operation without a GPU lowering), and a kernel whose tiles need more shared memory than an
H100 gives a block fails only when it is loaded on the device. The sampling kernels have the same
compile check in tests/sample/test_triton_sample.py."""

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

a = triton_paged._kernels()
paged = {"GROUP": 4, "BLOCK_SIZE": 16, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128, "HAS_WINDOW": True, "PARTITION_BLOCKS": 32}
kernels = [
    (a.write_kv_kernel, sig("key_ptr value_ptr cache_ptr slots_ptr stride_kt stride_kh stride_vt stride_vh stride_c stride_cs "
                   "stride_ch", "*bf16 *bf16 *bf16 *i64 i32 i32 i32 i32 i32 i32 i32"),
     {"NUM_KV_HEADS": 8, "HEAD_DIM": 128, "HEAD_DIM_PAD": 128}),
    (a.attention_kernel, sig("q_ptr cache_ptr out_ptr block_tables_ptr seq_lens_ptr query_start_ptr token_request_ptr "
                             "sinks_ptr scale softcap window stride_qt stride_qh stride_ot stride_oh stride_c stride_cb "
                             "stride_cs stride_ch stride_bt", "*bf16 *bf16 *bf16 *i32 *i32 *i32 *i32 *fp32 fp32 fp32 i32 "
                             "i32 i32 i32 i32 i32 i32 i32 i32 i32"),
     {**paged, "HAS_SOFTCAP": True, "HAS_SINKS": True}),
    (a.split_kernel, sig("q_ptr cache_ptr parts_ptr block_tables_ptr seq_lens_ptr query_start_ptr token_request_ptr "
                         "scale softcap window stride_qt stride_qh stride_pt stride_ph stride_pp stride_c stride_cb "
                         "stride_cs stride_ch stride_bt", "*bf16 *bf16 *fp32 *i32 *i32 *i32 *i32 fp32 fp32 i32 i32 i32 "
                         "i32 i32 i32 i32 i32 i32 i32 i32"),
     {**paged, "HAS_SOFTCAP": True}),
    (a.combine_kernel, sig("parts_ptr out_ptr sinks_ptr seq_lens_ptr query_start_ptr token_request_ptr window "
                           "stride_pt stride_ph stride_pp stride_ot stride_oh", "*fp32 *bf16 *fp32 *i32 *i32 *i32 i32 "
                           "i32 i32 i32 i32 i32"),
     {key: paged[key] for key in ("BLOCK_SIZE", "HEAD_DIM", "HEAD_DIM_PAD", "HAS_WINDOW", "PARTITION_BLOCKS")}
     | {"HAS_SINKS": True}),
    (e.rms_norm_kernel, sig("x_ptr residual_ptr weight_ptr out_ptr total_ptr stride_x n eps",
                            "*bf16 *bf16 *bf16 *bf16 *bf16 i32 i32 fp32"), {"HAS_RESIDUAL": True, "BLOCK": 4096}),
    (e.silu_and_mul_kernel, sig("x_ptr out_ptr d", "*bf16 *bf16 i32"), {"BLOCK": 1024}),
    (e.rotary_kernel, sig("x_ptr cos_ptr sin_ptr out_ptr stride_xt stride_xh num_heads", "*bf16 *bf16 *bf16 *bf16 i32 i32 i32"),
     {"HALF": 64, "HALF_PAD": 64}),
]
# the launchers' tile sizes (triton_quant_linear: 16 x 32 up to 16 rows, else 64 x 64; triton_moe: 16 or 64 rows)
for dtype, bits, e2m1, offsets, block_m, block_n in (("bf16", 4, False, True, 64, 64), ("bf16", 4, True, False, 16, 32),
                                                     ("fp32", 8, False, False, 64, 64)):
    codes = "*i8" if bits == 8 else "*u8"
    kernels.append((q.quant_linear_kernel, sig(
        "x_ptr w_ptr scales_ptr offsets_ptr bias_ptr out_ptr m n k_packed stride_x group_size",
        f"*{dtype} {codes} *fp32 *fp32 *fp32 *{dtype} i32 i32 i32 i32 i32"),
        {"BITS": bits, "E2M1": e2m1, "HAS_OFFSETS": offsets, "HAS_BIAS": True,
         "PRECISION": "ieee" if dtype == "fp32" else None, "INTERPRETED": False, "BLOCK_M": block_m,
         "BLOCK_N": block_n, "BLOCK_K": 64}))
for bits, e2m1, offsets, gather, block_m in ((16, False, False, True, 64), (4, True, False, False, 16),
                                             (4, False, True, True, 64), (8, False, False, True, 16)):
    kernels.append((m.moe_gemm_kernel, sig(
        "a_ptr pair_ptr block_expert_ptr weight_table scales_table offsets_table bias_table out_ptr n k_in k_steps "
        "stride_a group_size", "*bf16 *i64 *i32 *i64 *i64 *i64 *i64 *bf16 i32 i32 i32 i32 i32"),
        {"TOP_K": 4, "GATHER": gather, "BITS": bits, "E2M1": e2m1, "HAS_OFFSETS": offsets, "HAS_BIAS": True,
         "PRECISION": None, "INTERPRETED": False, "BLOCK_M": block_m, "BLOCK_N": 64, "BLOCK_K": 64}))
# as the launcher specialises them for real shapes: pointers and model dimensions divisible by 16
ALIGNED = {"n", "k_in", "k_packed", "stride_x", "stride_a", "group_size", "d", "stride_xt", "stride_xh", "stride_qt",
           "stride_qh", "stride_ot", "stride_oh", "stride_kt", "stride_kh", "stride_vt", "stride_vh"}
largest = 0
for fn, signature, constants in kernels:
    attrs = {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(signature.items())
             if kind.startswith("*") or name in ALIGNED}
    signature.update({name: "constexpr" for name in constants})
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32))
    largest = max(largest, compiled.metadata.shared)
print(len(kernels), largest)
"""


@pytest.mark.slow
def test_the_gpu_kernels_compile_for_an_h100():
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    count, shared = done.stdout.split()[-2:]
    assert count == "14"
    assert int(shared) <= 232448, f"{shared} bytes of shared memory: an H100 gives a block at most 227 KiB"
