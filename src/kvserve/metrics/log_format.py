"""Log output set-up: level and format (``--log-level``, ``--log-format text|json``).

The JSON format writes one object per line (for log shippers)::

    {"time": "2026-11-30T02:45:21.123Z", "level": "INFO", "logger": "kvserve.stats",
     "message": "Avg prompt throughput: ...", "stats": {...}}

Structured fields that consumers pass in ``extra`` (``stats``, ``request``) become keys.
"""

from __future__ import annotations

import json
import logging
import sys
import time

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_EXTRA_KEYS = ("stats", "request")


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object (UTC ISO-8601 time with milliseconds)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key in _EXTRA_KEYS:
            if key in record.__dict__:
                entry[key] = record.__dict__[key]
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str = "info", log_format: str = "text", stream=None) -> logging.Handler:
    """Replace the root logger's handlers with one writing to ``stream`` (default stderr).

    Args:
        level: ``debug``, ``info``, ``warning`` or ``error`` (any case).
        log_format: ``text`` or ``json``.

    Returns:
        the installed handler.

    Raises:
        ValueError: unknown level or format (the message lists the allowed ones).
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log format {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"log level {level!r} is not one of debug, info, warning, error")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(numeric)
    return handler
