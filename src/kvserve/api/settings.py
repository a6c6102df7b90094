"""HTTP server settings: one frozen dataclass built once from the command line (and environment).

Flag names and meanings follow ``vllm serve``'s ``Frontend`` group (``--host``, ``--port``,
``--api-key``, ``--allowed-origins``, ``--root-path``, ``--ssl-keyfile``, ...); vLLM frontend flags
kvserve does not implement are refused by name (``kvserve.vllm_compat``). kvserve's own flags
(rate limits, drain timeout, request-size and read-time limits) are in the ``kvserve`` group.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from kvserve.lora.flags import RUNTIME_UPDATING_ENV, LoRAModulePath, env_allows_runtime_updating
from kvserve.slo.targets import SLOClasses

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
        enable_server_load_tracking: ``GET /load`` reports the generation requests in flight
            (vLLM's flag; without it ``server_load`` is 0).
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
        responses_store_max: ``/v1/responses`` keeps at most this many responses (``store``),
            least recently used dropped first; 0 keeps none (``kvserve.api.responses_store``).
        slo_classes: latency-target classes (``--slo-classes``; ``kvserve.slo.targets``).
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
    enable_server_load_tracking: bool = False
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
    responses_store_max: int = 1000
    slo_classes: SLOClasses = field(default_factory=lambda: SLOClasses({}))

    @property
    def served_model_names(self) -> tuple[str, ...]:
        """Every name clients may send as ``model`` (the reported one first)."""
        return ((self.served_model_name,) if self.served_model_name else ()) + self.served_model_aliases

    @property
    def scheme(self) -> str:
        return "https" if self.ssl_certfile else "http"


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
        disable_fastapi_docs=args.disable_fastapi_docs,
        enable_server_load_tracking=args.enable_server_load_tracking, max_request_body_bytes=args.max_request_body_bytes,
        header_read_timeout=args.header_read_timeout, body_read_timeout=args.body_read_timeout,
        timeout_keep_alive=args.timeout_keep_alive, h11_max_incomplete_event_size=args.h11_max_incomplete_event_size,
        h11_max_header_count=args.h11_max_header_count,
        enable_auto_tool_choice=args.enable_auto_tool_choice, tool_call_parser=args.tool_call_parser,
        exclude_tools_when_tool_choice_none=args.exclude_tools_when_tool_choice_none,
        reasoning_parser=getattr(args, "reasoning_parser", None) or None,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
        lora_modules=lora_modules, allow_runtime_lora_updating=runtime_lora,
        responses_store_max=getattr(args, "responses_store_max", 1000),
        slo_classes=getattr(args, "slo_classes", None) or SLOClasses({}),
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

