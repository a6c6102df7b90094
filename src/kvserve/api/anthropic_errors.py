"""Errors of the Anthropic routes in Anthropic's shape (its API reference, "Errors"):
``{"type": "error", "error": {"type": ..., "message": ...}}`` with the HTTP status.

    400 invalid_request_error   (also 405, 408, 422, 431)   413 request_too_large
    401 authentication_error    403 permission_error         404 not_found_error
    429 rate_limit_error        500 api_error                503/529 overloaded_error
    504 timeout_error

Every error of the app is first made in OpenAI's shape (``kvserve.api.errors``: handlers,
validation, the API key, body limits); :class:`AnthropicErrorMiddleware` rewrites the ones
answered on :func:`is_anthropic_path` paths, so no error on ``/v1/messages`` leaves in OpenAI's
shape whichever layer made it. ``param`` has no place in Anthropic's error, so a message that
does not name its field is prefixed with it. The OpenAI routes keep OpenAI's shape. (vLLM 0.32
answers ``/v1/messages`` errors with its OpenAI error's ``type`` and message, and request
validation errors in OpenAI's shape.)
"""

from __future__ import annotations

import json

from starlette.datastructures import MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvserve.api.anthropic_protocol import AnthropicError, AnthropicErrorResponse
from kvserve.api.errors import APIError, error_response

MESSAGES_PATH = "/v1/messages"

_TYPE_BY_STATUS = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error",
                   500: "api_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def is_anthropic_path(path: str) -> bool:
    """``/v1/messages`` and every path under it (``count_tokens``; an unknown one is a 404 in
    Anthropic's shape)."""
    return path == MESSAGES_PATH or path.startswith(MESSAGES_PATH + "/")


def error_type(status: int) -> str:
    """Anthropic's error ``type`` of an HTTP status (other 4xx: ``invalid_request_error``,
    other 5xx: ``api_error``)."""
    return _TYPE_BY_STATUS.get(status, "invalid_request_error" if status < 500 else "api_error")


def anthropic_error(status: int, message: str, param: str | None = None) -> AnthropicErrorResponse:
    """The Anthropic error body of a status, message and (OpenAI) ``param``."""
    if param and param not in message:
        message = f"{param}: {message}"
    return AnthropicErrorResponse(error=AnthropicError(type=error_type(status), message=message))


def from_api_error(error: APIError) -> AnthropicErrorResponse:
    return anthropic_error(error.status_code, error.message, error.param)


def anthropic_error_response(exc: BaseException) -> JSONResponse:
    """As ``kvserve.api.errors.error_response`` (status, ``Retry-After``), in Anthropic's shape:
    for code that answers outside the app (the router's forwarded paths)."""
    response = error_response(exc)
    headers = {k: v for k, v in response.headers.items() if k.lower() not in ("content-length", "content-type")}
    return JSONResponse(json.loads(_translated(response.status_code, response.body)),
                        status_code=response.status_code, headers=headers or None)


def _translated(status: int, body: bytes) -> bytes | None:
    """An OpenAI error body as Anthropic's, or None when ``body`` is not one."""
    try:
        error = json.loads(body)["error"]
        message, param = error["message"], error.get("param")
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(message, str) or not (param is None or isinstance(param, str)):
        return None
    return anthropic_error(status, message, param).model_dump_json().encode()


class AnthropicErrorMiddleware:
    """Rewrite OpenAI-shaped JSON error responses (status >= 400) of the Anthropic paths into
    Anthropic's shape (status and headers kept, ``content-length`` updated). Other responses,
    streams included, pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_anthropic_path(_local_path(scope)):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        body = bytearray()

        async def rewrite(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message  # held until the body is complete
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            body.extend(message.get("body", b""))
            if message.get("more_body", False):
                return
            translated = _translated(start["status"], bytes(body))
            if translated is not None:
                headers = MutableHeaders(scope=start)
                headers["content-length"] = str(len(translated))
                headers["content-type"] = "application/json"
            await send(start)
            await send({"type": "http.response.body", "body": translated if translated is not None else bytes(body)})

        await self.app(scope, receive, rewrite)


def _local_path(scope: Scope) -> str:
    root = scope.get("root_path", "")
    path = scope["path"]
    return path[len(root):] if root and path.startswith(root) else path
