"""uvicorn's HTTP/1.1 (h11) protocol with a deadline for request headers.

uvicorn closes idle keep-alive connections (``timeout_keep_alive``) but gives a client that has
connected, or has started a request, unlimited time to finish its headers: a slowloris client
sending a byte every few seconds holds the connection (and its memory) forever. Here a request's
headers must be complete within ``header_timeout`` seconds of the connection opening or of the
request's first byte; otherwise the client gets 408 (when it had sent part of a request) and the
connection closes. The body's deadline is the ASGI middleware's (``kvserve.api.middleware``).

    connect ──► [header timer] ──► headers complete: timer off ──► body, response ──► keep-alive
                    │ expires                                                          │ next byte
                    ▼                                                                  ▼
              408 (if partial) + close                                          [header timer]

Malformed requests (h11 errors, a header block over ``--h11-max-incomplete-event-size``) get
uvicorn's 400 with an OpenAI error body instead of plain text.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvserve.api.errors import error_body


def error_response_bytes(status: int, reason: str, message: str, code: str | None = None) -> bytes:
    """A complete HTTP/1.1 response with an OpenAI error body that closes the connection."""
    body = json.dumps(error_body(message, "invalid_request_error", None, code)).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\nconnection: close\r\n"
            f"content-length: {len(body)}\r\n\r\n")
    return head.encode("ascii") + body


def guarded_h11_protocol(header_timeout: float) -> type[asyncio.Protocol]:
    """An ``H11Protocol`` subclass enforcing ``header_timeout`` seconds (for ``uvicorn.Config(http=...)``)."""

    class GuardedH11Protocol(_GuardedH11Protocol):
        pass

    GuardedH11Protocol.header_timeout = header_timeout
    return GuardedH11Protocol


class _GuardedH11Protocol(H11Protocol):
    header_timeout: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._header_timer: asyncio.TimerHandle | None = None
        self._partial_request = False
        super().connection_made(transport)
        self._arm_header_timer()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._cancel_header_timer()
        elif self.conn.their_state is h11.IDLE:  # a request line / headers still incomplete
            self._partial_request = self._partial_request or bool(data)
            self._arm_header_timer()
        else:
            self._partial_request = False
            self._cancel_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._cancel_header_timer()
        self.transport.write(error_response_bytes(400, "Bad Request", f"Invalid HTTP request: {msg}"))
        self.transport.close()

    def _arm_header_timer(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout, self._header_timeout_expired)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout_expired(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self._partial_request:
            self.transport.write(error_response_bytes(
                408, "Request Timeout", f"The request headers did not arrive within {self.header_timeout:g} s.",
                code="request_timeout"))
        self._unset_keepalive_if_required()
        self.transport.close()
