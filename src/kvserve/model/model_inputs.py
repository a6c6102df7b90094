"""One step's flat batch: every scheduled token of every request back to back, with the layout
the attention backends read (``kvserve.attention.backend``)::

    requests:       r0 (c=0, n=5)        r1 (c=36, n=1)   r2 (c=16, n=3)
    input_ids:      r0 tokens[0:5]      | r1[36:37]      | r2[16:19]
    positions:      0 1 2 3 4           | 36             | 16 17 18
    slot_mapping:   block_table[p // bs] * bs + p % bs, per position p
    logits_indices: index of each sampling request's last token in the batch (its last
                    1 + k tokens when it verifies k draft tokens)
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from kvserve.attention.backend import AttentionMetadata


class ModelInputs(NamedTuple):
    """One step's flat batch (device tensors).

    Attributes:
        input_ids: int64 [T].
        positions: int64 [T].
        attn_metadata: layout for the attention backend.
        logits_indices: int64 [num_sampling_requests], rows of the hidden states to sample from.
        token_type_ids: int64 [T], each token's segment type, for a model that reads them (BERT
            cross-encoders' pairs), or None: every token type 0.
    """

    input_ids: torch.Tensor
    positions: torch.Tensor
    attn_metadata: AttentionMetadata
    logits_indices: torch.Tensor
    token_type_ids: torch.Tensor | None = None


class FlatBatch(NamedTuple):
    """The host-side arrays of a flat batch (int64 numpy), before they go to the device.

    Attributes:
        input_ids, positions, slot_mapping: [T].
        query_start_loc: [B + 1]; seq_lens: [B]; block_tables: [B, max_blocks] (0-padded).
        logits_indices: [S], the last token of each request that samples.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: np.ndarray
    logits_indices: np.ndarray


def make_flat_batch(token_ids: np.ndarray, num_computed: np.ndarray, num_scheduled: np.ndarray,
                    block_tables: np.ndarray, block_size: int, samples: np.ndarray,
                    num_logits: np.ndarray | None = None) -> FlatBatch:
    """Lay out ``B`` requests' scheduled tokens (vectorized: no per-token Python loop).

    Args:
        token_ids: int [B, L], each request's known tokens (at least up to its scheduled end).
        num_computed: int [B], tokens already in the KV cache.
        num_scheduled: int [B], tokens to compute now (>= 1 each).
        block_tables: int [B, W], block ids; ``W * block_size`` covers every scheduled position.
        block_size: tokens per block.
        samples: bool [B], which requests sample a token this step.
        num_logits: int [B], positions (the last ones) whose logits a sampling request needs:
            1, or 1 + its draft tokens (default: 1 each).
    """
    num_computed = num_computed.astype(np.int64)
    query_start_loc = np.zeros(len(num_scheduled) + 1, dtype=np.int64)
    np.cumsum(num_scheduled, out=query_start_loc[1:])
    req_of_token = np.repeat(np.arange(len(num_scheduled)), num_scheduled)
    positions = num_computed[req_of_token] + np.arange(query_start_loc[-1]) - query_start_loc[req_of_token]
    input_ids = token_ids[req_of_token, positions].astype(np.int64)
    block_tables = block_tables.astype(np.int64)
    slot_mapping = block_tables[req_of_token, positions // block_size] * block_size + positions % block_size
    ends = query_start_loc[1:][samples]
    if num_logits is None:
        logits_indices = ends - 1
    else:
        counts = num_logits[samples].astype(np.int64)
        starts = np.repeat(ends - counts, counts)
        logits_indices = starts + np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return FlatBatch(input_ids, positions, slot_mapping, query_start_loc, num_computed + num_scheduled,
                     block_tables, logits_indices)


def to_model_inputs(batch: FlatBatch, device: torch.device) -> ModelInputs:
    """Move a flat batch to ``device`` as the model and its attention backend take it."""

    def on_device(array: np.ndarray, dtype: torch.dtype = torch.int64) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(device=device, dtype=dtype)

    query_start_loc_cpu = torch.from_numpy(batch.query_start_loc).to(torch.int32)
    seq_lens_cpu = torch.from_numpy(batch.seq_lens).to(torch.int32)
    metadata = AttentionMetadata(
        query_start_loc=query_start_loc_cpu.to(device),
        seq_lens=seq_lens_cpu.to(device),
        block_tables=on_device(batch.block_tables, torch.int32),
        slot_mapping=on_device(batch.slot_mapping),
        max_query_len=int(np.diff(batch.query_start_loc).max(initial=0)),
        max_seq_len=int(batch.seq_lens.max(initial=0)),
        query_start_loc_cpu=query_start_loc_cpu,
        seq_lens_cpu=seq_lens_cpu,
    )
    return ModelInputs(on_device(batch.input_ids), on_device(batch.positions), metadata,
                       on_device(batch.logits_indices))
