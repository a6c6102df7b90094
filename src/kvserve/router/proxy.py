"""Forwarding a request to a worker, with retries before the first byte.

    choose worker ─► POST ─► connect refused / 5xx / 429 / broken before any body byte
        ▲                      └─► (attempts left) backoff with jitter, another worker ─┐
        └──────────────────────────────────────────────────────────────────────────────┘
                         200 + first body chunk ─► response to the client starts
                         later break in a stream ─► in-band error event + [DONE]

Nothing reaches the client before the worker's first body byte, so a failure until then is
invisible to it: the request is retried (at most ``max_retries`` times, each on a worker not
tried yet while one is left; delay ``min(max_backoff, initial * multiplier**k) * (1 +- jitter)``).
A 4xx other than 429 is the client's mistake and is passed back as it is. Streams are passed
through byte for byte (each piece as the worker's socket delivered it); when one breaks after its
first byte, the client gets ``data: {"error": {...}}`` and ``data: [DONE]``, as a kvserve worker
ends a stream that fails. A client that leaves mid-stream closes the worker connection (the worker
sees its client leave and stops generating).

The proxy writes the client's response itself through the ASGI ``send`` of the request
(``kvserve.router.app`` hands forwarded paths to it without FastAPI's layers), and reaches workers
through ``kvserve.router.upstream`` (keep-alive connections per worker).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kvserve.api.errors import APIError, error_body
from kvserve.router.config import RetryConfig
from kvserve.router.fleet import Fleet
from kvserve.router.metrics import RouterMetrics
from kvserve.router.policies import RouteRequest
from kvserve.router.upstream import UpstreamClient, UpstreamError, UpstreamResponse
from kvserve.router.worker import Worker

logger = logging.getLogger(__name__)

Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]

_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
                         b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length", b"date",
                         b"server", b"x-request-id"})


@dataclass
class ForwardRequest:
    """One client request as the proxy forwards it.

    Attributes:
        headers: the client's headers to pass on (``(name, value)``, names lower-case).
        received_at: ``time.perf_counter()`` when the router got it.
    """

    path: str
    body: bytes
    headers: list[tuple[bytes, bytes]]
    request_id: str
    model: str | None
    route: RouteRequest
    stream: bool
    received_at: float


@dataclass
class _Answer:
    """A whole response not yet sent to the client."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class _Retry(Exception):
    """An attempt failed before the first byte; ``reason`` is the retries_total label."""

    def __init__(self, reason: str, answer: _Answer | None = None):
        super().__init__(reason)
        self.reason = reason
        self.answer = answer


class Proxy:
    """Args:
        fleet: where workers are chosen.
        client: the worker connections.
        retry: the retry budget and backoff.
        request_timeout: seconds a worker may stay silent during a request.
        on_failure: called with ``(worker, fatal)`` when a worker failed a request (``fatal``:
            the connection was refused); on_success with the worker when it answered.
        on_routed: called with ``(worker, decision, route)`` each time a worker is chosen.
    """

    def __init__(self, fleet: Fleet, client: UpstreamClient, retry: RetryConfig, metrics: RouterMetrics,
                 request_timeout: float, on_failure: Callable[[Worker, bool], None],
                 on_routed: Callable, rng: random.Random | None = None):
        self.fleet, self.client, self.retry, self.metrics = fleet, client, retry, metrics
        self.request_timeout = request_timeout
        self.on_failure, self.on_routed = on_failure, on_routed
        self.rng = rng or random.Random()
        self.ttft_window = None  # set by the app: SlidingWindow
        self.itl_window = None
        self.prefill_leg = None  # set by the app with --pd: kvserve.router.pd.PrefillLeg

    def backoff(self, retry_index: int) -> float:
        """Seconds before retry number ``retry_index`` (0-based)."""
        base = min(self.retry.max_backoff, self.retry.initial_backoff * self.retry.multiplier ** retry_index)
        return base * (1 + self.rng.uniform(-self.retry.jitter, self.retry.jitter))

    async def forward(self, request: ForwardRequest, send: Send, receive: Receive,
                      on_done: Callable[[], None]) -> None:
        """Answer the client through ``send``. ``on_done`` runs once when the response has ended
        (also when it failed), e.g. to release a rate-limit slot.

        Raises:
            APIError: 503 ``no_worker_available`` when no worker could be tried (nothing was sent).
        """
        if self.prefill_leg is not None:
            request = await self.prefill_leg.prepare(request)
        tried: set[str] = set()
        last: _Retry | None = None
        for attempt in range(self.retry.max_retries + 1):
            if attempt:
                self.metrics.retries.labels(last.reason).inc()
                await asyncio.sleep(self.backoff(attempt - 1))
            decision = self.fleet.choose(request.model, request.route, tried)
            if decision is None:
                break
            worker = decision.worker
            tried.add(worker.url)
            self.on_routed(worker, decision, request.route)
            try:
                return await self._attempt(worker, request, send, receive, on_done)
            except _Retry as retry:
                last = retry
        on_done()
        if last is not None and last.answer is not None:
            return await _send_whole(send, last.answer)  # the last worker's own 5xx/429, as it was
        self.metrics.requests.labels("none", "error").inc()
        message = "No worker could take the request" + (f" (last failure: {last.reason})." if last else
                                                        f" (no healthy worker serves {request.model!r}).")
        raise APIError(503, message, code="no_worker_available", retry_after=1)

    async def _attempt(self, worker: Worker, request: ForwardRequest, send: Send, receive: Receive,
                       on_done: Callable[[], None]) -> None:
        """One try on ``worker``. Raises ``_Retry`` when it failed before the first byte."""
        worker.in_flight += 1
        worker.num_requests += 1
        worker.breaker.on_attempt()
        try:
            upstream = await self._send(worker, request)
            status = upstream.status
            if status >= 500 or status == 429:
                body = await self._read(worker, upstream)
                if status >= 500:
                    self.on_failure(worker, False)
                raise _Retry(f"status_{'429' if status == 429 else '5xx'}",
                             _Answer(status, self._response_headers(upstream, request), body))
            streamed = request.stream and status == 200
            if streamed:
                chunks = upstream.body_chunks()
                first = await self._first_chunk(worker, upstream, chunks)
            else:
                body = await self._read(worker, upstream)
        except _Retry:
            worker.in_flight -= 1
            raise
        if streamed:
            await self._relay(worker, request, upstream, first, chunks, send, receive, on_done)
        else:
            await self._whole(worker, request, upstream, body, send, on_done)

    async def _send(self, worker: Worker, request: ForwardRequest) -> UpstreamResponse:
        headers = [*request.headers, (b"x-request-id", request.request_id.encode("latin-1"))]
        try:
            return await self.client.pool(worker.url).request(b"POST", request.path, headers, request.body,
                                                              self.request_timeout)
        except UpstreamError as exc:
            self.on_failure(worker, exc.connect)
            raise _Retry("connect" if exc.connect else "read") from None

    async def _read(self, worker: Worker, upstream: UpstreamResponse) -> bytes:
        try:
            return await upstream.read()
        except UpstreamError:
            self.on_failure(worker, False)
            raise _Retry("read") from None
        finally:
            upstream.release()

    async def _whole(self, worker: Worker, request: ForwardRequest, upstream: UpstreamResponse, body: bytes,
                     send: Send, on_done: Callable[[], None]) -> None:
        """A non-streamed answer, read whole before anything went to the client."""
        worker.in_flight -= 1
        worker.breaker.record_success()
        self._observe_done(request, worker, "ok" if upstream.status < 400 else "error")
        on_done()
        await _send_whole(send, _Answer(upstream.status, self._response_headers(upstream, request), body))

    async def _first_chunk(self, worker: Worker, upstream: UpstreamResponse, chunks) -> bytes:
        try:
            return await anext(chunks, b"")
        except UpstreamError:
            upstream.release()
            self.on_failure(worker, False)
            raise _Retry("read") from None

    async def _relay(self, worker: Worker, request: ForwardRequest, upstream: UpstreamResponse, first: bytes,
                     chunks, send: Send, receive: Receive, on_done: Callable[[], None]) -> None:
        """Stream the worker's body to the client; see the module docstring for its endings."""
        now = time.perf_counter()
        self._observe_ttft(now - request.received_at)
        left = asyncio.get_running_loop().create_future()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, upstream, left))
        outcome = "ok"
        try:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": self._response_headers(upstream, request)})
            if first:
                await send({"type": "http.response.body", "body": first, "more_body": True})
            previous = now
            async for chunk in chunks:
                now = time.perf_counter()
                self._observe_itl(now - previous)
                previous = now
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            worker.breaker.record_success()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except UpstreamError as exc:
            if left.done():
                outcome = "client_disconnected"
            else:
                outcome = "stream_error"
                await self._stream_broke(worker, request, exc, send)
        finally:
            watcher.cancel()
            await chunks.aclose()
            worker.in_flight -= 1
            upstream.release()
            self._observe_done(request, worker, outcome)
            on_done()

    async def _stream_broke(self, worker: Worker, request: ForwardRequest, exc: Exception, send: Send) -> None:
        self.on_failure(worker, False)
        logger.warning("stream %s from %s broke after its first byte: %s", request.request_id, worker.url, exc)
        message = (f"The worker serving this request failed after the stream started ({type(exc).__name__}); "
                   f"request {request.request_id} did not finish.")
        error = f"data: {json.dumps(error_body(message, 'server_error', code='worker_failed'))}\n\n".encode()
        await send({"type": "http.response.body", "body": error + b"data: [DONE]\n\n", "more_body": False})

    def _response_headers(self, upstream: UpstreamResponse, request: ForwardRequest) -> list[tuple[bytes, bytes]]:
        headers = [(k, v) for k, v in upstream.headers if k not in _HOP_BY_HOP]
        headers.append((b"x-request-id", request.request_id.encode("latin-1")))
        return headers

    def _observe_ttft(self, seconds: float) -> None:
        self.metrics.ttft.observe(seconds)
        if self.ttft_window is not None:
            self.ttft_window.add(seconds)

    def _observe_itl(self, seconds: float) -> None:
        self.metrics.itl.observe(seconds)
        if self.itl_window is not None:
            self.itl_window.add(seconds)

    def _observe_done(self, request: ForwardRequest, worker: Worker, outcome: str) -> None:
        self.metrics.requests.labels(worker.url, outcome).inc()
        elapsed = time.perf_counter() - request.received_at
        self.metrics.e2e.observe(elapsed)
        if not request.stream and outcome == "ok":
            self._observe_ttft(elapsed)  # a whole response arrives at once: its first token is its last


async def _send_whole(send: Send, answer: _Answer) -> None:
    headers = [*answer.headers, (b"content-length", str(len(answer.body)).encode())]
    await send({"type": "http.response.start", "status": answer.status, "headers": headers})
    await send({"type": "http.response.body", "body": answer.body, "more_body": False})


async def _watch_disconnect(receive: Receive, upstream: UpstreamResponse, left: asyncio.Future) -> None:
    """Close the worker connection when the client leaves mid-stream."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            left.set_result(None)
            upstream.abort()
            return
