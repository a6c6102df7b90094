"""Disaggregated prefill/decode over TCP (ZeroMQ): a prefill instance (``--kv-role producer``) keeps
the full blocks it computes in memory and serves them by hash; a decode instance
(``--kv-role consumer``) fetches a request's prompt blocks before the request enters its engine,
which then loads them instead of computing them (``kvserve.kv_transfer.connector``)::

    router ──(max_tokens 1, kv_transfer_params {do_remote_decode})──► producer: prefill
           ◄──(kv_transfer_params {do_remote_prefill, remote_host, remote_port, remote_engine_id})──
    router ──(the request + those kv_transfer_params)──► consumer
                  consumer front end ──[fingerprint, hashes]──► producer's block server
                                     ◄──[count, payload, payload, ...]──
                  consumer engine: the blocks load as a prefix hit; it computes the rest

The hashes are the consumer's own (its prompt, adapter and cache salt), so a block the producer
holds under the same hash has the same whole prefix; the fingerprints must match (same model,
dtype, KV layout: ``kvserve.kv_transfer.fingerprint``). Any failure of the fetch (the producer gone,
a timeout, another fingerprint) leaves the request to compute its prompt itself: it is slower,
never wrong, never stuck.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import TYPE_CHECKING

import msgspec
import zmq
import zmq.asyncio

from kvserve.kv_cache.block_hash import update_block_hashes
from kvserve.kv_transfer.memory_store import MemoryKVStore
from kvserve.request import Request

if TYPE_CHECKING:
    from kvserve.engine.engine_request import EngineRequest

logger = logging.getLogger(__name__)

FETCH_TIMEOUT_S = 10.0  # a producer silent this long is taken to be gone
FAILED_PRODUCER_S = 30.0  # ... and is not asked again for this long (its requests compute their prompts)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(dict)


class BlockServer:
    """The producer's block server: answers ``[header]`` with ``[header, payloads...]`` on a
    ROUTER socket from its own thread.

    Args:
        store: the blocks it serves (the connector's sink).
        fingerprint: this engine's (``kvserve.kv_transfer.fingerprint``).
        host, port: where it binds.
    """

    def __init__(self, store: MemoryKVStore, fingerprint: str, host: str, port: int):
        self.store = store
        self.fingerprint = fingerprint
        self.endpoint = f"tcp://{host}:{port}"
        self._context = zmq.Context.instance()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(self.endpoint)
        except zmq.ZMQError as exc:
            self._socket.close()
            raise OSError(f"--kv-role producer: cannot bind the block server to {self.endpoint}: {exc}") from exc
        self.served_blocks = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="kvserve-kv-blocks", daemon=True)
        self._thread.start()
        logger.info("KV block server (P/D producer) on %s", self.endpoint)

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            identity, *frames = self._socket.recv_multipart(copy=True)
            try:
                reply = self._answer(frames)
            except Exception as exc:  # noqa: BLE001 - a bad request must not stop the server
                reply = [_encoder.encode({"error": f"bad request: {exc}"})]
            self._socket.send_multipart([identity, *reply], copy=False)
        self._socket.close()

    def _answer(self, frames: list[bytes]) -> list:
        header = _decoder.decode(frames[-1])
        if header.get("fingerprint") != self.fingerprint:
            return [_encoder.encode({"error": "another model or KV layout (fingerprint "
                                              f"{header.get('fingerprint')!r}, this server {self.fingerprint!r})"})]
        hashes = [int.from_bytes(h, "big") for h in header.get("hashes", [])]
        payloads = self.store.prefix(hashes)
        self.served_blocks += len(payloads)
        return [_encoder.encode({"count": len(payloads)}), *payloads]

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


async def fetch_blocks(host: str, port: int, fingerprint: str, hashes: list[int],
                       timeout: float | None = None) -> list[bytes]:
    """The payloads of the longest run of ``hashes`` the producer at ``host:port`` holds.

    Raises:
        ConnectionError: no answer within ``timeout`` (default ``FETCH_TIMEOUT_S``), or the
            producer refused (its reason).
    """
    timeout = FETCH_TIMEOUT_S if timeout is None else timeout
    context = zmq.asyncio.Context.instance()
    socket = context.socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(f"tcp://{host}:{port}")
        await socket.send_multipart([_encoder.encode({"fingerprint": fingerprint,
                                                      "hashes": [h.to_bytes(32, "big") for h in hashes]})])
        try:
            frames = await asyncio.wait_for(socket.recv_multipart(), timeout)
        except asyncio.TimeoutError:
            raise ConnectionError(f"the prefill instance at {host}:{port} did not answer in {timeout:g} s") from None
        header = _decoder.decode(frames[0])
        if "error" in header:
            raise ConnectionError(f"the prefill instance at {host}:{port} refused: {header['error']}")
        return list(frames[1:1 + header["count"]])
    finally:
        socket.close()


class PDConsumer:
    """A decode instance's side: fetch a request's prompt blocks into ``inbox`` (a tier of the
    engine's connector) before the request is queued.

    Args:
        inbox: the blocks fetched, until the engine loads them.
        fingerprint: this engine's.
        block_size: tokens per block.
        block_nbytes: a block's payload size (a payload of another size is not kept).
    """

    def __init__(self, inbox: MemoryKVStore, fingerprint: str, block_size: int, block_nbytes: int):
        self.inbox = inbox
        self.fingerprint = fingerprint
        self.block_size = block_size
        self.block_nbytes = block_nbytes
        self.fetched_blocks = 0
        self.failures = 0
        self._failed_until: dict[str, float] = {}  # producer "host:port" -> monotonic time

    async def prefetch(self, spec: EngineRequest, params: dict) -> int:
        """Fetch the prompt blocks of ``spec`` from the producer ``params`` names
        (``remote_host``, ``remote_port``); returns the blocks now held. A failure is logged
        and counted: the request computes its prompt itself."""
        request = Request(spec)
        engine = params.get("remote_engine_id")
        if engine is not None and engine != self.fingerprint:
            self.failures += 1
            logger.warning("request %s: the prefill instance is another model or KV layout (engine %s, this "
                           "server %s); its prompt is computed here", request.request_id, engine, self.fingerprint)
            return 0
        address = f"{params['remote_host']}:{params['remote_port']}"
        if time.monotonic() < self._failed_until.get(address, 0.0):
            return 0  # it failed moments ago: do not wait on it again
        hashes = update_block_hashes(request, self.block_size)[:(request.num_tokens - 1) // self.block_size]
        missing = [h for h in hashes if h not in self.inbox]
        if not missing:
            return len(hashes)
        start = hashes.index(missing[0])
        try:
            payloads = await fetch_blocks(str(params["remote_host"]), int(params["remote_port"]), self.fingerprint,
                                          hashes[start:])
        except Exception as exc:  # noqa: BLE001 - whatever the producer did, the prompt is computed here
            self.failures += 1
            self._failed_until[address] = time.monotonic() + FAILED_PRODUCER_S
            logger.warning("request %s: fetching its prompt's KV failed (%s); it is computed here instead",
                           request.request_id, exc)
            return start
        kept = 0
        for block_hash, payload in zip(hashes[start:], payloads):
            if len(payload) != self.block_nbytes:
                logger.warning("request %s: the prefill instance sent a block of %d bytes, not %d; the rest of "
                               "its prompt is computed here", request.request_id, len(payload), self.block_nbytes)
                break
            self.inbox.put(block_hash, payload)
            kept += 1
        payloads = payloads[:kept]
        self.fetched_blocks += len(payloads)
        return start + len(payloads)
