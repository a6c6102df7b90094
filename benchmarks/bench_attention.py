"""Time kvserve's paged-attention kernel alone on a decode step's shapes.

``--batch`` decode rows, request i with ``--context + i`` tokens in the cache (as
``profile_decode.py`` builds them), the Qwen2.5-0.5B attention shape (14 query heads on 2 KV heads,
head_dim 64), the engine's block size 16 with each request's blocks scattered over the cache, and
one cache per layer (``--layers``, 24: 176 MB of bf16 K/V at batch 64, more than the caches hold,
so each layer's K/V comes from memory as in a real step), in huge pages as the engine's cache
(``KVSERVE_HUGE_PAGES=0``: 4 KiB pages). Prints the median time of one pass over
every layer and the K/V bytes read per second::

    python benchmarks/bench_attention.py --batch 64 --context 192

Compare two trees by running it in each (``PYTHONPATH=<tree>/src``) back to back.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import time_calls

from kvserve import huge_pages
from kvserve.kernels import cpu_kernels

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 14, 2, 64, 16


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--context", type=int, default=192)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--amx", choices=["auto", "on", "off"], default="auto",
                        help="bfloat16 on AMX tiles where the CPU has them (auto), required (on) or never (off)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ops, dtype, gen = cpu_kernels(), getattr(torch, args.dtype), torch.Generator().manual_seed(0)
    lens = [args.context + i for i in range(args.batch)]
    counts = [-(-n // BLOCK_SIZE) for n in lens]
    order = torch.randperm(sum(counts), generator=gen) + 1  # block 0 unused; blocks scattered
    tables = torch.zeros(args.batch, max(counts), dtype=torch.int32)
    for r, start in enumerate(torch.tensor([0, *counts]).cumsum(0)[:-1].tolist()):
        tables[r, : counts[r]] = order[start : start + counts[r]]
    caches = [huge_pages.place(torch.randn(2, sum(counts) + 1, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM, generator=gen).to(dtype))
              for _ in range(args.layers)]  # in huge pages, as the engine's KV cache
    query = torch.randn(args.batch, NUM_HEADS, HEAD_DIM, generator=gen).to(dtype)
    out = torch.empty_like(query)
    amx = {"auto": -1, "on": 1, "off": 0}[args.amx]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    starts = torch.arange(args.batch + 1, dtype=torch.int32)

    def one_pass() -> None:
        for cache in caches:
            ops.paged_attention(out, query, cache, tables, seq_lens, starts, HEAD_DIM**-0.5, 0, 1 << 30, amx)

    median = statistics.median(time_calls(one_pass, args.repeats))
    kv_bytes = sum(lens) * NUM_KV_HEADS * HEAD_DIM * 2 * caches[0].element_size() * args.layers
    print(f"paged attention, {args.batch} decode rows, contexts {lens[0]}-{lens[-1]}, {args.layers} layers, "
          f"{args.dtype}, amx {args.amx}, {torch.get_num_threads()} threads: {median * 1e3:.2f} ms "
          f"({median / args.layers * 1e3:.3f} ms per layer), K/V read at {kv_bytes / median / 1e9:.1f} GB/s")


if __name__ == "__main__":
    main()
