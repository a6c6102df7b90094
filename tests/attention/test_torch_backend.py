"""The torch paged-attention backend against a naive dense causal attention written here."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.attention import TorchAttentionBackend, get_attention_backend
from kvserve.errors import ConfigError
from kvserve.testing.attention import paged_metadata

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS = 4, 2, 8, 4, 32


def dense_attention(q, k, v, window):
    """q [L, H, D], k/v [L, H_kv, D] of one whole sequence -> [L, H, D]; float64 softmax loops."""
    length, group = q.shape[0], NUM_HEADS // NUM_KV_HEADS
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(NUM_HEADS):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for i in range(length):
            lo = 0 if window is None else max(0, i - window + 1)
            scores = (kh[lo : i + 1] @ q[i, h].double()) / math.sqrt(HEAD_DIM)
            out[i, h] = torch.softmax(scores, dim=0) @ vh[lo : i + 1]
    return out


def metadata_for(computed, new, block_tables):
    """AttentionMetadata for requests with ``computed`` cached and ``new`` new tokens each."""
    return paged_metadata(computed, new, block_tables, BLOCK_SIZE)


def run_in_steps(steps, seqs, block_tables, window, batch_invariant=True, backend=None):
    """Feed each sequence's tokens as ``steps`` says (list of per-request new-token counts per
    step), returning the outputs of every token in order per request (reference backend unless
    ``backend`` is given)."""
    backend = backend or TorchAttentionBackend(batch_invariant=batch_invariant)
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=seqs[0][0].dtype)
    done = [0] * len(seqs)
    outputs = [[] for _ in seqs]
    for new in steps:
        active = [r for r, n in enumerate(new) if n > 0]
        meta = metadata_for([done[r] for r in active], [new[r] for r in active], [block_tables[r] for r in active])
        q = torch.cat([seqs[r][0][done[r] : done[r] + new[r]] for r in active])
        k = torch.cat([seqs[r][1][done[r] : done[r] + new[r]] for r in active])
        v = torch.cat([seqs[r][2][done[r] : done[r] + new[r]] for r in active])
        out = backend.forward(q, k, v, cache, meta, scale=HEAD_DIM**-0.5, sliding_window=window)
        assert out.shape == q.shape and out.dtype == q.dtype
        start = 0
        for r in active:
            outputs[r].append(out[start : start + new[r]])
            start += new[r]
            done[r] += new[r]
    return [torch.cat(o) for o in outputs], cache


def random_seqs(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        (
            torch.randn(n, NUM_HEADS, HEAD_DIM, generator=gen),
            torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen),
            torch.randn(n, NUM_KV_HEADS, HEAD_DIM, generator=gen),
        )
        for n in lengths
    ]


# Non-contiguous, out-of-order block ids; request 1 shares no block with the others.
BLOCK_TABLES = [[7, 2, 19, 11], [30, 0, 5], [13, 25, 3, 9]]


@pytest.mark.parametrize("window", [None, 3, 6])
def test_mixed_prefill_chunks_and_decodes_match_dense(window):
    seqs = random_seqs([13, 12, 14])
    steps = [
        [5, 10, 0],  # prefill chunk of r0, whole prompt of r1
        [6, 1, 9],  # second chunk of r0, a decode of r1, first chunk of r2
        [1, 1, 5],  # decodes + last chunk of r2
        [1, 0, 0],
    ]
    outs, _ = run_in_steps(steps, seqs, BLOCK_TABLES, window)
    for r, (q, k, v) in enumerate(seqs):
        n = outs[r].shape[0]
        assert n == q.shape[0]
        ref = dense_attention(q[:n], k[:n], v[:n], window)
        torch.testing.assert_close(outs[r].double(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch_invariant", [True, False])
@pytest.mark.parametrize("window", [None, 4])
def test_decode_only_batch_matches_dense(window, batch_invariant):
    seqs = random_seqs([12, 7, 11], seed=1)
    steps = [[9, 4, 8], [1, 1, 1], [1, 1, 1], [1, 1, 1]]  # three pure-decode steps after prefill
    outs, _ = run_in_steps(steps, seqs, BLOCK_TABLES, window, batch_invariant)
    for r, (q, k, v) in enumerate(seqs):
        n = outs[r].shape[0]
        torch.testing.assert_close(outs[r].double(), dense_attention(q[:n], k[:n], v[:n], window), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("window", [None, 5])
def test_bfloat16_decode_is_batch_invariant(window):
    """A request's decode output is bit-identical whether it runs alone or with others."""
    seqs = [tuple(t.to(torch.bfloat16) for t in s) for s in random_seqs([16, 9, 14, 9], seed=3)]
    tables = BLOCK_TABLES + [[14, 15, 16]]
    batched, _ = run_in_steps([[15, 8, 13, 8], [1, 1, 1, 1]], seqs, tables, window)
    for r in range(len(seqs)):
        alone, _ = run_in_steps([[len(seqs[r][0]) - 1], [1]], [seqs[r]], [tables[r]], window)
        assert torch.equal(batched[r][-1], alone[0][-1])


def test_kv_written_at_slots():
    seqs = random_seqs([6])
    _, cache = run_in_steps([[6]], seqs, [[9, 4]], None)
    k, v = seqs[0][1], seqs[0][2]
    torch.testing.assert_close(cache[0, 9], k[:4])
    torch.testing.assert_close(cache[1, 4, :2], v[4:6])
    assert cache[0, 4, 2:].abs().sum() == 0  # untouched slots stay zero


def test_bfloat16_output_dtype_and_values():
    seqs = [tuple(t.to(torch.bfloat16) for t in s) for s in random_seqs([9, 5], seed=2)]
    backend = TorchAttentionBackend()
    cache = torch.zeros(2, NUM_BLOCKS, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    meta = metadata_for([0, 0], [9, 5], [[3, 1, 8], [4, 6]])
    q, k, v = (torch.cat([s[i] for s in seqs]) for i in range(3))
    out = backend.forward(q, k, v, cache, meta, scale=HEAD_DIM**-0.5)
    assert out.dtype == torch.bfloat16
    ref = torch.cat([dense_attention(*s, None) for s in seqs])
    torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_registry():
    assert isinstance(get_attention_backend(), TorchAttentionBackend)
    assert get_attention_backend("torch").name == "torch"
    with pytest.raises(ConfigError, match="available: auto, cpu_paged, torch, triton"):
        get_attention_backend("flash")
