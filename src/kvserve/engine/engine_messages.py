"""Commands the event loop sends to the engine thread (``AsyncLLM``): typed, one class each."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from kvserve.engine.request_stream import RequestStream


@dataclass(frozen=True)
class AddRequests:
    """Queue ``stream.requests`` (all or none); their deltas go to ``stream``. ``done`` is
    resolved (or gets the admission error) on the requester's event loop."""

    stream: RequestStream
    done: asyncio.Future


@dataclass(frozen=True)
class AbortRequest:
    """Abort one request (client gone); unknown ids are ignored."""

    request_id: str


@dataclass(frozen=True)
class AbortAll:
    """Abort every request; their streams end with ``RequestRejectedError(message)``."""

    message: str


@dataclass(frozen=True)
class Shutdown:
    """Stop the engine loop."""


EngineCommand = AddRequests | AbortRequest | AbortAll | Shutdown
