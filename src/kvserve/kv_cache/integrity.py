"""A full consistency check of the KV-cache accounting, for tests and debugging (O(blocks))."""

from __future__ import annotations

from collections import Counter

from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.block_pool import BlockPool


def check_kv_cache_integrity(pool: BlockPool, req_to_blocks: dict[str, list[KVCacheBlock]]) -> None:
    """Check that:

    * free + used = usable blocks, and the free queue's length equals its counter;
    * every block's ``ref_cnt`` equals the number of requests holding it, and no request holds a
      block twice or holds the null block;
    * every free block has ref 0 and every block with ref 0 is free (except the null block);
    * the hash map and the blocks' ``block_hash`` agree both ways, and nothing is cached with
      caching off.

    Raises:
        AssertionError: naming the first inconsistency found.
    """
    free_blocks = pool.free_block_queue.get_all_free_blocks()
    num_free = pool.free_block_queue.num_free_blocks
    assert len(free_blocks) == num_free, f"free queue holds {len(free_blocks)} blocks but counts {num_free}"
    free_ids = {block.block_id for block in free_blocks}
    assert len(free_ids) == len(free_blocks), "a block appears twice in the free queue"
    assert pool.null_block.block_id not in free_ids, "the null block is in the free queue"
    holders: Counter[int] = Counter()
    for request_id, blocks in req_to_blocks.items():
        ids = [block.block_id for block in blocks]
        assert len(set(ids)) == len(ids), f"request {request_id} holds a block twice: {ids}"
        assert pool.null_block.block_id not in ids, f"request {request_id} holds the null block"
        holders.update(ids)
    num_used = len(holders)
    assert num_free + num_used == pool.num_usable_blocks, (
        f"free ({num_free}) + used ({num_used}) != usable blocks ({pool.num_usable_blocks})"
    )
    for block in pool.blocks[1:]:
        expected = holders.get(block.block_id, 0)
        assert block.ref_cnt == expected, (
            f"block {block.block_id} has ref_cnt {block.ref_cnt} but {expected} requests hold it"
        )
        assert (block.ref_cnt == 0) == (block.block_id in free_ids), (
            f"block {block.block_id} has ref_cnt {block.ref_cnt} but free-queue membership is "
            f"{block.block_id in free_ids}"
        )
    assert pool.null_block.ref_cnt == 0 and pool.null_block.block_hash is None, "the null block was used"
    _check_hash_map(pool)


def _check_hash_map(pool: BlockPool) -> None:
    cached = pool.cached_block_hash_to_block
    if not pool.enable_caching:
        assert not cached, f"{len(cached)} blocks cached with prefix caching off"
    for block_hash, block in cached.items():
        assert block.block_hash == block_hash, f"hash map entry for block {block.block_id} disagrees with its hash"
    hashed = [block for block in pool.blocks if block.block_hash is not None]
    assert len(hashed) == len(cached), f"{len(hashed)} blocks carry a hash but the map has {len(cached)} entries"
    for block in hashed:
        assert cached.get(block.block_hash) is block, f"block {block.block_id} has a hash missing from the map"
