"""A KV block as bytes: every layer's K and V (or latent rows) of one block of the paged cache,
copied out of the per-layer tensors into one buffer and back, exactly (no conversion: a bf16 or
int8 block travels as it is).

    payload of block b = cat over layers l of kv_caches[l][:, b]   ([K, block_size, heads, row])
"""

from __future__ import annotations

import numpy as np
import torch


class BlockCodec:
    """Copies blocks between the cache tensors and payloads of ``nbytes`` bytes.

    Args:
        kv_caches: the runner's per-layer cache tensors (``kvserve.model.kv_cache_layout``).
    """

    def __init__(self, kv_caches: list[torch.Tensor]):
        self.kv_caches = kv_caches
        first = kv_caches[0]
        self.block_shape = (len(kv_caches), first.shape[0], *first.shape[2:])  # [L, K, bs, H, row]
        self.dtype = first.dtype
        self.nbytes = int(np.prod(self.block_shape)) * first.element_size()

    def gather(self, block_ids: list[int]) -> np.ndarray:
        """The payloads of ``block_ids``: a new ``[len(block_ids), nbytes]`` uint8 array."""
        index = torch.tensor(block_ids, dtype=torch.long, device=self.kv_caches[0].device)
        layers = torch.stack([cache.index_select(1, index) for cache in self.kv_caches])  # [L, K, n, bs, H, row]
        blocks = layers.movedim(2, 0).contiguous().cpu()  # [n, L, K, bs, H, row]
        return blocks.view(torch.uint8).reshape(len(block_ids), self.nbytes).numpy()

    def scatter(self, block_ids: list[int], payloads: list[bytes | memoryview | np.ndarray]) -> None:
        """Write ``payloads`` (``nbytes`` each) into ``block_ids``."""
        flat = np.concatenate([np.frombuffer(p, dtype=np.uint8) for p in payloads])
        blocks = torch.from_numpy(flat).view(self.dtype).reshape(len(block_ids), *self.block_shape)
        device = self.kv_caches[0].device
        blocks = blocks.to(device)
        index = torch.tensor(block_ids, dtype=torch.long, device=device)
        for layer, cache in enumerate(self.kv_caches):
            cache.index_copy_(1, index, blocks[:, layer].movedim(0, 1))
