"""API-key authentication: ``Authorization: Bearer <key>``, compared in constant time.

:class:`AuthMiddleware` checks the key before anything reads the body, on every route but the
probes of :data:`OPEN_PATHS` (``/health``, ``/ping``, ``/load``, ``/version`` (the version alone
without a key), ``/metrics``) and CORS preflights: the API routes, ``/invocations``, the tokenizer
and LoRA routes and the docs need it when keys are set, and so does a path that does not exist
(a 401, not a 404 that would tell which routes do). vLLM guards only ``/v1``, ``/v2``,
``/inference`` and ``/cohere`` (docs/api.md). The Anthropic routes (``/v1/messages...``) also take
the key as ``x-api-key``, and answer its 401 in Anthropic's shape (``kvserve.api.anthropic_errors``).
"""

from __future__ import annotations

import hmac
import json

from fastapi import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from kvserve.api.anthropic_errors import is_anthropic_path
from kvserve.api.errors import APIError

OPEN_PATHS = frozenset({"/health", "/ping", "/load", "/version", "/metrics", "/metrics/"})

# The key used for rate limiting when the server runs without API keys.
ANONYMOUS_KEY = "anonymous"


def _bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization")
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _anthropic_key(request: Request) -> str | None:
    """``x-api-key``, the header Anthropic's clients send, read on the Anthropic routes only."""
    if not is_anthropic_path(_local_path(request.scope)):
        return None
    token = request.headers.get("x-api-key", "").strip()
    return token or None


def authenticate(request: Request, api_keys: tuple[str, ...]) -> str:
    """Return the caller's key (``ANONYMOUS_KEY`` when the server has none configured): the
    ``Authorization: Bearer`` token, or on the Anthropic routes (``/v1/messages...``) also
    ``x-api-key`` (vLLM 0.32 reads only the bearer token).

    Raises:
        APIError: 401 ``invalid_api_key`` when keys are configured and the header is missing,
            malformed, or names an unknown key.
    """
    if not api_keys:
        return ANONYMOUS_KEY
    token = _bearer_token(request) or _anthropic_key(request)
    if token is None:
        how = "'x-api-key: YOUR_KEY' or " if is_anthropic_path(_local_path(request.scope)) else ""
        raise APIError(401, f"You didn't provide an API key. Send it as {how}'Authorization: Bearer YOUR_KEY'.",
                       code="invalid_api_key")
    matched = [hmac.compare_digest(token.encode(), key.encode()) for key in api_keys]
    if not any(matched):
        raise APIError(401, f"Incorrect API key provided: {_redact(token)}.", code="invalid_api_key")
    return token


def _redact(token: str) -> str:
    return token[:3] + "*" * max(0, min(len(token) - 7, 20)) + token[-4:] if len(token) > 8 else "****"


def api_key_of(request: Request) -> str:
    """The key :class:`AuthMiddleware` accepted for this request (``ANONYMOUS_KEY`` without keys,
    or on an open path)."""
    return request.scope.get("state", {}).get("api_key", ANONYMOUS_KEY)


class AuthMiddleware:
    """Refuse a request without a valid key (401 in OpenAI's error JSON) before its body is read;
    put the accepted key in ``scope["state"]["api_key"]`` (the rate limiter's key)."""

    def __init__(self, app: ASGIApp, api_keys: tuple[str, ...]) -> None:
        self.app = app
        self.api_keys = api_keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self.api_keys or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        try:
            key = authenticate(request, self.api_keys)
        except APIError as error:
            if _local_path(scope) in OPEN_PATHS:
                await self.app(scope, receive, send)
                return
            await _send_401(send, error)
            return
        scope.setdefault("state", {})["api_key"] = key
        await self.app(scope, receive, send)


def _local_path(scope: Scope) -> str:
    root = scope.get("root_path", "")
    path = scope["path"]
    return path[len(root):] if root and path.startswith(root) else path


async def _send_401(send: Send, error: APIError) -> None:
    body = json.dumps(error.body()).encode()
    await send({"type": "http.response.start", "status": 401,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
