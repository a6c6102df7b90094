"""Typed KV-cache events: what entered and left the prefix cache, in the order it happened.

The KV manager appends these to a :class:`KVEventSink` (no I/O, no torch); the engine thread
drains the sink after each step and hands the batch to a publisher
(``kvserve.kv_events.publisher``), which writes vLLM's wire format. The three kinds and their
meaning follow vLLM's ``vllm/distributed/kv_events.py``:

    BlockStored       full blocks registered in the prefix cache: their chained hashes, the hash
                      of the block before the first one (None when it is the request's first
                      block), their tokens (block_size per block) and extra hash keys
    BlockRemoved      blocks evicted from the prefix cache (their hashes can no longer be hit)
    AllBlocksCleared  every hash forgotten (``reset_prefix_cache``)

A consumer that applies the events in order holds exactly the set of hashes the pool can hit
(``BlockPool.cached_block_hash_to_block``): a hash appears in one BlockStored only while it is
cached (a block whose hash is already cached by another block is not registered, so it is not
announced either), and in one BlockRemoved when it is evicted.

Hashes here are kvserve's 256-bit block hashes (``block_hash.py``); the publisher converts them to
the external form.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class BlockStored:
    """Consecutive blocks of one request entered the prefix cache.

    Attributes:
        block_hashes: chained hashes, in block order.
        parent_block_hash: hash of the block before ``block_hashes[0]``; None for a first block.
        token_ids: the blocks' tokens, ``block_size * len(block_hashes)`` of them.
        block_size: tokens per block.
        extra_keys: the extra hash keys of each block (``request_extra_keys``: the cache salt),
            one entry per block, ``None`` where a block has none.
    """

    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[tuple | None, ...] = ()


@dataclass(frozen=True)
class BlockRemoved:
    """Blocks left the prefix cache (evicted for reuse)."""

    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class AllBlocksCleared:
    """The prefix cache was reset: no hash can be hit any more."""


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass
class KVEventSink:
    """Where the block pool and the KV manager put events. Disabled sinks drop everything, so the
    cost of events when nobody listens is one attribute check.

    Attributes:
        enabled: record events (``--kv-events-config`` with ``enable_kv_cache_events``).
        events: recorded events, oldest first, until :meth:`take`.
    """

    enabled: bool = False
    events: list[KVCacheEvent] = field(default_factory=list)

    def append(self, event: KVCacheEvent) -> None:
        if self.enabled:
            self.events.append(event)

    def take(self) -> list[KVCacheEvent]:
        """The recorded events, oldest first; the sink is empty afterwards."""
        events, self.events = self.events, []
        return events
