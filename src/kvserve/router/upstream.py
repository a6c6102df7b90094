"""The router's HTTP/1.1 client for the worker hop: keep-alive connections per worker on asyncio
protocols, h11 for the protocol.

    UpstreamClient ── pool(worker url) ──► UpstreamPool: idle connections, newest first
                                              │ acquire: reuse one still open, else connect
                                              ▼
                                           _Connection (asyncio.Protocol + h11.Connection)
                                              │ request(): write request, read status + headers
                                              ▼
                                           UpstreamResponse: body_chunks() / read(), release()

A general client (httpx/httpcore) paid ~3 ms of CPU per proxied stream here, most of it in its
connection pool's bookkeeping and its per-chunk layers (docs/benchmarks.md section 12). This one
does only what the hop needs: one h11 state machine per connection, the body handed on in the
pieces the socket delivered (every SSE event that arrived in one read goes on as one piece; the
bytes are the same), no per-request tasks. A connection goes back to its pool only after a whole
response on a connection that may be kept; one that broke or was left early is closed.

A worker closes idle keep-alive connections on its own schedule (uvicorn: 5 s). A reused
connection that fails before any response byte is therefore tried once more on a new connection
to the same worker before the failure counts (as aiohttp and browsers do).
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import h11

# Bytes a connection buffers before it stops reading from its socket (the consumer is slow).
_HIGH_WATER = 256 * 1024


class UpstreamError(Exception):
    """The worker could not be reached (``connect``) or broke the exchange.

    Attributes:
        connect: the connection was never made (refused, unreachable, connect timeout).
    """

    def __init__(self, message: str, connect: bool = False):
        super().__init__(message)
        self.connect = connect


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 connection to a worker; bytes from the socket wait in ``_pending`` until the
    response reader feeds them to h11."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.h11 = h11.Connection(h11.CLIENT)
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._paused = False
        self._waiter: asyncio.Future | None = None
        self.closed = False
        self.timed_out = False
        self.reused = False  # served a whole response before the current one
        self.got_bytes = False  # something arrived for the current exchange

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        self._pending.append(data)
        self._pending_bytes += len(data)
        if self._pending_bytes > _HIGH_WATER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_timeout(self) -> None:
        self.timed_out = True
        self.abort()

    # -- used by UpstreamPool / UpstreamResponse ---------------------------------------------------

    def abort(self) -> None:
        """Close at once (the worker sees the request's client leave)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    async def receive(self, timeout: float) -> None:
        """Feed h11 what the socket delivered, waiting at most ``timeout`` s for something.

        Raises:
            UpstreamError: nothing came within ``timeout``.
        """
        if not self._pending and not self.closed:
            self._waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, self._on_timeout)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self._pending:
            data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            if self._paused:
                self._paused = False
                self.transport.resume_reading()
            self.h11.receive_data(data)
        elif self.timed_out:
            raise UpstreamError(f"no data from the worker within {timeout:g} s")
        else:
            self.h11.receive_data(b"")  # end of stream: h11 says whether the message was complete

    async def next_event(self, timeout: float):
        """The next h11 event of the response, reading as needed.

        Raises:
            UpstreamError: the connection broke or broke the protocol, or a read timed out.
        """
        try:
            while True:
                event = self.h11.next_event()
                if event is not h11.NEED_DATA:
                    return event
                await self.receive(timeout)
        except h11.ProtocolError as exc:
            raise UpstreamError(f"the worker broke the HTTP exchange: {exc}") from None

    def send(self, data: bytes) -> None:
        if self.closed or self.transport.is_closing():
            raise UpstreamError("the connection to the worker was closed")
        self.transport.write(data)

    @property
    def reusable(self) -> bool:
        return (not self.closed and self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE
                and not self._pending)


class UpstreamResponse:
    """A worker's response after its status line and headers; the body is read from it.

    Attributes:
        status: the HTTP status code.
        headers: ``(name, value)`` pairs, names lower-case, as the worker sent them.
    """

    def __init__(self, pool: UpstreamPool, connection: _Connection, status: int,
                 headers: list[tuple[bytes, bytes]], timeout: float):
        self.status, self.headers = status, headers
        self._pool, self._connection, self._timeout = pool, connection, timeout
        self._done = False

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: one piece per socket read (never empty).

        Raises:
            UpstreamError: the connection broke before the body's end.
        """
        connection = self._connection
        parts: list[bytes] = []
        try:
            while True:
                event = connection.h11.next_event()
                kind = type(event)
                if kind is h11.Data:
                    parts.append(event.data)
                    continue
                if event is h11.NEED_DATA:
                    if parts:
                        yield b"".join(parts)
                        parts = []
                    await connection.receive(self._timeout)
                    continue
                if kind is h11.EndOfMessage:
                    self._done = True
                    if parts:
                        yield b"".join(parts)
                    return
                raise UpstreamError(f"unexpected {kind.__name__} in the worker's response body")
        except h11.ProtocolError as exc:
            raise UpstreamError(f"the worker broke the HTTP exchange: {exc}") from None

    async def read(self) -> bytes:
        """The whole body (raises as ``body_chunks``)."""
        return b"".join([chunk async for chunk in self.body_chunks()])

    def abort(self) -> None:
        """Close the connection now (a client that left, or a stream given up)."""
        if self._connection is not None:
            self._connection.abort()

    def release(self) -> None:
        """Back to the pool after a whole response, else closed. Idempotent."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if self._done and connection.reusable:
            self._pool.put(connection)
        else:
            connection.abort()


class UpstreamPool:
    """Keep-alive connections to one worker.

    Args:
        url: ``http[s]://host[:port][/prefix]``; request targets are appended to the prefix.
        max_idle: idle connections kept (more are closed after their response).
        connect_timeout: seconds for a new connection.
    """

    def __init__(self, url: str, max_idle: int = 256, connect_timeout: float = 5.0):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.host_header = (parts.hostname if default_port else f"{parts.hostname}:{self.port}").encode()
        self.max_idle, self.connect_timeout = max_idle, connect_timeout
        self._idle: collections.deque[_Connection] = collections.deque()

    async def request(self, method: bytes, target: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      timeout: float) -> UpstreamResponse:
        """Send a request with ``body`` and return once the status line and headers arrived.

        ``timeout`` bounds each wait for bytes from the worker. Informational (1xx) responses
        are skipped.

        Raises:
            UpstreamError: as above (``connect`` when no connection could be made).
        """
        connection = self._take_idle()
        if connection is not None:
            try:
                return await self._exchange(connection, method, target, headers, body, timeout)
            except UpstreamError:
                if connection.got_bytes or connection.timed_out:
                    raise  # the worker answered part of it, or stayed silent: a real failure
                # the worker closed this idle connection before it read the request: once more, on a new one
        connection = await self._connect()
        return await self._exchange(connection, method, target, headers, body, timeout)

    async def _exchange(self, connection: _Connection, method: bytes, target: str,
                        headers: list[tuple[bytes, bytes]], body: bytes, timeout: float) -> UpstreamResponse:
        connection.got_bytes = False
        try:
            all_headers = [(b"host", self.host_header), (b"content-length", str(len(body)).encode()), *headers]
            data = connection.h11.send(h11.Request(method=method, target=(self.prefix + target).encode(),
                                                   headers=all_headers))
            data += connection.h11.send(h11.Data(data=body)) if body else b""
            data += connection.h11.send(h11.EndOfMessage())
        except h11.LocalProtocolError as exc:
            connection.abort()
            raise UpstreamError(f"the request cannot be sent: {exc}") from None
        try:
            connection.send(data)
            while True:
                event = await connection.next_event(timeout)
                if type(event) is h11.Response:
                    return UpstreamResponse(self, connection, event.status_code, list(event.headers), timeout)
                if type(event) is not h11.InformationalResponse:
                    raise UpstreamError(f"the worker closed the connection without a response ({event!r})")
        except UpstreamError:
            connection.abort()
            raise

    def _take_idle(self) -> _Connection | None:
        while self._idle:
            connection = self._idle.pop()
            if not connection.closed and not connection.transport.is_closing():
                return connection
        return None

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            _, connection = await asyncio.wait_for(
                loop.create_connection(lambda: _Connection(loop), self.host, self.port, ssl=self.ssl,
                                       server_hostname=self.host if self.ssl else None),
                self.connect_timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            raise UpstreamError(f"cannot connect to {self.host}:{self.port}: {exc or type(exc).__name__}",
                                connect=True) from None
        return connection

    def put(self, connection: _Connection) -> None:
        """Keep ``connection`` (a whole response was read from it) for a later request."""
        if len(self._idle) >= self.max_idle:
            connection.abort()
            return
        connection.h11.start_next_cycle()
        connection.reused = True
        self._idle.append(connection)

    def close(self) -> None:
        """Close every idle connection."""
        while self._idle:
            self._idle.pop().abort()


class UpstreamClient:
    """One pool per worker URL, made on first use.

    Args:
        max_idle_per_worker: idle keep-alive connections kept per worker.
        connect_timeout: seconds for a new connection.
    """

    def __init__(self, max_idle_per_worker: int = 256, connect_timeout: float = 5.0):
        self.max_idle, self.connect_timeout = max_idle_per_worker, connect_timeout
        self._pools: dict[str, UpstreamPool] = {}

    def pool(self, url: str) -> UpstreamPool:
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = UpstreamPool(url, self.max_idle, self.connect_timeout)
        return pool

    def discard(self, url: str) -> None:
        """Forget a worker's pool (it was removed), closing its idle connections."""
        pool = self._pools.pop(url, None)
        if pool is not None:
            pool.close()

    def close(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()
