"""The attention-backend interface and the metadata every backend reads.

KV cache layout (one tensor per layer)::

    kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim]
               |   |           |
               |   |           +-- offset of the token inside its block
               |   +-- block id (from the request's block table)
               +-- 0 = keys, 1 = values

    slot = block_id * block_size + offset     (slot_mapping holds one slot per new token)

A flat batch holds the new tokens of all requests of a step back to back::

    query tokens:  | req 0: 5 prompt tokens | req 1: 1 decode token | req 2: 3-token chunk |
    query_start_loc = [0, 5, 6, 9]
    seq_lens        = [5, 37, 19]   (cached context + new tokens, per request)

Token ``i`` of request ``r`` sits at absolute position ``seq_lens[r] - q_len[r] + i`` and attends
causally to every cached and new token at positions <= its own (and > position - sliding_window
when a window is set).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Attributes (device tensors unless marked ``_cpu``):
    query_start_loc: int32 [B + 1], offsets of each request's new tokens in the flat batch.
    seq_lens: int32 [B], context + new tokens per request.
    block_tables: int32 [B, max_blocks_per_seq], KV block ids, padded with 0.
    slot_mapping: int64 [T], cache slot of each new token.
    max_query_len: largest number of new tokens of one request (1 = pure decode).
    max_seq_len: largest ``seq_lens`` entry.
    query_start_loc_cpu, seq_lens_cpu: the same on the host, for backends that loop in Python.
    """

    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_seq_len: int
    query_start_loc_cpu: torch.Tensor
    seq_lens_cpu: torch.Tensor

    @property
    def num_requests(self) -> int:
        return self.seq_lens.shape[0]

    @property
    def is_decode_only(self) -> bool:
        return self.max_query_len == 1


class AttentionBackend(ABC):
    """Paged attention: write the new tokens' K/V into the cache, then attend.

    Implementations are registered by name; the portable torch backend is the reference every
    faster backend is tested against.
    """

    name: str = "abstract"

    @abstractmethod
    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
        *,
        scale: float,
        sliding_window: int | None = None,
        softcap: float = 0.0,
        sinks: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args:
            query: [T, num_heads, head_dim], the new tokens' queries (rotary already applied).
            key, value: [T, num_kv_heads, head_dim], the new tokens' keys (rotated) and values.
            kv_cache: [2, num_blocks, block_size, num_kv_heads, head_dim], updated in place at
                ``metadata.slot_mapping``.
            metadata: the batch layout.
            scale: softmax scale (usually ``head_dim ** -0.5``).
            sliding_window: attend only to the last ``sliding_window`` positions (Mistral), or all.
            softcap: > 0 caps the scaled scores at ``softcap * tanh(s / softcap)`` (Gemma 2).
            sinks: [num_heads] sink logits (GPT-OSS): each head's softmax denominator gains
                ``exp(sink)``, which attends to no value.

        Returns:
            [T, num_heads, head_dim], same dtype as ``query``. Grouped-query attention: query
            head h reads KV head ``h // (num_heads // num_kv_heads)``.
        """
