"""The Triton kernel of :mod:`kvserve.kernels.triton_quant_linear` (imported by it at first use:
Triton decides between its compiler and its interpreter when it is imported)."""

import triton
import triton.language as tl

from kvserve.kernels.triton_elementwise_kernels import round_to


@triton.jit
def e2m1_doubled(code):
    """MXFP4's E2M1 value of a 4-bit code, doubled (``quant_tensor.E2M1_DOUBLED``): magnitudes
    0, 1, 2, 3, 4, 6, 8, 12 for codes 0-7, the same negated for 8-15 (code 8 gives -0.0)."""
    code = code.to(tl.int32)
    m = code & 7
    big = (2 + (m & 1)) << tl.maximum((m >> 1) - 1, 0)
    magnitude = tl.where(m < 4, m, big).to(tl.float32)
    return tl.where(code >= 8, -magnitude, magnitude)


@triton.jit
def dequantize(codes, k, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype: tl.constexpr,
               BITS: tl.constexpr, E2M1: tl.constexpr, HAS_OFFSETS: tl.constexpr):
    """Weights [BLOCK_K, BLOCK_N] of inputs ``k`` (< 0 or past K: masked by the caller's zero
    activations) by ``QuantizedTensor.dequantize``'s formulas in float32, rounded to ``dtype``."""
    mask = (k[:, None] >= 0) & col_mask[None, :]
    group = (k // group_size)[:, None] * n + cols[None, :]
    scale = tl.load(scales_ptr + group, mask=mask, other=0.0)
    if E2M1:
        w = e2m1_doubled(codes) * scale
    elif BITS == 4 and not HAS_OFFSETS:
        w = (codes.to(tl.float32) - 8.0) * scale
    else:
        w = codes.to(tl.float32) * scale
    if HAS_OFFSETS:
        w = w - tl.load(offsets_ptr + group, mask=mask, other=0.0)
    return round_to(w, dtype)


@triton.jit
def dot(x, w, acc, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr):
    """acc + x @ w. ``INTERPRETED``: products in float32 summed by ``tl.sum``, for Triton's
    interpreter, whose ``tl.dot`` (numpy's matmul) neither takes bfloat16 nor sums a row the same
    way in every place of the tile (so a row's bits would depend on its neighbours there only)."""
    if INTERPRETED:
        return acc + tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
    else:
        return tl.dot(x, w, acc, input_precision=PRECISION)


@triton.jit
def quant_linear_kernel(x_ptr, w_ptr, scales_ptr, offsets_ptr, bias_ptr, out_ptr, m, n, k_packed, stride_x,
                        group_size, BITS: tl.constexpr, E2M1: tl.constexpr, HAS_OFFSETS: tl.constexpr,
                        HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr, INTERPRETED: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """out[m, n] = x[m, :] . w[n, :] (+ bias[n]) over the packed weight of ``TritonQuantLinear``:
    ``k_packed`` rows of N codes (int8: row k is input k; int4: the low nibble of row r is input r,
    the high nibble input r + k_packed)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask, col_mask = rows < m, cols < n
    dtype = x_ptr.dtype.element_ty
    x_rows = x_ptr + rows[:, None].to(tl.int64) * stride_x
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, k_packed, BLOCK_K):
        k = start + tl.arange(0, BLOCK_K)
        k_mask = k < k_packed
        k_valid = tl.where(k_mask, k, -1)
        codes = tl.load(w_ptr + k[:, None].to(tl.int64) * n + cols[None, :],
                        mask=k_mask[:, None] & col_mask[None, :], other=0)
        x = tl.load(x_rows + k[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        if BITS == 8:
            w = dequantize(codes, k_valid, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype, BITS, E2M1,
                           HAS_OFFSETS)
            acc = dot(x, w, acc, PRECISION, INTERPRETED)
        else:
            low = dequantize(codes & 15, k_valid, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype, BITS,
                             E2M1, HAS_OFFSETS)
            acc = dot(x, low, acc, PRECISION, INTERPRETED)
            high_k = tl.where(k_mask, k + k_packed, -1)
            high = dequantize(codes >> 4, high_k, cols, col_mask, scales_ptr, offsets_ptr, n, group_size, dtype, BITS,
                              E2M1, HAS_OFFSETS)
            x_high = tl.load(x_rows + (k + k_packed)[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
            acc = dot(x_high, high, acc, PRECISION, INTERPRETED)
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + cols, mask=col_mask, other=0.0)[None, :]
    out = round_to(acc, out_ptr.dtype.element_ty)
    tl.store(out_ptr + rows[:, None].to(tl.int64) * n + cols[None, :], out, mask=row_mask[:, None] & col_mask[None, :])
