"""The pool of KV blocks: allocation, reference counting, the prefix-cache map and LRU eviction.

Block 0 is reserved as the null block: it is never handed out, never freed and never cached.
Model runners may point padding entries of ``block_tables`` / ``slot_mapping`` at it (for example
padded tokens of a CUDA-graph batch) without touching any request's K/V. So a pool of
``num_blocks`` blocks has ``num_blocks - 1`` usable ones.

Life of a block::

    free, no hash --get_new_blocks--> in use (ref 1) --cache_full_blocks--> in use, hashed
         ^                                  |                                   |
         |  (evicted: hash dropped)         v free_blocks (ref 0)               v free_blocks
         +------------- popleft ------ free queue <-------------------- free, hashed (still a hit)
                                              \\--- touch (prefix-cache hit) ---> in use again

Method after vLLM v1's ``BlockPool``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.events import AllBlocksCleared, BlockRemoved, KVEventSink
from kvserve.kv_cache.free_block_queue import FreeKVCacheBlockQueue

NULL_BLOCK_ID = 0


class BlockPool:
    """All KV blocks of one cache.

    Args:
        num_blocks: blocks in the KV-cache tensor, including the reserved null block 0 (>= 2).
        enable_caching: keep a hash -> block map of full, computed blocks for prefix caching.
        events: where evictions (``BlockRemoved``) and resets (``AllBlocksCleared``) are recorded;
            None records nothing. (``BlockStored`` needs the tokens: the KV manager records it.)

    Raises:
        ValueError: ``num_blocks < 2``.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, events: KVEventSink | None = None):
        if num_blocks < 2:
            raise ValueError(f"a KV cache needs at least 2 blocks (1 is the null block), got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(block_id) for block_id in range(num_blocks)]
        self.null_block = self.blocks[NULL_BLOCK_ID]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks[NULL_BLOCK_ID + 1 :])
        # Full, computed blocks by hash; free blocks stay here until evicted.
        self.cached_block_hash_to_block: dict[int, KVCacheBlock] = {}
        self.events = events if events is not None else KVEventSink()

    @property
    def num_usable_blocks(self) -> int:
        return self.num_blocks - 1

    def get_num_free_blocks(self) -> int:
        """Blocks with ref 0, cached or not (a cached free block is evictable)."""
        return self.free_block_queue.num_free_blocks

    def get_cached_block(self, block_hash: int) -> KVCacheBlock | None:
        """The cached block with this hash, in use or free, or ``None``."""
        return self.cached_block_hash_to_block.get(block_hash)

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the LRU end of the free queue, each with ref 1.

        A taken block that still had a hash is evicted from the prefix cache.

        Raises:
            ValueError: fewer than ``num_blocks`` blocks are free (nothing changes).
        """
        blocks = self.free_block_queue.popleft_n(num_blocks)
        for block in blocks:
            assert block.ref_cnt == 0, f"free block {block.block_id} has ref_cnt {block.ref_cnt}"
            if block.block_hash is not None:
                self._evict(block)
            block.ref_cnt = 1
        return blocks

    def _evict(self, block: KVCacheBlock) -> None:
        cached = self.cached_block_hash_to_block.pop(block.block_hash)
        assert cached is block, f"hash map entry of block {block.block_id} points at block {cached.block_id}"
        self.events.append(BlockRemoved((block.block_hash,)))
        block.block_hash = None

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Add one reference to each block (a prefix-cache hit); a free one leaves the free queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order; a block reaching 0 goes to the
        MRU end of the free queue and KEEPS its hash, so it can still be hit until evicted.
        Callers pass a request's blocks tail first, so tails are evicted before shared prefixes."""
        for block in blocks:
            assert block.ref_cnt > 0, f"block {block.block_id} freed more often than allocated"
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def cache_full_blocks(self, blocks: Sequence[KVCacheBlock], block_hashes: Sequence[int]) -> int:
        """Register full, computed blocks under their hashes.

        A block that already has a hash is skipped (it came from a hit). If another block already
        holds the same hash (two requests computed the same prefix at once), the first one stays
        cached and this block stays unhashed: it is freed as a plain block later.

        Returns:
            the number of blocks newly registered.
        """
        if not self.enable_caching:
            return 0
        assert len(blocks) == len(block_hashes), f"{len(blocks)} blocks but {len(block_hashes)} hashes"
        num_registered = 0
        for block, block_hash in zip(blocks, block_hashes):
            if block.block_hash is not None:
                assert block.block_hash == block_hash, f"block {block.block_id} is cached under another hash"
                continue
            if block_hash in self.cached_block_hash_to_block:
                continue
            block.block_hash = block_hash
            self.cached_block_hash_to_block[block_hash] = block
            num_registered += 1
        return num_registered

    def reset_prefix_cache(self) -> int:
        """Forget every cached hash (in-use blocks keep their K/V but can no longer be hit).

        Returns:
            the number of hashes dropped.
        """
        num_dropped = len(self.cached_block_hash_to_block)
        for block in self.cached_block_hash_to_block.values():
            block.block_hash = None
        self.cached_block_hash_to_block.clear()
        self.events.append(AllBlocksCleared())
        return num_dropped

    def get_usage(self) -> float:
        """Fraction (0-1) of usable blocks held by requests."""
        return 1.0 - self.get_num_free_blocks() / self.num_usable_blocks
