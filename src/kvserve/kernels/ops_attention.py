"""Paged attention and the KV-cache write (``csrc/paged_attention.cpp``); latent attention over the
compressed cache (``csrc/latent_attention.cpp``)."""

from __future__ import annotations

import torch

from kvserve.kernels.tensors import code, optional_ptr, ptr, require

_QUERY_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_ONE_BYTE = (torch.int8, torch.float8_e4m3fn, torch.float8_e5m2)


class AttentionOps:
    """``paged_attention``, ``write_kv_cache`` (the shapes are ``paged_attention.cpp``'s) and
    ``latent_attention``."""

    def paged_attention(self, out: torch.Tensor, query: torch.Tensor, kv_cache: torch.Tensor,
                        block_tables: torch.Tensor, seq_lens: torch.Tensor, query_start_loc: torch.Tensor,
                        scale: float, window: int, max_q_len: int, amx: int = -1, softcap: float = 0.0,
                        sinks: torch.Tensor | None = None) -> None:
        """out/query [T, H, D] (float32, bfloat16 or float16); kv_cache [2, num_blocks, block_size,
        H_kv, D] in query's dtype, or int8/fp8 [..., D + 4]; block_tables int32 [B, W]; seq_lens
        int32 [B]; query_start_loc int32 [B + 1]. Writes the rows of requests with 1 <= q_len <=
        max_q_len. amx: -1 where this host has tiles, 0 never, 1 required. softcap > 0 caps the
        scaled scores at ``softcap * tanh(s / softcap)``; sinks: float32 [H] sink logits."""
        require(query.dim() == 3 and kv_cache.dim() == 5, "paged_attention: query [T, H, D] and kv_cache "
                "[2, num_blocks, block_size, H_kv, D]")
        require(query.is_contiguous() and out.is_contiguous() and kv_cache.is_contiguous()
                and block_tables.is_contiguous(), "paged_attention: query, out, kv_cache and block_tables must be contiguous")
        one_byte = kv_cache.dtype in _ONE_BYTE
        require(query.dtype in _QUERY_DTYPES and (one_byte or query.dtype == kv_cache.dtype)
                and out.dtype == query.dtype, "paged_attention: query/out float32, bfloat16 or float16, the cache alike or one byte")
        require(block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32 and query_start_loc.dtype == torch.int32,
                "paged_attention: block_tables, seq_lens and query_start_loc must be int32")
        heads, dim = query.shape[1], query.shape[2]
        _, blocks, block_size, kv_heads, row = kv_cache.shape
        require(row == (dim + 4 if one_byte else dim) and out.shape == query.shape, "paged_attention: cache rows do not match the query")
        require(block_tables.dim() == 2 and block_tables.shape[0] >= seq_lens.shape[0],
                f"paged_attention: block_tables [{', '.join(map(str, block_tables.shape))}] for {seq_lens.shape[0]} requests")
        require(softcap >= 0, "paged_attention: softcap must be >= 0")
        require(sinks is None or (sinks.dtype == torch.float32 and sinks.shape == (heads,) and sinks.is_contiguous()),
                f"paged_attention: sinks must be a contiguous float32 [{heads}]")
        seq_lens, query_start_loc = seq_lens.contiguous(), query_start_loc.contiguous()
        require(seq_lens.dim() == 1 and query_start_loc.numel() == seq_lens.numel() + 1,
                "paged_attention: query_start_loc needs B + 1 entries")
        self._lib.call("kvserve_paged_attention", ptr(out), ptr(query), code(query.dtype), ptr(kv_cache),
                       code(kv_cache.dtype), ptr(block_tables), ptr(seq_lens), ptr(query_start_loc), query.shape[0],
                       heads, dim,
                       kv_heads, block_size, blocks, seq_lens.numel(), block_tables.shape[1], scale, window,
                       max_q_len, amx, float(softcap), optional_ptr(sinks))

    def write_kv_cache(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
        """key/value [T, H_kv, D] (unit stride in D) into slots ``slot_mapping`` (int64 [T]) of
        kv_cache [2, num_blocks, block_size, H_kv, D] of the same dtype."""
        require(kv_cache.dim() == 5 and key.dim() == 3, "write_kv_cache: keys [T, H_kv, D], cache [2, blocks, "
                "block_size, H_kv, D]")
        require(kv_cache.is_contiguous() and slot_mapping.is_contiguous() and key.dtype == kv_cache.dtype
                and value.dtype == kv_cache.dtype and slot_mapping.dtype == torch.int64,
                "write_kv_cache: a contiguous cache of the keys' dtype and int64 slots")
        require(key.dim() == 3 and value.shape == key.shape and key.stride(2) == 1 and value.stride(2) == 1
                and key.shape[1] == kv_cache.shape[3] and key.shape[2] == kv_cache.shape[4]
                and slot_mapping.numel() == key.shape[0], "write_kv_cache: keys/values [T, H_kv, D] for the cache's heads")
        tokens, heads, dim = key.shape
        self._lib.call("kvserve_write_kv_cache", ptr(key), key.stride(0), key.stride(1), ptr(value), value.stride(0),
                       value.stride(1), tokens, heads, dim, key.element_size(), ptr(kv_cache),
                       kv_cache.shape[1] * kv_cache.shape[2], ptr(slot_mapping))

    def latent_attention(self, query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         seq_lens: torch.Tensor, query_start_loc: torch.Tensor, value_width: int) -> torch.Tensor:
        """query float32 [T, H, W] (absorbed, times the softmax scale); kv_cache [1, num_blocks,
        block_size, 1, W] float32 or bfloat16; block_tables int32 [B', table_width] (B' >= B),
        seq_lens int32 [B], query_start_loc int32 [B + 1] -> float32 [T, H, value_width]: each
        head's softmax-weighted sum of the first ``value_width`` values of the rows its token
        sees (``latent_attention.cpp``)."""
        require(query.dim() == 3 and query.dtype == torch.float32 and query.is_contiguous(),
                "latent_attention: query float32 [T, H, W], contiguous")
        require(kv_cache.dim() == 5 and kv_cache.shape[0] == 1 and kv_cache.shape[3] == 1
                and kv_cache.shape[4] == query.shape[2] and kv_cache.dtype in (torch.float32, torch.bfloat16)
                and kv_cache.is_contiguous(), "latent_attention: kv_cache [1, num_blocks, block_size, 1, W], "
                "float32 or bfloat16, contiguous")
        seq_lens, query_start_loc = seq_lens.contiguous(), query_start_loc.contiguous()
        require(block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32 and query_start_loc.dtype == torch.int32
                and block_tables.is_contiguous() and block_tables.dim() == 2 and seq_lens.dim() == 1
                and query_start_loc.numel() == seq_lens.numel() + 1 and block_tables.shape[0] >= seq_lens.numel(),
                "latent_attention: int32 block_tables [B, W], seq_lens [B] and query_start_loc [B + 1]")
        require(0 < value_width <= query.shape[2], "latent_attention: 0 < value_width <= W")
        tokens, heads, width = query.shape
        out = torch.empty((tokens, heads, value_width), dtype=torch.float32)
        self._lib.call("kvserve_latent_attention", ptr(out), ptr(query), code(kv_cache.dtype), ptr(kv_cache),
                       ptr(block_tables), ptr(seq_lens), ptr(query_start_loc), tokens, heads, width, value_width,
                       kv_cache.shape[2], kv_cache.shape[1], seq_lens.numel(), block_tables.shape[1])
        return out
