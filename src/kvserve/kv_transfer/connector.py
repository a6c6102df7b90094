"""The engine's KV connector: blocks from outside the pool, keyed by the prefix cache's block hashes
(which already carry the adapter and ``cache_salt``), in vLLM v1's shape::

    scheduler   count(hashes)  how many of a waiting request's next blocks can be loaded
                               (consecutive, after its prefix-cache hit)      -> allocate them
                read(hashes)   their payloads, tier by tier (stops at the first that fails)
    queued      prefetch(...)  tiers that can read ahead start reading a new request's blocks
    step        load(...)      before the forward: payloads into the allocated blocks
                save(...)      after the step: blocks that entered the prefix cache, to the sinks

Tiers are looked up in order: the host-memory tier (``host``, ``--kv-offloading-size``), the blocks
a decode instance fetched from its prefill instance (``p2p``, ``kvserve.kv_transfer.pd``), then the
disk tier (``disk``). Sinks receive every full
block computed here: the disk tier, and a prefill instance's store its consumers fetch from.
A block that cannot be read counts as a miss: the request computes it (``recompute``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import takewhile
from typing import Protocol

from kvserve.kv_transfer.block_io import BlockCodec
from kvserve.kv_transfer.scheduling import ExternalBlocks, ExternalCacheStats
from kvserve.scheduler.stats import KVTransferStats


class KVTier(Protocol):
    name: str

    def __contains__(self, block_hash: int) -> bool: ...

    def get(self, block_hash: int) -> bytes | None: ...

    def put(self, block_hash: int, payload) -> None: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def used_bytes(self) -> int: ...


@dataclass
class ConnectorTotals:
    """Totals since start-up (bytes by tier name; seconds spent loading)."""

    loaded_bytes: dict[str, int] = field(default_factory=dict)
    stored_bytes: dict[str, int] = field(default_factory=dict)
    load_seconds: float = 0.0


class KVConnector:
    """Args:
        tiers: where blocks are looked up, in order.
        sinks: where computed blocks are written.
        codec: the copies between the runner's cache tensors and payloads.
    """

    def __init__(self, tiers: Sequence[KVTier], sinks: Sequence[KVTier], codec: BlockCodec):
        self.tiers = list(tiers)
        self.sinks = list(sinks)
        self.codec = codec
        self.totals = ConnectorTotals()

    # -- the scheduler's side ----------------------------------------------------------------

    def count(self, hashes: Sequence[int]) -> int:
        """How many of ``hashes``, from the first, some tier holds."""
        return sum(1 for _ in takewhile(lambda h: any(h in tier for tier in self.tiers), hashes))

    def prefetch(self, hashes: Sequence[int]) -> None:
        """Let tiers that can read ahead (the disk tier) start reading these blocks."""
        for tier in self.tiers:
            prefetch = getattr(tier, "prefetch", None)
            if prefetch is not None:
                prefetch(list(hashes))

    def read(self, hashes: Sequence[int]) -> tuple[list[bytes], list[str]]:
        """The payloads of ``hashes`` from the first, and the tier each came from; shorter when a
        block cannot be read (it is computed instead)."""
        payloads, sources = [], []
        for block_hash in hashes:
            for tier in self.tiers:
                payload = tier.get(block_hash)
                if payload is not None:
                    payloads.append(payload)
                    sources.append(tier.name)
                    break
            else:
                break
        return payloads, sources

    # -- the step's side ---------------------------------------------------------------------

    def load(self, loads: Sequence[ExternalBlocks]) -> None:
        """Write the read payloads into their blocks (before the step's forward)."""
        start = time.perf_counter()
        block_ids = [b for load in loads for b in load.block_ids]
        payloads = [p for load in loads for p in load.payloads]
        if not block_ids:
            return
        self.codec.scatter(block_ids, payloads)
        totals = self.totals
        for load in loads:
            for name in load.sources:
                totals.loaded_bytes[name] = totals.loaded_bytes.get(name, 0) + self.codec.nbytes
        totals.load_seconds += time.perf_counter() - start

    def save(self, blocks: Sequence[tuple[int, int]]) -> None:
        """Give the sinks the blocks (``(block id, hash)``) that entered the prefix cache this step
        and that they do not hold yet (copied out now: the pool may reuse the blocks next step)."""
        wanted = [(block_id, block_hash) for block_id, block_hash in blocks
                  if any(block_hash not in sink for sink in self.sinks)]
        if not wanted:
            return
        payloads = self.codec.gather([block_id for block_id, _ in wanted])
        for (_, block_hash), payload in zip(wanted, payloads):
            for sink in self.sinks:
                if block_hash not in sink:
                    sink.put(block_hash, payload)
                    stored = self.totals.stored_bytes
                    stored[sink.name] = stored.get(sink.name, 0) + len(payload)

    def stats(self, lookups: ExternalCacheStats) -> KVTransferStats:
        """A snapshot for the metrics: ``lookups`` (the scheduler's), the totals, the tiers now."""
        totals = self.totals
        tiers = {tier.name: tier for tier in [*self.tiers, *self.sinks]}
        return KVTransferStats(lookups.queries, lookups.hits, dict(lookups.hits_by_source), dict(totals.loaded_bytes),
                               dict(totals.stored_bytes), totals.load_seconds,
                               {name: tier.num_blocks for name, tier in tiers.items()},
                               {name: tier.used_bytes for name, tier in tiers.items()})

    def close(self) -> None:
        for tier in {id(t): t for t in [*self.tiers, *self.sinks]}.values():
            close = getattr(tier, "close", None)
            if close is not None:
                close()
