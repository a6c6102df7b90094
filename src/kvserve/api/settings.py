"""HTTP server settings: one frozen dataclass built once from the command line (and environment).

Flag names and meanings follow ``vllm serve``'s ``Frontend`` group (``--host``, ``--port``,
``--api-key``, ``--allowed-origins``, ``--root-path``, ``--ssl-keyfile``, ...); vLLM frontend flags
kvserve does not implement are refused by name (``kvserve.vllm_compat``). kvserve's own flags
(rate limits, drain timeout, request-size and read-time limits) are in the ``kvserve`` group.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvserve.lora.flags import RUNTIME_UPDATING_ENV, LoRAModulePath, env_allows_runtime_updating, lora_module
from kvserve.vllm_compat import FRONTEND_REFUSED_FLAGS, add_refused_flags

logger = logging.getLogger(__name__)

API_KEY_ENV = "KVSERVE_API_KEY"
VLLM_API_KEY_ENV = "VLLM_API_KEY"
DEFAULT_MAX_REQUEST_BODY_BYTES = 32 * 2**20
"""32 MiB: a 128k-token prompt as a JSON array of ids is under 1 MiB; this leaves room for batches."""
H11_MAX_INCOMPLETE_EVENT_SIZE = 4 * 2**20  # vLLM's default (bytes of a header block being parsed)
H11_MAX_HEADER_COUNT = 256  # vLLM's default


@dataclass(frozen=True)
class ServerSettings:
    """How the OpenAI-compatible server listens, authenticates and limits clients.

    Attributes:
        host, port: where uvicorn listens (``kvserve serve`` defaults to ``0.0.0.0``, all IPv4
            interfaces, as ``vllm serve``; this dataclass, used by tests and embedders, to loopback).
        api_keys: accepted ``Authorization: Bearer`` keys; empty = no authentication.
        api_key_env: the environment variable a key came from (for the printed curl hint), or None.
        served_model_name: the name responses report as ``model``; ``None`` = the engine's
            ``model_name``.
        served_model_aliases: further names clients may send as ``model`` (vLLM's
            ``--served-model-name a b``: ``a`` is reported, ``a`` and ``b`` accepted).
        model_path: the served checkpoint's absolute path, reported as ``root`` by ``/v1/models``
            (as vLLM reports its ``--model``), so that a benchmark client finds the tokenizer.
        chat_template: a Jinja chat template overriding the tokenizer's (the text, not a path).
        response_role: the assistant message's role in chat responses.
        requests_per_minute, tokens_per_minute, max_concurrent_requests: per-key limits (None =
            unlimited; tokens are prompt + max_tokens, charged at admission).
        shutdown_timeout: seconds running requests may take to finish after SIGTERM.
        log_level: uvicorn's log level; ``access_log``: uvicorn's access lines on or off.
        root_path: the path prefix a proxy strips (FastAPI ``root_path``), e.g. ``/llm``.
        allowed_origins, allowed_methods, allowed_headers, allow_credentials: CORS (vLLM's defaults:
            every origin, method and header; no credentials).
        ssl_keyfile, ssl_certfile, ssl_ca_certs, ssl_cert_reqs, ssl_ciphers: TLS (uvicorn's).
        disable_fastapi_docs: no ``/docs``, ``/redoc``, ``/openapi.json`` (otherwise they need the
            API key when one is set).
        max_request_body_bytes: larger request bodies get 413.
        header_read_timeout: seconds a client may take to send a request's headers (then 408 and
            the connection closes), counted from the connection or the request's first byte.
        body_read_timeout: seconds a client may take to send a request's body once its headers
            are in (then 408).
        timeout_keep_alive: seconds an idle keep-alive connection stays open.
        h11_max_incomplete_event_size: most bytes of a header block being parsed (then 400).
        h11_max_header_count: most headers in one request (then 431).
        enable_auto_tool_choice: ``tool_choice: "auto"`` (the default when a request has
            ``tools``) parses the model's tool calls with ``tool_call_parser``; without it such
            requests get vLLM's 400.
        tool_call_parser: the model's tool-call format (``kvserve.tool_parsers``: ``hermes``,
            ``llama3_json``, ``mistral``, ``pythonic``), or None.
        exclude_tools_when_tool_choice_none: ``tool_choice: "none"`` keeps ``tools`` out of the
            prompt (by default the template shows them).
        reasoning_parser: splits the model's reasoning into ``reasoning``/``reasoning_content``
            (``kvserve.reasoning``: ``deepseek_r1``, ``qwen3``), or None.
        default_chat_template_kwargs: template variables every chat request gets unless it sets
            them itself (e.g. ``{"enable_thinking": false}``).
        lora_modules: adapters served from start-up (``--lora-modules``; need ``--enable-lora``).
        allow_runtime_lora_updating: ``POST /v1/load_lora_adapter`` and
            ``/v1/unload_lora_adapter`` are allowed (``--allow-runtime-lora-updating`` or vLLM's
            ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``); otherwise they answer 404 saying so.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    api_key_env: str | None = None
    served_model_name: str | None = None
    served_model_aliases: tuple[str, ...] = ()
    model_path: str | None = None
    chat_template: str | None = None
    response_role: str = "assistant"
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    max_concurrent_requests: int | None = None
    shutdown_timeout: float = 30.0
    log_level: str = "info"
    access_log: bool = True
    root_path: str = ""
    allowed_origins: tuple[str, ...] = ("*",)
    allowed_methods: tuple[str, ...] = ("*",)
    allowed_headers: tuple[str, ...] = ("*",)
    allow_credentials: bool = False
    ssl_keyfile: str | None = None
    ssl_certfile: str | None = None
    ssl_ca_certs: str | None = None
    ssl_cert_reqs: int = 0
    ssl_ciphers: str | None = None
    disable_fastapi_docs: bool = False
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES
    header_read_timeout: float = 30.0
    body_read_timeout: float = 60.0
    timeout_keep_alive: float = 5.0
    h11_max_incomplete_event_size: int = H11_MAX_INCOMPLETE_EVENT_SIZE
    h11_max_header_count: int = H11_MAX_HEADER_COUNT
    enable_auto_tool_choice: bool = False
    tool_call_parser: str | None = None
    exclude_tools_when_tool_choice_none: bool = False
    reasoning_parser: str | None = None
    default_chat_template_kwargs: Mapping[str, Any] | None = None
    lora_modules: tuple[LoRAModulePath, ...] = ()
    allow_runtime_lora_updating: bool = False

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name clients may send as ``model`` (the reported one first)."""
        return ((self.served_model_name,) if self.served_model_name else ()) + self.served_model_aliases

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"


def add_server_args(parser: argparse.ArgumentParser) -> None:
    """Add the server's flags to ``parser`` (read back with :func:`settings_from_args`)."""
    frontend = parser.add_argument_group("Frontend")
    _add_listen_args(frontend)
    _add_cors_and_tls_args(frontend)
    _add_compat_args(frontend)
    _add_tool_args(frontend)
    _add_lora_args(frontend)
    add_refused_flags({"Frontend": frontend}, parser, FRONTEND_REFUSED_FLAGS)
    _add_kvserve_args(parser.add_argument_group("kvserve (limits of this server)"))


def _add_listen_args(group) -> None:
    group.add_argument("--host", default="0.0.0.0",
                       help="address to listen on (default 0.0.0.0: every IPv4 interface, as vLLM)")
    group.add_argument("--port", type=_port, default=8000, help="TCP port (default 8000)")
    group.add_argument("--api-key", nargs="+", action="extend", default=[], dest="api_key", metavar="KEY",
                       help=f"accepted API key(s), also comma-separated (env {API_KEY_ENV}, {VLLM_API_KEY_ENV})")
    group.add_argument("--chat-template", default=None,
                       help="path to a Jinja chat template file, or the template text itself")
    group.add_argument("--response-role", default="assistant",
                       help="role of the reply message in chat responses (default assistant)")
    group.add_argument("--root-path", default="",
                       help="path prefix stripped by a proxy in front (FastAPI root_path), e.g. /llm")
    group.add_argument("--uvicorn-log-level", default="info", dest="uvicorn_log_level",
                       choices=["critical", "error", "warning", "info", "debug", "trace"])
    group.add_argument("--disable-uvicorn-access-log", action="store_true", help="no access log lines")
    group.add_argument("--disable-fastapi-docs", action="store_true",
                       help="no /docs, /redoc, /openapi.json (with an API key they need it)")
    group.add_argument("--h11-max-incomplete-event-size", type=_positive_int, default=H11_MAX_INCOMPLETE_EVENT_SIZE,
                       help="most bytes of a request's header block (default 4 MiB, as vLLM)")
    group.add_argument("--h11-max-header-count", type=_positive_int, default=H11_MAX_HEADER_COUNT,
                       help="most headers in one request (default 256, as vLLM)")


def _add_cors_and_tls_args(group) -> None:
    for name in ("origins", "methods", "headers"):
        group.add_argument(f"--allowed-{name}", type=_json_list, default=["*"], metavar="JSON",
                           help=f"CORS allowed {name}, a JSON list (default [\"*\"])")
    group.add_argument("--allow-credentials", action="store_true", help="CORS: allow credentials")
    group.add_argument("--ssl-keyfile", default=None, help="TLS private key file (PEM)")
    group.add_argument("--ssl-certfile", default=None, help="TLS certificate file (PEM)")
    group.add_argument("--ssl-ca-certs", default=None, help="CA certificates to check client certificates")
    group.add_argument("--ssl-cert-reqs", type=int, choices=[0, 1, 2], default=0,
                       help="client certificates: 0 none, 1 optional, 2 required (Python's ssl.CERT_*)")
    group.add_argument("--ssl-ciphers", default=None, help="TLS 1.2 cipher suites (OpenSSL syntax)")


def _add_compat_args(group) -> None:
    """vLLM flags whose meaning is kvserve's behaviour already, or that map onto its own flags."""
    group.add_argument("--enable-request-id-headers", action="store_true",
                       help="accepted for vLLM compatibility: kvserve always answers with X-Request-Id")
    group.add_argument("--disable-frontend-multiprocessing", action="store_true",
                       help="accepted for vLLM compatibility: kvserve's frontend always runs in the engine's process")
    group.add_argument("--disable-log-requests", action="store_false", dest="enable_log_requests",
                       default=argparse.SUPPRESS, help="no per-request log lines (the default; vLLM's old flag)")
    group.add_argument("--disable-log-stats", action="store_const", const=0.0, dest="log_stats_interval",
                       default=argparse.SUPPRESS, help="no periodic engine summary lines (= --log-stats-interval 0)")


def _add_tool_args(group) -> None:
    """Tool calling and chat-template defaults (vLLM's ``Frontend`` flags of the same names)."""
    from kvserve.tool_parsers import tool_parser_names

    group.add_argument("--enable-auto-tool-choice", action="store_true",
                       help="tool_choice \"auto\" (the default when a request has tools) returns the tool calls "
                            "the model writes, read with --tool-call-parser (without this flag: a 400, as vLLM)")
    group.add_argument("--tool-call-parser", type=tool_call_parser_name, default=None,
                       metavar="{" + ",".join(tool_parser_names()) + "}",
                       help="the model's tool-call format: hermes (Qwen2.5/Qwen3/Hermes <tool_call>), llama3_json, "
                            "mistral ([TOOL_CALLS]), openai (GPT-OSS's harmony to=functions.NAME), pythonic")
    group.add_argument("--exclude-tools-when-tool-choice-none", action="store_true",
                       help="tool_choice \"none\" keeps the tools out of the prompt (default: the template shows them)")
    group.add_argument("--default-chat-template-kwargs", type=_json_object, default=None, metavar="JSON",
                       help="template variables every chat request gets unless it sets them, e.g. "
                            "'{\"enable_thinking\": false}'")


def _add_lora_args(group) -> None:
    group.add_argument("--lora-modules", type=lora_module, nargs="+", action="extend", default=[],
                       metavar="NAME=PATH|JSON",
                       help="LoRA adapters to serve (needs --enable-lora): name=path, or vLLM's JSON "
                            "'{\"name\": ..., \"path\": ..., \"base_model_name\": ...}'")
    group.add_argument("--allow-runtime-lora-updating", action="store_true", default=None,
                       help="allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM: "
                            f"{RUNTIME_UPDATING_ENV}=True, also honoured)")


def tool_call_parser_name(text: str) -> str:
    """argparse type of ``--tool-call-parser``: a registered parser name."""
    from kvserve.tool_parsers import get_tool_parser

    try:
        get_tool_parser(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object such as '{{\"enable_thinking\": false}}', got {text!r}")
    return value


def _add_kvserve_args(group) -> None:
    group.add_argument("--requests-per-minute", type=_positive_float, default=None,
                       help="per-key request rate limit (default: none)")
    group.add_argument("--tokens-per-minute", type=_positive_float, default=None,
                       help="per-key token rate limit, prompt + max_tokens (default: none)")
    group.add_argument("--max-concurrent-requests", type=_positive_int, default=None,
                       help="per-key cap on requests in flight (default: none)")
    group.add_argument("--shutdown-timeout", type=_non_negative_float, default=30.0,
                       help="seconds running requests may take to finish after SIGTERM")
    group.add_argument("--max-request-body-bytes", type=_positive_int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                       help="larger request bodies get 413 (default 32 MiB)")
    group.add_argument("--header-read-timeout", type=_positive_float, default=30.0,
                       help="seconds a client may take to send request headers (default 30)")
    group.add_argument("--body-read-timeout", type=_positive_float, default=60.0,
                       help="seconds a client may take to send a request body (default 60)")
    group.add_argument("--timeout-keep-alive", type=_positive_float, default=5.0,
                       help="seconds an idle keep-alive connection stays open (default 5)")


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


def _json_list(text: str) -> list[str]:
    """vLLM's form, a JSON list of strings (``'["https://a.example"]'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise argparse.ArgumentTypeError(f"must be a JSON list of strings such as '[\"*\"]', got {text!r}")
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


def _api_keys(flag_values: list[str]) -> tuple[tuple[str, ...], str | None]:
    """Keys from ``--api-key`` and the environment, and the variable a key came from.

    Raises:
        ValueError: ``--api-key`` was given with no key in it (``--api-key ""``), which would
            otherwise serve without authentication.
    """
    if flag_values and not parse_api_keys(flag_values, None):
        raise ValueError("--api-key is empty; give a key, or leave the flag out to serve without authentication")
    keys, env_name = parse_api_keys(flag_values, None), None
    for name in (API_KEY_ENV, VLLM_API_KEY_ENV):
        from_env = parse_api_keys([], os.environ.get(name))
        if from_env and env_name is None:
            env_name = name
        keys = tuple(dict.fromkeys(keys + from_env))
    return keys, env_name


def _read_chat_template(value: str | None) -> str | None:
    if value is None:
        return None
    path = Path(value)
    if len(value) < 4096 and "{" not in value and path.is_file():
        return path.read_text(encoding="utf-8")
    return value


def _check_tls(keyfile: str | None, certfile: str | None) -> None:
    if (keyfile is None) != (certfile is None):
        raise ValueError("--ssl-keyfile and --ssl-certfile go together; give both for HTTPS")
    for flag, path in (("--ssl-keyfile", keyfile), ("--ssl-certfile", certfile)):
        if path is not None and not Path(path).is_file():
            raise ValueError(f"{flag} {path!r} is not a file")


def _check_tool_flags(args: argparse.Namespace) -> None:
    if args.enable_auto_tool_choice and not args.tool_call_parser:
        raise ValueError("--enable-auto-tool-choice requires --tool-call-parser (the model's tool-call format: "
                         "hermes, llama3_json, mistral, openai or pythonic)")
    if args.tool_call_parser and not args.enable_auto_tool_choice:
        logger.warning("--tool-call-parser %s without --enable-auto-tool-choice: tool_choice \"auto\" (the "
                       "default when a request has tools) gets a 400, as in vLLM", args.tool_call_parser)


def settings_from_args(args: argparse.Namespace) -> ServerSettings:
    """Build :class:`ServerSettings` from parsed flags, ``KVSERVE_API_KEY`` and ``VLLM_API_KEY``
    (``--reasoning-parser`` is an engine flag, in vLLM's ``StructuredOutputsConfig`` group).

    Raises:
        ValueError: an empty ``--api-key``, a lone ``--ssl-keyfile``/``--ssl-certfile`` or a
            missing file, an empty ``--served-model-name``, ``--enable-auto-tool-choice``
            without ``--tool-call-parser``.
    """
    from kvserve.engine.arg_utils import served_model_names

    keys, env_name = _api_keys(args.api_key)
    _check_tls(args.ssl_keyfile, args.ssl_certfile)
    _check_tool_flags(args)
    names = served_model_names(getattr(args, "served_model_name", None))
    lora_modules, runtime_lora = _lora_settings(args)
    return ServerSettings(
        host=args.host, port=args.port, api_keys=keys, api_key_env=env_name,
        served_model_name=names[0] if names else None, served_model_aliases=names[1:],
        chat_template=_read_chat_template(args.chat_template), response_role=args.response_role,
        requests_per_minute=args.requests_per_minute, tokens_per_minute=args.tokens_per_minute,
        max_concurrent_requests=args.max_concurrent_requests, shutdown_timeout=args.shutdown_timeout,
        log_level=args.uvicorn_log_level, access_log=not args.disable_uvicorn_access_log,
        root_path=args.root_path.rstrip("/"), allowed_origins=tuple(args.allowed_origins),
        allowed_methods=tuple(args.allowed_methods), allowed_headers=tuple(args.allowed_headers),
        allow_credentials=args.allow_credentials, ssl_keyfile=args.ssl_keyfile, ssl_certfile=args.ssl_certfile,
        ssl_ca_certs=args.ssl_ca_certs, ssl_cert_reqs=args.ssl_cert_reqs, ssl_ciphers=args.ssl_ciphers,
        disable_fastapi_docs=args.disable_fastapi_docs, max_request_body_bytes=args.max_request_body_bytes,
        header_read_timeout=args.header_read_timeout, body_read_timeout=args.body_read_timeout,
        timeout_keep_alive=args.timeout_keep_alive, h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count,
        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        reasoning_parser=getattr(args, "reasoning_parser", None) or None,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        lora_modules=lora_modules, allow_runtime_lora_updating=runtime_lora,
    )


def _lora_settings(args: argparse.Namespace) -> tuple[tuple[LoRAModulePath, ...], bool]:
    """``--lora-modules`` and whether runtime loading is allowed (the flag, else the environment).

    Raises:
        ValueError: adapters or runtime loading asked for without ``--enable-lora``, or one name twice.
    """
    modules = tuple(getattr(args, "lora_modules", None) or ())
    runtime = getattr(args, "allow_runtime_lora_updating", None)
    if runtime is None:
        runtime = env_allows_runtime_updating(os.environ.get(RUNTIME_UPDATING_ENV))
    enabled = bool(getattr(args, "enable_lora", False))
    if modules and not enabled:
        raise ValueError("--lora-modules needs --enable-lora")
    if getattr(args, "allow_runtime_lora_updating", None) and not enabled:
        raise ValueError("--allow-runtime-lora-updating needs --enable-lora")
    names = [m.name for m in modules]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"--lora-modules names {repeated[0]!r} twice; give each adapter its own name")
    return modules, bool(runtime) and enabled


def with_model_argument_name(settings: ServerSettings, given: str | None, default_name: str) -> ServerSettings:
    """``settings`` that also accept the ``MODEL`` argument as given (``/models/qwen``) as a
    ``model`` name when no ``--served-model-name`` is set.

    kvserve reports a folder under its own name (``qwen``); vLLM's default served name is the
    ``--model`` string itself, so a client written for vLLM sends the path. Both are accepted;
    ``default_name`` stays the reported one."""
    if settings.served_model_name is not None or given in (None, "", default_name, *settings.served_model_aliases):
        return settings
    return replace(settings, served_model_aliases=(*settings.served_model_aliases, given))

