"""Hostile-client findings on /v1/responses and /v1/messages (loopback, scripted engine): each
request here once got a 500 or a misleading answer; now each is a 4xx naming the field it is
about, nothing is started, and the server goes on serving."""

from __future__ import annotations

import httpx
import pytest

from kvserve.testing.tokenizer_kinds import build_tokenizer
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine
from test_server_errors import assert_error


@pytest.fixture(scope="module")
def srv():
    with LoopbackServer(ScriptedEngine(build_tokenizer("bpe"), step_delay=0.001)) as server:
        yield server


def responses(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/responses", timeout=30,
                      json={"model": "scripted-model", "input": "hi", "max_output_tokens": 2, **body})


def messages(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/messages", timeout=30,
                      json={"model": "scripted-model", "max_tokens": 2,
                            "messages": [{"role": "user", "content": "hi"}], **body})


def assert_still_serving(srv) -> None:
    assert srv.state.in_flight == 0
    assert responses(srv).status_code == 200


@pytest.mark.parametrize("key, value", [("content", {"text": "x"}), ("content", 5), ("content", "thought"),
                                        ("summary", {"0": {"text": "x"}}), ("summary", 3)])
def test_a_reasoning_item_whose_parts_are_not_a_list_is_400(srv, key, value):
    calls = len(srv.engine.calls)
    error = assert_error(responses(srv, input=[{"type": "reasoning", key: value}]), 400, param=f"input.0.{key}")
    assert "list" in error["message"]
    assert len(srv.engine.calls) == calls
    assert_still_serving(srv)


def test_a_replay_starting_before_the_first_event_is_400_not_the_last_events(srv):
    events = httpx.post(srv.base_url + "/v1/responses", timeout=30, json={
        "model": "scripted-model", "input": "hi", "max_output_tokens": 3, "background": True, "stream": True}).text
    response_id = events.split('"id":"', 1)[1].split('"', 1)[0]
    url = f"{srv.base_url}/v1/responses/{response_id}"
    every = httpx.get(url, params={"stream": "true"}, timeout=30).text
    assert httpx.get(url, params={"stream": "true", "starting_after": -1}, timeout=30).text == every
    for bad in (-2, -5):
        error = assert_error(httpx.get(url, params={"stream": "true", "starting_after": bad}, timeout=30), 400,
                             param="starting_after")
        assert str(bad) in error["message"]
    assert_still_serving(srv)


def anthropic_message(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    return body["error"]["message"]


@pytest.mark.parametrize("content, field, words", [
    ([{"type": "text"}], "messages.0.content.0.text", ["Field required"]),
    ([{"type": "tool_result", "tool_use_id": "t", "content": 5}], "messages.0.content.0.content",
     ["valid string", "valid list"]),
    ([{"type": "tool_result", "tool_use_id": None, "content": "r"}], "messages.0.content.0.tool_use_id",
     ["valid string"]),
    (None, "messages.0.content", ["valid string", "valid list"]),
    ([None], "messages.0.content.0", []),
])
def test_a_bad_content_block_is_named_by_its_own_path_not_the_string_alternative(srv, content, field, words):
    """``content`` is a string or a list of blocks: the error of the block the client sent was
    hidden behind the string alternative's (``messages.0.content.str: Input should be a valid
    string``)."""
    message = anthropic_message(messages(srv, messages=[{"role": "user", "content": content}]))
    assert f"'{field}'" in message and ".str" not in message and "list[" not in message, message
    for word in words:
        assert word in message, message
    assert_still_serving(srv)


def test_a_tool_use_whose_input_is_not_an_object_is_named(srv):
    turns = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "get", "input": "x"}]},
             {"role": "user", "content": "go on"}]
    message = anthropic_message(messages(srv, messages=turns))
    assert "'messages.1.content.0.input'" in message and "dictionary" in message, message


def test_openai_routes_name_the_union_field_too(srv):
    error = assert_error(httpx.post(srv.base_url + "/v1/chat/completions", timeout=30, json={
        "model": "scripted-model", "messages": [{"role": "user", "content": 5}]}), 400, param="messages.0.content")
    assert "valid string" in error["message"] and "valid list" in error["message"]
    assert_still_serving(srv)


class CutEngine(ScriptedEngine):
    """Writes ``text`` one token a step, cut at ``max_tokens`` (finish_reason ``length``)."""

    def __init__(self, tokenizer, text: str):
        super().__init__(tokenizer, max_model_len=4096)
        self.text = text

    async def _steps(self, prompt_ids, params, request_id, prompt):
        import asyncio

        from kvserve.engine.detokenizer import IncrementalDetokenizer
        from kvserve.outputs import CompletionOutput, RequestOutput
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        cut = len(ids) > params.max_tokens
        ids = ids[:params.max_tokens]
        detokenizer = IncrementalDetokenizer(self.tokenizer, list(prompt_ids), params.skip_special_tokens)
        for step, token in enumerate(ids):
            await asyncio.sleep(0)
            last = step + 1 == len(ids)
            text = detokenizer.add_tokens([token]) + (detokenizer.flush() if last else "")
            finish = ("length" if cut else "stop") if last else None
            yield RequestOutput(request_id, prompt, list(prompt_ids), None,
                                [CompletionOutput(0, text, [token], logprobs=None, finish_reason=finish)],
                                finished=last, num_cached_tokens=0)


def test_a_response_cut_inside_a_streamed_function_call_can_be_continued():
    """A stream cut by max_output_tokens inside a call stores the call with its arguments so far
    (not JSON); a follow-up with previous_response_id was a 400 naming ``input`` (a field the
    client had sent nothing wrong in). The cut call is continued as the assistant's text, as the
    non-streamed response of the same text stores it."""
    from kvserve.api.settings import ServerSettings
    from kvserve.testing.tool_checkpoint import build_tool_tokenizer
    tokenizer = build_tool_tokenizer()
    text = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    cut_at = len(tokenizer.encode('<tool_call>\n{"name": "get_time", "arguments": {"tz": "U', add_special_tokens=False))
    settings = ServerSettings(tool_call_parser="hermes", enable_auto_tool_choice=True)
    tools = [{"type": "function", "name": "get_time", "parameters": {"type": "object"}}]
    with LoopbackServer(CutEngine(tokenizer, text), settings) as server:
        events = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
            "model": "scripted-model", "input": "time?", "tools": tools, "max_output_tokens": cut_at,
            "stream": True}).text
        final = [line for line in events.split("\n") if line.startswith("data:")][-1]
        import json
        stored = json.loads(final[5:])["response"]
        assert stored["status"] == "incomplete"
        assert [(o["type"], o["status"]) for o in stored["output"]] == [("function_call", "incomplete")]
        follow = httpx.post(server.base_url + "/v1/responses", timeout=30, json={
            "model": "scripted-model", "input": "go on", "previous_response_id": stored["id"], "tools": tools,
            "max_output_tokens": 2})
        assert follow.status_code == 200, follow.text
        prompt = tokenizer.decode(server.engine.calls[-1][1])
        assert stored["output"][0]["arguments"] in prompt and prompt.index("go on") > prompt.index("time?")
        assert server.state.in_flight == 0


def test_a_function_call_item_whose_arguments_are_not_json_is_named_by_its_index(srv):
    items = [{"role": "user", "content": "time?"},
             {"type": "function_call", "call_id": "c1", "name": "get_time", "arguments": "{\"tz\": "},
             {"type": "function_call_output", "call_id": "c1", "output": "noon"}]
    error = assert_error(responses(srv, input=items), 400, param="input.1.arguments")
    assert "JSON" in error["message"]
    assert_still_serving(srv)
