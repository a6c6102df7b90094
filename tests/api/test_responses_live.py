"""/v1/responses through the official ``openai`` client against live servers on random-weight
checkpoints (tiny_llama; a Qwen2 with hermes tool calling, kvserve.testing.tool_checkpoint): a
greedy response
equals the chat completion it translates to (text, logprob bits, token count, usage), a stream
adds up to its final response, retrieve/delete, a function call round trip through
``previous_response_id`` equal to the same conversation sent to chat, ``text.format`` JSON
schemas (``responses.parse`` and ``responses.stream`` with a pydantic model), background +
cancel (the engine ends the request), and refused requests leaving the server working."""

from __future__ import annotations

import json
import time

import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from kvserve.testing.live_server import start_live_server
from kvserve.testing.tool_checkpoint import build_tool_checkpoint

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"],
    "additionalProperties": False}
TOOL = {"type": "function", "name": "get_weather", "description": "Weather forecast", "parameters": WEATHER,
        "strict": True}
CHAT_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                              "parameters": WEATHER, "strict": True}}
LOGPROBS = ["message.output_text.logprobs"]


class Forecast(BaseModel):
    city: str = Field(max_length=12)
    days: int


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_tool_checkpoint(tmp_path_factory.mktemp("responses-qwen2"))
    srv = start_live_server(str(model), served_model_name="tiny", api_key="k", dtype="float32", max_model_len=2048,
                            num_gpu_blocks_override=512, max_num_seqs=16,
                            settings={"enable_auto_tool_choice": True, "tool_call_parser": "hermes"})
    srv.client = srv.make_client()
    yield srv
    srv.stop()


def wait_idle(server, timeout: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = server.engine_stats()
        if (stats["num_running"], stats["num_waiting"], server.engine.num_unfinished_requests) == (0, 0, 0):
            break
        time.sleep(0.02)
    return server.engine_stats()


def bits(logprob: float) -> str:
    return float(logprob).hex()


def test_a_greedy_response_equals_the_chat_answer_it_translates_to(live_server):
    """On tiny_llama (tests/api/conftest.py): the tool checkpoint's spare vocabulary rows make
    ids its tokenizer cannot name, so its top logprobs cannot be spelled."""
    response = live_server.client.responses.create(
        model="tiny-llama", instructions="You are terse.", input="Tell me a story.", temperature=0,
        max_output_tokens=12, include=LOGPROBS, top_logprobs=3)
    chat = live_server.client.chat.completions.create(
        model="tiny-llama", messages=[{"role": "system", "content": "You are terse."},
                                {"role": "user", "content": "Tell me a story."}],
        temperature=0, max_completion_tokens=12, logprobs=True, top_logprobs=3, extra_body={"return_token_ids": True})
    choice = chat.choices[0]
    assert response.output_text == choice.message.content and len(response.output) == 1
    text = response.output[0].content[0]
    ours = [(lp.token, lp.bytes, bits(lp.logprob), [(t.token, t.bytes, bits(t.logprob)) for t in lp.top_logprobs])
            for lp in text.logprobs]
    theirs = [(lp.token, lp.bytes, bits(lp.logprob), [(t.token, t.bytes, bits(t.logprob)) for t in lp.top_logprobs])
              for lp in choice.logprobs.content]
    assert ours == theirs and len(ours) == len(choice.token_ids) == response.usage.output_tokens
    assert (response.usage.input_tokens, response.usage.output_tokens, response.usage.total_tokens) == \
           (chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)
    assert response.status == ("incomplete" if choice.finish_reason == "length" else "completed")
    assert (response.temperature, response.max_output_tokens, response.model) == (0.0, 12, "tiny-llama")


def test_a_stream_adds_up_to_its_final_response_and_to_the_whole_one(live_server):
    body = dict(model="tiny-llama", input="Count to five.", temperature=0, max_output_tokens=16, include=LOGPROBS,
                top_logprobs=1)
    whole = live_server.client.responses.create(**body)
    events = list(live_server.client.responses.create(stream=True, **body))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == f"response.{whole.status}"
    final = events[-1].response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    logprobs = [lp.logprob for e in events if e.type == "response.output_text.delta" for lp in e.logprobs]
    assert text == final.output_text == whole.output_text
    assert logprobs == [lp.logprob for lp in final.output[0].content[0].logprobs] == \
           [lp.logprob for lp in whole.output[0].content[0].logprobs]
    counts = ("input_tokens", "output_tokens", "total_tokens")
    assert [getattr(final.usage, k) for k in counts] == [getattr(whole.usage, k) for k in counts]
    assert final.usage.input_tokens_details.cached_tokens > 0  # the second time, the prompt was cached
    assert final.id != whole.id


def test_retrieve_and_delete(server):
    created = server.client.responses.create(model="tiny", input="Hi", max_output_tokens=4, metadata={"k": "v"})
    assert server.client.responses.retrieve(created.id) == created
    server.client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as info:
        server.client.responses.retrieve(created.id)
    assert info.value.body["param"] == "response_id"


def test_a_function_call_round_trip_through_previous_response_id(server):
    first = server.client.responses.create(model="tiny", input="Weather in Paris for two days?", tools=[TOOL],
                                           tool_choice={"type": "function", "name": "get_weather"},
                                           max_output_tokens=80)
    [call] = first.output
    assert (call.type, call.name, call.status, first.status) == ("function_call", "get_weather", "completed",
                                                                  "completed")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    assert call.call_id.startswith("chatcmpl-tool-") and call.id.startswith("fc_")
    second = server.client.responses.create(
        model="tiny", previous_response_id=first.id, tools=[TOOL], tool_choice="none", temperature=0,
        max_output_tokens=8, input=[{"type": "function_call_output", "call_id": call.call_id, "output": '{"c": 21}'}])
    chat = server.client.chat.completions.create(
        model="tiny", tools=[CHAT_TOOL], tool_choice="none", temperature=0, max_completion_tokens=8, messages=[
            {"role": "user", "content": "Weather in Paris for two days?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call.call_id, "type": "function", "function": {
                "name": "get_weather", "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.call_id, "content": '{"c": 21}'}])
    assert second.output_text == chat.choices[0].message.content
    assert second.usage.input_tokens == chat.usage.prompt_tokens and second.previous_response_id == first.id


def test_text_format_json_schema_constrains_the_output(server):
    parsed = server.client.responses.parse(model="tiny", input="A forecast, please.", text_format=Forecast,
                                           max_output_tokens=60)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Forecast)
    jsonschema.validate(json.loads(parsed.output_text), Forecast.model_json_schema())
    with server.client.responses.stream(model="tiny", input="Another one.", text_format=Forecast,
                                        max_output_tokens=60) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Forecast) and final.output_text == deltas
    assert final.text.format.type == "json_schema" and final.text.format.name == "Forecast"


def test_background_then_cancel_ends_the_engine_request(server):
    queued = server.client.responses.create(model="tiny", input="Write a long story.", background=True,
                                            max_output_tokens=1500, extra_body={"ignore_eos": True})
    assert (queued.status, queued.background, queued.output) == ("queued", True, [])
    cancelled = server.client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled"
    assert server.client.responses.retrieve(queued.id).status == "cancelled"
    stats = wait_idle(server)
    assert (stats["num_running"], stats["num_waiting"]) == (0, 0)
    with pytest.raises(openai.BadRequestError) as info:
        finished = server.client.responses.create(model="tiny", input="Hi", max_output_tokens=2)
        server.client.responses.cancel(finished.id)  # not a background response
    assert info.value.body["param"] == "response_id"
    done = server.client.responses.create(model="tiny", input="Hi", max_output_tokens=3, background=True)
    deadline = time.monotonic() + 30
    while server.client.responses.retrieve(done.id).status in ("queued", "in_progress"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert server.client.responses.retrieve(done.id).usage.output_tokens <= 3


@pytest.mark.parametrize("body, error, param", [
    ({"previous_response_id": "resp_unknown"}, openai.NotFoundError, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, openai.BadRequestError, "tools.0.type"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, openai.BadRequestError, "tools.0.type"),
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "What is this?"},
                                             {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
     openai.BadRequestError, "input.0.content.1.type"),
])
def test_refused_requests_leave_the_server_working(server, body, error, param):
    with pytest.raises(error) as info:
        server.client.responses.create(model="tiny", **{"input": "Hi", **body})
    assert info.value.body["param"] == param and info.value.body["type"] == "invalid_request_error"
    assert server.client.responses.create(model="tiny", input="Hi", max_output_tokens=2).output_text is not None
