"""Bidirectional self-attention of encoder models (BERT and kin), within each request of a flat
batch, with no KV cache::

    flat batch:   | req 0: tokens 0..4 | req 1: tokens 0..2 |      query_start_loc_cpu = [0, 5, 8]
    req 0's tokens attend to req 0's tokens only, every one of them (no causal mask), or those
    within ``window // 2`` positions on either side (ModernBERT's local layers)

An encoder's request runs whole in one step (pooling requests are never chunked: its
``seq_lens`` equal its query lengths). Each request is computed alone on copies of its own rows
(``torch.nn.functional.scaled_dot_product_attention``), so its result does not depend on the
other requests of the step. Reference: transformers' ``BertSelfAttention`` /
``ModernBertAttention`` (sdpa); sliding window as transformers' ModernBERT builds it
(``|i - j| <= local_attention // 2``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvserve.attention.backend import AttentionMetadata


def encoder_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, metadata: AttentionMetadata,
                      scale: float, window: int | None = None) -> torch.Tensor:
    """Args:
        q, k, v: [T, heads, head_dim], the step's tokens (rotary already applied where used).
        metadata: the flat batch; only ``query_start_loc_cpu`` and ``seq_lens_cpu`` are read.
        scale: softmax scale (``head_dim ** -0.5``).
        window: a token attends only to tokens at most ``window // 2`` positions away; None =
            every token of its request.

    Returns:
        [T, heads, head_dim] in q's dtype.

    Raises:
        ValueError: a request was not given whole (its context is longer than its tokens this step).
    """
    starts = metadata.query_start_loc_cpu.tolist()
    seq_lens = metadata.seq_lens_cpu.tolist()
    out = torch.empty_like(q)
    for i, (start, end) in enumerate(zip(starts[:-1], starts[1:])):
        if seq_lens[i] != end - start:
            raise ValueError(f"an encoder request runs whole in one step, got {end - start} of its {seq_lens[i]} "
                             "tokens (a scheduler bug)")
        rows = [x[start:end].transpose(0, 1).contiguous() for x in (q, k, v)]  # [heads, n, head_dim], copies
        mask = None if window is None else _window_mask(end - start, window, q.device)
        attended = F.scaled_dot_product_attention(*rows, attn_mask=mask, scale=scale)
        out[start:end] = attended.transpose(0, 1)
    return out


def _window_mask(n: int, window: int, device: torch.device) -> torch.Tensor:
    """bool [n, n]: True where ``|i - j| <= window // 2``."""
    positions = torch.arange(n, device=device)
    return (positions[:, None] - positions[None, :]).abs() <= window // 2
