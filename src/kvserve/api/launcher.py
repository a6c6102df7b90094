"""``kvserve serve``: build the engine from the command line, run the server, stop the engine.

    flags ──► EngineConfig ──► LLMEngine ──► AsyncLLM.start() ──► serve() ──► AsyncLLM.shutdown()
          └─► ServerSettings ─────────────────────────────────────────┘
"""

from __future__ import annotations

import argparse
import json
import logging
import threading
from pathlib import Path
import time

from kvserve.api.run import make_server
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


class _Announcer:
    """Prints the ready message once both the socket listens and the weights are loaded."""

    def __init__(self, message, served_name: str, settings, start: float, engine) -> None:
        self.message, self.served_name, self.settings, self.start = message, served_name, settings, start
        self.engine = engine
        self.server = None
        self.failed = False

    def server_listening(self) -> None:
        threading.Thread(target=self._wait_and_print, name="kvserve-announce", daemon=True).start()

    def _wait_and_print(self) -> None:
        if self.engine.wait_until_loaded():
            seconds = time.perf_counter() - self.start
            print(self.message(self.served_name, self.settings, seconds), flush=True)
        else:  # the model could not be loaded: nothing to serve, exit with the error logged
            self.failed = True
            self.server.should_exit = True


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
    from kvserve.engine.core import resolve_device, resolve_max_model_len
    from kvserve.engine.llm_engine import LLMEngine
    from kvserve.model.arch_config import ModelArchConfig
    from kvserve.tokenizer import eos_token_ids, load_tokenizer

    from kvserve.metrics.log_format import configure_logging
    from kvserve.metrics.wiring import build_stats_consumers, install_metrics, observability_config_from_args

    model, default_name = resolve_model(args.model)
    start = time.perf_counter()
    settings = settings_from_args(args)
    observability = observability_config_from_args(args)
    configure_logging(getattr(args, "log_level", "info"), observability.log_format)
    served_name = settings.served_model_name or default_name
    consumers = build_stats_consumers(observability, served_name)  # fails early if tracing is missing
    config = engine_config_from_args(model, args)
    resolve_device(config.model.device)  # fail before serving when the device is missing
    arch = ModelArchConfig.from_file(Path(model) / "config.json")  # a bad folder fails here, first
    tokenizer = load_tokenizer(config.model.tokenizer or model, settings.chat_template)
    async_engine = AsyncLLM.deferred(
        lambda: LLMEngine(config, chat_template=settings.chat_template), served_name,
        tokenizer=tokenizer, max_model_len=resolve_max_model_len(arch, config.model.max_model_len),
        vocab_size=arch.vocab_size, eos_token_ids=eos_token_ids(model, tokenizer), stats_consumers=consumers,
    )
    install_metrics(async_engine)
    async_engine.start()  # loads the weights on the engine thread; /health is 503 until then
    logger.info("serving %s (%s) on http://%s:%d/v1", served_name, model, settings.host, settings.port)
    announce = _Announcer(ready_message, served_name, settings, start, async_engine)

    server = make_server(async_engine, settings, on_ready=announce.server_listening)
    announce.server = server
    try:
        server.run()
    finally:
        async_engine.shutdown()
    return 1 if announce.failed else 0
