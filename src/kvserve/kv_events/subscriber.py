"""Following a worker's prefix cache from its KV events: ``WorkerBlockIndex`` (the hashes the
worker can hit) kept up to date by ``KVEventSubscriber`` (a thread on a SUB socket that asks the
replay socket for anything it missed).

    publisher ─PUB─► SUB ─► seq == last + 1 ───────────────► index.apply(batch)
                            seq >  last + 1 ─► REQ replay [last + 1 ...] ─► apply each, then this one
                            seq <= last ─────► the publisher restarted: index.clear(), then apply

Used by ``kvserve route`` (precise prefix matching) and by the tests, which check that the index
equals the worker's block pool.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from kvserve.kv_events.wire import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, decode_batch

logger = logging.getLogger(__name__)


class WorkerBlockIndex:
    """The external block hashes one worker holds in its prefix cache, rebuilt from events.

    Args:
        keep_tokens: also keep each block's tokens, parent hash and extra keys (tests, debugging).

    Attributes:
        hashes: the 64-bit hashes currently cached.
        blocks: with ``keep_tokens``: hash -> (parent hash, token ids, extra keys).
        block_size: tokens per block, from the last ``BlockStored`` (None before one).
        num_batches: batches applied since the last reset.
    """

    def __init__(self, keep_tokens: bool = False):
        self.keep_tokens = keep_tokens
        self.hashes: set[int] = set()
        self.blocks: dict[int, tuple[int | None, tuple[int, ...], object]] = {}
        self.block_size: int | None = None
        self.num_batches = 0

    def apply(self, batch: KVEventBatch) -> None:
        """Apply one batch's events in order."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._store(event)
            elif isinstance(event, BlockRemoved):
                for block_hash in event.block_hashes:
                    self.hashes.discard(block_hash)
                    self.blocks.pop(block_hash, None)
            elif isinstance(event, AllBlocksCleared):
                self.hashes.clear()
                self.blocks.clear()
        self.num_batches += 1

    def _store(self, event: BlockStored) -> None:
        self.block_size = event.block_size
        self.hashes.update(event.block_hashes)
        if not self.keep_tokens:
            return
        parent = event.parent_block_hash
        extra = event.extra_keys or [None] * len(event.block_hashes)
        for i, block_hash in enumerate(event.block_hashes):
            tokens = tuple(event.token_ids[i * event.block_size:(i + 1) * event.block_size])
            self.blocks[block_hash] = (parent, tokens, extra[i])
            parent = block_hash

    def clear(self) -> None:
        self.hashes.clear()
        self.blocks.clear()
        self.num_batches = 0

    def match_length(self, external_hashes: list[int]) -> int:
        """How many leading blocks of a request (its chain of external hashes) are cached."""
        count = 0
        for block_hash in external_hashes:
            if block_hash not in self.hashes:
                break
            count += 1
        return count


class KVEventSubscriber:
    """A thread following one publisher (see the module docstring).

    Args:
        endpoint: the publisher's PUB address to connect to (``tcp://127.0.0.1:5557``).
        replay_endpoint: its ROUTER address, or None (gaps are then only logged).
        topic: the topic to subscribe to (``""`` = all).
        index: where batches are applied (a new one by default).
        on_batch: called after each applied batch with ``(seq, batch)`` (tests, metrics).

    Attributes:
        last_seq: the sequence number of the last applied batch (-1 before any).
        num_gaps: gaps seen; num_restarts: times the publisher started over.
    """

    POLL_MS = 50
    REPLAY_TIMEOUT_MS = 1000

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, topic: str = "",
                 index: WorkerBlockIndex | None = None,
                 on_batch: Callable[[int, KVEventBatch], None] | None = None,
                 context: zmq.Context | None = None):
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.index = index if index is not None else WorkerBlockIndex()
        self.on_batch = on_batch
        self.last_seq = -1
        self.num_gaps = 0
        self.num_restarts = 0
        self._context = context or zmq.Context.instance()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kv-events-sub {endpoint}", daemon=True)

    def start(self) -> KVEventSubscriber:
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def reset(self) -> None:
        """Forget the worker's cache (it was restarted or removed); later batches rebuild it."""
        self.index.clear()
        self.last_seq = -1

    def _run(self) -> None:
        sub = self._context.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt_string(zmq.SUBSCRIBE, self.topic)
        sub.connect(self.endpoint)
        try:
            while not self._stop.is_set():
                if not sub.poll(self.POLL_MS):
                    continue
                frames = sub.recv_multipart()
                if len(frames) != 3:
                    continue
                self._receive(int.from_bytes(frames[1], "big"), frames[2])
        finally:
            sub.close(linger=0)

    def _receive(self, seq: int, payload: bytes) -> None:
        if seq <= self.last_seq:  # sequence numbers start over: a new publisher (worker restart)
            self.num_restarts += 1
            self.reset()
        if seq > self.last_seq + 1:
            self.num_gaps += 1
            self._replay(self.last_seq + 1, seq)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except Exception:  # noqa: BLE001 - a malformed message is skipped, not fatal
            logger.warning("skipping an undecodable KV event batch (seq %d) from %s", seq, self.endpoint)
            return
        self.index.apply(batch)
        self.last_seq = seq
        if self.on_batch is not None:
            self.on_batch(seq, batch)

    def _replay(self, start: int, stop: int) -> None:
        """Apply batches ``start .. stop - 1`` from the replay socket (as many as it still has)."""
        if self.replay_endpoint is None:
            logger.warning("missed KV event batches %d..%d from %s (no replay endpoint)", start, stop - 1,
                           self.endpoint)
            return
        # A DEALER (not vLLM's example REQ, which takes one reply per request) reads the many
        # replies the ROUTER streams back; it sends the empty delimiter frame a REQ would add.
        req = self._context.socket(zmq.DEALER)
        req.setsockopt(zmq.LINGER, 0)
        req.connect(self.replay_endpoint)
        try:
            req.send_multipart((b"", start.to_bytes(8, "big")))
            while req.poll(self.REPLAY_TIMEOUT_MS):
                frames = req.recv_multipart()
                seq_bytes, payload = frames[-2], frames[-1]
                if not payload:
                    break  # end of replay
                seq = int.from_bytes(seq_bytes, "big")
                if self.last_seq < seq < stop:
                    self._apply(seq, payload)
        except zmq.ZMQError:
            logger.warning("replay from %s failed", self.replay_endpoint)
        finally:
            req.close(linger=0)
