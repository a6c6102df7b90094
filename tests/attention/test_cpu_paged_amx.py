"""The bfloat16 paged-attention kernel on AMX tiles (``attend_tile_amx``), where the CPU has them:
close to float64 attention, close to the AVX512-BF16 vector path, and a row's bits the same
however it is computed (decode or prefill, any chunking, alone or in a batch, any thread count,
in place or through the copy of a group that is not)."""

from __future__ import annotations

import pytest
import torch
from test_cpu_paged import _chunked_outputs

from kvserve.attention import cpu_paged_available
from kvserve.kernels import cpu_kernels

pytestmark = pytest.mark.skipif(not cpu_paged_available() or not cpu_kernels().amx_linear_available(),
                                reason="no AMX-BF16 tiles on this CPU (or no C++ compiler)")

NUM_HEADS, NUM_KV = 14, 2  # the Qwen2.5-0.5B group of 7


def _sequence(length, dim, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(length, n, dim, generator=gen).to(torch.bfloat16) for n in (NUM_HEADS, NUM_KV, NUM_KV))


def _float64_attention(q, k, v, window):
    """Causal attention of every row of one sequence in float64 (GQA: KV head = head // group)."""
    group, out = NUM_HEADS // NUM_KV, torch.empty(q.shape, dtype=torch.float64)
    for i in range(q.shape[0]):
        lo = 0 if window is None else max(0, i - window + 1)
        for h in range(NUM_HEADS):
            scores = k[lo : i + 1, h // group].double() @ q[i, h].double() * q.shape[2] ** -0.5
            out[i, h] = torch.softmax(scores, 0) @ v[lo : i + 1, h // group].double()
    return out


@pytest.mark.parametrize(("dim", "window", "block_size"), [(64, None, 16), (128, 37, 16), (64, 50, 8), (32, None, 32)])
def test_amx_rows_close_to_float64_and_to_the_vector_path(dim, window, block_size):
    """Every row of a 150-token prompt (three 64-position chunks, group 7): within bfloat16
    rounding of float64 attention and as close to it as the vector path; the two paths agree to a
    bfloat16 step. Block size 8 reads every group through its copy, 32 in place."""
    q, k, v = _sequence(150, dim, seed=dim + (window or 0))
    blocks = list(range(40, 0, -1))[: -(-150 // block_size)]
    amx = _chunked_outputs(q, k, v, [150], blocks, window, 41, amx=True, block_size=block_size)
    vector = _chunked_outputs(q, k, v, [150], blocks, window, 41, amx=False, block_size=block_size)
    ref = _float64_attention(q, k, v, window)
    torch.testing.assert_close(amx.double(), ref, atol=2e-2, rtol=2e-2)
    assert (amx.double() - ref).abs().mean() <= 1.2 * (vector.double() - ref).abs().mean()
    torch.testing.assert_close(amx.float(), vector.float(), atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize(("dim", "window", "block_size"), [(64, None, 16), (64, 37, 16), (128, None, 8), (64, 21, 32)])
def test_amx_rows_identical_decode_prefill_chunked_batched(dim, window, block_size):
    """On the AMX path a row's output bits do not depend on how the prompt is chunked (prefill
    tiles of up to 8 rows, single decode rows, chunks that cross the 64-position chunks of the
    kernel), on a neighbour request in the same call or on the thread count."""
    q, k, v = _sequence(150, dim, seed=7 * dim + block_size)
    blocks = list(range(40, 0, -1))[: -(-150 // block_size)]

    def run(chunks, neighbour=None):
        return _chunked_outputs(q, k, v, chunks, blocks, window, 60, neighbour, amx=True, block_size=block_size)

    whole = run([150])
    for chunks in ([61, 1, 40, 48], [3] * 50, [1] * 20 + [130], [1] * 150):
        assert torch.equal(run(chunks), whole), chunks
    other = _sequence(23, dim, seed=99)
    other_blocks = list(range(59, 40, -1))[: -(-23 // block_size)]
    assert torch.equal(run([100, 50], (*other, other_blocks)), whole)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2 if before == 1 else 1)
        assert torch.equal(run([70, 1, 79]), whole)
    finally:
        torch.set_num_threads(before)


def test_amx_batch_rows_equal_alone():
    """A decode batch of 24 requests with contexts 1-200 (every chunk and group boundary case):
    each request's row is bit-identical to the same request decoded alone."""
    gen = torch.Generator().manual_seed(11)
    dim, block = 64, 16
    lens = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 66, 100, 127, 128, 129, 130, 150, 170, 191, 192, 193, 199, 200]
    counts = [-(-n // block) for n in lens]
    order = (torch.randperm(sum(counts), generator=gen) + 1).tolist()
    tables, start = [], 0
    for n in counts:
        tables.append(order[start : start + n])
        start += n
    cache = torch.randn(2, sum(counts) + 1, block, NUM_KV, dim, generator=gen).to(torch.bfloat16)
    query = torch.randn(len(lens), NUM_HEADS, dim, generator=gen).to(torch.bfloat16)
    ops = cpu_kernels()

    def attend(rows):
        width = max(counts[r] for r in rows)
        table = torch.tensor([tables[r] + [0] * (width - counts[r]) for r in rows], dtype=torch.int32)
        out = torch.empty(len(rows), NUM_HEADS, dim, dtype=torch.bfloat16)
        ops.paged_attention(out, query[rows].contiguous(), cache, table, torch.tensor([lens[r] for r in rows],
                            dtype=torch.int32), torch.arange(len(rows) + 1, dtype=torch.int32), dim**-0.5, 0, 1, 1)
        return out

    batch = attend(list(range(len(lens))))
    for r in range(len(lens)):
        assert torch.equal(attend([r])[0], batch[r]), lens[r]
    # A row at one position is the same in the batch and as the last row of a prefill chunk.
    assert torch.equal(attend([5, 3, 9])[1], batch[3])

