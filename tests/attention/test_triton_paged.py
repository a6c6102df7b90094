"""The Triton paged-attention backend (for NVIDIA GPUs), run on the CPU by Triton's interpreter,
against the float64 attention and the reference backend: mixed prefill chunks and decodes, GQA,
sliding windows, soft-capping, sinks, float32 and bfloat16, the KV cache written at its slots,
and rows identical whatever else the batch holds. (tests/conftest.py sets ``TRITON_INTERPRET=1``
before anything imports Triton.)"""

from __future__ import annotations

import pytest
import torch
import test_softmax_variants as variants
import test_torch_backend as helpers

from kvserve.attention import TorchAttentionBackend, get_attention_backend
from kvserve.attention.triton_paged import TritonPagedAttentionBackend
from kvserve.errors import ConfigError

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("window", [None, 3])
def test_mixed_steps_match_dense_and_write_the_cache_as_the_reference(window):
    seqs = helpers.random_seqs([13, 12, 14])
    steps = [[5, 10, 0], [6, 1, 9], [1, 1, 5], [1, 0, 0]]
    outs, cache = helpers.run_in_steps(steps, seqs, helpers.BLOCK_TABLES, window, backend=TritonPagedAttentionBackend())
    _, ref_cache = helpers.run_in_steps(steps, seqs, helpers.BLOCK_TABLES, window)
    assert torch.equal(cache, ref_cache)
    for r, (q, k, v) in enumerate(seqs):
        torch.testing.assert_close(outs[r].double(), helpers.dense_attention(q, k, v, window), atol=1e-5, rtol=1e-5)


# The Triton interpreter runs each (token, head) program in Python: the shapes stay small.
@pytest.mark.parametrize(("dtype", "softcap", "with_sinks", "window"), [
    (torch.float32, 0.0, False, None), (torch.float32, 5.0, True, 9), (torch.bfloat16, 5.0, True, None),
    (torch.bfloat16, 0.0, False, 9), (torch.float32, 0.0, True, None)])
def test_softmax_variants_match_float64(dtype, softcap, with_sinks, window):
    q, k, v, sinks = variants.inputs(dtype, 64, length=24)
    sinks = sinks if with_sinks else None
    got = variants.run(TritonPagedAttentionBackend(), q, k, v, [10, 8, 1, 1, 4], window, softcap, sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), variants.dense(q, k, v, window, softcap, sinks), atol=tol, rtol=tol)
    reference = variants.run(TorchAttentionBackend(), q, k, v, [10, 8, 1, 1, 4], window, softcap, sinks)
    torch.testing.assert_close(got.double(), reference.double(), atol=tol, rtol=tol)


def test_rows_are_identical_however_chunked_and_batched():
    q, k, v, sinks = variants.inputs(torch.bfloat16, 64, length=24, seed=3)
    other = tuple(t[:5] for t in variants.inputs(torch.bfloat16, 64, length=5, seed=4)[:3])
    backend = TritonPagedAttentionBackend()
    whole = variants.run(backend, q, k, v, [24], 9, 5.0, sinks)
    assert torch.equal(variants.run(backend, q, k, v, [13, 1, 10], 9, 5.0, sinks), whole)
    assert torch.equal(variants.run(backend, q, k, v, [12, 12], 9, 5.0, sinks, neighbour=other), whole)


def test_decode_over_partitions_gives_the_bits_of_one_program_per_row():
    """Contexts over several partitions (16 positions here): a decode step runs one program per
    partition and merges them (flash-decoding), a prefill chunk runs them in one program per row;
    both give the same bits, within bfloat16 error of the float64 attention. The window (9) reaches
    into the first partition up to position 23 and not after: from there a row has one partition
    fewer than the grid (the program of the other stores nothing, as for a shorter neighbour)."""
    q, k, v, sinks = variants.inputs(torch.bfloat16, 64, length=28, seed=5)
    backend = TritonPagedAttentionBackend(partition_size=16)
    chunked = variants.run(backend, q, k, v, [20, 8], 9, 5.0, sinks)
    assert torch.equal(variants.run(backend, q, k, v, [20] + [1] * 8, 9, 5.0, sinks), chunked)
    torch.testing.assert_close(chunked.double(), variants.dense(q, k, v, 9, 5.0, sinks), atol=2e-2, rtol=2e-2)


def test_what_it_cannot_run_is_refused_by_name():
    seqs = helpers.random_seqs([4])
    q, k, v = seqs[0]
    cache = torch.zeros(2, 8, 3, helpers.NUM_KV_HEADS, helpers.HEAD_DIM)
    old, helpers.BLOCK_SIZE = helpers.BLOCK_SIZE, 3
    try:
        meta = helpers.metadata_for([0], [4], [[1, 2]])
    finally:
        helpers.BLOCK_SIZE = old
    with pytest.raises(NotImplementedError, match="power-of-two --block-size"):
        TritonPagedAttentionBackend().forward(q, k, v, cache, meta, scale=0.3)
    one_byte = torch.zeros(2, 8, 4, helpers.NUM_KV_HEADS, helpers.HEAD_DIM + 4, dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="--kv-cache-dtype int8/fp8"):
        TritonPagedAttentionBackend().forward(q, k, v, one_byte, helpers.metadata_for([0], [4], [[1]]), scale=0.3)


def test_a_cache_the_backend_cannot_serve_is_refused_at_start_and_auto_takes_torch():
    with pytest.raises(ConfigError, match="--kv-cache-dtype int8/fp8 needs --attention-backend torch"):
        get_attention_backend("triton", "cuda", kv_cache_dtype="int8")
    with pytest.raises(ConfigError, match="power-of-two --block-size, got 6"):
        get_attention_backend("triton", "cuda", block_size=6)
    assert get_attention_backend("auto", "cuda", kv_cache_dtype="fp8").name == "torch"
    assert get_attention_backend("auto", "cuda", block_size=16).name == "triton"
