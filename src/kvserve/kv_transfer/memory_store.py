"""Blocks held in host memory by hash, least recently used dropped past a size bound: what a
prefill instance keeps for decode instances to fetch, and what a decode instance fetched until its
engine loads it (``kvserve.kv_transfer.pd``). Thread-safe: the engine thread puts and takes, the
transfer threads read and add."""

from __future__ import annotations

import threading
from collections import OrderedDict


class MemoryKVStore:
    """Args:
        name: the tier's label in metrics (``p2p``).
        max_bytes: size bound of the payloads.
    """

    def __init__(self, name: str, max_bytes: int):
        self.name = name
        self.max_bytes = max_bytes
        self._blocks: OrderedDict[int, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def used_bytes(self) -> int:
        return self._bytes

    def get(self, block_hash: int) -> bytes | None:
        with self._lock:
            payload = self._blocks.get(block_hash)
            if payload is not None:
                self._blocks.move_to_end(block_hash)
            return payload

    def put(self, block_hash: int, payload) -> None:
        payload = bytes(payload)
        with self._lock:
            old = self._blocks.pop(block_hash, None)
            if old is not None:
                self._bytes -= len(old)
            self._blocks[block_hash] = payload
            self._bytes += len(payload)
            while self._bytes > self.max_bytes and self._blocks:
                self._bytes -= len(self._blocks.popitem(last=False)[1])

    def prefix(self, hashes: list[int]) -> list[bytes]:
        """The payloads of the longest run of ``hashes`` from the first one that is held."""
        found = []
        with self._lock:
            for block_hash in hashes:
                payload = self._blocks.get(block_hash)
                if payload is None:
                    break
                self._blocks.move_to_end(block_hash)
                found.append(payload)
        return found
