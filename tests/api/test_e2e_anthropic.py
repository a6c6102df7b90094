"""``/v1/messages`` on a real engine through the official ``anthropic`` client: greedy replies equal
the same conversation through ``/v1/chat/completions`` (text, token counts, finish), streamed
or not; ``stop_sequences`` and ``max_tokens`` end as Anthropic says; and a tool round trip
(a forced ``tool_use``, its ``tool_result`` sent back) on a random-weight Qwen2 checkpoint whose
template speaks the Qwen2.5 tool format (``kvserve.testing.tool_checkpoint``); refusals are
counted in ``request_rejected_total`` as on the OpenAI routes."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kvserve.testing.live_server import start_live_server
from kvserve.testing.tool_checkpoint import build_tool_checkpoint

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                            "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "Forecast", "input_schema": WEATHER}]
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Forecast",
                                                "parameters": WEATHER}}]
FINISH = {"stop": "end_turn", "length": "max_tokens"}
# The anthropic client (2.x) has no sampling arguments any more; vLLM's /v1/messages still reads them.
GREEDY = {"temperature": 0}


def client_of(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key=server.api_key, base_url=server.base_url, max_retries=0)


def stream_text(client, **body) -> tuple[str, object]:
    with client.messages.stream(**body) as stream:
        text = "".join(stream.text_stream)
        return text, stream.get_final_message()


def test_greedy_replies_equal_chat_completions(live_server):
    client = client_of(live_server)
    for max_tokens in (6, 24):
        body = dict(model="tiny-llama", max_tokens=max_tokens, extra_body=GREEDY, system="You are terse.",
                    messages=[{"role": "user", "content": "Tell me a story."}])
        chat = live_server.client.chat.completions.create(
            model="tiny-llama", max_tokens=max_tokens, temperature=0,
            messages=[{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Tell me a story."}])
        message = client.messages.create(**body)
        text, final = stream_text(client, **body)
        expected = chat.choices[0].message.content
        for got in (message, final):
            assert [block.type for block in got.content] == ["text"] and got.content[0].text == expected
            assert got.stop_reason == FINISH[chat.choices[0].finish_reason] and got.stop_sequence is None
            assert got.usage.output_tokens == chat.usage.completion_tokens
            assert got.usage.input_tokens + got.usage.cache_read_input_tokens == chat.usage.prompt_tokens
        assert text == expected


def test_max_tokens_and_stop_sequences(live_server):
    client = client_of(live_server)
    body = dict(model="tiny-llama", extra_body=GREEDY, messages=[{"role": "user", "content": "Count to ten."}])
    full = client.messages.create(max_tokens=16, **body)
    assert full.stop_reason == "max_tokens" and full.usage.output_tokens == 16  # random weights: no early EOS
    text = full.content[0].text
    at = next(i for i in range(3, len(text) - 2) if text.find(text[i:i + 2]) == i)  # a first occurrence
    stop = text[at:at + 2]
    for got in (client.messages.create(max_tokens=16, stop_sequences=["never-written", stop], **body),
                stream_text(client, max_tokens=16, stop_sequences=["never-written", stop], **body)[1]):
        assert (got.stop_reason, got.stop_sequence) == ("stop_sequence", stop)
        assert got.content[0].text == text[:at]  # the stop sequence is not in the text, as Anthropic


@pytest.fixture(scope="module")
def tool_server(tmp_path_factory):
    model = build_tool_checkpoint(tmp_path_factory.mktemp("tool-qwen2-anthropic"))
    server = start_live_server(str(model), served_model_name="tiny", api_key="k", dtype="float32",
                               max_model_len=2048, num_gpu_blocks_override=512, max_num_seqs=16,
                               structured_outputs_config={"disable_any_whitespace": True},
                               settings={"enable_auto_tool_choice": True, "tool_call_parser": "hermes"})
    server.client = server.make_client()
    yield server
    server.stop()


def test_a_tool_round_trip(tool_server):
    client = client_of(tool_server)
    question = {"role": "user", "content": "Weather in Paris?"}
    forced = dict(model="tiny", max_tokens=96, extra_body=GREEDY, tools=TOOLS, messages=[question],
                  tool_choice={"type": "tool", "name": "get_weather"})
    call = client.messages.create(**forced)
    assert call.stop_reason == "tool_use" and [block.type for block in call.content] == ["tool_use"]
    use = call.content[0]
    assert use.name == "get_weather" and use.id.startswith("chatcmpl-tool-")
    jsonschema.validate(use.input, WEATHER)
    streamed = stream_text(client, **forced)[1]
    assert streamed.stop_reason == "tool_use" and streamed.content[0].input == use.input

    conversation = [question, {"role": "assistant", "content": call.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18 C"}]}]
    answer = client.messages.create(model="tiny", max_tokens=8, extra_body=GREEDY, tools=TOOLS, messages=conversation,
                                    tool_choice={"type": "none"})
    chat = tool_server.client.chat.completions.create(
        model="tiny", max_tokens=8, extra_body=GREEDY, tools=CHAT_TOOLS, tool_choice="none", messages=[
            question, {"role": "assistant", "content": None, "tool_calls": [
                {"id": use.id, "type": "function", "function": {"name": "get_weather",
                                                                "arguments": json.dumps(use.input)}}]},
            {"role": "tool", "tool_call_id": use.id, "content": "18 C"}])
    assert [block.type for block in answer.content] == ["text"]
    assert answer.content[0].text == chat.choices[0].message.content
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == chat.usage.prompt_tokens
    counted = client.messages.count_tokens(model="tiny", tools=TOOLS, messages=conversation,
                                           tool_choice={"type": "none"})
    assert counted.input_tokens == chat.usage.prompt_tokens


def test_any_tool_is_a_required_call(tool_server):
    client = client_of(tool_server)
    message = client.messages.create(model="tiny", max_tokens=96, extra_body=GREEDY, tools=TOOLS,
                                     tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                     messages=[{"role": "user", "content": "Weather?"}])
    assert message.stop_reason == "tool_use" and [block.type for block in message.content] == ["tool_use"]
    jsonschema.validate(message.content[0].input, WEATHER)


def rejected(server, reason: str) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "kvserve:request_rejected_total" and sample.labels.get("reason") == reason)


def test_refusals_are_counted_as_on_the_openai_routes(live_server):
    before = rejected(live_server, "invalid_request"), rejected(live_server, "invalid_api_key")
    image = {"model": "tiny-llama", "max_tokens": 4, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}
    assert httpx.post(live_server.base_url + "/v1/messages", json=image,
                      headers={"x-api-key": live_server.api_key}).status_code == 400
    assert httpx.post(live_server.base_url + "/v1/messages", json=image,
                      headers={"x-api-key": "wrong-key-123"}).status_code == 401
    after = rejected(live_server, "invalid_request"), rejected(live_server, "invalid_api_key")
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
