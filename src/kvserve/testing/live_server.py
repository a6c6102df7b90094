"""A real kvserve server on 127.0.0.1 inside the test process (uvicorn in a thread), for
end-to-end tests through the official ``openai`` client and raw httpx."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from kvserve.api.run import make_server
from kvserve.api.settings import ServerSettings
from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.llm_engine import build_engine
from kvserve.free_port import free_port
from kvserve.metrics.wiring import install_metrics


@dataclass
class LiveServer:
    """A running server. ``engine_stats()`` reads the engine's latest scheduler snapshot."""

    base_url: str
    model: str
    api_key: str
    engine: AsyncLLM
    server: Any
    thread: threading.Thread

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    @property
    def serving_state(self) -> Any:
        return self.server.state

    @property
    def core(self):
        return self.engine.core

    def engine_stats(self) -> dict[str, float]:
        return self.engine.engine_stats()

    def make_client(self, **kwargs: Any):
        from openai import OpenAI

        return OpenAI(base_url=self.base_url + "/v1", api_key=self.api_key, max_retries=0, **kwargs)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.engine.shutdown()


def start_live_server(
    model_dir: str,
    *,
    served_model_name: str = "tiny",
    api_key: str = "test-key",
    settings: dict[str, Any] | None = None,
    metrics_prefix: str = "kvserve",
    stats_consumers: list[Any] | None = None,
    **engine_kwargs: Any,
) -> LiveServer:
    """Load ``model_dir``, start the engine thread and uvicorn on a free loopback port, and wait
    until ``/health`` answers 200 (at most 60 s).

    Raises:
        RuntimeError: the server did not become healthy in time.
    """
    core, processor = build_engine(engine_config_from_kwargs(model_dir, **engine_kwargs))
    async_llm = AsyncLLM(core, processor, served_model_name, stats_consumers=stats_consumers)
    install_metrics(async_llm, prefix=metrics_prefix)
    async_llm.start()
    port = free_port()
    server_settings = ServerSettings(
        host="127.0.0.1", port=port, api_keys=(api_key,) if api_key else (),
        served_model_name=served_model_name, log_level="warning",
        **{"model_path": str(Path(model_dir).resolve()), **(settings or {})},  # as the launcher reports it
    )
    for module in server_settings.lora_modules:  # what the launcher does for --lora-modules
        async_llm.lora_registry.add(module.name, module.path, module.base_model_name)
    server = make_server(async_llm, server_settings)
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(base_url + "/health", timeout=1).status_code == 200:
                return LiveServer(base_url, served_model_name, api_key, async_llm, server, thread)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    server.should_exit = True
    async_llm.shutdown()
    raise RuntimeError(f"server on {base_url} did not become healthy within 60 s")
