"""An O(1) doubly linked queue of free KV blocks in LRU order (the eviction order).

Layout (fake head and tail sentinels, so no operation needs a special case)::

    head <-> b7 <-> b3 <-> b9 <-> tail
             ^                ^
             |                +-- freed last (most recently used): evicted last
             +-- freed first (least recently used): popped first by ``popleft``

* ``popleft()`` takes the LRU block for a new allocation (the pool drops its hash then).
* ``remove(block)`` unlinks a block from anywhere, e.g. a cached free block that a prefix-cache
  hit puts back in use.
* ``append(block)`` puts a freed block at the MRU end.

The links live on the blocks themselves (``prev_free_block`` / ``next_free_block``), so no
operation allocates. Method after vLLM v1's ``FreeKVCacheBlockQueue``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from kvserve.kv_cache.block import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Free blocks, least recently freed first.

    Args:
        blocks: the initially free blocks, in the order they should be handed out.
    """

    def __init__(self, blocks: Iterable[KVCacheBlock]):
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        self.num_free_blocks = 0
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        """Remove and return the least recently freed block.

        Raises:
            ValueError: the queue is empty.
        """
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("no free KV blocks left")
        self.remove(block)
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Remove and return the ``n`` least recently freed blocks, LRU first.

        Raises:
            ValueError: fewer than ``n`` blocks are free (the queue is left unchanged).
        """
        if n > self.num_free_blocks:
            raise ValueError(f"asked for {n} free KV blocks, only {self.num_free_blocks} free")
        return [self.popleft() for _ in range(n)]

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from anywhere in the queue in O(1).

        Raises:
            ValueError: the block is not in the queue.
        """
        prev_block, next_block = block.prev_free_block, block.next_free_block
        if prev_block is None or next_block is None:
            raise ValueError(f"block {block.block_id} is not in the free queue")
        prev_block.next_free_block = next_block
        next_block.prev_free_block = prev_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the most recently used end.

        Raises:
            ValueError: the block is already in the queue.
        """
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise ValueError(f"block {block.block_id} is already in the free queue")
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def __len__(self) -> int:
        return self.num_free_blocks

    def __iter__(self) -> Iterator[KVCacheBlock]:
        """Walk the queue from the LRU end (O(n); for tests and integrity checks)."""
        block = self._head.next_free_block
        while block is not self._tail:
            yield block
            block = block.next_free_block

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks, LRU first."""
        return list(self)
