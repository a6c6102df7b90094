"""Attention metadata for hand-written batches (kernel tests and the GPU check)."""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionMetadata


def paged_metadata(computed: list[int], new: list[int], block_tables: list[list[int]], block_size: int,
                   device: torch.device | str = "cpu") -> AttentionMetadata:
    """AttentionMetadata for requests with ``computed`` cached and ``new`` new tokens each, whose
    pages are ``block_tables`` (one list of block ids per request)."""
    q_lens = torch.tensor(new)
    seq_lens = (torch.tensor(computed) + q_lens).to(torch.int32)
    qsl = torch.zeros(len(new) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    width = max(len(b) for b in block_tables)
    tables = torch.tensor([b + [0] * (width - len(b)) for b in block_tables], dtype=torch.int32)
    slots = [block_tables[r][p // block_size] * block_size + p % block_size
             for r, (c, n) in enumerate(zip(computed, new)) for p in range(c, c + n)]
    return AttentionMetadata(
        query_start_loc=qsl.to(device),
        seq_lens=seq_lens.to(device),
        block_tables=tables.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=int(q_lens.max()),
        max_seq_len=int(seq_lens.max()),
        query_start_loc_cpu=qsl,
        seq_lens_cpu=seq_lens,
    )
