"""ASGI middleware of the server: request ids, and limits on what a request may send.

    client ──► CORS ──► RequestIdMiddleware ──► RequestGuardMiddleware ──► FastAPI routes
                        X-Request-Id echoed,     headers <= N (431), body <= max bytes (413),
                        request.state.request_id body within the read timeout (408)

``RequestIdMiddleware`` answers every response with ``X-Request-Id``: the client's own (as vLLM
with ``--enable-request-id-headers``) or a new ``uuid4().hex``, and exposes it to handlers as
``request.state.request_id`` (:func:`request_id_of`), the id the engine should use for the
request's logs and traces.

``RequestGuardMiddleware`` reads a request's whole body before the route runs (FastAPI reads it
whole anyway, to parse JSON) so that a client announcing or sending too much, or too slowly, is
answered in OpenAI's error JSON without holding the handler.
"""

from __future__ import annotations

import asyncio
import json
import uuid

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.api.errors import error_body
from kvserve.heap import trim

REQUEST_ID_HEADER = "X-Request-Id"
# A body at least this large is followed by a malloc_trim once answered: parsing a 20 MB prompt
# left the server's RSS at 2.0 GB (from 690 MB) for good.
LARGE_BODY_BYTES = 4 << 20
MAX_REQUEST_ID_LENGTH = 256


def request_id_of(request: Request) -> str:
    """The request's id: its ``X-Request-Id`` header, or the one the server made up for it."""
    return request.state.request_id


async def _send_error(send: Send, status: int, message: str, code: str | None = None,
                      param: str | None = None, close: bool = False) -> None:
    body = json.dumps(error_body(message, "invalid_request_error", param, code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class RequestIdMiddleware:
    """Echo (or create) ``X-Request-Id`` and put it in ``scope["state"]["request_id"]``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = next((v.decode("latin-1").strip() for k, v in scope["headers"] if k == b"x-request-id"), "")
        too_long = len(given) > MAX_REQUEST_ID_LENGTH
        request_id = given if given and not too_long else uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        if too_long:
            await _send_error(send_with_id, 400, f"The {REQUEST_ID_HEADER} header is {len(given)} characters "
                              f"long; at most {MAX_REQUEST_ID_LENGTH} are allowed.", param=REQUEST_ID_HEADER)
            return
        await self.app(scope, receive, send_with_id)


class RequestGuardMiddleware:
    """Refuse requests with too many headers (431), too large a body (413) or a body that does
    not arrive within ``body_timeout`` seconds (408); replay the body read to the app."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float, max_header_count: int) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.body_timeout = body_timeout
        self.max_header_count = max_header_count

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = scope["headers"]
        if len(headers) > self.max_header_count:
            await _send_error(send, 431, f"The request has {len(headers)} headers; at most "
                              f"{self.max_header_count} are allowed.", close=True)
            return
        length = next((v for k, v in headers if k == b"content-length"), None)
        chunked = any(k == b"transfer-encoding" for k, _ in headers)
        if length is not None and length.isdigit() and int(length) > self.max_body_bytes:
            await self._too_large(send, f"{int(length)} bytes")
            return
        if not chunked and (length is None or length in (b"", b"0")):
            await self.app(scope, receive, send)
            return
        body = await self._read_body(receive, send)
        if body is not None:
            await self.app(scope, _replay(body, receive), send)
            if len(body) >= LARGE_BODY_BYTES:  # its parse freed far more than it: give that back
                del body
                await asyncio.to_thread(trim)

    async def _read_body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering 413/408 (or when the client went away)."""
        chunks, size = [], 0
        deadline = asyncio.get_running_loop().time() + self.body_timeout
        while True:
            remaining = deadline - asyncio.get_running_loop().time()
            try:
                message = await asyncio.wait_for(receive(), timeout=max(remaining, 0.0))
            except asyncio.TimeoutError:
                await _send_error(send, 408, f"The request body did not arrive within {self.body_timeout:g} s.",
                                  code="request_timeout", close=True)
                return None
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send, f"more than {self.max_body_bytes} bytes")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _too_large(self, send: Send, size: str) -> None:
        await _send_error(send, 413, f"The request body is {size}; at most {self.max_body_bytes} bytes are "
                          "allowed (--max-request-body-bytes).", code="request_too_large", close=True)


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # after the body: wait for the disconnect, as the app expects

    return replay
