"""API-key authentication: ``Authorization: Bearer <key>``, compared in constant time.

``/health``, ``/version`` and ``/metrics`` stay open so probes and scrapers need no key; the API
routes and the docs (``/docs``, ``/redoc``, ``/openapi.json``) need it when keys are set.
"""

from __future__ import annotations

import hmac

from fastapi import Request

from kvserve.api.errors import APIError

OPEN_PATHS = frozenset({"/health", "/version", "/metrics", "/metrics/"})

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


def authenticate(request: Request, api_keys: tuple[str, ...]) -> str:
    """Return the caller's key (``ANONYMOUS_KEY`` when the server has none configured).

    Raises:
        APIError: 401 ``invalid_api_key`` when keys are configured and the header is missing,
            malformed, or names an unknown key.
    """
    if not api_keys:
        return ANONYMOUS_KEY
    token = _bearer_token(request)
    if token is None:
        raise APIError(401, "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
                       code="invalid_api_key")
    matched = [hmac.compare_digest(token.encode(), key.encode()) for key in api_keys]
    if not any(matched):
        raise APIError(401, f"Incorrect API key provided: {_redact(token)}.", code="invalid_api_key")
    return token


def _redact(token: str) -> str:
    return token[:3] + "*" * max(0, min(len(token) - 7, 20)) + token[-4:] if len(token) > 8 else "****"
