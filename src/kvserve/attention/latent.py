"""Multi-head latent attention over a compressed paged cache (DeepSeek-V2/V3; DeepSeek-AI 2024,
"DeepSeek-V2", section 2.1), for ``kvserve.model.deepseek``.

KV cache layout (one tensor per layer)::

    kv_cache: [1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]
               each token's normalised latent c (kv_lora_rank values), then its rotated key part
               k_rope (shared by every head)

    slot = block_id * block_size + offset     (as for kvserve.attention.backend's layout)

With the up-projection ``kv_b_proj`` (per head h: W_k[h] [nope, L] for the keys, W_v[h] [v, L]
for the values), head h's key of a cached token is ``[W_k[h] c | k_rope]`` and its value
``W_v[h] c``, so::

    q_h . k_h = (W_k[h]^T q_nope_h) . c + q_rope_h . k_rope     the query absorbs W_k[h]
    out_h     = W_v[h] (sum_j p_hj c_j)                          W_v[h] after the weighted sum

and attention runs once over the cached rows themselves, as multi-query attention with one KV
head whose keys are the whole rows and whose values are their first L values. The caller
absorbs and projects (``kvserve.model.deepseek.LatentUpProjection``); this module writes the new
rows and attends, in float32.

On the CPU the attention is one kernel call (``latent_attention.cpp``) over the cached rows in
place: the scores and the weighted sums are the sequences of kvserve's invariant GEMM (each value
one fixed sequence of fused multiply-adds over its inputs), the softmax runs over each query row's
causal prefix only, so a query row's result depends on its position and the cached values alone,
not on the batch, its chunk or whether its context came from the prefix cache. Elsewhere (no
kernels, other devices) the same steps run per request as torch matmuls and a masked softmax.
"""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionMetadata
from kvserve.kernels import CpuKernels


def write_latent_rows(rows: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' rows [T, width] at ``slot_mapping`` (int64 [T]) of ``kv_cache``
    [1, num_blocks, block_size, 1, width], in place."""
    kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, slot_mapping, rows.to(kv_cache.dtype))


def latent_attention(query: torch.Tensor, rows: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                     *, scale: float, value_width: int, ops: CpuKernels | None) -> torch.Tensor:
    """Write ``rows`` (the new tokens' cache rows [T, width]) and attend.

    Args:
        query: float32 [T, H, width], each head's absorbed query (``[W_k^T q_nope | q_rope]``).
        rows: [T, width] in the cache's dtype or any float dtype (rounded to the cache's).
        kv_cache: [1, num_blocks, block_size, 1, width], updated at ``metadata.slot_mapping``.
        metadata: the batch layout.
        scale: the softmax scale.
        value_width: the values are the rows' first ``value_width`` entries (kv_lora_rank).

    Returns:
        float32 [T, H, value_width]: each head's softmax-weighted sum of the cached latents.
    """
    write_latent_rows(rows, kv_cache, metadata.slot_mapping)
    scaled = query * scale
    if ops is not None:
        return ops.latent_attention(scaled.contiguous(), kv_cache, metadata.block_tables, metadata.seq_lens,
                                        metadata.query_start_loc, value_width)
    tokens, heads, width = query.shape
    cache = kv_cache.view(kv_cache.shape[1], kv_cache.shape[2], width)
    block_size = cache.shape[1]
    out = torch.empty((tokens, heads, value_width), dtype=torch.float32, device=query.device)
    starts = metadata.query_start_loc_cpu.tolist()
    for r, seq_len in enumerate(metadata.seq_lens_cpu.tolist()):
        start, end = starts[r], starts[r + 1]
        if end == start:
            continue
        blocks = metadata.block_tables[r, : -(-seq_len // block_size)].long()
        context = cache[blocks].reshape(-1, width)[:seq_len].float()  # [S, width]
        q = scaled[start:end].reshape(-1, width)  # [q_len * H, width], query-major
        first = seq_len - (end - start) + 1  # the first query row sees this many positions
        visible = torch.arange(seq_len, device=q.device)[None, :] < torch.arange(
            first, seq_len + 1, device=q.device).repeat_interleave(heads)[:, None]
        probs = torch.softmax((q @ context.t()).masked_fill(~visible, float("-inf")), dim=-1)
        out[start:end] = (probs @ context[:, :value_width]).view(end - start, heads, value_width)
    return out
