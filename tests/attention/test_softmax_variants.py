"""Soft-capped scores (Gemma 2) and attention sinks (GPT-OSS) in both backends against a float64
attention written here: every path of the C++ kernel (float32 rows, the bfloat16 vector tiles,
AMX tiles where the CPU has them) and the reference backend's eager product, through prefill
chunks and decodes, with and without a sliding window; bfloat16 rows are the same bits however
the prompt is chunked and whatever else is in the batch."""

from __future__ import annotations

import pytest
import torch
import test_torch_backend as helpers

from kvserve.attention import CpuPagedAttentionBackend, TorchAttentionBackend, cpu_paged_available
from kvserve.kernels import cpu_kernels

NUM_HEADS, NUM_KV, BLOCK = 8, 2, 16
HAS_AMX = cpu_paged_available() and cpu_kernels().amx_linear_available()


def dense(q, k, v, window, softcap, sinks):
    """float64 causal attention of one whole sequence: q [L, H, D], k/v [L, H_kv, D] -> [L, H, D]."""
    length, dim = q.shape[0], q.shape[2]
    group = q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    for h in range(q.shape[1]):
        kh, vh = k[:, h // group].double(), v[:, h // group].double()
        for i in range(length):
            lo = 0 if window is None else max(0, i - window + 1)
            scores = (kh[lo : i + 1] @ q[i, h].double()) * dim**-0.5
            if softcap:
                scores = softcap * torch.tanh(scores / softcap)
            if sinks is not None:
                scores = torch.cat([scores, sinks[h : h + 1].double()])
            probs = torch.softmax(scores, dim=0)
            out[i, h] = probs[: i + 1 - lo] @ vh[lo : i + 1]
    return out


def run(backend, q, k, v, chunks, window, softcap, sinks, neighbour=None):
    """One sequence fed in ``chunks`` (a neighbour request alongside in every call when given);
    its output rows in order."""
    dim = q.shape[2]
    cache = torch.zeros(2, 48, BLOCK, NUM_KV, dim, dtype=q.dtype)
    blocks = list(range(30, 10, -1))
    outs, done = [], 0
    old, helpers.BLOCK_SIZE = helpers.BLOCK_SIZE, BLOCK
    try:
        for n in chunks:
            rows = [(q[done : done + n], k[done : done + n], v[done : done + n])]
            computed, new, tables = [done], [n], [blocks]
            if neighbour is not None:
                rows.append(neighbour)
                computed, new, tables = [done, 0], [n, neighbour[0].shape[0]], [blocks, [40, 41]]
            meta = helpers.metadata_for(computed, new, tables)
            out = backend.forward(*(torch.cat(parts) for parts in zip(*rows)), cache, meta, scale=dim**-0.5,
                                  sliding_window=window, softcap=softcap, sinks=sinks)
            outs.append(out[:n])
            done += n
    finally:
        helpers.BLOCK_SIZE = old
    return torch.cat(outs)


def inputs(dtype, dim, length=90, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # Scores of a few units: the cap (5) bends them, the sinks (around the scores' size) take a share.
    q, k, v = (torch.randn(length, n, dim, generator=gen).mul(2).to(dtype) for n in (NUM_HEADS, NUM_KV, NUM_KV))
    sinks = torch.randn(NUM_HEADS, generator=gen) * 2
    return q, k, v, sinks


BACKENDS = {
    "torch": lambda: TorchAttentionBackend(),
    "kernel": lambda: CpuPagedAttentionBackend(amx=False),
    "kernel_amx": lambda: CpuPagedAttentionBackend(amx=True),
    "kernel_then_sdpa": lambda: CpuPagedAttentionBackend(max_kernel_query_len=8, amx=False),
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("softcap", "with_sinks"), [(5.0, False), (0.0, True), (5.0, True)])
@pytest.mark.parametrize("window", [None, 21])
def test_matches_float64(backend, dtype, softcap, with_sinks, window):
    if backend.startswith("kernel") and not cpu_paged_available():
        pytest.skip("no C++ compiler for the kernel")
    if backend == "kernel_amx" and (dtype != torch.bfloat16 or not HAS_AMX):
        pytest.skip("AMX tiles: bfloat16 on CPUs that have them")
    q, k, v, sinks = inputs(dtype, 64)
    sinks = sinks if with_sinks else None
    got = run(BACKENDS[backend](), q, k, v, [40, 30, 1, 1, 18], window, softcap, sinks)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.double(), dense(q, k, v, window, softcap, sinks), atol=tol, rtol=tol)


@pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")
@pytest.mark.parametrize("amx", [False, True])
def test_bfloat16_rows_identical_however_chunked_and_batched(amx):
    if amx and not HAS_AMX:
        pytest.skip("no AMX tiles here")
    q, k, v, sinks = inputs(torch.bfloat16, 64, length=100, seed=3)
    other = tuple(t[:7] for t in inputs(torch.bfloat16, 64, length=7, seed=4)[:3])
    backend = CpuPagedAttentionBackend(amx=amx)
    whole = run(backend, q, k, v, [100], 33, 5.0, sinks)
    for chunks in ([61, 1, 38], [3] * 33 + [1], [1] * 10 + [90]):
        assert torch.equal(run(backend, q, k, v, chunks, 33, 5.0, sinks), whole)
    assert torch.equal(run(backend, q, k, v, [50, 50], 33, 5.0, sinks, neighbour=other), whole)


@pytest.mark.skipif(not cpu_paged_available(), reason="no C++ compiler for the kernel")
def test_kernel_refuses_sinks_of_another_shape():
    q, k, v, sinks = inputs(torch.float32, 16, length=4)
    with pytest.raises(RuntimeError, match=r"sinks must be a contiguous float32 \[8\]"):
        run(CpuPagedAttentionBackend(), q, k, v, [4], None, 0.0, sinks[:4])
