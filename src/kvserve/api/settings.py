"""HTTP server settings: one frozen dataclass built once from the command line (and environment).

Flag names follow vLLM's OpenAI server where one exists (``--host``, ``--port``, ``--api-key``,
``--served-model-name``, ``--chat-template``).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

API_KEY_ENV = "KVSERVE_API_KEY"


@dataclass(frozen=True)
class ServerSettings:
    """How the OpenAI-compatible server listens, authenticates and limits clients.

    Attributes:
        host, port: where uvicorn listens.
        api_keys: accepted ``Authorization: Bearer`` keys; empty = no authentication.
        served_model_name: the name clients send in ``model``; ``None`` = the engine's
            ``model_name``.
        chat_template: a Jinja chat template overriding the tokenizer's (the text, not a path).
        requests_per_minute: per-key request rate limit; ``None`` = unlimited.
        tokens_per_minute: per-key token rate limit (prompt + max_tokens charged at admission);
            ``None`` = unlimited.
        max_concurrent_requests: per-key cap on requests in flight; ``None`` = unlimited.
        shutdown_timeout: seconds running requests may take to finish after SIGTERM.
        log_level: uvicorn's log level.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    served_model_name: str | None = None
    chat_template: str | None = None
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent_requests: int | None = None
    shutdown_timeout: float = 30.0
    log_level: str = "info"


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """Add the server's flags to ``parser`` (read back with :func:`settings_from_args`)."""
    group = parser.add_argument_group("OpenAI-compatible server")
    group.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    group.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    group.add_argument("--api-key", action="append", default=[], dest="api_key",
                       help=f"accepted API key; repeat or comma-separate for several (env {API_KEY_ENV})")
    group.add_argument("--served-model-name", default=None,
                       help="the name clients send as `model` (default: the model folder's name)")
    group.add_argument("--chat-template", default=None,
                       help="path to a Jinja chat template file, or the template text itself")
    group.add_argument("--requests-per-minute", type=_positive_float, default=None,
                       help="per-key request rate limit (default: none)")
    group.add_argument("--tokens-per-minute", type=_positive_float, default=None,
                       help="per-key token rate limit, prompt + max_tokens (default: none)")
    group.add_argument("--max-concurrent-requests", type=_positive_int, default=None,
                       help="per-key cap on requests in flight (default: none)")
    group.add_argument("--shutdown-timeout", type=_non_negative_float, default=30.0,
                       help="seconds running requests may take to finish after SIGTERM")
    group.add_argument("--uvicorn-log-level", default="info", dest="uvicorn_log_level",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])


def _number(kind, minimum: float, inclusive: bool):
    def parse(text: str):
        value = kind(text)
        if not (value >= minimum if inclusive else value > minimum) or value != value:
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}, got {text}")
        return value

    return parse


_positive_float = _number(float, 0, inclusive=False)
_non_negative_float = _number(float, 0, inclusive=True)
_positive_int = _number(int, 1, inclusive=True)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port 0-65535, got {text}")
    return value


def parse_api_keys(values: list[str] | tuple[str, ...], env_value: str | None) -> tuple[str, ...]:
    """Split repeated and comma-separated keys, add the environment's, drop blanks and repeats."""
    keys: list[str] = []
    for value in [*values, env_value or ""]:
        for key in value.split(","):
            key = key.strip()
            if key and key not in keys:
                keys.append(key)
    return tuple(keys)


def _read_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8")
    return value


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Build :class:`ServerSettings` from parsed flags and ``KVSERVE_API_KEY``."""
    return ServerSettings(
        host=args.host,
        port=args.port,
        api_keys=parse_api_keys(args.api_key, os.environ.get(API_KEY_ENV)),
        served_model_name=args.served_model_name,
        chat_template=_read_chat_template(args.chat_template),
        requests_per_minute=args.requests_per_minute,
        tokens_per_minute=args.tokens_per_minute,
        max_concurrent_requests=args.max_concurrent_requests,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.uvicorn_log_level,
    )
