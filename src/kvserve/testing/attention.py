"""Attention metadata for hand-written batches (kernel tests and the GPU check)."""

from __future__ import annotations

import numpy as np
import torch

from kvserve.attention.backend import AttentionMetadata
from kvserve.model.model_inputs import make_flat_batch, to_model_inputs


def paged_metadata(computed: list[int], new: list[int], block_tables: list[list[int]], block_size: int,
                   device: torch.device | str = "cpu") -> AttentionMetadata:
    """AttentionMetadata for requests with ``computed`` cached and ``new`` new tokens each, whose
    pages are ``block_tables`` (one list of block ids per request), laid out as the runner lays
    out a step (``kvserve.model.model_inputs``)."""
    width = max(len(b) for b in block_tables)
    tables = np.array([b + [0] * (width - len(b)) for b in block_tables], dtype=np.int64)
    lengths = np.array(computed) + np.array(new)
    flat = make_flat_batch(np.zeros((len(new), int(lengths.max())), dtype=np.int64), np.array(computed),
                           np.array(new), tables, block_size, np.zeros(len(new), dtype=bool))
    return to_model_inputs(flat, torch.device(device)).attn_metadata
