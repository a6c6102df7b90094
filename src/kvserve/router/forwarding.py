"""The router's ASGI entry: forwarded paths go to the proxy, the rest to the FastAPI app.

    uvicorn ─► RouterApp ─┬─ POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize,
                          │     /v1/messages, /v1/messages/count_tokens
                          │     key, JSON body, model, prompt hashes, rate limit ─► Proxy.forward
                          │  POST /v1/embeddings, /pooling, /classify, /score, /v1/score, /rerank,
                          │     /v1/rerank, /v2/rerank (a pooling model's: no prompt hashes)
                          └─ anything else (and the lifespan) ─► FastAPI (health, metrics, models,
                                                                 workers)

The forwarded paths skip FastAPI: its routing, request object, exception middleware and
StreamingResponse (a task group per stream) cost more CPU per request than the rest of the hop
(docs/benchmarks.md section 5.6). Errors still answer in OpenAI's JSON (``api.errors``), on
``/v1/messages`` in Anthropic's (``api.anthropic_errors``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import TYPE_CHECKING

from fastapi import FastAPI, Request

from kvserve.api.anthropic_errors import anthropic_error_response, is_anthropic_path
from kvserve.api.auth import authenticate
from kvserve.api.errors import APIError, error_response
from kvserve.router.proxy import ForwardRequest

if TYPE_CHECKING:
    from kvserve.router.app import Router

logger = logging.getLogger(__name__)

FORWARDED_PATHS = frozenset({"/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize",
                             "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank",
                             "/v1/rerank", "/v2/rerank",
                             "/v1/messages", "/v1/messages/count_tokens",
                             "/v1/responses"})  # POST only: a stored response lives on its worker (docs/router.md)
# Client headers passed on to the worker (besides X-Request-Id, which the router sets).
_PASSED_HEADERS = frozenset({b"authorization", b"content-type", b"accept", b"user-agent", b"openai-organization",
                             b"x-api-key", b"anthropic-version", b"anthropic-beta"})  # the last three: /v1/messages


class _ClientLeft(Exception):
    """The client disconnected before its request body arrived."""


class RouterApp:
    """The router's ASGI app: requests to ``FORWARDED_PATHS`` go to the proxy from here, the rest
    (and the lifespan) to the FastAPI app ``app``."""

    def __init__(self, router: Router, app: FastAPI):
        self.router, self.app = router, app

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in FORWARDED_PATHS:
            return await self.app(scope, receive, send)
        try:
            if scope["method"] != "POST":
                raise APIError(405, "Method Not Allowed; this route accepts POST.", headers={"Allow": "POST"})
            await self._forward(scope, receive, send)
        except _ClientLeft:
            return
        except Exception as exc:  # noqa: BLE001 - every failure becomes the client's error response
            if not isinstance(exc, APIError):
                logger.exception("forwarding %s failed", scope["path"])
            respond = anthropic_error_response if is_anthropic_path(scope["path"]) else error_response
            try:
                await respond(exc)(scope, receive, send)
            except RuntimeError:
                pass  # the response had started: uvicorn closes the connection

    async def _forward(self, scope: dict, receive, send) -> None:
        received = time.perf_counter()
        router = self.router
        key = authenticate(Request(scope), router.config.api_keys)
        raw = await _read_body(receive)
        try:
            body = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise APIError(400, f"The request body is not valid JSON: {exc}") from None
        if not isinstance(body, dict):
            raise APIError(400, "The request body must be a JSON object.")
        model = body.get("model") if isinstance(body.get("model"), str) else None
        router.check_model(model)
        path = scope["path"]
        route = router.route_request(path, body, model)
        router.limiter.acquire(key, route.num_tokens + _max_tokens(body))
        request_id = None
        headers = []
        for name, value in scope["headers"]:
            if name in _PASSED_HEADERS:
                headers.append((name, value))
            elif name == b"x-request-id":
                request_id = value.decode("latin-1")
        forward_request = ForwardRequest(path, raw, headers, request_id or uuid.uuid4().hex, model, route,
                                         bool(body.get("stream")), received)
        await router.proxy.forward(forward_request, send, receive, lambda: router.limiter.release(key))


async def _read_body(receive) -> bytes:
    """The request body from ASGI ``receive``. Raises _ClientLeft if the client left."""
    message = await receive()
    parts = []
    while True:
        if message["type"] == "http.disconnect":
            raise _ClientLeft
        parts.append(message.get("body", b""))
        if not message.get("more_body"):
            return parts[0] if len(parts) == 1 else b"".join(parts)
        message = await receive()


def _max_tokens(body: dict) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens", body.get("max_output_tokens")))
    return value if isinstance(value, int) and value > 0 else 16
