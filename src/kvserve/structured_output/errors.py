"""Errors of structured outputs. Each is a client's mistake (HTTP 400) naming the request field."""

from __future__ import annotations

from kvserve.errors import InvalidRequestError


class StructuredOutputError(InvalidRequestError):
    """A structured-output spec is malformed or the grammar backend rejects it.

    ``param`` names the request field the spec came from (``response_format``,
    ``structured_outputs``, ``guided_json``...), so the API words a 400 about that field.
    """


class GrammarCompileTimeout(StructuredOutputError):
    """Compiling a spec took longer than the configured limit; the request is refused (HTTP 400).

    The compile itself may still finish on its worker thread; its result then enters the cache.
    """
