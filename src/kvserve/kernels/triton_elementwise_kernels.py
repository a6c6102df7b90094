"""The Triton kernels of :mod:`kvserve.kernels.triton_elementwise` (imported by it at first use:
Triton decides between its compiler and its interpreter when it is imported, and a ``@triton.jit``
function calls only functions of its own module)."""

import triton
import triton.language as tl


@triton.jit
def round_to(x, dtype: tl.constexpr):
    """float32 x rounded to ``dtype``, to nearest even. bfloat16 by integer arithmetic: Triton's
    interpreter truncates (its conversion), the GPU rounds; both then give torch's bits. A NaN stays
    a NaN (the GPU's canonical 0x7FFFFFFF would carry into the sign and round to -0)."""
    if dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        rounded = (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
        return tl.where(x == x, rounded, x.to(tl.bfloat16))
    else:
        return x.to(dtype)


@triton.jit
def rms_norm_kernel(x_ptr, residual_ptr, weight_ptr, out_ptr, total_ptr, stride_x, n, eps,
                    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        residual = tl.load(residual_ptr + row * n + cols, mask=mask, other=0.0)
        x = round_to(x.to(tl.float32) + residual.to(tl.float32), total_ptr.dtype.element_ty)
        tl.store(total_ptr + row * n + cols, x, mask=mask)
    x32 = x.to(tl.float32)
    variance = tl.sum(x32 * x32, axis=0) / n
    dtype = out_ptr.dtype.element_ty
    normed = round_to(x32 * tl.rsqrt(variance + eps), dtype)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0)
    out = round_to(weight.to(tl.float32) * normed.to(tl.float32), dtype)
    tl.store(out_ptr + row * n + cols, out, mask=mask)


@triton.jit
def silu_and_mul_kernel(x_ptr, out_ptr, d, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < d
    gate = tl.load(x_ptr + row * 2 * d + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * d + d + cols, mask=mask, other=0.0)
    dtype = out_ptr.dtype.element_ty
    silu = round_to(gate / (1.0 + tl.exp(-gate)), dtype)
    out = round_to(silu.to(tl.float32) * up.to(tl.float32), dtype)
    tl.store(out_ptr + row * d + cols, out, mask=mask)


@triton.jit
def rotary_kernel(x_ptr, cos_ptr, sin_ptr, out_ptr, stride_xt, stride_xh, num_heads,
                  HALF: tl.constexpr, HALF_PAD: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, HALF_PAD)
    mask = d < HALF
    dtype = out_ptr.dtype.element_ty
    x_row = x_ptr + t * stride_xt + h * stride_xh
    x1 = tl.load(x_row + d, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + HALF + d, mask=mask, other=0.0).to(tl.float32)
    c1 = tl.load(cos_ptr + t * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
    c2 = tl.load(cos_ptr + t * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
    s1 = tl.load(sin_ptr + t * 2 * HALF + d, mask=mask, other=0.0).to(tl.float32)
    s2 = tl.load(sin_ptr + t * 2 * HALF + HALF + d, mask=mask, other=0.0).to(tl.float32)
    # torch: x * cos + cat(-x2, x1) * sin, each product and the sum rounded to the dtype
    o1 = round_to(round_to(x1 * c1, dtype).to(tl.float32) + round_to(-x2 * s1, dtype).to(tl.float32), dtype)
    o2 = round_to(round_to(x2 * c2, dtype).to(tl.float32) + round_to(x1 * s2, dtype).to(tl.float32), dtype)
    out_row = out_ptr + (t * num_heads + h) * 2 * HALF
    tl.store(out_row + d, o1, mask=mask)
    tl.store(out_row + HALF + d, o2, mask=mask)
