"""The scheduler's side of the KV connector: for a waiting request about to be admitted, how many
blocks after its prefix-cache hit can be loaded instead of computed, and, once they are
allocated, reading them (``ExternalBlocks`` go to the step that loads them). Counts what vLLM
reports as the external prefix cache (tokens looked up, tokens found, by tier)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvserve.request import Request

if TYPE_CHECKING:
    from kvserve.kv_transfer.connector import KVConnector


@dataclass(frozen=True)
class ExternalBlocks:
    """Blocks read for one request: where they go, what they hold, which tier each came from."""

    block_ids: list[int]
    payloads: list[bytes]
    sources: list[str]


@dataclass
class ExternalCacheStats:
    """The scheduler's lookups since start-up, in tokens (vLLM's ``external_prefix_cache_*``)."""

    queries: int = 0
    hits: int = 0
    hits_by_source: dict[str, int] = field(default_factory=dict)


class ExternalKV:
    """Args:
        connector: the engine's connector.
        block_size: tokens per block.
    """

    def __init__(self, connector: KVConnector, block_size: int):
        self.connector = connector
        self.block_size = block_size
        self.stats = ExternalCacheStats()

    def prefetch(self, request: Request, num_hit_blocks: int) -> None:
        """A request was queued: let the tiers read ahead its blocks after its prefix-cache hit."""
        if request.sampling_params.prompt_logprobs is None:
            last = (request.num_tokens - 1) // self.block_size
            self.connector.prefetch(request.block_hashes[num_hit_blocks:last])

    def num_tokens(self, request: Request, num_hit_blocks: int) -> int:
        """Tokens after the request's ``num_hit_blocks`` prefix-cache blocks that a tier holds
        (whole blocks; never the last known token, which the step computes to sample from). 0 for
        requests asking for prompt logprobs (every position must be computed)."""
        if request.sampling_params.prompt_logprobs is not None:
            return 0
        last = (request.num_tokens - 1) // self.block_size
        return self.connector.count(request.block_hashes[num_hit_blocks:last]) * self.block_size

    def read(self, request: Request, block_ids: list[int], num_hit_blocks: int, num_tokens: int) -> ExternalBlocks:
        """Read the ``num_tokens`` counted for ``request`` (admitted: its blocks allocated); fewer
        when a block can no longer be read. Counts the lookup."""
        first = num_hit_blocks
        hashes = request.block_hashes[first:first + num_tokens // self.block_size]
        payloads, sources = self.connector.read(hashes)
        stats = self.stats
        stats.queries += request.num_tokens - num_hit_blocks * self.block_size
        stats.hits += len(payloads) * self.block_size
        for source in sources:
            stats.hits_by_source[source] = stats.hits_by_source.get(source, 0) + self.block_size
        return ExternalBlocks(block_ids[first:first + len(payloads)], payloads, sources)

    def count_miss(self, request: Request, num_hit_blocks: int) -> None:
        """Count the lookup of a request admitted with nothing to load."""
        self.stats.queries += request.num_tokens - num_hit_blocks * self.block_size
