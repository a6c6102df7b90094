"""OpenAI-shaped error responses and the exception handlers that produce them.

Every error leaves the server as ``{"error": {"message", "type", "param", "code"}}`` (the OpenAI
API reference's error object) with the matching status:

    400 invalid_request_error   bad parameters (ours, the engine's, or pydantic's validation)
    401 invalid_request_error   missing or wrong API key (code ``invalid_api_key``)
    404 invalid_request_error   unknown model (code ``model_not_found``) or route
    405 invalid_request_error   method not allowed on the route (+ ``Allow``)
    408/413/431                 body or headers too slow, too large, too many (``kvserve.api.middleware``)
    429 rate_limit_exceeded     rate limits, concurrency cap, full engine queue, latency targets
                                predicted to be missed (+ ``Retry-After``)
    503 service_unavailable     engine not ready or shutting down
    500 server_error            the engine failed on this request (the message names it), or
                                anything else (a generic message; the exception is logged)
"""

from __future__ import annotations

import logging
import math

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvserve.errors import InvalidRequestError, RequestFailedError, RequestRejectedError

logger = logging.getLogger(__name__)

_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    431: "invalid_request_error",
    429: "rate_limit_exceeded",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error the HTTP layer answers with a given status and OpenAI error body.

    Attributes:
        status_code: HTTP status.
        message: what was wrong and what is allowed.
        type: OpenAI error ``type``; defaults by status (see the module docstring).
        param: the offending request field, or None.
        code: OpenAI error ``code`` (``invalid_api_key``, ``model_not_found``, ...), or None.
        retry_after: seconds for a ``Retry-After`` header (429/503), or None.
        headers: further response headers (``Allow`` on a 405), or None.
        details: further fields of the error object (an SLO refusal's prediction), or None.
    """

    def __init__(self, status_code: int, message: str, *, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 retry_after: float | None = None, headers: dict[str, str] | None = None,
                 details: dict | None = None):
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type or _TYPE_BY_STATUS.get(status_code, "server_error")
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.headers = headers
        self.details = details

    def body(self) -> dict:
        body = error_body(self.message, self.type, self.param, self.code)
        if self.details:
            body["error"].update(self.details)
        return body


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``.

    A lone UTF-16 surrogate that a message or param quotes from the request (a JSON ``"\\ud800"``
    escape in a model name, say) is written as its ``\\ud800`` escape: it cannot be encoded as
    UTF-8, so the response itself would fail with a 500."""
    return {"error": {"message": _utf8_safe(message), "type": type, "param": _utf8_safe(param),
                      "code": code}}


def _utf8_safe(text: str | None) -> str | None:
    if text is None:
        return None
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception to the :class:`APIError` the client should see (500 for unknown ones)."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return APIError(400, exc.message, param=exc.param)
    if isinstance(exc, RequestRejectedError):
        status = 429 if exc.reason in ("queue_full", "slo_unattainable") else 503
        return APIError(status, exc.message, code=exc.reason, retry_after=exc.retry_after or 1, details=exc.details)
    if isinstance(exc, RequestFailedError):
        named = f" (request {exc.request_id})" if exc.request_id else ""
        return APIError(500, f"The server failed while processing this request{named}: {exc.message}",
                        type="server_error")
    logger.exception("unhandled error while serving a request", exc_info=exc)
    return APIError(500, "The server had an error while processing your request.", type="server_error")


def error_response(exc: BaseException) -> JSONResponse:
    """A JSON response for ``exc`` (status, OpenAI body, ``Retry-After`` when known)."""
    error = to_api_error(exc)
    headers = dict(error.headers or {})
    if error.retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after)))
    return JSONResponse(error.body(), status_code=error.status_code, headers=headers or None)


def _validation_error(exc: RequestValidationError) -> APIError:
    """FastAPI's 422 becomes a 400 naming the first bad field (``messages.0.role`` style).

    A field that takes one of several shapes (``content``: a string or a list of blocks) gets
    one error per shape, each under the shape's name (``content.str``, ``content.list[...]``):
    the field is named as the request names it (the shape names and tagged-union tags dropped),
    and of its errors those reaching deepest into the value are told (the shape the client
    meant), several joined with "or"."""
    errors = exc.errors()
    if not errors:
        return APIError(400, "Invalid request.")
    first = errors[0]
    if first.get("type") == "json_invalid":
        return APIError(400, f"The request body is not valid JSON: {first.get('msg', 'invalid value')}")
    body = getattr(exc, "body", None)
    paths = [_request_path(error, body) for error in errors]
    chosen = [0]
    if paths[0] != [part for part in first.get("loc", ()) if part != "body"]:
        # one field's alternatives: the errors within the field the first one names
        group = [i for i, path in enumerate(paths) if path[:len(paths[0])] == paths[0]]
        deepest = max(group, key=lambda i: len(paths[i]))
        chosen = [i for i in group if paths[i] == paths[deepest]]
    param = ".".join(str(part) for part in paths[chosen[0]]) or None
    messages = list(dict.fromkeys(errors[i].get("msg", "invalid value") for i in chosen))
    message = "; or ".join(messages)
    if param:
        message = f"Invalid value for '{param}': {message}"
    return APIError(400, message, param=param)


_SHAPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none", "bytes"})


def _request_path(error: dict, body) -> list:
    """An error's location as the request names it: union shape names (``str``,
    ``list[...]``, ``function-after[...]``) and tagged-union tags (the item's ``type``) dropped,
    found by walking ``body`` (without it, by their names)."""
    loc = [part for part in error.get("loc", ()) if part != "body"]
    path: list = []
    node = body
    for at, part in enumerate(loc):
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif body is not None and (isinstance(node, (dict, list)) or at > 0):
            last = at == len(loc) - 1
            if isinstance(node, dict) and last and error.get("type") == "missing":
                path.append(part)  # the missing field itself
            # else: a shape name or a tag; ``node`` stays
        elif not (isinstance(part, str) and ("[" in part or part in _SHAPE_NAMES)):
            path.append(part)
    return path


def install_error_handlers(app: FastAPI) -> None:
    """Route every error a handler raises through :func:`error_response`."""

    async def on_error(_: Request, exc: Exception) -> JSONResponse:
        return error_response(exc)

    async def on_validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_validation_error(exc))

    async def on_http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = dict(exc.headers or {})  # Starlette's 405 names the allowed methods in Allow
        message = str(exc.detail)
        if exc.status_code == 405 and "allow" in {k.lower() for k in headers}:
            allowed = next(v for k, v in headers.items() if k.lower() == "allow")
            message = f"Method Not Allowed; this route accepts {allowed}."
        return error_response(APIError(exc.status_code, message, headers=headers))

    app.add_exception_handler(APIError, on_error)
    app.add_exception_handler(InvalidRequestError, on_error)
    app.add_exception_handler(RequestRejectedError, on_error)
    app.add_exception_handler(RequestFailedError, on_error)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_error)
