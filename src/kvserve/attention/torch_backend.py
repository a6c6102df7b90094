"""The portable reference attention backend: plain PyTorch, any device.

Each call does two things::

    1. write   kv_cache[0|1].view(num_blocks * block_size, H_kv, D)[slot_mapping] = key | value
    2. attend  per request r, gather its context from its block table:
                 blocks = block_tables[r, :ceil(seq_lens[r] / block_size)]
                 K_r    = kv_cache[0, blocks].reshape(-1, H_kv, D)[:seq_lens[r]]
               and run causal attention of its new queries (the last q_len[r] positions) over K_r.

Decode-only batches (every request has one new token) are batched without padding: requests with
the same ``seq_len`` share one call (no mask needed). A request's result then never depends on
what else is in the batch, bit for bit (SDPA's fused kernels round differently when a context is
padded and masked). ``TorchAttentionBackend(batch_invariant=False)`` instead pads every context to
``max_seq_len`` with a mask: one call per step, equal up to rounding. Mixed batches loop over
requests.

A one-byte cache (``--kv-cache-dtype int8|fp8_e4m3|fp8_e5m2``, ``kvserve.attention.kv_quant``)
holds each row as one-byte values and a float32 scale: the write quantizes, the gather
dequantizes to the query's dtype.

Attention is ``torch.nn.functional.scaled_dot_product_attention`` on 4-D inputs in the model
dtype; its CPU and CUDA kernels keep the softmax statistics and the accumulation in float32. These
are the same kernel calls transformers makes (``sdpa`` attention), so bfloat16 results round the
same way as the reference: upcasting to float32 here would be slightly more exact but makes greedy
bfloat16 runs drift from transformers' after a few tokens on near-tied logits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kvserve.attention.backend import AttentionBackend, AttentionMetadata
from kvserve.attention.kv_quant import ONE_BYTE_DTYPES, dequantize_kv_rows, quantize_kv_rows


class TorchAttentionBackend(AttentionBackend):
    """Reference paged attention (see module docstring). Stateless; one instance can serve every
    layer and model.

    Args:
        batch_invariant: True (default) = decode batches grouped by equal ``seq_len``, results
            independent of the batch; False = one padded, masked call per decode step.
    """

    name = "torch"

    def __init__(self, batch_invariant: bool = True):
        self.batch_invariant = batch_invariant

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
        write_kv_cache(key, value, kv_cache, metadata.slot_mapping)
        extras = Softmax(softcap, sinks)
        if metadata.is_decode_only and self.batch_invariant:
            out = _grouped_decode_attention(query, kv_cache, metadata, scale, sliding_window, extras)
        elif metadata.is_decode_only:
            out = _padded_decode_attention(query, kv_cache, metadata, scale, sliding_window, extras)
        else:
            out = _varlen_attention(query, kv_cache, metadata, scale, sliding_window, extras)
        return out


def write_kv_cache(
    key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Store key/value [T, H_kv, D] at ``slot_mapping`` (int64 [T]) of
    ``kv_cache`` [2, num_blocks, block_size, H_kv, D] (one-byte dtypes: [..., D + 4], rows quantized), in place."""
    _, num_blocks, block_size, num_kv_heads, row = kv_cache.shape
    flat = kv_cache.view(2, num_blocks * block_size, num_kv_heads, row)
    if kv_cache.dtype in ONE_BYTE_DTYPES:  # int8 / fp8 rows and their scales, copied as bytes
        flat = flat.view(torch.int8)
        key = quantize_kv_rows(key, kv_cache.dtype).view(torch.int8)
        value = quantize_kv_rows(value, kv_cache.dtype).view(torch.int8)
    flat[0].index_copy_(0, slot_mapping, key.to(flat.dtype))
    flat[1].index_copy_(0, slot_mapping, value.to(flat.dtype))


def _gather_context(kv_cache: torch.Tensor, block_ids: torch.Tensor, length: int,
                    dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values of ``block_ids`` (int [N] or [B, N]), each [..., length, H_kv, D] in
    ``dtype`` (a one-byte cache's rows dequantized)."""
    one_byte = kv_cache.dtype in ONE_BYTE_DTYPES
    cache = kv_cache.view(torch.int8) if one_byte else kv_cache  # fp8 tensors index as bytes
    keys = cache[0][block_ids]  # [..., N, block_size, H_kv, D]
    values = cache[1][block_ids]
    shape = keys.shape[:-4] + (-1,) + keys.shape[-2:]
    keys, values = keys.reshape(shape)[..., :length, :, :], values.reshape(shape)[..., :length, :, :]
    if one_byte:
        return (dequantize_kv_rows(keys.contiguous().view(kv_cache.dtype), dtype),
                dequantize_kv_rows(values.contiguous().view(kv_cache.dtype), dtype))
    return keys, values


def _gather_padded_contexts(kv_cache: torch.Tensor, metadata: AttentionMetadata,
                            dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Every request's K and V, padded to ``max_seq_len``: two [B, H_kv, max_seq_len, D] tensors."""
    max_len = metadata.max_seq_len
    blocks = metadata.block_tables[:, : -(-max_len // kv_cache.shape[2])].long()
    keys, values = _gather_context(kv_cache, blocks, max_len, dtype)
    return keys.transpose(1, 2), values.transpose(1, 2)


class Softmax(NamedTuple):
    """The softmax variants of a layer: scores capped at ``softcap * tanh(s / softcap)`` (> 0;
    Gemma 2) and per-query-head sink logits (float32 [H]; GPT-OSS) in each row's denominator."""

    softcap: float = 0.0
    sinks: torch.Tensor | None = None


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float, causal: bool,
            extras: Softmax = Softmax()):
    """q [B, H, Lq, D], k/v [B, H_kv, Lk, D] -> [B, H, Lq, D] in q's dtype; mask broadcastable to
    [B, H, Lq, Lk] (True = attend). 4-D inputs select the same fused kernels transformers uses;
    with soft-capping or sinks, which SDPA lacks, the eager product transformers runs for them,
    in float32."""
    if not extras.softcap and extras.sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale, enable_gqa=True)
    group = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
    scores = torch.matmul(q.float(), k.transpose(-1, -2)) * scale
    if extras.softcap:
        scores = torch.tanh(scores / extras.softcap) * extras.softcap
    if causal:  # q_len == k_len here
        mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    if extras.sinks is not None:
        sinks = extras.sinks.to(scores.device, torch.float32).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        probs = torch.softmax(torch.cat([scores, sinks], dim=-1), dim=-1)[..., :-1]
    else:
        probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v).to(q.dtype)


def _grouped_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    extras: Softmax = Softmax(),
) -> torch.Tensor:
    """One query per request: query [B, H, D] -> [B, H, D]; one SDPA call per distinct seq_len.

    The contexts are gathered once, padded to max_seq_len; each call then reads an unpadded view
    ``[rows, :, :seq_len]`` of them, so no padding reaches the kernel.
    """
    keys, values = _gather_padded_contexts(kv_cache, metadata, query.dtype)  # [B, H_kv, max_len, D]
    queries = query[:, :, None, :]  # [B, H, 1, D]
    out = torch.empty_like(queries)
    groups: dict[int, list[int]] = {}
    for r, seq_len in enumerate(metadata.seq_lens_cpu.tolist()):
        groups.setdefault(seq_len, []).append(r)
    for seq_len, rows in groups.items():
        # A run of consecutive rows is a view; otherwise an index gather.
        index = slice(rows[0], rows[-1] + 1) if rows[-1] - rows[0] + 1 == len(rows) else torch.tensor(rows, device=query.device)
        mask = None
        if sliding_window is not None and sliding_window < seq_len:
            mask = (torch.arange(seq_len, device=query.device) > seq_len - 1 - sliding_window).view(1, 1, 1, -1)
        out[index] = _attend(
            queries[index], keys[index, :, :seq_len], values[index, :, :seq_len], mask, scale, causal=False,
            extras=extras,
        )
    return out[:, :, 0, :]


def _padded_decode_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    extras: Softmax = Softmax(),
) -> torch.Tensor:
    """One query per request: query [B, H, D] -> [B, H, D]; contexts padded to max_seq_len."""
    keys, values = _gather_padded_contexts(kv_cache, metadata, query.dtype)  # [B, H_kv, max_len, D]
    key_pos = torch.arange(metadata.max_seq_len, device=query.device)[None, :]
    seq_lens = metadata.seq_lens.to(torch.long)[:, None]
    mask = key_pos < seq_lens  # [B, max_len]
    if sliding_window is not None:
        mask &= key_pos > seq_lens - 1 - sliding_window
    out = _attend(
        query[:, :, None, :],  # [B, H, 1, D]
        keys,
        values,
        mask[:, None, None, :],
        scale,
        causal=False,
        extras=extras,
    )
    return out[:, :, 0, :]


def _varlen_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    metadata: AttentionMetadata,
    scale: float,
    sliding_window: int | None,
    extras: Softmax = Softmax(),
    out: torch.Tensor | None = None,
    min_query_len: int = 1,
) -> torch.Tensor:
    """Requests of any query length, one causal SDPA call each: query [T, H, D] -> [T, H, D].

    Only requests with at least ``min_query_len`` (>= 1) new tokens are computed, into ``out`` when
    given (its other rows are left as they are), else into a new tensor.
    """
    block_size = kv_cache.shape[2]
    out = torch.empty_like(query) if out is None else out
    starts = metadata.query_start_loc_cpu.tolist()
    seq_lens = metadata.seq_lens_cpu.tolist()
    for r, seq_len in enumerate(seq_lens):
        start, end = starts[r], starts[r + 1]
        q_len = end - start
        if q_len < min_query_len:
            continue
        blocks = metadata.block_tables[r, : -(-seq_len // block_size)].long()
        keys, values = _gather_context(kv_cache, blocks, seq_len, query.dtype)
        mask = _causal_mask(q_len, seq_len, sliding_window, query.device)
        out[start:end] = _attend(
            query[None, start:end].transpose(1, 2),  # [1, H, q_len, D]
            keys[None].transpose(1, 2),  # [1, H_kv, seq_len, D]
            values[None].transpose(1, 2),
            mask,
            scale,
            causal=mask is None,
            extras=extras,
        )[0].transpose(0, 1)
    return out


def _causal_mask(q_len: int, seq_len: int, sliding_window: int | None, device: torch.device) -> torch.Tensor | None:
    """Boolean [q_len, seq_len] (True = attend), or None when plain ``is_causal`` suffices (no
    cached context and no window that cuts the sequence)."""
    if q_len == seq_len and (sliding_window is None or sliding_window >= seq_len):
        return None
    q_pos = torch.arange(seq_len - q_len, seq_len, device=device)[:, None]
    k_pos = torch.arange(seq_len, device=device)[None, :]
    mask = k_pos <= q_pos
    if sliding_window is not None:
        mask &= k_pos > q_pos - sliding_window
    return mask
