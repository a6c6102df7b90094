"""Statistics the KV-cache manager hands to the metrics layer."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix-cache totals since start-up, in tokens.

    Attributes:
        queries: tokens of requests looked up when admitted (preempted requests count again).
        hits: of those, tokens found in the cache (``hits / queries`` is the hit rate).
    """

    queries: int = 0
    hits: int = 0

    @property
    def hit_rate(self) -> float:
        """hits / queries, 0.0 before any query."""
        return self.hits / self.queries if self.queries else 0.0
