"""Counting rejected requests (generation and pooling routes, ``GENERATION_PATHS``) where the
client sees the refusal: the HTTP layer.

Requests are refused in two places: the API layer (context too long, rate limits, shutdown,
authentication) and the engine (waiting queue full). Both end as an error response of
one of those routes (``/v1/messages`` seen here in OpenAI's shape, before
``AnthropicErrorMiddleware`` rewrites it) before any token, so this ASGI
middleware counts each refusal exactly once, labelled with the error's OpenAI ``code`` (e.g.
``queue_full``, ``shutting_down``, ``invalid_api_key``) or, without one, a reason by status
(``invalid_request`` for 400, ``rate_limited`` for 429). Server errors (5xx other than 503) are
failures, not refusals, and are not counted. Errors reported in-band after streaming began are
not refusals either (the status is already 200).
"""

from __future__ import annotations

import json
from typing import Any

from kvserve.metrics.prometheus import PrometheusStatsLogger

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses",
                              "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
                              "/v1/rerank", "/v2/rerank", "/invocations"})
_REASON_BY_STATUS = {400: "invalid_request", 401: "unauthorized", 404: "not_found", 429: "rate_limited",
                     503: "unavailable"}
_MAX_ERROR_BODY = 65536  # bytes read to find the error code


def rejection_reason_from_response(status: int, body: bytes) -> str | None:
    """The ``reason`` label of an error response, or None when it is not a refusal."""
    if status < 400 or (status >= 500 and status != 503):
        return None
    try:
        code = json.loads(body)["error"].get("code")
    except (ValueError, KeyError, TypeError, AttributeError):
        code = None
    return code or _REASON_BY_STATUS.get(status, str(status))


# vLLM's: the probes and /metrics itself are not counted.
UNCOUNTED_ROUTES = ("/metrics", "/health", "/load", "/ping", "/version", "/server_info")


def instrument_routes(app: Any, registry: Any) -> None:
    """Per-route HTTP series, as vLLM serves them (prometheus-fastapi-instrumentator's defaults,
    in the server's own registry): ``http_requests_total{handler,method,status}`` (status as
    ``2xx``, ``4xx``...), ``http_request_duration_seconds{handler,method}``,
    ``http_request_duration_highr_seconds``, ``http_request_size_bytes{handler}`` and
    ``http_response_size_bytes{handler}``; ``handler`` is the route's template
    (``/v1/responses/{response_id}``), ``none`` for an unknown path."""
    from prometheus_fastapi_instrumentator import Instrumentator

    Instrumentator(excluded_handlers=list(UNCOUNTED_ROUTES), registry=registry).instrument(app)


class RejectionCounterMiddleware:
    """ASGI middleware counting refused generation requests in ``metrics``.

    Args:
        app: the wrapped ASGI app.
        metrics: where ``kvserve:request_rejected_total{reason}`` lives.
    """

    def __init__(self, app: Any, metrics: PrometheusStatsLogger):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        status = 0
        body = bytearray()

        async def watch(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and status >= 400:
                if len(body) < _MAX_ERROR_BODY:
                    body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    reason = rejection_reason_from_response(status, bytes(body))
                    if reason is not None:
                        self.metrics.count_rejected(reason)
            await send(message)

        await self.app(scope, receive, watch)
