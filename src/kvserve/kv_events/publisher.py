"""``ZmqEventPublisher``: sends each engine step's KV events on a ZMQ PUB socket and answers
replay requests for recent ones on a ROUTER socket (vLLM's ``ZmqEventPublisher`` protocol).

    engine thread ── publish(events) ──► queue ──► publisher thread: seq += 1, encode,
                                                   PUB (topic, seq, payload), keep (seq, payload)
    subscriber  ── REQ [start_seq] ──► ROUTER ──► every kept (seq, payload) with seq >= start_seq,
                                                  then (-1, b"") = end of replay

The engine thread only appends to a queue: encoding and socket I/O run on the publisher thread.
A subscriber that sees a gap in ``seq`` (it joined late, or the high-water mark dropped messages)
asks the replay socket for the missing batches; the last ``buffer_steps`` batches are kept.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque

import msgspec
import zmq

from kvserve.kv_cache.events import KVCacheEvent
from kvserve.kv_events.config import KVEventsConfig
from kvserve.kv_events.wire import encode_batch

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def binds(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, ``::``, ipc:// or inproc:// address; connect to any other."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


class ZmqEventPublisher:
    """Publishes KV event batches (see the module docstring).

    Args:
        config: the (rank's) ``--kv-events-config``.
        medium: ``GPU`` or ``CPU``: where this engine's KV cache lives.
        data_parallel_rank: written into every batch.
        context: a ZMQ context (default: the process's shared one).

    Raises:
        zmq.ZMQError: an endpoint cannot be bound (port taken) or is malformed.
    """

    POLL_SECONDS = 0.05

    def __init__(self, config: KVEventsConfig, medium: str = "CPU", data_parallel_rank: int = 0,
                 context: zmq.Context | None = None):
        self.config = config
        self.medium = medium
        self.data_parallel_rank = data_parallel_rank
        self._queue: queue.Queue[tuple[float, list[KVCacheEvent]] | None] = queue.Queue(config.max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.buffer_steps)
        self._topic = config.topic.encode("utf-8")
        self._next_seq = 0
        self._context = context or zmq.Context.instance()
        self._pub, self._replay = self._open_sockets()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="kvserve-kv-events", daemon=True)
        self._thread.start()

    def _open_sockets(self) -> tuple[zmq.Socket, zmq.Socket | None]:
        pub = self._context.socket(zmq.PUB)
        pub.set_hwm(self.config.hwm)
        pub.setsockopt(zmq.LINGER, 0)
        replay = None
        try:
            (pub.bind if binds(self.config.endpoint) else pub.connect)(self.config.endpoint)
            if self.config.replay_endpoint is not None:
                replay = self._context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self.config.replay_endpoint)
        except zmq.ZMQError:
            pub.close()
            if replay is not None:
                replay.close()
            raise
        return pub, replay

    @property
    def num_published(self) -> int:
        """Batches sent so far (the next sequence number)."""
        return self._next_seq

    def publish(self, events: list[KVCacheEvent]) -> None:
        """Queue one step's events (called on the engine thread; returns at once unless
        ``max_queue_size`` batches are already waiting, then it waits, as vLLM's does)."""
        if events and not self._closed:
            self._queue.put((time.time(), events))

    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                self._serve_replay()
            try:
                item = self._queue.get(timeout=self.POLL_SECONDS)
            except queue.Empty:
                continue
            if item is None:
                break
            ts, events = item
            payload = encode_batch(ts, events, self.medium, self.data_parallel_rank, encoder)
            seq = self._next_seq
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except zmq.ZMQError:  # the socket is being closed: nothing more can be sent
                logger.exception("publishing KV events failed")
                break
            self._buffer.append((seq, payload))
            self._next_seq = seq + 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("ignoring a malformed KV-event replay request (%d frames)", len(frames))
            return
        client, _, start = frames
        start_seq = int.from_bytes(start, "big")
        for seq, payload in list(self._buffer):
            if seq >= start_seq:
                self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))

    def shutdown(self, timeout: float = 2.0) -> None:
        """Send what is queued (at most ``timeout`` seconds), then close the sockets."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(None)
        self._thread.join(timeout)
        self._pub.close(linger=0)
        if self._replay is not None:
            self._replay.close(linger=0)
