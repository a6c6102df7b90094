"""What the router knows about the prompt's blocks: their hashes, computed as a kvserve worker
computes them, and an approximate per-worker index of the prompts it routed.

Block hashes (``kvserve.kv_cache.block_hash``): block i of a prompt of token ids ``t`` is
``H(h(i-1), t[i*B:(i+1)*B], extra_keys)`` with ``h(-1) = ROOT_HASH`` and ``extra_keys`` the
request's ``(cache_salt,)``; KV events carry the low 64 bits (``external_block_hash``). A worker's
prefix-cache hit never covers the prompt's last token, so at most ``(n - 1) // B`` blocks of an
``n``-token prompt can be hit (:func:`hittable_blocks`).

The approximate index is a radix tree over blocks kept as the set of its paths' chained hashes
(equal chained hashes = equal whole prefixes, so the set is the tree): each routed prompt adds
its chain, a match walks the request's chain until a hash is missing. Entries are evicted least
recently used beyond ``capacity`` blocks (the worker's own cache evicts too), and, for workers
that publish KV events, after ``ttl`` seconds (by then the events tell the truth).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from kvserve.kv_cache.block_hash import ROOT_HASH, hash_block_tokens
from kvserve.kv_events.wire import external_block_hash


def request_block_hashes(token_ids: Sequence[int], block_size: int, cache_salt: str | None = None) -> list[int]:
    """External (64-bit) hashes of the prompt's full blocks, in order."""
    extra = (cache_salt,) if cache_salt is not None else ()
    hashes, parent = [], ROOT_HASH
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash_block_tokens(parent, token_ids[start:start + block_size], extra)
        hashes.append(external_block_hash(parent))
    return hashes


def hittable_blocks(num_tokens: int, block_size: int) -> int:
    """Most blocks of an ``num_tokens``-token prompt a worker's prefix cache can serve."""
    return max(0, (num_tokens - 1) // block_size)


class ApproxPrefixIndex:
    """The block chains of prompts routed to one worker (see the module docstring).

    Args:
        capacity: most blocks remembered.
        ttl: seconds an entry counts (None = until evicted by capacity).
        clock: seconds (injected in tests).
    """

    def __init__(self, capacity: int = 1 << 20, ttl: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.capacity = capacity
        self.ttl = ttl
        self.clock = clock
        self._entries: OrderedDict[int, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def insert(self, hashes: Sequence[int]) -> None:
        now = self.clock()
        for block_hash in hashes:
            self._entries[block_hash] = now
            self._entries.move_to_end(block_hash)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)

    def match_length(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` present (and fresh)."""
        oldest = None if self.ttl is None else self.clock() - self.ttl
        count = 0
        for block_hash in hashes:
            seen = self._entries.get(block_hash)
            if seen is None or (oldest is not None and seen < oldest):
                break
            count += 1
        return count

    def clear(self) -> None:
        self._entries.clear()
