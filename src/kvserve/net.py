"""HTTP client transport for latency-sensitive clients (the benchmark client and the router).

httpcore writes a request's headers and its body in two ``send`` calls. With Nagle's algorithm on,
the body waits until the peer acknowledges the headers, and a peer that delays its ACK (Linux: up
to 40 ms) holds every POST that long. ``TCP_NODELAY`` sends each write at once, as aiohttp (vLLM's
benchmark client) does by default.
"""

from __future__ import annotations

import socket

import httpx


def nodelay_transport(limits: httpx.Limits, **kwargs) -> httpx.AsyncHTTPTransport:
    """An async transport with ``TCP_NODELAY`` on every connection (``kwargs``: e.g. ``verify``)."""
    return httpx.AsyncHTTPTransport(limits=limits, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
                                    **kwargs)
