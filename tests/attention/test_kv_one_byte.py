"""One-byte KV caches (``--kv-cache-dtype int8|fp8_e4m3|fp8_e5m2``): int8 rows against a numpy
implementation of the rule, fp8 rows against torch's float8 conversion, and the ``cpu_paged``
kernel reading the rows in place gives exactly the bits it gives over a float32 cache holding
the dequantized rows (so the in-register widening is the reference dequantization); the torch
backend agrees within float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_torch_backend import metadata_for

from kvserve.attention import CpuPagedAttentionBackend, TorchAttentionBackend, cpu_paged_available
from kvserve.attention.kv_quant import dequantize_kv_rows, quantize_kv_rows

pytestmark = pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")


def test_rows_match_numpy():
    x = torch.randn(5, 3, 64, generator=torch.Generator().manual_seed(0)) * 3
    x[1, 2] = 0  # an all-zero row: scale 1
    rows = quantize_kv_rows(x, torch.int8)
    assert rows.dtype == torch.int8 and rows.shape == (5, 3, 68)
    xs = x.numpy()
    scale = (np.abs(xs).max(axis=-1, keepdims=True) / np.float32(127)).astype(np.float32)
    scale[scale == 0] = 1
    q = np.clip(np.rint(xs / scale), -127, 127).astype(np.int8)
    assert np.array_equal(rows[..., :64].numpy(), q)
    assert np.array_equal(rows[..., 64:].contiguous().view(torch.float32).numpy(), scale)
    assert np.array_equal(dequantize_kv_rows(rows, torch.float32).numpy(), q.astype(np.float32) * scale)


@pytest.mark.parametrize(("dtype", "cmax"), [(torch.float8_e4m3fn, 448.0), (torch.float8_e5m2, 57344.0)])
def test_fp8_rows_are_torchs_conversion_of_the_scaled_row(dtype, cmax):
    x = torch.randn(4, 2, 32, generator=torch.Generator().manual_seed(1)) * 5
    rows = quantize_kv_rows(x, dtype)
    assert rows.dtype == dtype and rows.shape == (4, 2, 36)
    scale = x.abs().amax(-1, keepdim=True) / cmax
    codes = (x / scale).clamp(-cmax, cmax).to(dtype)
    assert torch.equal(rows.view(torch.int8)[..., :32], codes.view(torch.int8))
    assert torch.equal(rows.view(torch.int8)[..., 32:].contiguous().view(torch.float32), scale)
    assert torch.equal(dequantize_kv_rows(rows, torch.float32), codes.to(torch.float32) * scale)


def run(backend, q, k, v, cache, steps, blocks, block_size):
    import test_torch_backend as helpers  # noqa: PLC0415 - metadata_for reads its BLOCK_SIZE

    old, helpers.BLOCK_SIZE = helpers.BLOCK_SIZE, block_size
    outs, done = [], 0
    try:
        for new in steps:
            meta = metadata_for([done], [new], [blocks])
            sl = slice(done, done + new)
            outs.append(backend.forward(q[sl], k[sl], v[sl], cache, meta, scale=q.shape[-1] ** -0.5))
            done += new
    finally:
        helpers.BLOCK_SIZE = old
    return torch.cat(outs)


@pytest.mark.parametrize("cache_dtype", [torch.int8, torch.float8_e4m3fn, torch.float8_e5m2])
@pytest.mark.parametrize("head_dim", [64, 24])  # the AVX-512 loops and the generic ones
def test_kernel_over_one_byte_rows_equals_kernel_over_dequantized_rows(head_dim, cache_dtype):
    gen = torch.Generator().manual_seed(head_dim)
    heads, kv_heads, block, length = 14, 2, 16, 70
    q, k, v = (torch.randn(length, n, head_dim, generator=gen) for n in (heads, kv_heads, kv_heads))
    blocks = [9, 2, 7, 4, 0 + 11]
    steps = [40, 1, 21, 1, 1, 6]  # prefill chunks and decodes
    int8_cache = torch.zeros(2, 12, block, kv_heads, head_dim + 4, dtype=cache_dtype)
    ours = run(CpuPagedAttentionBackend(), q, k, v, int8_cache, steps, blocks, block)
    k_deq = dequantize_kv_rows(quantize_kv_rows(k, cache_dtype), torch.float32)
    v_deq = dequantize_kv_rows(quantize_kv_rows(v, cache_dtype), torch.float32)
    float_cache = torch.zeros(2, 12, block, kv_heads, head_dim)
    expected = run(CpuPagedAttentionBackend(), q, k_deq, v_deq, float_cache, steps, blocks, block)
    assert torch.equal(ours, expected)
    assert torch.equal(dequantize_kv_rows(int8_cache, torch.float32), float_cache)
    reference = run(TorchAttentionBackend(), q, k, v, torch.zeros_like(int8_cache), steps, blocks, block)
    torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
    exact = run(CpuPagedAttentionBackend(), q, k, v, torch.zeros_like(float_cache), steps, blocks, block)
    bound = {torch.int8: 0.05, torch.float8_e4m3fn: 0.15, torch.float8_e5m2: 0.3}[cache_dtype]  # mantissa bits 7, 3, 2
    assert 0 < (ours - exact).abs().max() < bound  # one-byte rows: close to the float cache, not equal
