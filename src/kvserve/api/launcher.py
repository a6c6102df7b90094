"""``kvserve serve``: build the engine from the command line, start its thread, serve HTTP."""

from __future__ import annotations

import argparse
import logging
import time

from kvserve.api.run import make_server
from kvserve.api.settings import settings_from_args
from kvserve.engine.arg_utils import engine_config_from_args
from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.llm_engine import LLMEngine

logger = logging.getLogger("kvserve")


def run_server(args: argparse.Namespace) -> int:
    """Load the model, start the engine thread and serve until SIGTERM; returns the exit code."""
    from kvserve.cli import _resolve_model

    start = time.perf_counter()
    model, default_name = _resolve_model(args.model)
    settings = settings_from_args(args)
    config = engine_config_from_args(model, args)
    engine = LLMEngine(config, settings.chat_template)
    name = settings.served_model_name or default_name
    async_llm = AsyncLLM(engine, name)
    async_llm.start()
    server = make_server(async_llm, settings)
    base = f"http://{settings.host}:{settings.port}"
    logger.info("engine ready in %.1f s: %s", time.perf_counter() - start, engine.describe())
    print(
        f"kvserve is serving {name!r} at {base}/v1 (ready in {time.perf_counter() - start:.1f} s)\n"
        f"  try: curl {base}/v1/completions -H 'Content-Type: application/json' "
        f"-d '{{\"model\": \"{name}\", \"prompt\": \"It is a truth\", \"max_tokens\": 32}}'",
        flush=True,
    )
    try:
        server.run()
    finally:
        async_llm.shutdown()
    return 0
