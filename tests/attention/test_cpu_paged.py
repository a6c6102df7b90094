"""The C++ paged-attention backend against the dense float64 attention and the reference backend:
decode, short and long queries, sliding windows, GQA, bfloat16, batch invariance."""

from __future__ import annotations

import pytest
import torch
from test_torch_backend import BLOCK_TABLES, dense_attention, random_seqs, run_in_steps

from kvserve.attention import CpuPagedAttentionBackend, TorchAttentionBackend, cpu_paged_available, get_attention_backend

pytestmark = pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")


@pytest.mark.parametrize("window", [None, 3, 6])
@pytest.mark.parametrize("max_kernel_query_len", [1, 8])
def test_mixed_steps_match_dense(window, max_kernel_query_len):
    """Prefill chunks of 5-10 tokens go through SDPA (limit 1) or the kernel (limit 8)."""
    seqs = random_seqs([13, 12, 14])
    steps = [[5, 10, 0], [6, 1, 9], [1, 1, 5], [1, 0, 0]]
    backend = CpuPagedAttentionBackend(max_kernel_query_len=max_kernel_query_len)
    outs, _ = run_in_steps(steps, seqs, BLOCK_TABLES, window, backend=backend)
    for r, (q, k, v) in enumerate(seqs):
        assert outs[r].shape[0] == q.shape[0]
        torch.testing.assert_close(outs[r].double(), dense_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 4])
def test_decode_matches_reference_backend_float32(window):
    seqs = random_seqs([12, 7, 11], seed=1)
    steps = [[9, 4, 8], [1, 1, 1], [1, 1, 1], [1, 1, 1]]
    fast, cache_fast = run_in_steps(steps, seqs, BLOCK_TABLES, window, backend=CpuPagedAttentionBackend())
    ref, cache_ref = run_in_steps(steps, seqs, BLOCK_TABLES, window, backend=TorchAttentionBackend())
    assert torch.equal(cache_fast, cache_ref)
    for a, b in zip(fast, ref):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_bfloat16_close_to_dense_and_batch_invariant(window):
    """bfloat16: within bf16 rounding of the float64 attention, and a request's decode output is
    bit-identical alone or in a batch (of any composition)."""
    seqs = [tuple(t.to(torch.bfloat16) for t in s) for s in random_seqs([16, 9, 14, 9], seed=3)]
    tables = BLOCK_TABLES + [[14, 15, 16]]
    backend = CpuPagedAttentionBackend()
    batched, _ = run_in_steps([[15, 8, 13, 8], [1, 1, 1, 1]], seqs, tables, window, backend=backend)
    for r, (q, k, v) in enumerate(seqs):
        assert batched[r].dtype == torch.bfloat16
        ref = dense_attention(q, k, v, window)
        torch.testing.assert_close(batched[r].double(), ref, atol=2e-2, rtol=2e-2)
        alone, _ = run_in_steps([[len(q) - 1], [1]], [seqs[r]], [tables[r]], window, backend=backend)
        assert torch.equal(batched[r][-1], alone[0][-1])
    # The same request next to a different neighbour (other length, other blocks).
    pair, _ = run_in_steps([[15, 3], [1, 1]], [seqs[0], seqs[1]], [tables[0], [20, 21]], window, backend=backend)
    assert torch.equal(pair[0][-1], batched[0][-1])


@pytest.mark.parametrize(("dtype", "dim", "tol"), [(torch.float32, 64, 1e-5), (torch.bfloat16, 64, 2e-2),
                                                  (torch.bfloat16, 16, 2e-2), (torch.float16, 32, 5e-3)])
def test_many_heads_per_kv_head_and_long_context(dtype, dim, tol):
    """GQA group 7 (the Qwen2.5-0.5B shape), 300 tokens over 19 blocks of 16, against float64."""
    import test_torch_backend as helpers  # noqa: PLC0415 - metadata_for reads its BLOCK_SIZE

    gen = torch.Generator().manual_seed(5)
    num_heads, num_kv, block, length = 14, 2, 16, 300
    q, k, v = (torch.randn(length, n, dim, generator=gen).to(dtype) for n in (num_heads, num_kv, num_kv))
    cache = torch.zeros(2, 40, block, num_kv, dim, dtype=dtype)
    blocks = list(range(39, 20, -1))  # 19 blocks, reversed order
    old, helpers.BLOCK_SIZE = helpers.BLOCK_SIZE, block
    try:
        prefill = helpers.metadata_for([0], [length - 1], [blocks])
        decode = helpers.metadata_for([length - 1], [1], [blocks])
    finally:
        helpers.BLOCK_SIZE = old
    backend = CpuPagedAttentionBackend()
    backend.forward(q[:-1], k[:-1], v[:-1], cache, prefill, scale=dim**-0.5)
    out = backend.forward(q[-1:], k[-1:], v[-1:], cache, decode, scale=dim**-0.5)
    group = num_heads // num_kv
    for h in range(num_heads):
        scores = (k[:, h // group].double() @ q[-1, h].double()) * dim**-0.5
        expected = torch.softmax(scores, 0) @ v[:, h // group].double()
        torch.testing.assert_close(out[0, h].double(), expected, atol=tol, rtol=tol)


def test_single_token_context_returns_its_value_exactly():
    """softmax over one key is exactly 1: the output is V itself, in every dtype."""
    for dtype in (torch.float32, torch.bfloat16):
        q, k, v = (torch.randn(3, n, 16).to(dtype) for n in (4, 2, 2))
        import test_torch_backend as helpers  # noqa: PLC0415

        meta = helpers.metadata_for([0, 0, 0], [1, 1, 1], [[0], [1], [2]])
        cache = torch.zeros(2, 4, helpers.BLOCK_SIZE, 2, 16, dtype=dtype)
        out = CpuPagedAttentionBackend().forward(q, k, v, cache, meta, scale=0.25)
        assert torch.equal(out, v.repeat_interleave(2, dim=1))


def test_auto_picks_the_kernel_on_cpu():
    assert isinstance(get_attention_backend("auto"), CpuPagedAttentionBackend)
    assert isinstance(get_attention_backend("auto", device="meta"), TorchAttentionBackend)


def test_shapes_beyond_the_kernel_use_the_reference_path():
    """32 query heads on one KV head (group 32 > 16): same result as the reference backend."""
    import test_torch_backend as helpers  # noqa: PLC0415

    gen = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(5, n, 8, generator=gen) for n in (32, 1, 1))
    meta = helpers.metadata_for([0], [5], [[3, 1]])
    assert not CpuPagedAttentionBackend.supports(32, 1, 8, q.device)
    caches = [torch.zeros(2, 4, helpers.BLOCK_SIZE, 1, 8) for _ in range(2)]
    fast = CpuPagedAttentionBackend().forward(q, k, v, caches[0], meta, scale=8**-0.5)
    ref = TorchAttentionBackend().forward(q, k, v, caches[1], meta, scale=8**-0.5)
    assert torch.equal(fast, ref) and torch.equal(caches[0], caches[1])


def _chunked_outputs(q, k, v, chunks, blocks, window, cache_blocks, neighbour=None, *, amx=None, block_size=16):
    """Feed one sequence in ``chunks`` (a neighbour request rides along in every call when given);
    returns the sequence's output rows in order. Block size 16 (the engine's default) unless given;
    ``amx``: the backend's choice of AMX tiles (None: where the CPU has them)."""
    import test_torch_backend as helpers  # noqa: PLC0415 - metadata_for reads its BLOCK_SIZE

    dim, num_kv = q.shape[2], k.shape[1]
    cache = torch.zeros(2, cache_blocks, block_size, num_kv, dim, dtype=q.dtype)
    backend, outs, done = CpuPagedAttentionBackend(amx=amx), [], 0
    old, helpers.BLOCK_SIZE = helpers.BLOCK_SIZE, block_size
    try:
        for n in chunks:
            rows = [(q[done : done + n], k[done : done + n], v[done : done + n])]
            computed, new, tables = [done], [n], [blocks]
            if neighbour is not None:
                nq, nk, nv, nblocks = neighbour
                rows.append((nq, nk, nv))
                computed, new, tables = [done, 0], [n, nq.shape[0]], [blocks, nblocks]
            meta = helpers.metadata_for(computed, new, tables)
            out = backend.forward(*(torch.cat(parts) for parts in zip(*rows)), cache, meta, scale=dim**-0.5,
                                  sliding_window=window)
            outs.append(out[:n])
            done += n
    finally:
        helpers.BLOCK_SIZE = old
    return torch.cat(outs)


@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("window", [None, 37])
def test_bfloat16_rows_identical_however_the_prompt_is_chunked(dim, window):
    """The bfloat16 path (AVX512-BF16 tiles of up to 8 rows where the CPU has it): a row's output
    is bit-identical whether it is computed in one prefill, in chunks of any size, one token at a
    time or next to another request, and close to float64 attention."""
    gen = torch.Generator().manual_seed(dim)
    length, num_heads, num_kv = 150, 14, 2
    q, k, v = (torch.randn(length, n, dim, generator=gen).to(torch.bfloat16) for n in (num_heads, num_kv, num_kv))
    blocks = list(range(20, 10, -1))  # 10 blocks of 16, out of order
    whole = _chunked_outputs(q, k, v, [length], blocks, window, 32)
    for chunks in ([61, 1, 40, 48], [3] * 50, [1] * 20 + [130]):
        assert torch.equal(_chunked_outputs(q, k, v, chunks, blocks, window, 32), whole)
    other = tuple(torch.randn(9, n, dim, generator=gen).to(torch.bfloat16) for n in (num_heads, num_kv, num_kv))
    assert torch.equal(_chunked_outputs(q, k, v, [100, 50], blocks, window, 32, (*other, [1])), whole)
    group = num_heads // num_kv
    for i in (0, 7, 8, 63, 64, 149):
        lo = 0 if window is None else max(0, i - window + 1)
        for h in (0, 6, 13):
            scores = (k[lo : i + 1, h // group].double() @ q[i, h].double()) * dim**-0.5
            expected = torch.softmax(scores, 0) @ v[lo : i + 1, h // group].double()
            torch.testing.assert_close(whole[i, h].double(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_kernel_cache_write_equals_index_copy(dtype):
    """The C++ K/V write (rows into their slots; v a strided view as the model passes it) stores
    exactly what the reference backend's index_copy_ stores."""
    from kvserve.attention.torch_backend import write_kv_cache  # noqa: PLC0415
    from kvserve.kernels import cpu_kernels  # noqa: PLC0415

    gen = torch.Generator().manual_seed(4)
    qkv = torch.randn(5, 3 * 2 * 32, generator=gen).to(dtype)
    key, value = qkv[:, 64:128].reshape(5, 2, 32), qkv[:, 128:].reshape(5, 2, 32)
    slots = torch.tensor([17, 3, 40, 0, 63])
    caches = [torch.zeros(2, 4, 16, 2, 32, dtype=dtype) for _ in range(2)]
    cpu_kernels().write_kv_cache(key, value, caches[0], slots)
    write_kv_cache(key, value, caches[1], slots)
    assert torch.equal(caches[0], caches[1])
    with pytest.raises(RuntimeError, match="slot out of range"):
        cpu_kernels().write_kv_cache(key, value, caches[0], torch.tensor([0, 1, 2, 3, 64]))
