"""Paged attention in Triton, for NVIDIA GPUs (``--attention-backend triton``; ``auto`` on CUDA when
Triton imports). On a CPU it runs only under Triton's interpreter (``TRITON_INTERPRET=1``), which
is how the tests check it against the torch reference backend.

A token's context is read in partitions of ``partition_size`` positions (512, vLLM's paged-attention
v2 size), counted from position 0 whatever the batch: within a partition, block by block through
the block table (positions <= its own and inside the sliding window), online softmax in float32
(scores soft-capped where the model caps them); the partitions' (max, sum, weighted values) merged
in increasing order; the sink logit added to the denominator where the model has them; GQA by
``kv head = head // group``. The kernels::

    write    one program per new token: its K and V rows stored at its slot (none for slot -1,
             the padding rows of a CUDA graph's batch)
    attend   one program per (new token, query head): its partitions in turn, each merged as it ends
    split    (decode steps whose longest context spans several partitions: flash-decoding) one
    combine  program per (token, head, partition), then one per (token, head) merging the stored
             partitions in the same order with the same arithmetic as ``attend``

Prefill chunks and decode tokens go through the same arithmetic, so a mixed step is one launch and
a decode step over long contexts spreads each row over as many programs as it has partitions. A
row's result depends only on its own request (its partitions are fixed by its positions, merged in
one order whichever kernels ran them): batch-invariant, as kvserve's CPU kernels are. Not yet:
one-byte KV caches (``--kv-cache-dtype int8|fp8``).
"""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.kv_quant import ONE_BYTE_DTYPES
from kvserve.kernels.triton_support import triton_available

# Imported at first use (``_kernels``): Triton decides between its compiler and its interpreter
# (``TRITON_INTERPRET=1``) when it is imported, and a process that never runs these kernels
# need not pay for the import.
triton = None
# Positions of context per partition: vLLM's paged-attention v2 partition.
PARTITION_SIZE = 512


def triton_refuses(one_byte_kv: bool, block_size: int) -> str | None:
    """Why this backend cannot serve a cache (a one-byte ``--kv-cache-dtype``, a block size that
    is not a power of two), with the fix; None when it can."""
    if one_byte_kv:
        return ("the triton attention backend reads a model-dtype KV cache; --kv-cache-dtype int8/fp8 needs "
                "--attention-backend torch")
    if block_size & (block_size - 1):
        return f"the triton attention backend needs a power-of-two --block-size, got {block_size}"
    return None


def _kernels():
    """The kernels' module, imported at first use."""
    global triton
    import triton

    from kvserve.attention import triton_paged_kernels

    return triton_paged_kernels


class TritonPagedAttentionBackend(AttentionBackend):
    """See the module docstring. Stateless.

    Args:
        partition_size: tokens of context per partition (a multiple of the block size; smaller
            blocks' worth rounds down, at least one block): a token's context is read in
            partitions of this many positions from position 0, merged in order.
    """

    name = "triton"

    def __init__(self, partition_size: int = PARTITION_SIZE):
        if not triton_available():
            raise RuntimeError("the triton attention backend needs the triton package (pip install triton)")
        self.partition_size = partition_size

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                metadata: AttentionMetadata, *, scale: float, sliding_window: int | None = None,
                softcap: float = 0.0, sinks: torch.Tensor | None = None) -> torch.Tensor:
        num_tokens, num_heads, head_dim = query.shape
        _, _, block_size, num_kv_heads, _ = kv_cache.shape
        refusal = triton_refuses(kv_cache.dtype in ONE_BYTE_DTYPES, block_size)
        if refusal is not None:
            raise NotImplementedError(refusal)
        kernels = _kernels()
        pad = triton.next_power_of_2(head_dim)
        kernels.write_kv_kernel[(num_tokens,)](
            key, value, kv_cache, metadata.slot_mapping, key.stride(0), key.stride(1), value.stride(0),
            value.stride(1), kv_cache.stride(0), kv_cache.stride(2), kv_cache.stride(3),
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad)
        out = torch.empty_like(query)
        lengths = metadata.query_start_loc[1:] - metadata.query_start_loc[:-1]
        token_request = torch.repeat_interleave(torch.arange(metadata.num_requests, device=query.device,
                                                             dtype=torch.int32), lengths, output_size=num_tokens)
        block_tables = metadata.block_tables
        partition_blocks = max(1, self.partition_size // block_size)
        num_parts = triton.cdiv(metadata.max_seq_len, partition_blocks * block_size)
        common = dict(GROUP=num_heads // num_kv_heads, BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad,
                      HAS_SOFTCAP=bool(softcap), HAS_WINDOW=sliding_window is not None,
                      PARTITION_BLOCKS=partition_blocks)
        cache_strides = (kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3))
        if not (metadata.is_decode_only and num_parts > 1):
            kernels.attention_kernel[(num_tokens, num_heads)](
                query, kv_cache, out, block_tables, metadata.seq_lens, metadata.query_start_loc, token_request,
                sinks if sinks is not None else query, scale, float(softcap), int(sliding_window or 0),
                query.stride(0), query.stride(1), out.stride(0), out.stride(1), *cache_strides,
                block_tables.stride(0), HAS_SINKS=sinks is not None, **common)
            return out
        parts = torch.empty((num_tokens, num_heads, num_parts, pad + 2), dtype=torch.float32, device=query.device)
        kernels.split_kernel[(num_tokens, num_heads, num_parts)](
            query, kv_cache, parts, block_tables, metadata.seq_lens, metadata.query_start_loc, token_request, scale,
            float(softcap), int(sliding_window or 0), query.stride(0), query.stride(1), parts.stride(0),
            parts.stride(1), parts.stride(2), *cache_strides, block_tables.stride(0), **common)
        kernels.combine_kernel[(num_tokens, num_heads)](
            parts, out, sinks if sinks is not None else query, metadata.seq_lens, metadata.query_start_loc,
            token_request, int(sliding_window or 0), parts.stride(0), parts.stride(1), parts.stride(2),
            out.stride(0), out.stride(1), BLOCK_SIZE=block_size, HEAD_DIM=head_dim, HEAD_DIM_PAD=pad,
            HAS_SINKS=sinks is not None, HAS_WINDOW=sliding_window is not None, PARTITION_BLOCKS=partition_blocks)
        return out
