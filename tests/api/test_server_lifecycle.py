"""Client disconnects abort engine requests; SIGTERM drains running requests and refuses new ones."""

from __future__ import annotations

import signal
import threading
import time

import httpx
import pytest

from kvserve.api.settings import ServerSettings
from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe")


def wait_until(predicate, timeout: float = 2.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": "x"}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
])
def test_stream_closed_after_one_chunk_aborts(tokenizer, path, body):
    engine = ScriptedEngine(tokenizer, step_delay=0.05)
    settings = ServerSettings(max_concurrent_requests=20)
    with LoopbackServer(engine, settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        for _ in range(5):
            with http.stream("POST", path, json={**body, "max_tokens": 200, "stream": True}) as response:
                assert response.status_code == 200
                first = next(response.iter_lines())
                assert first.startswith("data: {")
        assert wait_until(lambda: not engine.running and srv.state.in_flight == 0)
        assert sorted(engine.aborted) == sorted(call[0] for call in engine.calls)
        assert len(engine.aborted) == 5
        done = http.post(path, json={**body, "max_tokens": 3})
        assert done.status_code == 200 and len(engine.aborted) == 5


def test_non_streamed_disconnect_aborts(tokenizer):
    engine = ScriptedEngine(tokenizer, step_delay=0.05)
    with LoopbackServer(engine) as srv, httpx.Client(base_url=srv.base_url, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json={"prompt": "x", "max_tokens": 200})
        assert wait_until(lambda: not engine.running and srv.state.in_flight == 0)
        assert engine.aborted == [engine.calls[0][0]]


def test_finished_requests_are_not_aborted(tokenizer):
    engine = ScriptedEngine(tokenizer)
    with LoopbackServer(engine) as srv, httpx.Client(base_url=srv.base_url) as http:
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4})
        http.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "stream": True})
        assert engine.aborted == [] and srv.state.in_flight == 0


def test_concurrency_cap_per_key(tokenizer):
    engine = ScriptedEngine(tokenizer, step_delay=0.05)
    settings = ServerSettings(max_concurrent_requests=1)
    with LoopbackServer(engine, settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        with http.stream("POST", "/v1/completions", json={"prompt": "x", "max_tokens": 50, "stream": True}):
            second = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
        assert wait_until(lambda: srv.state.in_flight == 0)
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def test_sigterm_drains_running_and_refuses_new(tokenizer):
    engine = ScriptedEngine(tokenizer, step_delay=0.02)
    settings = ServerSettings(shutdown_timeout=10)
    srv = LoopbackServer(engine, settings).__enter__()
    result: dict = {}

    def long_request() -> None:
        with httpx.Client(base_url=srv.base_url, timeout=10) as http:
            result["body"] = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 20}).json()

    worker = threading.Thread(target=long_request)
    worker.start()
    assert wait_until(lambda: engine.running)
    srv.server.handle_exit(signal.SIGTERM, None)
    with httpx.Client(base_url=srv.base_url) as http:
        refused = http.post("/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "shutting_down"
        assert http.get("/health").status_code == 503
    worker.join(timeout=10)
    srv.thread.join(timeout=10)
    assert not srv.thread.is_alive()
    choice = result["body"]["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["text"] == tokenizer.decode(engine.choice_token_ids(0, 20))
    assert engine.aborted == []
