"""The server's command-line flags (``kvserve serve``), in ``vllm serve``'s ``Frontend`` group and
kvserve's own, with their value types; ``kvserve.api.settings.settings_from_args`` turns them into
``ServerSettings``."""

from __future__ import annotations

import argparse
import json

from kvserve.api.settings import (API_KEY_ENV, DEFAULT_MAX_REQUEST_BODY_BYTES, H11_MAX_HEADER_COUNT,
                                  H11_MAX_INCOMPLETE_EVENT_SIZE, VLLM_API_KEY_ENV)
from kvserve.errors import ConfigError
from kvserve.lora.flags import RUNTIME_UPDATING_ENV, lora_module
from kvserve.slo.targets import SLOClasses
from kvserve.vllm_compat import FRONTEND_REFUSED_FLAGS, add_refused_flags


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
    group.add_argument("--enable-server-load-tracking", action=argparse.BooleanOptionalAction, default=False,
                       help="GET /load counts the generation requests in flight (otherwise it reads 0), as vLLM")
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
    group.add_argument("--responses-store-max", type=_non_negative_int, default=1000,
                       help="/v1/responses keeps at most this many responses for GET and previous_response_id, "
                            "least recently used dropped first (default 1000; 0: none, store is then false)")
    group.add_argument("--slo-classes", type=_slo_classes, default=None, metavar="JSON",
                       help='latency-target classes, selected by API key or priority, e.g. \'{"interactive": '
                            '{"ttft_ms": 1000, "tpot_ms": 100, "priority": 0}, "batch": {"priority": 1}}\' '
                            "(a request's own slo field or X-SLO-* headers override its class's targets)")


def _slo_classes(text: str) -> SLOClasses:
    try:
        return SLOClasses.from_json(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--slo-classes: ")) from None


def _number(kind, minimum: float, inclusive: bool):
    def parse(text: str):
        value = kind(text)
        if not (value >= minimum if inclusive else value > minimum) or value != value:
            raise argparse.ArgumentTypeError(f"must be {'>=' if inclusive else '>'} {minimum:g}, got {text}")
        return value

    return parse


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


_positive_float = _number(float, 0, inclusive=False)
_non_negative_float = _number(float, 0, inclusive=True)
_positive_int = _number(int, 1, inclusive=True)
_non_negative_int = _number(int, 0, inclusive=True)
