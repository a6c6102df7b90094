"""The router's HTTP/1.1 client for the worker hop: keep-alive connections per worker on asyncio
protocols, httptools (llhttp, as uvicorn's fast server protocol) to read responses.

    UpstreamClient ── pool(worker url) ──► UpstreamPool: idle connections, newest first
                                              │ acquire: reuse one still open, else connect
                                              ▼
                                           _Connection (asyncio.Protocol + a response parser)
                                              │ request(): one write (head + body), then the
                                              ▼ status line and headers
                                           UpstreamResponse: body_chunks() / read(), release()

A general client (httpx/httpcore) cost ~3 ms of CPU per proxied stream here, and a pure-Python
protocol (h11) still most of 1 ms (docs/benchmarks.md section 5.6). This one does only what the hop
needs: the request head is written from the forwarded headers in one piece (their values come from
the router's own HTTP parser, which refuses CR and LF), the response is parsed in C as it arrives,
and the body is handed on in the pieces the socket delivered (every SSE event that arrived in one
read goes on as one piece; the bytes are the same). No per-request tasks. A connection goes back to
its pool only after a whole response that allows keep-alive; one that broke or was left early is
closed.

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

import httptools

# Body bytes a connection buffers before it stops reading from its socket (the consumer is slow).
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
    """One HTTP/1.1 connection to a worker. The parser's callbacks fill the current response's
    status, headers and body pieces; the response reader takes them."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self.closed = False
        self.timed_out = False
        self.error: str | None = None
        self.reused = False  # served a whole response before the current one
        self._new_exchange()

    def _new_exchange(self) -> None:
        self.got_bytes = False  # something arrived for the current exchange
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.framed = False  # content-length or chunked: the body's end is known without a close
        self.body: list[bytes] = []
        self.body_bytes = 0
        self.complete = False
        self.keep_alive = False

    # -- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = f"the worker broke the HTTP exchange: {exc}"
            self.abort()
            return
        if self.body_bytes > _HIGH_WATER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self.framed and not self.complete:
            self.complete = True  # a body without length ends with the connection
        self._wake()

    # -- httptools callbacks -----------------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name in (b"content-length", b"transfer-encoding"):
            self.framed = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if self.status >= 200:
            self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.body_bytes += len(body)

    def on_message_complete(self) -> None:
        if self.status < 200:  # an informational response: the real one follows
            self.headers, self.framed = [], False
            return
        self.keep_alive = self.parser.should_keep_alive()  # only meaningful inside the callback
        self.complete = True

    # -- used by UpstreamPool / UpstreamResponse ---------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _on_timeout(self) -> None:
        self.timed_out = True
        self.abort()

    def abort(self) -> None:
        """Close at once (the worker sees the request's client leave)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        self._wake()

    async def wait(self, timeout: float) -> None:
        """Until the parser produced more or the connection ended.

        Raises:
            UpstreamError: the connection ended with an error, or nothing came within ``timeout``.
        """
        if not self.closed:
            self._waiter = self.loop.create_future()
            timer = self.loop.call_later(timeout, self._on_timeout)
            try:
                await self._waiter
            finally:
                timer.cancel()
                self._waiter = None
        if self.closed and not self.complete and not self.body and not self.headers_done:
            raise UpstreamError(self._failure(timeout))

    def _failure(self, timeout: float) -> str:
        if self.timed_out:
            return f"no data from the worker within {timeout:g} s"
        return self.error or "the worker closed the connection before the response ended"

    def take_body(self) -> bytes:
        body = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.body_bytes = 0
        if self._paused:
            self._paused = False
            self.transport.resume_reading()
        return body

    def send(self, data: bytes) -> None:
        if self.closed or self.transport.is_closing():
            raise UpstreamError("the connection to the worker was closed")
        self.transport.write(data)

    @property
    def reusable(self) -> bool:
        return not self.closed and self.complete and self.keep_alive


class UpstreamResponse:
    """A worker's response after its status line and headers; the body is read from it.

    Attributes:
        status: the HTTP status code.
        headers: ``(name, value)`` pairs, names lower-case, as the worker sent them.
    """

    def __init__(self, pool: UpstreamPool, connection: _Connection, timeout: float):
        self.status, self.headers = connection.status, connection.headers
        self._pool, self._connection, self._timeout = pool, connection, timeout
        self._done = False

    async def body_chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives: one piece per socket read (never empty).

        Raises:
            UpstreamError: the connection broke before the body's end.
        """
        connection = self._connection
        while True:
            if connection.body:
                yield connection.take_body()
            elif connection.complete:
                self._done = True
                return
            elif connection.closed:
                raise UpstreamError(connection._failure(self._timeout))
            else:
                await connection.wait(self._timeout)

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
        self.prefix = parts.path.rstrip("/").encode()
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        default_port = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.host_header = (parts.hostname if default_port else f"{parts.hostname}:{self.port}").encode()
        self.max_idle, self.connect_timeout = max_idle, connect_timeout
        self._idle: collections.deque[_Connection] = collections.deque()

    async def request(self, method: bytes, target: str, headers: list[tuple[bytes, bytes]], body: bytes,
                      timeout: float) -> UpstreamResponse:
        """Send a request with ``body`` and return once the status line and headers arrived.

        ``timeout`` bounds each wait for bytes from the worker. Informational (1xx) responses
        are skipped. ``headers`` are written as given: names and values from a parsed request
        (no CR or LF), without Host and Content-Length, which are set here.

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
        connection._new_exchange()
        head = [method, b" ", self.prefix + target.encode(), b" HTTP/1.1\r\nhost: ", self.host_header,
                b"\r\ncontent-length: ", str(len(body)).encode(), b"\r\n"]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"\r\n")
        try:
            connection.send(b"".join(head) + body)
            while not connection.headers_done:
                await connection.wait(timeout)
        except UpstreamError:
            connection.abort()
            raise
        return UpstreamResponse(self, connection, timeout)

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
