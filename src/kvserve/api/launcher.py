"""``kvserve serve``: build the engine from the command line, run the server, stop the engine.

    flags ──► EngineConfig ──► LLMEngine ──► AsyncLLM.start() ──► serve() ──► AsyncLLM.shutdown()
          └─► ServerSettings ─────────────────────────────────────────┘
"""

from __future__ import annotations

import argparse
import logging

from kvserve.api.run import serve
from kvserve.api.settings import settings_from_args

logger = logging.getLogger(__name__)


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
    from kvserve.cli import _resolve_model
    from kvserve.engine.arg_utils import engine_config_from_args
    from kvserve.engine.async_llm import AsyncLLM
    from kvserve.engine.llm_engine import LLMEngine

    from kvserve.metrics.log_format import configure_logging
    from kvserve.metrics.wiring import build_stats_consumers, install_metrics, observability_config_from_args

    model, default_name = _resolve_model(args.model)
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
    try:
        serve(async_engine, settings)
    finally:
        async_engine.shutdown()
    return 0
