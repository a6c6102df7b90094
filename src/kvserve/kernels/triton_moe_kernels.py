"""The Triton kernel of :mod:`kvserve.kernels.triton_moe` (imported by it at first use)."""

import triton
import triton.language as tl

from kvserve.kernels.triton_elementwise_kernels import round_to
from kvserve.kernels.triton_quant_linear_kernels import dequantize, dot


@triton.jit
def moe_gemm_kernel(a_ptr, pair_ptr, block_expert_ptr, weight_table, scales_table, offsets_table, bias_table,
                    out_ptr, n, k_in, k_steps, stride_a, group_size, TOP_K: tl.constexpr, GATHER: tl.constexpr,
                    BITS: tl.constexpr, E2M1: tl.constexpr, HAS_OFFSETS: tl.constexpr, HAS_BIAS: tl.constexpr,
                    PRECISION: tl.constexpr, INTERPRETED: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Row ``i`` of block ``b`` (``i = b * BLOCK_M + r``) holds pair ``pair[i]`` (-1: padding,
    neither read nor written) of expert ``block_expert[b]`` (-1: a block past the last):
    ``out[i] = round(a_row . W_e) (+ bias_e, rounded)``, ``a_row`` row ``pair[i] // TOP_K`` of
    ``a`` (``GATHER``: the tokens) or row ``i`` (the gate-up output). Weights as in
    ``triton_quant_linear`` (``BITS`` 8, 4), or the expert's float [N, K] weight (``BITS`` 16);
    ``k_steps`` runs of ``BLOCK_K`` rows of weights (4 bits: packed rows, each two inputs)."""
    block = tl.program_id(0)
    expert = tl.load(block_expert_ptr + block)
    if expert < 0:
        return
    index = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(pair_ptr + index)
    row_mask = pair >= 0
    a_rows = a_ptr + (pair // TOP_K if GATHER else index).to(tl.int64)[:, None] * stride_a
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    col_mask = cols < n
    # the tables' addresses are 16-byte aligned (``triton_moe.expert_table`` checks)
    w_addr = tl.multiple_of(tl.load(weight_table + expert), 16)
    scales_ptr = tl.multiple_of(tl.load(scales_table + expert), 16).to(tl.pointer_type(tl.float32))
    offsets_ptr = tl.load(offsets_table + expert).to(tl.pointer_type(tl.float32))
    dtype = out_ptr.dtype.element_ty
    half = k_in // 2
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, k_steps):
        k = step * BLOCK_K + tl.arange(0, BLOCK_K)
        k_mask = k < (half if BITS == 4 else k_in)
        mask = k_mask[:, None] & col_mask[None, :]
        a = tl.load(a_rows + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        if BITS == 16:  # the expert's own [N, K] weight
            w = tl.load(w_addr.to(tl.pointer_type(dtype)) + cols[None, :].to(tl.int64) * k_in + k[:, None], mask=mask,
                        other=0.0)
            acc = dot(a, w, acc, PRECISION, INTERPRETED)
        else:
            codes_ptr = w_addr.to(tl.pointer_type(tl.int8 if BITS == 8 else tl.uint8))
            codes = tl.load(codes_ptr + k[:, None].to(tl.int64) * n + cols[None, :], mask=mask, other=0)
            k_valid = tl.where(k_mask, k, -1)
            if BITS == 8:
                w = dequantize(codes, k_valid, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype, BITS, E2M1,
                               HAS_OFFSETS)
                acc = dot(a, w, acc, PRECISION, INTERPRETED)
            else:  # the low nibbles are inputs k, the high ones k + K / 2
                low = dequantize(codes & 15, k_valid, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype,
                                 BITS, E2M1, HAS_OFFSETS)
                acc = dot(a, low, acc, PRECISION, INTERPRETED)
                high = dequantize(codes >> 4, tl.where(k_mask, k + half, -1), cols, col_mask, scales_ptr, offsets_ptr,
                                  n, group_size, dtype, BITS, E2M1, HAS_OFFSETS)
                a_high = tl.load(a_rows + (k + half)[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
                acc = dot(a_high, high, acc, PRECISION, INTERPRETED)
    out = round_to(acc, dtype)
    if HAS_BIAS:
        bias_ptr = tl.load(bias_table + expert).to(tl.pointer_type(dtype))
        bias = tl.load(bias_ptr + cols, mask=col_mask, other=0.0)
        out = round_to(out.to(tl.float32) + bias.to(tl.float32)[None, :], dtype)
    tl.store(out_ptr + index.to(tl.int64)[:, None] * n + cols[None, :], out, mask=row_mask[:, None] & col_mask[None, :])
