"""``/health`` is 503 while the weights load (and generation is refused with 503), 200 once the
engine runs; a model that fails to load keeps it 503 and never serves."""

from __future__ import annotations

import threading
import time

import httpx

from kvserve.api.run import make_server
from kvserve.api.settings import ServerSettings
from kvserve.engine.arg_utils import engine_config_from_kwargs
from kvserve.engine.async_llm import AsyncLLM
from kvserve.engine.input_processor import InputProcessor
from kvserve.engine.core import EngineCore
from kvserve.testing.live_server import free_port
from kvserve.tokenizer import load_tokenizer


def _serve(async_llm: AsyncLLM):
    port = free_port()
    server = make_server(async_llm, ServerSettings(port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(base + "/health", timeout=1)
            return server, thread, base
        except httpx.HTTPError:
            time.sleep(0.05)
    raise RuntimeError("server did not start")


def _deferred(model_dir, factory) -> AsyncLLM:
    processor = InputProcessor(load_tokenizer(model_dir), 960, 256, frozenset())
    return AsyncLLM.deferred(factory, "tiny", input_processor=processor)


def test_health_503_until_loaded_then_200(tiny_llama):
    release = threading.Event()

    def slow_factory() -> EngineCore:
        release.wait(30)
        return EngineCore(engine_config_from_kwargs(str(tiny_llama), max_model_len=256, num_gpu_blocks_override=64))

    async_llm = _deferred(tiny_llama, slow_factory)
    async_llm.start()
    server, thread, base = _serve(async_llm)
    try:
        assert httpx.get(base + "/health").status_code == 503
        body = {"model": "tiny", "prompt": "Hello", "max_tokens": 2}
        refused = httpx.post(base + "/v1/completions", json=body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "engine_not_ready"
        release.set()
        assert async_llm.wait_until_loaded(30)
        assert httpx.get(base + "/health").status_code == 200
        ok = httpx.post(base + "/v1/completions", json={**body, "ignore_eos": True}, timeout=60)
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2
    finally:
        server.should_exit = True
        thread.join(10)
        async_llm.shutdown()


def test_failed_load_stays_503(tiny_llama, tmp_path):
    def broken_factory() -> EngineCore:
        return EngineCore(engine_config_from_kwargs(str(tmp_path)))  # no config.json there

    async_llm = _deferred(tiny_llama, broken_factory)
    async_llm.start()
    assert not async_llm.wait_until_loaded(30)
    assert not async_llm.is_ready
    assert "config.json" in str(async_llm.dead_reason)
