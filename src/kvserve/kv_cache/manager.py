"""The KV-cache manager: which blocks each request holds, and prefix-cache lookups.

The scheduler asks two questions per request and decides everything else (preemption, order)::

    blocks, num_cached = manager.get_computed_blocks(request)     # once, when admitting
    new_blocks = manager.allocate_slots(request, num_new_tokens,  # every step it is scheduled
                                        blocks, num_cached)       # None = not enough blocks
    ... model runner computes the tokens ...
    manager.cache_blocks(request, request.num_computed_tokens)    # full blocks -> prefix cache
    manager.free(request)                                          # finished / preempted

A request's block table covers its computed tokens plus the tokens scheduled this step::

    block_size = 4, num_computed_tokens = 6, num_new_tokens = 3
    tokens:       [t0 t1 t2 t3][t4 t5 t6 t7][t8 .. .. ..]
    block table:  [    b5     ][    b2     ][    b9     ]
    computed:      x  x  x  x   x  x
    this step:                        n  n   n

Method after vLLM v1's ``KVCacheManager``; blocks enter the prefix cache only after their K/V are
computed (``cache_blocks`` from ``Scheduler.update_from_output``), never at allocation, so a hit
can never read K/V that a preempted request did not get to write.
"""

from __future__ import annotations

from typing import NamedTuple

from kvserve.kv_cache.block import KVCacheBlock
from kvserve.kv_cache.block_hash import request_extra_keys, update_block_hashes
from kvserve.kv_cache.block_pool import BlockPool
from kvserve.kv_cache.events import BlockStored, KVCacheEvent, KVEventSink
from kvserve.kv_cache.integrity import check_kv_cache_integrity
from kvserve.kv_cache.stats import PrefixCacheStats
from kvserve.request import Request


class ComputedBlocks(NamedTuple):
    """A prefix-cache hit: ``blocks`` hold the K/V of the first ``num_computed_tokens`` tokens."""

    blocks: list[KVCacheBlock]
    num_computed_tokens: int


class KVCacheManager:
    """Block tables of all requests over one :class:`BlockPool`.

    Args:
        num_blocks: blocks in the cache, including the reserved null block 0.
        block_size: tokens per block.
        enable_caching: prefix caching on or off.
        enable_kv_cache_events: record what enters and leaves the prefix cache
            (``kv_cache/events.py``); the engine drains them with :meth:`take_events`.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 enable_kv_cache_events: bool = False):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.events = KVEventSink(enabled=enable_kv_cache_events and enable_caching)
        self.block_pool = BlockPool(num_blocks, enable_caching, self.events)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        # The same tables as plain ids, kept in step so get_block_ids is one list copy.
        self.req_to_block_ids: dict[str, list[int]] = {}
        # Leading blocks of each request that are already registered in the prefix cache.
        self.num_cached_block: dict[str, int] = {}
        self._queries = 0
        self._hits = 0
        # (block id, hash) of the blocks cache_blocks registered, for a KV connector's sinks
        # (``record_cached_blocks``); None records nothing
        self._newly_cached: list[tuple[int, int]] | None = None

    # -- queries -------------------------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return self.block_pool.get_num_free_blocks()

    @property
    def usage(self) -> float:
        """Fraction (0-1) of usable blocks held by requests."""
        return self.block_pool.get_usage()

    @property
    def stats(self) -> PrefixCacheStats:
        """Prefix-cache totals in tokens since start-up."""
        return PrefixCacheStats(queries=self._queries, hits=self._hits)

    def get_block_ids(self, request_id: str) -> list[int]:
        """The request's block table (a new list; empty for an unknown or blockless request)."""
        return list(self.req_to_block_ids.get(request_id, ()))

    def num_blocks_needed(self, num_tokens: int) -> int:
        """Blocks that hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> ComputedBlocks:
        """The longest chain of cached full blocks at the start of the request's tokens.

        The hit never covers the last known token: that token must be computed so the step can
        sample from its logits. E.g. block_size 16: 40 tokens -> up to 32 cached; 32 tokens ->
        16 cached. Requests asking for ``prompt_logprobs`` get no hit (every prompt position must be
        computed). Has no side effect besides filling ``request.block_hashes``; statistics are
        counted when the request is admitted (``allocate_slots``), so a waiting request that is
        looked up again is not counted twice.
        """
        if not self.enable_caching or request.sampling_params.prompt_logprobs is not None:
            return ComputedBlocks([], 0)
        block_hashes = update_block_hashes(request, self.block_size)
        max_blocks = (request.num_tokens - 1) // self.block_size
        blocks: list[KVCacheBlock] = []
        for block_hash in block_hashes[:max_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break
            blocks.append(block)
        return ComputedBlocks(blocks, len(blocks) * self.block_size)

    # -- changes -------------------------------------------------------------------------------

    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        new_computed_blocks: list[KVCacheBlock] | tuple = (),
        num_new_computed_tokens: int = 0,
        num_lookahead_tokens: int = 0,
    ) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens of ``request``.

        Args:
            request: its ``num_computed_tokens`` is the count before this allocation.
            num_new_tokens: tokens to compute this step (>= 1).
            new_computed_blocks, num_new_computed_tokens: a prefix-cache hit from
                ``get_computed_blocks`` (only when the request holds no blocks yet).
            num_lookahead_tokens: slots beyond this step's tokens, for a draft model's K/V of
                the drafts it proposes after the step (vLLM's name; 0 without a draft model).

        Returns:
            the newly allocated blocks (possibly empty), or ``None`` when there are not enough free
            blocks; then nothing has changed.
        """
        assert num_new_tokens >= 1, f"num_new_tokens must be >= 1, got {num_new_tokens}"
        request_id = request.request_id
        req_blocks = self.req_to_blocks.get(request_id)
        assert not (req_blocks and new_computed_blocks), f"{request_id} holds blocks; a hit is only for new requests"
        num_tokens = request.num_computed_tokens + num_new_computed_tokens + num_new_tokens + num_lookahead_tokens
        num_held = (len(req_blocks) if req_blocks else 0) + len(new_computed_blocks)
        num_new_blocks = max(0, self.num_blocks_needed(num_tokens) - num_held)
        if num_new_blocks == 0 and req_blocks is not None:
            return []  # the common decode step: the last block still has room
        # Hit blocks that are free now leave the free queue when touched: they are not available.
        num_free_hits = sum(1 for block in new_computed_blocks if block.ref_cnt == 0)
        if num_new_blocks > self.num_free_blocks - num_free_hits:
            return None
        if req_blocks is None:
            req_blocks = self.req_to_blocks[request_id] = []
            self.req_to_block_ids[request_id] = []
            self.num_cached_block[request_id] = len(new_computed_blocks)
            if self.enable_caching:
                self._queries += request.num_tokens
                self._hits += num_new_computed_tokens
        block_ids = self.req_to_block_ids[request_id]
        if new_computed_blocks:
            self.block_pool.touch(new_computed_blocks)
            req_blocks.extend(new_computed_blocks)
            block_ids.extend(block.block_id for block in new_computed_blocks)
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        block_ids.extend(block.block_id for block in new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Register the request's full blocks among its first ``num_computed_tokens`` tokens (K/V
        computed) in the prefix cache. Called after each step; prompt and generated tokens alike."""
        if not self.enable_caching:
            return
        request_id = request.request_id
        num_full = min(num_computed_tokens, request.num_tokens) // self.block_size
        start = self.num_cached_block.get(request_id, 0)
        if num_full <= start:
            return
        block_hashes = update_block_hashes(request, self.block_size)
        blocks = self.req_to_blocks[request_id]
        record = self.events.enabled or self._newly_cached is not None
        unhashed = [block.block_hash is None for block in blocks[start:num_full]] if record else None
        self.block_pool.cache_full_blocks(blocks[start:num_full], block_hashes[start:num_full])
        self.num_cached_block[request_id] = num_full
        if self._newly_cached is not None:
            self._newly_cached.extend((block.block_id, block.block_hash) for block, was in
                                      zip(blocks[start:num_full], unhashed) if was and block.block_hash is not None)
        if self.events.enabled:
            self._record_stored(request, blocks, block_hashes, start, unhashed)

    def _record_stored(self, request: Request, blocks: list[KVCacheBlock], block_hashes: list[int], start: int,
                       unhashed: list[bool]) -> None:
        """One ``BlockStored`` per run of consecutive blocks that ``cache_blocks`` registered
        (a block that came from a hit, or whose hash another block holds, is not registered)."""
        registered = [start + i for i, was_unhashed in enumerate(unhashed)
                      if was_unhashed and blocks[start + i].block_hash is not None]
        extra = request_extra_keys(request) or None
        size = self.block_size
        runs: list[list[int]] = []
        for index in registered:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            first, last = run[0], run[-1]
            self.events.append(BlockStored(
                block_hashes=tuple(block_hashes[first:last + 1]),
                parent_block_hash=block_hashes[first - 1] if first > 0 else None,
                token_ids=tuple(request.all_token_ids[first * size:(last + 1) * size]),
                block_size=size, extra_keys=(extra,) * len(run)))

    def record_cached_blocks(self) -> None:
        """From now on, remember the blocks ``cache_blocks`` registers (``take_cached_blocks``)."""
        self._newly_cached = []

    def take_cached_blocks(self) -> list[tuple[int, int]]:
        """``(block id, hash)`` of the blocks registered since the last call, oldest first."""
        if self._newly_cached is None:
            return []
        taken, self._newly_cached = self._newly_cached, []
        return taken

    def take_events(self) -> list[KVCacheEvent]:
        """Events recorded since the last call, oldest first (empty when events are off)."""
        return self.events.take()

    def free(self, request: Request) -> None:
        """Return every block of the request to the pool, tail first (so the tail is evicted
        before the shared prefix). Unknown or blockless requests are ignored."""
        blocks = self.req_to_blocks.pop(request.request_id, None)
        self.req_to_block_ids.pop(request.request_id, None)
        self.num_cached_block.pop(request.request_id, None)
        if blocks:
            self.block_pool.free_blocks(reversed(blocks))

    def reset_prefix_cache(self) -> int:
        """Forget all cached hashes (benchmarks, weight reloads). Returns how many were dropped."""
        return self.block_pool.reset_prefix_cache()

    def check_integrity(self) -> None:
        """Check the accounting of pool and block tables.

        Raises:
            AssertionError: with a message naming the first inconsistency found.
        """
        check_kv_cache_integrity(self.block_pool, self.req_to_blocks)
        for request_id, blocks in self.req_to_blocks.items():
            block_ids = [block.block_id for block in blocks]
            assert self.req_to_block_ids[request_id] == block_ids, f"block ids of {request_id} out of step"
        assert self.req_to_block_ids.keys() == self.req_to_blocks.keys(), "block-id tables out of step"
