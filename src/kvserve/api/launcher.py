"""``kvserve serve``: build the engine from the command line, run the server, stop the engine.

    flags ──► EngineConfig ──► LLMEngine ──► AsyncLLM.start() ──► serve() ──► AsyncLLM.shutdown()
          └─► ServerSettings ─────────────────────────────────────────┘
"""

from __future__ import annotations

import argparse
import json
import logging
import time

from kvserve.api.run import serve
from kvserve.api.settings import settings_from_args

logger = logging.getLogger(__name__)


def ready_message(served_name: str, settings, seconds: float) -> str:
    """What ``kvserve serve`` prints once it listens: where, and a request to try."""
    base = f"http://{settings.host}:{settings.port}"
    auth = " -H 'Authorization: Bearer $KVSERVE_API_KEY'" if settings.api_keys else ""
    body = json.dumps({"model": served_name, "prompt": "It is a truth universally acknowledged", "max_tokens": 32})
    return (
        f"kvserve: serving {served_name!r} at {base}/v1 (ready in {seconds:.1f} s)\n"
        f"  try:  curl {base}/v1/completions -H 'Content-Type: application/json'{auth} -d '{body}'\n"
        f"  chat: kvserve chat --base-url {base}/v1"
    )


def run_server(args: argparse.Namespace) -> int:
    """Serve the model named by ``args`` until SIGTERM/SIGINT; returns the exit status (0).

    ``args`` comes from the ``serve`` sub-command's parser (engine flags from
    ``kvserve.engine.arg_utils.add_engine_args``, server flags from
    ``kvserve.api.settings.add_server_args``, observability flags from
    ``kvserve.metrics.wiring.add_observability_args``, optional positional ``model``).

    Raises:
        CheckpointError: the model folder cannot be loaded.
        ImportError: ``--otlp-traces-endpoint`` given but OpenTelemetry is not installed.
    """
    from kvserve.builtin import resolve_model
    from kvserve.engine.arg_utils import engine_config_from_args
    from kvserve.engine.async_llm import AsyncLLM
    from kvserve.engine.llm_engine import LLMEngine

    from kvserve.metrics.log_format import configure_logging
    from kvserve.metrics.wiring import build_stats_consumers, install_metrics, observability_config_from_args

    model, default_name = resolve_model(args.model)
    start = time.perf_counter()
    settings = settings_from_args(args)
    observability = observability_config_from_args(args)
    configure_logging(getattr(args, "log_level", "info"), observability.log_format)
    served_name = settings.served_model_name or default_name
    consumers = build_stats_consumers(observability, served_name)  # fails early if tracing is missing
    engine = LLMEngine(engine_config_from_args(model, args), chat_template=args.chat_template)
    async_engine = AsyncLLM(engine, served_name, stats_consumers=consumers)
    install_metrics(async_engine)
    async_engine.start()
    logger.info("serving %s (%s) on http://%s:%d/v1", served_name, model, settings.host, settings.port)

    def announce() -> None:
        print(ready_message(served_name, settings, time.perf_counter() - start), flush=True)

    try:
        serve(async_engine, settings, on_ready=announce)
    finally:
        async_engine.shutdown()
    return 0
