import pytest

from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.free_block_queue import FreeKVCacheBlockQueue


def ids(queue):
    return [block.block_id for block in queue]


def make_queue(n=5):
    blocks = [KVCacheBlock(i) for i in range(n)]
    return blocks, FreeKVCacheBlockQueue(blocks)


def test_initial_order_and_popleft():
    blocks, queue = make_queue()
    assert ids(queue) == [0, 1, 2, 3, 4]
    assert queue.popleft() is blocks[0]
    assert queue.popleft_n(2) == [blocks[1], blocks[2]]
    assert len(queue) == 2 and ids(queue) == [3, 4]
    assert blocks[0].prev_free_block is None and blocks[0].next_free_block is None


def test_remove_middle_head_tail_and_append():
    blocks, queue = make_queue()
    queue.remove(blocks[2])
    queue.remove(blocks[0])
    queue.remove(blocks[4])
    assert ids(queue) == [1, 3]
    queue.append(blocks[2])
    queue.append(blocks[0])
    assert ids(queue) == [1, 3, 2, 0]
    assert queue.num_free_blocks == 4


def test_errors_leave_queue_unchanged():
    blocks, queue = make_queue(3)
    with pytest.raises(ValueError, match="asked for 4 free KV blocks, only 3 free"):
        queue.popleft_n(4)
    assert ids(queue) == [0, 1, 2]
    with pytest.raises(ValueError, match="already in the free queue"):
        queue.append(blocks[1])
    taken = queue.popleft()
    with pytest.raises(ValueError, match="not in the free queue"):
        queue.remove(taken)
    queue.popleft_n(2)
    with pytest.raises(ValueError, match="no free KV blocks"):
        queue.popleft()
    assert len(queue) == 0 and ids(queue) == []
