"""Property: no ``/v1/messages`` body produces a 5xx. Random bodies (hypothesis) mixing valid and
malformed blocks, tools, tool choices, thinking and sampling fields hit the real app
(--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3) on loopback with a
scripted engine; every answer is 200 (a message, or an event stream ending in message_stop) or a
4xx in Anthropic's error shape, and nothing stays in flight."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.api.settings import ServerSettings
from kvserve.testing.tool_checkpoint import build_tool_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_client_mistakes import VALUES

TOOL = {"name": "f", "input_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}}
BLOCK = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.one_of(st.text(max_size=6), VALUES)}),
    st.just({"type": "thinking", "thinking": "hm", "signature": "s"}),
    st.just({"type": "redacted_thinking", "data": "x"}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": st.just("t1"), "name": st.just("f"),
                           "input": st.one_of(st.just({"a": 1}), VALUES)}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": st.just("t1"),
                           "content": st.one_of(st.text(max_size=4), st.just([{"type": "text", "text": "r"}]),
                                                st.just([{"type": "image", "source": {}}]), VALUES)}),
    st.sampled_from([{"type": "image", "source": {}}, {"type": "document"}, {"type": "server_tool_use"}, {}]),
    VALUES)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "tool"]),
                                 "content": st.one_of(st.text(max_size=6), st.lists(BLOCK, max_size=3), VALUES)})
FIELDS = {
    "model": st.sampled_from(["scripted-model", "other", ""]),
    "max_tokens": st.one_of(st.integers(-1, 6), VALUES),
    "messages": st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), VALUES),
    "system": st.one_of(st.text(max_size=6), st.lists(BLOCK, max_size=2), VALUES),
    "tools": st.one_of(st.just([TOOL]), st.just([]), st.just([{"type": "web_search_20250305", "name": "w"}]),
                       st.lists(st.one_of(st.just(TOOL), VALUES), max_size=2), VALUES),
    "tool_choice": st.one_of(st.sampled_from([{"type": "auto"}, {"type": "any"}, {"type": "none"},
                                              {"type": "tool", "name": "f"}, {"type": "tool", "name": "g"},
                                              {"type": "tool"}, {"type": "any", "disable_parallel_tool_use": True}]),
                             VALUES),
    "thinking": st.one_of(st.sampled_from([{"type": "adaptive"}, {"type": "disabled"},
                                           {"type": "enabled", "budget_tokens": 1024}]), VALUES),
    "output_config": st.one_of(st.just({"effort": "low"}), st.just({"format": {"type": "json_schema",
                                                                               "schema": {"type": "object"}}}),
                               VALUES),
    "stop_sequences": st.one_of(st.lists(st.text(max_size=3), max_size=2), VALUES),
    "temperature": VALUES, "top_p": VALUES, "top_k": VALUES, "metadata": VALUES, "service_tier": VALUES,
    "stream": st.booleans(), "container": VALUES, "speed": VALUES,
}


@pytest.fixture(scope="module")
def server():
    settings_ = ServerSettings(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    with LoopbackServer(ScriptedEngine(build_tool_tokenizer(), max_model_len=4096), settings_) as srv:
        yield srv


def check(response: httpx.Response, ok_key: str = "type") -> None:
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"} and body["error"]["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        assert response.text.endswith('event: message_stop\ndata: {"type":"message_stop"}\n\n'), response.text
    else:
        assert ok_key in json.loads(response.text)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(sorted(FIELDS)), st.none(), max_size=7).flatmap(
    lambda keys: st.fixed_dictionaries({key: FIELDS[key] for key in keys})))
def test_random_message_bodies_never_5xx(server, body):
    body.setdefault("model", "scripted-model")
    body.setdefault("max_tokens", 4)
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        check(http.post("/v1/messages", json=body))
        count = {key: value for key, value in body.items() if key not in ("max_tokens", "stream")}
        check(http.post("/v1/messages/count_tokens", json=count), ok_key="input_tokens")
    assert server.state.in_flight == 0
