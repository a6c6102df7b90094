import pytest

from kvserve.kv_cache.block_pool import BlockPool


def free_ids(pool):
    return [block.block_id for block in pool.free_block_queue]


def test_null_block_reserved():
    pool = BlockPool(4)
    assert pool.num_usable_blocks == 3 and pool.get_num_free_blocks() == 3
    assert [b.block_id for b in pool.get_new_blocks(3)] == [1, 2, 3]
    with pytest.raises(ValueError):
        pool.get_new_blocks(1)
    with pytest.raises(ValueError, match="at least 2 blocks"):
        BlockPool(1)


def test_ref_counting_and_touch():
    pool = BlockPool(5)
    a, b = pool.get_new_blocks(2)
    assert (a.ref_cnt, b.ref_cnt) == (1, 1)
    pool.touch([a])
    assert a.ref_cnt == 2
    pool.free_blocks([a])
    assert a.ref_cnt == 1 and free_ids(pool) == [3, 4]
    pool.free_blocks([b, a])
    assert free_ids(pool) == [3, 4, 2, 1]
    pool.touch([b])  # a free block that is touched leaves the free queue
    assert b.ref_cnt == 1 and free_ids(pool) == [3, 4, 1]
    assert pool.get_usage() == pytest.approx(1 / 4)


def test_free_keeps_hash_and_lru_eviction_drops_it():
    pool = BlockPool(4)
    b1, b2, b3 = pool.get_new_blocks(3)
    assert pool.cache_full_blocks([b1, b2], [111, 222]) == 2
    pool.free_blocks([b2, b1, b3])  # free order: b2 is LRU, then b1, then b3
    assert b1.block_hash == 111 and pool.get_cached_block(111) is b1
    assert free_ids(pool) == [2, 1, 3]
    (taken,) = pool.get_new_blocks(1)
    assert taken is b2 and b2.block_hash is None and pool.get_cached_block(222) is None
    assert pool.get_cached_block(111) is b1  # not evicted yet


def test_duplicate_hash_first_writer_wins_and_reset():
    pool = BlockPool(4)
    b1, b2 = pool.get_new_blocks(2)
    assert pool.cache_full_blocks([b1], [7]) == 1
    assert pool.cache_full_blocks([b2], [7]) == 0
    assert b2.block_hash is None and pool.get_cached_block(7) is b1
    assert pool.cache_full_blocks([b1], [7]) == 0  # already cached: skipped
    assert pool.reset_prefix_cache() == 1
    assert b1.block_hash is None and pool.cached_block_hash_to_block == {}


def test_caching_disabled_registers_nothing():
    pool = BlockPool(3, enable_caching=False)
    blocks = pool.get_new_blocks(2)
    assert pool.cache_full_blocks(blocks, [1, 2]) == 0
    assert all(block.block_hash is None for block in blocks)
