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

On the CPU every step is batch-invariant by construction: the scores and the weighted sum are
kvserve's invariant GEMM (``invariant_linear``: each value one fixed sequence of fused
multiply-adds over its inputs, the cached rows packed as its weight), and the softmax runs
over each query row's causal prefix only (``softmax_prefix_rows``), so a query row's result
depends on its position and the cached values alone, not on the batch, its chunk or whether its
context came from the prefix cache. Elsewhere (no kernels, other devices) the same steps run as
torch matmuls and a masked softmax.
"""

from __future__ import annotations

import torch

from kvserve.attention.backend import AttentionMetadata
from kvserve.kernels import cpu_kernels


def write_latent_rows(rows: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store the new tokens' rows [T, width] at ``slot_mapping`` (int64 [T]) of ``kv_cache``
    [1, num_blocks, block_size, 1, width], in place."""
    kv_cache.view(-1, kv_cache.shape[-1]).index_copy_(0, slot_mapping, rows.to(kv_cache.dtype))


def latent_attention(query: torch.Tensor, rows: torch.Tensor, kv_cache: torch.Tensor, metadata: AttentionMetadata,
                     *, scale: float, value_width: int) -> torch.Tensor:
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
    kernels = cpu_kernels() if query.device.type == "cpu" else None
    tokens, heads, width = query.shape
    cache = kv_cache.view(kv_cache.shape[1], kv_cache.shape[2], width)
    block_size = cache.shape[1]
    scaled = query * scale
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
        lengths = torch.arange(first, seq_len + 1, dtype=torch.int32).repeat_interleave(heads)
        out[start:end] = _attend(q, context, lengths, value_width, kernels).view(end - start, heads, value_width)
    return out


def _attend(q: torch.Tensor, context: torch.Tensor, lengths: torch.Tensor, value_width: int, kernels) -> torch.Tensor:
    """q float32 [R, width] against context float32 [S, width]; row i sees positions
    [0, lengths[i]) -> [R, value_width]."""
    seq_len = context.shape[0]
    if kernels is not None:
        scores = kernels.invariant_linear(q.contiguous(), kernels.pack_linear_weight(context), None, seq_len)
        probs = kernels.softmax_prefix_rows(scores, lengths)
        values = kernels.pack_linear_weight(context[:, :value_width].t().contiguous())
        return kernels.invariant_linear(probs, values, None, value_width)
    scores = q @ context.t()
    visible = torch.arange(seq_len, device=q.device)[None, :] < lengths.to(q.device)[:, None]
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    return probs @ context[:, :value_width]
