"""Every route of the app against the API key (none, a wrong one, the right one), so a new route
cannot be left open by mistake (Anthropic's /v1/messages routes also read x-api-key and answer
the 401 in Anthropic's shape); the open probes (/health, /ping, /load, /version, /metrics); and
vLLM's SageMaker and load routes (/ping, /invocations, /load)."""

from __future__ import annotations

import httpx
import pytest

from kvserve.api.settings import ServerSettings
from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_server_errors import assert_error

OPEN = {"/health", "/ping", "/load", "/version", "/metrics"}
KEY = {"Authorization": "Bearer key-one"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer("bpe")


def routes(srv: LoopbackServer) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, path parameters filled in."""
    found = []
    for route in srv.server.config.app.routes:
        for method in sorted(getattr(route, "methods", ()) - {"HEAD"}):
            found.append((method, route.path.replace("{model_id:path}", "scripted-model")
                           .replace("{response_id}", "resp_0")))
    return found


def test_every_route_but_the_probes_needs_the_key(tokenizer):
    settings = ServerSettings(api_keys=("key-one",))
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        served = routes(srv)
        assert {path for _, path in served} >= OPEN | {"/v1/completions", "/v1/chat/completions", "/invocations",
                                                      "/tokenize", "/v1/models", "/docs", "/v1/responses",
                                                      "/v1/responses/resp_0", "/v1/responses/resp_0/cancel"}
        assert {"/v1/messages", "/v1/messages/count_tokens"} <= {path for _, path in served}
        for method, path in served:
            for headers in ({}, {"Authorization": "Bearer wrong-key-123"}, {"Authorization": "Basic key-one"},
                            {"x-api-key": "wrong-key-123"}):
                response = http.request(method, path, headers=headers, json={})
                if path in OPEN:
                    assert response.status_code in (200, 405), (method, path, response.text)
                elif path.startswith("/v1/messages"):  # Anthropic's routes answer in Anthropic's shape
                    assert response.status_code == 401 and response.json() == {"type": "error", "error": {
                        "type": "authentication_error", "message": response.json()["error"]["message"]}}
                else:
                    assert_error(response, 401, code="invalid_api_key")
            assert http.request(method, path, headers=KEY, json={}).status_code != 401, (method, path)
            # x-api-key (Anthropic's header) is read on Anthropic's routes only
            by_x_api_key = http.request(method, path, headers={"x-api-key": "key-one"}, json={})
            assert (by_x_api_key.status_code != 401) == (path in OPEN or path.startswith("/v1/messages")), path
        assert_error(http.get("/no/such/route"), 401, code="invalid_api_key")  # no key: no route list either
        assert http.get("/no/such/route", headers=KEY).status_code == 404
        assert srv.engine.calls == []


def test_the_key_is_checked_before_the_body_is_read(tokenizer):
    settings = ServerSettings(api_keys=("key-one",), max_request_body_bytes=1000)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        too_big = b"x" * 5000
        assert_error(http.post("/v1/completions", content=too_big), 401, code="invalid_api_key")
        assert http.post("/v1/completions", content=too_big, headers=KEY).status_code == 413


def test_version_tells_the_rest_only_with_the_key(tokenizer):
    settings = ServerSettings(api_keys=("key-one",))
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert set(http.get("/version").json()) == {"version"}
        assert set(http.get("/version", headers={"Authorization": "Bearer wrong-key-123"}).json()) == {"version"}
        assert {"version", "quantization", "engine"} <= set(http.get("/version", headers=KEY).json())


def test_ping_invocations_and_load_as_vllm(tokenizer):
    settings = ServerSettings(enable_server_load_tracking=True)
    with LoopbackServer(ScriptedEngine(tokenizer), settings) as srv, httpx.Client(base_url=srv.base_url) as http:
        assert http.get("/ping").status_code == 200 and http.post("/ping").status_code == 200
        assert http.get("/load").json() == {"server_load": 0}
        chat = http.post("/invocations", json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert chat.status_code == 200 and chat.json()["object"] == "chat.completion"
        completion = http.post("/invocations", json={"prompt": "x", "max_tokens": 2})
        assert completion.status_code == 200 and completion.json()["object"] == "text_completion"
        error = assert_error(http.post("/invocations", json={"input": "x"}), 400)
        assert "Cannot find suitable handler" in error["message"]
        assert_error(http.post("/invocations", json={"prompt": "x", "temperature": -1}), 400, param="temperature")
        assert_error(http.post("/invocations", json={"messages": "x"}), 400, param="messages")
        assert_error(http.post("/invocations", content=b"{not json", headers={"content-type": "application/json"}),
                     400)
        srv.state.in_flight = 3  # what /load reads (requests being served)
        assert http.get("/load").json() == {"server_load": 3}
        srv.state.in_flight = 0
    with LoopbackServer(ScriptedEngine(tokenizer)) as srv, httpx.Client(base_url=srv.base_url) as http:
        srv.state.in_flight = 3
        assert http.get("/load").json() == {"server_load": 0}  # without --enable-server-load-tracking, as vLLM
        srv.state.in_flight = 0


def test_large_bodies_are_parsed_off_the_event_loop_and_the_heap_trimmed_after(tokenizer, monkeypatch):
    """The cost of a huge body: its JSON is parsed on a worker thread (the event loop keeps
    answering /health), a prompt longer in characters than the context can hold is refused
    before it is tokenized, and the freed memory is given back once it is answered."""
    import threading
    import time

    from kvserve.api import middleware, server

    threads, trims = [], []
    monkeypatch.setattr(server, "parse_json", lambda raw: (threads.append(threading.current_thread()),
                                                           __import__("json").loads(raw))[1])
    monkeypatch.setattr(middleware, "trim", lambda: trims.append(1))
    engine = ScriptedEngine(tokenizer, max_model_len=64)
    with LoopbackServer(engine) as srv, httpx.Client(base_url=srv.base_url, timeout=60) as http:
        assert http.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
        assert threads == [] and trims == [] and len(engine.calls) == 1  # small bodies: parsed in place
        huge = "word " * (middleware.LARGE_BODY_BYTES // 5 + 1)
        error = assert_error(http.post("/v1/completions", json={"prompt": huge, "max_tokens": 2}), 400,
                             param="prompt")
        assert error["message"].startswith(f"You passed {len(huge)} input characters. However, the model's context "
                                           "length is only 64 tokens")
        assert len(threads) == 1 and threads[0].name.startswith("asyncio_")  # asyncio.to_thread's workers
        deadline = time.monotonic() + 5
        while not trims and time.monotonic() < deadline:  # trimmed once the response went out
            time.sleep(0.01)
        assert trims == [1] and len(engine.calls) == 1  # the huge prompt reached no engine
