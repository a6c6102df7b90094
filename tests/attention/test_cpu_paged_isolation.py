"""The C++ paged-attention kernel reads only what a row may attend to, and a row's result does not
depend on the batch or the thread count.

Every cache slot a step may not read (other requests' blocks, the padding block 0 of the block
tables, positions before a row's sliding window, slots past the sequence) holds NaN: one read
would make the output NaN. The batch mixes a prefill, a 20-row chunk (tiles of 8, 8 and 4) that
crosses a 64-position chunk boundary, a decode and a request with no new token, over block sizes
1, 8, 16 and 32, at the shapes' limits (16 query heads per KV head, head_dim 256) and through the
generic path (head_dim 96)."""

from __future__ import annotations

import math

import pytest
import torch

from kvserve.attention import CpuPagedAttentionBackend, cpu_paged_available
from kvserve.attention.backend import AttentionMetadata

pytestmark = pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")

# (computed, new) per request: a chunk of 20 rows at positions 130..149, a request with nothing
# new, a 70-token prefill, a decode at position 8.
STEP = [(130, 20), (1, 0), (0, 70), (8, 1)]


def _metadata(steps, tables, block_size):
    q_lens = torch.tensor([n for _, n in steps])
    seq_lens = (torch.tensor([c for c, _ in steps]) + q_lens).to(torch.int32)
    qsl = torch.zeros(len(steps) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    width = max(len(t) for t in tables)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    slots = [t[p // block_size] * block_size + p % block_size for (c, n), t in zip(steps, tables) for p in range(c, c + n)]
    return AttentionMetadata(qsl, seq_lens, block_tables, torch.tensor(slots, dtype=torch.int64), int(q_lens.max()),
                             int(seq_lens.max()), qsl, seq_lens)


def _attend(seqs, steps, tables, block_size, num_blocks, window):
    """One call on a NaN-filled cache holding only the K/V each request may read this step."""
    num_kv, dim = seqs[0][1].shape[1:]
    cache = torch.full((2, num_blocks, block_size, num_kv, dim), float("nan"), dtype=seqs[0][0].dtype)
    flat = cache.view(2, -1, num_kv, dim)
    for (q, k, v), (computed, new), table in zip(seqs, steps, tables):
        first = 0 if window is None else max(0, computed - window + 1)
        for p in range(first, computed if new else 0):
            slot = table[p // block_size] * block_size + p % block_size
            flat[0, slot], flat[1, slot] = k[p], v[p]
    parts = [[s[i][c : c + n] for s, (c, n) in zip(seqs, steps)] for i in range(3)]
    return CpuPagedAttentionBackend().forward(*(torch.cat(p) for p in parts), cache,
                                              _metadata(steps, tables, block_size), scale=dim**-0.5,
                                              sliding_window=window)


@pytest.mark.parametrize(("dim", "group", "block_size", "window"),
                         [(64, 16, 1, 5), (128, 2, 32, 65), (256, 1, 8, None), (96, 4, 16, 63)])
def test_no_forbidden_slot_read_and_rows_equal_alone_on_other_threads(dim, group, block_size, window):
    gen = torch.Generator().manual_seed(dim + group)
    num_kv, lengths = 2, [c + n for c, n in STEP]
    seqs = [tuple(torch.randn(n, h, dim, generator=gen).to(torch.bfloat16) for h in (group * num_kv, num_kv, num_kv))
            for n in lengths]
    # Block 0 is the tables' padding; the others are handed out shuffled.
    ids = (torch.randperm(sum(-(-n // block_size) for n in lengths), generator=gen) + 1).tolist()
    tables = []
    for n in lengths:
        tables.append(ids[: -(-n // block_size)])
        ids = ids[len(tables[-1]) :]
    num_blocks = max(max(t) for t in tables) + 1
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        out = _attend(seqs, STEP, tables, block_size, num_blocks, window)
        assert torch.isfinite(out).all()
        torch.set_num_threads(2)
        start = 0
        for (q, k, v), (computed, new), table in zip(seqs, STEP, tables):
            for i in range(new):
                position = computed + i
                alone = _attend([(q, k, v)], [(position, 1)], [table], block_size, num_blocks, window)
                assert torch.equal(out[start + i], alone[0]), (position, computed, new)
                lo = 0 if window is None else max(0, position - window + 1)
                for h in (0, group * num_kv - 1):
                    scores = k[lo : position + 1, h // group].double() @ q[position, h].double() / math.sqrt(dim)
                    expected = torch.softmax(scores, 0) @ v[lo : position + 1, h // group].double()
                    torch.testing.assert_close(out[start + i, h].double(), expected, atol=2e-2, rtol=2e-2)
            start += new
    finally:
        torch.set_num_threads(before)
