"""Typed errors. User mistakes raise these with a message that says what was wrong and what is
allowed; the API layer maps them to OpenAI error JSON (4xx). ``assert`` is only for invariants."""


class KVServeError(Exception):
    """Base of all kvserve errors."""


class InvalidRequestError(KVServeError, ValueError):
    """A client's request is invalid (HTTP 400). ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class RequestRejectedError(KVServeError):
    """The engine cannot take the request now (HTTP 429 / 503), e.g. the waiting queue is full.

    Attributes:
        reason: ``queue_full``, ``slo_unattainable`` (both 429), ``shutting_down``, ``engine_dead``.
        retry_after: seconds the client should wait before retrying, or None (the API says 1).
        details: extra fields for the error object (an SLO refusal's prediction and target), or None.
    """

    def __init__(self, message: str, reason: str, retry_after: float | None = None, details: dict | None = None):
        super().__init__(message)
        self.message = message
        self.reason = reason
        self.retry_after = retry_after
        self.details = details


class CheckpointError(KVServeError, ValueError):
    """A model folder is missing a file, names an unsupported architecture, or has a tensor of the
    wrong name or shape."""


class ConfigError(KVServeError, ValueError):
    """A configuration value (a flag) is invalid or cannot work on this machine; raised at
    start-up, never while serving a request."""


class EngineDeadError(KVServeError):
    """The engine hit a failure it could not attribute to one request (a failed step where every
    request also failed alone, a scheduler error): it stops, and the server exits non-zero so a
    supervisor restarts it."""


class RequestFailedError(KVServeError):
    """Processing one request failed inside the engine (the others went on), or the engine died
    under it. The API answers 500 (or an in-band error event for a stream), naming the request."""

    def __init__(self, message: str, request_id: str | None = None):
        super().__init__(message)
        self.message = message
        self.request_id = request_id
