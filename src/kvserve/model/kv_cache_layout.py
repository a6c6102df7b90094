"""The paged KV cache's tensors: one per layer, ``[2, num_blocks, block_size, num_kv_heads, row]``
(K and V), or latent attention's one row per token; their shape, allocation and bytes per block
(what the KV budget is divided by)."""

from __future__ import annotations

import math

import torch

from kvserve import huge_pages
from kvserve.attention.kv_quant import kv_cache_torch_dtype, kv_row_size
from kvserve.errors import ConfigError
from kvserve.model.arch_config import ModelArchConfig


def kv_cache_shape(arch: ModelArchConfig, num_blocks: int, block_size: int, kv_cache_dtype: str = "auto",
                   num_kv_heads: int | None = None) -> tuple[int, ...]:
    """One layer's KV cache tensor: [2, num_blocks, block_size, num_kv_heads, row], a row being
    ``head_dim`` values (a one-byte ``kv_cache_dtype``: ``head_dim + 4`` bytes,
    ``kvserve.attention.kv_quant``); multi-head latent attention (DeepSeek) caches one latent row
    per token, [1, num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim]
    (``kvserve.attention.latent``). ``num_kv_heads``: the heads one process caches (a
    tensor-parallel rank's share); default all of the model's.

    Raises:
        ConfigError: a one-byte ``kv_cache_dtype`` for latent attention (its cache holds the
            model dtype).
    """
    if arch.mla is not None:
        if kv_cache_dtype != "auto":
            raise ConfigError(f"--kv-cache-dtype {kv_cache_dtype} is not supported for {arch.architecture}'s latent "
                              "attention cache (already compressed); use auto")
        return (1, num_blocks, block_size, 1, arch.mla.cache_width)
    heads = arch.num_key_value_heads if num_kv_heads is None else num_kv_heads
    return (2, num_blocks, block_size, heads, kv_row_size(arch.head_dim, kv_cache_dtype))


def allocate_kv_caches(arch: ModelArchConfig, num_blocks: int, block_size: int, kv_cache_dtype: str,
                       dtype: torch.dtype, device: torch.device, num_kv_heads: int | None = None) -> list[torch.Tensor]:
    """One zeroed ``kv_cache_shape`` tensor per layer, in ``kv_cache_dtype`` (``auto``: the model's
    ``dtype``); on the CPU in huge pages (attention reads scattered blocks: they spare the TLB).
    The engine's runner and each tensor-parallel worker allocate theirs here."""
    shape = kv_cache_shape(arch, num_blocks, block_size, kv_cache_dtype, num_kv_heads)
    cache_dtype = kv_cache_torch_dtype(kv_cache_dtype, dtype)
    if device.type == "cpu":
        return [huge_pages.zeros(shape, cache_dtype) for _ in range(arch.num_hidden_layers)]
    return [torch.zeros(shape, dtype=cache_dtype, device=device) for _ in range(arch.num_hidden_layers)]


def kv_cache_bytes_per_block(arch: ModelArchConfig, block_size: int, dtype: torch.dtype,
                             kv_cache_dtype: str = "auto", num_kv_heads: int | None = None) -> int:
    """Bytes of one block's cache over all layers (``kv_cache_shape`` without the block count:
    K and V of every cached head, or MLA's latent rows) in ``dtype`` or the one-byte
    ``kv_cache_dtype``."""
    element = torch.empty((), dtype=kv_cache_torch_dtype(kv_cache_dtype, dtype)).element_size()
    return arch.num_hidden_layers * math.prod(kv_cache_shape(arch, 1, block_size, kv_cache_dtype, num_kv_heads)) * element
