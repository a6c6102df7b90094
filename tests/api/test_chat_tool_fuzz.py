"""Property: no combination of the chat tool and reasoning fields produces a 5xx. Random bodies
(hypothesis) mixing valid and malformed tools, tool_choice, earlier tool calls, reasoning fields
hit the real app (--enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3)
on loopback with a scripted engine; every answer is 200 or a 4xx in OpenAI's error shape, and
nothing stays in flight."""

from __future__ import annotations

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvserve.api.settings import ServerSettings
from kvserve.testing.tool_checkpoint import build_tool_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_client_mistakes import VALUES, check

TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object",
                                                                     "properties": {"a": {"type": "integer"}}}}}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
FIELDS = {
    "tools": st.one_of(st.just([TOOL]), st.just([]), st.lists(st.one_of(st.just(TOOL), VALUES), max_size=2), VALUES),
    "tool_choice": st.one_of(st.sampled_from(["none", "auto", "required", "any"]),
                             st.just({"type": "function", "function": {"name": "f"}}),
                             st.fixed_dictionaries({"type": st.just("function"),
                                                    "function": st.fixed_dictionaries({"name": VALUES})}), VALUES),
    "parallel_tool_calls": st.one_of(st.booleans(), VALUES),
    "include_reasoning": st.one_of(st.booleans(), VALUES),
    "reasoning_effort": st.one_of(st.sampled_from(["none", "low", "high", "max"]), VALUES),
    "chat_template_kwargs": st.one_of(st.just({"enable_thinking": False}), VALUES),
    "stream": st.booleans(),
    "max_tokens": st.integers(1, 8),
    "messages": st.one_of(
        st.just([{"role": "user", "content": "hi"}]),
        st.just([{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [CALL]},
                 {"role": "tool", "tool_call_id": "c1", "content": "2"}]),
        st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "tool"]),
                                        "content": st.one_of(st.text(max_size=5), st.none()),
                                        "tool_calls": VALUES}), min_size=1, max_size=2)),
}


@pytest.fixture(scope="module")
def server():
    settings_ = ServerSettings(enable_auto_tool_choice=True, tool_call_parser="hermes", reasoning_parser="qwen3")
    with LoopbackServer(ScriptedEngine(build_tool_tokenizer(), max_model_len=4096), settings_) as srv:
        yield srv


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.dictionaries(st.sampled_from(sorted(FIELDS)), st.none(), max_size=7).flatmap(
    lambda keys: st.fixed_dictionaries({key: FIELDS[key] for key in keys})))
def test_random_tool_and_reasoning_bodies_never_5xx(server, body):
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    with httpx.Client(base_url=server.base_url, timeout=30) as http:
        check(http.post("/v1/chat/completions", json=body))
    assert server.state.in_flight == 0
