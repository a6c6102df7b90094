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
through byte for byte (``aiter_raw``); when one breaks after its first byte, the client gets
``data: {"error": {...}}`` and ``data: [DONE]``, as a kvserve worker ends a stream that fails.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from starlette.responses import Response, StreamingResponse

from kvserve.api.errors import APIError, error_body
from kvserve.router.config import RetryConfig
from kvserve.router.fleet import Fleet
from kvserve.router.metrics import RouterMetrics
from kvserve.router.policies import RouteRequest
from kvserve.router.worker import Worker

logger = logging.getLogger(__name__)

_HOP_BY_HOP = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailers",
                         "transfer-encoding", "upgrade", "host", "content-length", "date", "server"})


@dataclass
class ForwardRequest:
    """One client request as the proxy forwards it."""

    path: str
    body: bytes
    headers: dict[str, str]
    request_id: str
    model: str | None
    route: RouteRequest
    stream: bool
    received_at: float


class _Retry(Exception):
    """An attempt failed before the first byte; ``reason`` is the retries_total label."""

    def __init__(self, reason: str, response: Response | None = None):
        super().__init__(reason)
        self.reason = reason
        self.response = response


class Proxy:
    """Args:
        fleet: where workers are chosen.
        retry: the retry budget and backoff.
        on_failure: called with ``(worker, fatal)`` when a worker failed a request (``fatal``:
            the connection was refused); on_success with the worker when it answered.
        on_routed: called with ``(worker, decision, route)`` each time a worker is chosen.
    """

    def __init__(self, fleet: Fleet, client: httpx.AsyncClient, retry: RetryConfig, metrics: RouterMetrics,
                 request_timeout: float, on_failure: Callable[[Worker, bool], None],
                 on_routed: Callable, rng: random.Random | None = None):
        self.fleet, self.client, self.retry, self.metrics = fleet, client, retry, metrics
        self.request_timeout = request_timeout
        self.on_failure, self.on_routed = on_failure, on_routed
        self.rng = rng or random.Random()
        self.ttft_window = None  # set by the app: SlidingWindow
        self.itl_window = None

    def backoff(self, retry_index: int) -> float:
        """Seconds before retry number ``retry_index`` (0-based)."""
        base = min(self.retry.max_backoff, self.retry.initial_backoff * self.retry.multiplier ** retry_index)
        return base * (1 + self.rng.uniform(-self.retry.jitter, self.retry.jitter))

    async def forward(self, request: ForwardRequest, on_done: Callable[[], None]) -> Response:
        """The client's response. ``on_done`` runs once when the response has ended (also when it
        failed), e.g. to release a rate-limit slot."""
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
                return await self._attempt(worker, request, on_done)
            except _Retry as retry:
                last = retry
        on_done()
        if last is not None and last.response is not None:
            return last.response  # the last worker's own 5xx/429, as it was
        self.metrics.requests.labels("none", "error").inc()
        message = "No worker could take the request" + (f" (last failure: {last.reason})." if last else
                                                        f" (no healthy worker serves {request.model!r}).")
        raise APIError(503, message, code="no_worker_available", retry_after=1)

    async def _attempt(self, worker: Worker, request: ForwardRequest, on_done: Callable[[], None]) -> Response:
        """One try on ``worker``. Raises ``_Retry`` when it failed before the first byte."""
        worker.in_flight += 1
        worker.num_requests += 1
        worker.breaker.on_attempt()
        try:
            upstream = await self._send(worker, request)
            status = upstream.status_code
            if status >= 500 or status == 429:
                body = await upstream.aread()
                await upstream.aclose()
                if status >= 500:
                    self.on_failure(worker, False)
                raise _Retry(f"status_{'429' if status == 429 else '5xx'}",
                             Response(body, status, self._response_headers(upstream, request)))
            if not (request.stream and status == 200):
                return await self._whole(worker, request, upstream, on_done)
            chunks = upstream.aiter_raw()
            first = await self._first_chunk(worker, upstream, chunks)
        except _Retry:
            worker.in_flight -= 1
            raise
        return StreamingResponse(self._relay(worker, request, upstream, first, chunks, on_done),
                                 status_code=status, headers=self._response_headers(upstream, request))

    async def _whole(self, worker: Worker, request: ForwardRequest, upstream: httpx.Response,
                     on_done: Callable[[], None]) -> Response:
        """A non-streamed answer, read whole before anything goes to the client."""
        try:
            body = await upstream.aread()
        except httpx.HTTPError:
            self.on_failure(worker, False)
            raise _Retry("read") from None
        finally:
            await upstream.aclose()
        worker.in_flight -= 1
        worker.breaker.record_success()
        self._observe_done(request, worker, "ok" if upstream.status_code < 400 else "error")
        on_done()
        return Response(body, upstream.status_code, self._response_headers(upstream, request))

    async def _send(self, worker: Worker, request: ForwardRequest) -> httpx.Response:
        headers = dict(request.headers)
        headers["x-request-id"] = request.request_id
        try:
            return await self.client.send(
                self.client.build_request("POST", worker.url + request.path, content=request.body, headers=headers,
                                          timeout=httpx.Timeout(self.request_timeout, connect=5.0)),
                stream=True)
        except httpx.ConnectError:
            self.on_failure(worker, True)
            raise _Retry("connect") from None
        except httpx.HTTPError:
            self.on_failure(worker, False)
            raise _Retry("read") from None

    async def _first_chunk(self, worker: Worker, upstream: httpx.Response, chunks: AsyncIterator[bytes]) -> bytes:
        try:
            return await anext(chunks, b"")
        except httpx.HTTPError:
            await upstream.aclose()
            self.on_failure(worker, False)
            raise _Retry("read") from None

    async def _relay(self, worker: Worker, request: ForwardRequest, upstream: httpx.Response, first: bytes,
                     chunks: AsyncIterator[bytes], on_done: Callable[[], None]) -> AsyncIterator[bytes]:
        now = time.perf_counter()
        self._observe_ttft(now - request.received_at)
        outcome = "ok"
        try:
            if first:
                yield first
            previous = now
            async for chunk in chunks:
                now = time.perf_counter()
                self._observe_itl(now - previous)
                previous = now
                yield chunk
            worker.breaker.record_success()
        except httpx.HTTPError as exc:
            outcome = "stream_error"
            self.on_failure(worker, False)
            logger.warning("stream %s from %s broke after its first byte: %s", request.request_id, worker.url, exc)
            message = (f"The worker serving this request failed after the stream started ({type(exc).__name__}); "
                       f"request {request.request_id} did not finish.")
            yield f"data: {json.dumps(error_body(message, 'server_error', code='worker_failed'))}\n\n".encode()
            yield b"data: [DONE]\n\n"
        finally:
            worker.in_flight -= 1
            await upstream.aclose()
            self._observe_done(request, worker, outcome)
            on_done()

    def _response_headers(self, upstream: httpx.Response, request: ForwardRequest) -> dict[str, str]:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_BY_HOP}
        headers["x-request-id"] = request.request_id
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
