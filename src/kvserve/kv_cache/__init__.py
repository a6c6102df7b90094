"""Paged KV-cache bookkeeping (pure Python, no torch): blocks, free queue, prefix cache."""

from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.block_hash import ROOT_HASH, hash_block_tokens, update_block_hashes
from kvserve.kv_cache.block_pool import NULL_BLOCK_ID, BlockPool
from kvserve.kv_cache.free_block_queue import FreeKVCacheBlockQueue
from kvserve.kv_cache.manager import ComputedBlocks, KVCacheManager
from kvserve.kv_cache.stats import PrefixCacheStats

__all__ = [
    "NULL_BLOCK_ID",
    "ROOT_HASH",
    "BlockPool",
    "ComputedBlocks",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheManager",
    "PrefixCacheStats",
    "hash_block_tokens",
    "update_block_hashes",
]
