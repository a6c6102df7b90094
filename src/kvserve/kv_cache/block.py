"""One KV-cache block as the block pool sees it (no tensors: the model runner owns those)."""

from __future__ import annotations


class KVCacheBlock:
    """Bookkeeping of one KV block.

    Attributes:
        block_id: index of the block in the KV-cache tensor (``0 .. num_blocks - 1``).
        ref_cnt: number of requests whose block table holds this block (0 = free).
        block_hash: chained hash of the block's tokens (``block_hash.py``) once the block is full
            and its K/V are computed; ``None`` otherwise. A free block keeps its hash, so a later
            request can still hit it, until the pool evicts it for reuse.
        prev_free_block, next_free_block: links of the doubly linked free queue (``None`` while
            the block is in use).
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block")

    def __init__(self, block_id: int):
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: int | None = None
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        hash_text = "None" if self.block_hash is None else f"{self.block_hash & 0xFFFF:04x}.."
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, hash={hash_text})"
