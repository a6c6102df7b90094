"""``POST /v1/messages`` through the official ``anthropic`` client against the real app on loopback,
with scripted engines that write given text cut into chosen token pieces (hermes tool parser,
qwen3 reasoning parser): the message equals the chat completion of the same text, the stream adds
up to the message at every split, errors come in Anthropic's shape on these routes only (OpenAI's
elsewhere), the key is also read from ``x-api-key``, and nothing stays in flight."""

from __future__ import annotations

import asyncio
import json
import random
import re

import anthropic
import httpx
import pytest

from kvserve.api.anthropic_request import TemplateFacts
from kvserve.api.serving_messages import probe_template
from kvserve.api.settings import ServerSettings
from kvserve.engine.detokenizer import IncrementalDetokenizer
from kvserve.errors import RequestFailedError
from kvserve.outputs import CompletionOutput, RequestOutput
from kvserve.testing.tool_checkpoint import build_tool_tokenizer
from loopback import LoopbackServer
from scripted_engine import TextEngine

KEY = "key-1"
MODEL = "scripted-model"
TOOLS = [{"name": "get_weather", "description": "Forecast", "input_schema": {
             "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}},
         {"name": "get_time", "input_schema": {"type": "object", "properties": {"tz": {"type": "string"}}}}]
CHAT_TOOLS = [{"type": "function", "function": {"name": t["name"], **({"description": t["description"]}
                                                                     if "description" in t else {}),
                                               "parameters": t["input_schema"]}} for t in TOOLS]
USER = [{"role": "user", "content": "Weather in Paris?"}]
THINK_CALLS = ('<think>\nThe user wants weather.\n</think>\n\nChecking 2 cities.<tool_call>\n{"name": "get_weather", '
               '"arguments": {"city": "Paris", "days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", '
               '"arguments": {"tz": "CET"}}\n</tool_call>')
TEXTS = {"plain": "Café 你好 🙂, plain text without tags.", "thinking": "<think>\nHm.\n</think>\n\nIt is 18 °C.",
         "calls": THINK_CALLS, "call_only": '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>',
         "cut_reasoning": "<think>\nstill thinking", "empty": ""}


class SplitEngine(TextEngine):
    """Writes ``text`` in pieces of ``sizes(number of tokens)`` tokens (set before each request),
    then stops as at EOS; with ``fail_after`` set, the request fails after that many pieces."""

    def __init__(self, tokenizer):
        super().__init__(tokenizer, "")
        self.sizes = lambda total: [1] * total
        self.fail_after: int | None = None

    async def _feed(self, request, sink) -> None:
        try:
            async for output in self._steps(request.prompt_token_ids, request.sampling_params, request.request_id,
                                            request.prompt):
                sink(output)
        except RequestFailedError as exc:
            sink(exc)
        finally:
            self.running.discard(request.request_id)
            self._tasks.pop(request.request_id, None)

    async def _steps(self, prompt_ids, params, request_id, prompt):
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        pieces, at = [], 0
        for size in self.sizes(len(ids)) if ids else []:
            pieces.append(ids[at:at + size])
            at += size
        assert at == len(ids)
        pieces = pieces or [[self.tokenizer.eos_token_id]]  # nothing to write: the EOS alone
        detokenizer = IncrementalDetokenizer(self.tokenizer, list(prompt_ids), params.skip_special_tokens)
        for step, piece in enumerate(pieces):
            await asyncio.sleep(0)
            if self.fail_after is not None and step == self.fail_after:
                raise RequestFailedError("the scripted engine failed", request_id)
            last = step + 1 == len(pieces)
            text = detokenizer.add_tokens(piece) if ids else ""
            text += detokenizer.flush() if last and ids else ""
            output = CompletionOutput(0, text, piece, logprobs=None, finish_reason="stop" if last else None)
            yield RequestOutput(request_id, prompt, list(prompt_ids), None, [output], finished=last,
                                num_cached_tokens=0)


@pytest.fixture(scope="module")
def server():
    settings = ServerSettings(api_keys=(KEY,), enable_auto_tool_choice=True, tool_call_parser="hermes",
                              reasoning_parser="qwen3", max_request_body_bytes=100_000)
    with LoopbackServer(SplitEngine(build_tool_tokenizer()), settings) as srv:
        srv.client = anthropic.Anthropic(api_key=KEY, base_url=srv.base_url, max_retries=0)
        yield srv


@pytest.fixture
def engine(server):
    engine = server.engine
    yield engine
    engine.sizes, engine.fail_after = (lambda total: [1] * total), None
    assert server.state.in_flight == 0


def http(server, path: str, body, headers=None) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers={"x-api-key": KEY, **(headers or {})}, timeout=30)


def shape(message) -> dict:
    """A message as JSON without what differs between two requests (the message id, the random
    thinking signatures; tool_use ids are renamed by position)."""
    data = message if isinstance(message, dict) else message.model_dump(mode="json", exclude_none=True)
    data = json.loads(json.dumps(data))
    assert data.pop("id").startswith("msg_")
    for i, block in enumerate(data["content"]):
        if block["type"] == "thinking":
            assert re.fullmatch(r"[0-9a-f]{32}", block.pop("signature"))
        if block["type"] == "tool_use":
            assert block.pop("id").startswith("chatcmpl-tool-")
    return data


def expected_from_chat(server, text_key: str) -> dict:
    """The message the same text gives through ``/v1/chat/completions`` (reasoning, content and
    tool calls, in that order; usage with the prefix-cache hits apart)."""
    server.engine.text = TEXTS[text_key]
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={
        "model": MODEL, "messages": USER, "tools": CHAT_TOOLS, "max_tokens": 500},
        headers={"Authorization": f"Bearer {KEY}"}, timeout=30).json()
    choice, usage = chat["choices"][0], chat["usage"]
    content = []
    if choice["message"]["reasoning"]:
        content.append({"type": "thinking", "thinking": choice["message"]["reasoning"]})
    if choice["message"]["content"]:
        content.append({"type": "text", "text": choice["message"]["content"]})
    content += [{"type": "tool_use", "name": c["function"]["name"], "input": json.loads(c["function"]["arguments"])}
                for c in choice["message"].get("tool_calls") or []]
    stop = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}[choice["finish_reason"]]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    return {"type": "message", "role": "assistant", "model": MODEL,
            "content": content or [{"type": "text", "text": ""}], "stop_reason": stop,
            "usage": {"input_tokens": usage["prompt_tokens"] - cached, "output_tokens": usage["completion_tokens"],
                      "cache_read_input_tokens": cached}}


def create(server, **extra):
    return server.client.messages.create(**{"model": MODEL, "max_tokens": 500, "messages": USER, "tools": TOOLS,
                                            **extra})


def fine(client) -> str:
    """A request that must work: the scripted text as the reply (thinking disabled, so the qwen3
    parser reads it all as the answer)."""
    message = client.messages.create(model=MODEL, max_tokens=5, messages=USER, thinking={"type": "disabled"})
    assert [block.type for block in message.content] == ["text"]
    return message.content[0].text


def streamed(server, **extra):
    with server.client.messages.stream(model=MODEL, max_tokens=500, messages=USER, tools=TOOLS, **extra) as stream:
        for _ in stream:
            pass
        return stream.get_final_message()


@pytest.mark.parametrize("text_key", sorted(TEXTS))
def test_the_message_is_the_chat_completion_of_the_same_text(server, engine, text_key):
    expected = expected_from_chat(server, text_key)
    assert shape(create(server)) == expected
    assert shape(streamed(server)) == expected


def _splits(total: int):
    yield [total]
    yield [1] * total
    for seed in range(3):
        rng, sizes = random.Random(seed), []
        while sum(sizes) < total:
            sizes.append(min(rng.randint(1, 4), total - sum(sizes)))
        yield sizes


@pytest.mark.parametrize("text_key", ["plain", "thinking", "call_only", "cut_reasoning"])
def test_the_stream_adds_up_to_the_message_at_any_split(server, engine, text_key):
    expected = expected_from_chat(server, text_key)
    for sizes in _splits(len(server.engine.tokenizer.encode(TEXTS[text_key], add_special_tokens=False))):
        engine.sizes = lambda total, sizes=sizes: sizes
        assert shape(streamed(server)) == expected, sizes


def test_the_stream_adds_up_to_the_message_cut_at_every_token(server, engine):
    """Thinking, text and two calls: the text cut in two at each token boundary in turn."""
    expected = expected_from_chat(server, "calls")
    total = len(server.engine.tokenizer.encode(THINK_CALLS, add_special_tokens=False))
    for cut in range(1, total):
        engine.sizes = lambda total, cut=cut: [cut, total - cut]
        assert shape(streamed(server)) == expected, cut


def sse_events(response: httpx.Response) -> list[tuple[str, dict]]:
    events = []
    for block in response.text.split("\n\n"):
        if block:
            name, data = block.split("\n")
            assert name.startswith("event: ") and data.startswith("data: ")
            events.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return events


def test_event_names_and_order(server, engine):
    engine.text, engine.sizes = THINK_CALLS, (lambda total: [3] * (total // 3) + [total % 3] * (total % 3 > 0))
    response = http(server, "/v1/messages", {"model": MODEL, "max_tokens": 500, "messages": USER, "tools": TOOLS,
                                             "stream": True})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response)
    assert all(name == data["type"] for name, data in events)
    order = " ".join(name for name, _ in events)
    blocks = r"(content_block_start( content_block_delta)+ content_block_stop ?)+"
    assert re.fullmatch(rf"message_start {blocks} message_delta message_stop", order), order
    starts = [data["content_block"]["type"] for name, data in events if name == "content_block_start"]
    assert starts == ["thinking", "text", "tool_use", "tool_use"]
    indices = [data["index"] for name, data in events if name.startswith("content_block")]
    assert indices == sorted(indices) and set(indices) == {0, 1, 2, 3}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert "data: [DONE]" not in response.text


def test_an_engine_failure_mid_stream_is_an_error_event(server, engine):
    engine.text, engine.fail_after = TEXTS["thinking"], 2
    response = http(server, "/v1/messages", {"model": MODEL, "max_tokens": 50, "messages": USER, "stream": True})
    events = sse_events(response)
    assert [name for name, _ in events][:1] == ["message_start"] and events[-1][0] == "error"
    assert events[-1][1]["type"] == "error" and events[-1][1]["error"]["type"] == "api_error"
    assert "the scripted engine failed" in events[-1][1]["error"]["message"]
    with pytest.raises(anthropic.APIStatusError, match="the scripted engine failed"):
        streamed(server)
    with pytest.raises(anthropic.InternalServerError) as info:  # not streamed: a 500 in Anthropic's shape
        create(server)
    assert info.value.body["error"]["type"] == "api_error"


def assert_anthropic_error(response: httpx.Response, status: int, error_type: str, *words: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"} and body["error"]["type"] == error_type
    for word in words:
        assert word in body["error"]["message"], body
    return body["error"]["message"]


BAD = [
    ({"messages": USER}, "max_tokens", "Field required"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}]}]},
     "messages.0.content.0.type", "'image' blocks are not supported"),
    ({"max_tokens": 5, "messages": USER, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools.0.type", "server tool"),
    ({"max_tokens": 5, "messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024}}, "thinking.type",
     "budget_tokens"),
    ({"max_tokens": 0, "messages": USER}, "max_tokens", ">= 1"),
    ({"max_tokens": 5, "messages": USER, "stop_sequences": [""]}, "stop_sequences", "non-empty"),
    ({"max_tokens": 5, "messages": USER, "temperature": -1}, "temperature", ">= 0"),
    ({"max_tokens": 5, "messages": USER, "tool_choice": {"type": "tool", "name": "nope"}, "tools": TOOLS},
     "tool_choice", "does not match"),
    ({"max_tokens": 5, "messages": [{"role": "user", "content": "x"}, {"role": "robot", "content": "y"}]},
     "messages.1.role", "Input should be"),
    ({"max_tokens": 5, "messages": USER, "service_tier": "priority"}, "service_tier", "Input should be"),
    ({"max_tokens": 5, "messages": USER, "thinking": {"type": "between_tools"}}, "thinking", "between_tools"),
    ({"max_tokens": 5, "messages": USER, "container": "c"}, "container", "not supported"),
    # OpenAI chat fields sent by mistake: refused with the Messages field to use
    ({"max_tokens": 5, "messages": USER, "stop": ["x"]}, "stop", "use stop_sequences"),
    ({"max_tokens": 5, "messages": USER, "n": 2}, "n", "one reply"),
    ({"max_tokens": 5, "messages": USER, "logprobs": True}, "logprobs", "no logprobs"),
    ({"max_tokens": 5, "messages": USER, "seed": 1}, "seed", "no seed"),
]


@pytest.mark.parametrize("body, field, words", BAD)
def test_bad_input_is_a_400_naming_the_field_and_the_server_goes_on(server, engine, body, field, words):
    engine.text = "Fine."
    message = assert_anthropic_error(http(server, "/v1/messages", {"model": MODEL, **body}), 400,
                                     "invalid_request_error", words)
    assert field in message
    with pytest.raises(anthropic.BadRequestError):  # the client's own call (its checks of arguments skipped)
        server.client.post("/v1/messages", cast_to=anthropic.types.Message, body={"model": MODEL, **body})
    assert fine(server.client) == "Fine."


def test_other_errors_in_anthropic_shape(server, engine):
    assert_anthropic_error(http(server, "/v1/messages", {"model": "nope", "max_tokens": 5, "messages": USER}), 404,
                           "not_found_error", "`nope` does not exist")
    assert_anthropic_error(httpx.post(server.base_url + "/v1/messages", content=b"{not json",
                                      headers={"x-api-key": KEY, "content-type": "application/json"}), 400,
                           "invalid_request_error", "not valid JSON")
    assert_anthropic_error(http(server, "/v1/messages", [1, 2]), 400, "invalid_request_error")
    assert_anthropic_error(http(server, "/v1/messages", {"model": MODEL, "max_tokens": 5,
                                                         "messages": [{"role": "user", "content": "x" * 200_000}]}),
                           413, "request_too_large")
    assert_anthropic_error(httpx.get(server.base_url + "/v1/messages", headers={"x-api-key": KEY}), 405,
                           "invalid_request_error", "POST")
    assert_anthropic_error(http(server, "/v1/messages/batches", {}), 404, "not_found_error")
    server.engine.ready = False
    try:
        assert_anthropic_error(http(server, "/v1/messages", {"model": MODEL, "max_tokens": 5, "messages": USER}), 503,
                               "overloaded_error", "not ready")
    finally:
        server.engine.ready = True
    # the OpenAI routes keep OpenAI's shape
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={"model": MODEL},
                      headers={"Authorization": f"Bearer {KEY}"})
    assert chat.status_code == 400 and set(chat.json()) == {"error"} and chat.json()["error"]["param"] == "messages"


def test_the_key_as_x_api_key_or_bearer_and_401_in_anthropic_shape(server, engine):
    engine.text = "Fine."
    body = {"model": MODEL, "max_tokens": 5, "messages": USER}
    assert http(server, "/v1/messages", body).status_code == 200
    assert httpx.post(server.base_url + "/v1/messages", json=body,
                      headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
    assert_anthropic_error(httpx.post(server.base_url + "/v1/messages", json=body), 401, "authentication_error",
                           "x-api-key")
    for headers in ({"x-api-key": "wrong-key-123"}, {"Authorization": "Bearer wrong-key-123"}):
        assert_anthropic_error(httpx.post(server.base_url + "/v1/messages", json=body, headers=headers), 401,
                               "authentication_error", "Incorrect API key")
    # x-api-key is the Anthropic routes' header: the OpenAI routes answer 401 (OpenAI's shape) to it
    chat = httpx.post(server.base_url + "/v1/chat/completions", json={"model": MODEL, "messages": USER},
                      headers={"x-api-key": KEY})
    assert chat.status_code == 401 and chat.json()["error"]["code"] == "invalid_api_key"
    by_header = anthropic.Anthropic(api_key=None, auth_token=None, base_url=server.base_url, max_retries=0,
                                    default_headers={"x-api-key": KEY})
    assert fine(by_header) == "Fine."
    wrong = anthropic.Anthropic(api_key="wrong-key-123", base_url=server.base_url, max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as info:
        wrong.messages.create(model=MODEL, max_tokens=5, messages=USER)
    assert info.value.body["error"]["type"] == "authentication_error"


def test_count_tokens_is_the_prompt_the_chat_template_renders(server, engine):
    conversation = [*USER, {"role": "assistant", "content": [
        {"type": "text", "text": "Let me look."},
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}]}]
    chat_conversation = [*USER, {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"}]
    tokenized = httpx.post(server.base_url + "/tokenize", headers={"Authorization": f"Bearer {KEY}"}, json={
        "model": MODEL, "messages": chat_conversation, "tools": CHAT_TOOLS}).json()
    counted = server.client.messages.count_tokens(model=MODEL, messages=conversation, system="Be brief.",
                                                  tools=TOOLS)
    system_tokens = httpx.post(server.base_url + "/tokenize", headers={"Authorization": f"Bearer {KEY}"}, json={
        "model": MODEL, "messages": [{"role": "system", "content": "Be brief."}, *chat_conversation],
        "tools": CHAT_TOOLS}).json()["count"]
    assert counted.input_tokens == system_tokens and system_tokens > tokenized["count"]
    assert http(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": conversation,
                                                      "tools": TOOLS}).json() == {
        "input_tokens": tokenized["count"], "context_management": {"original_input_tokens": tokenized["count"]}}
    engine.text = "Fine."
    assert create(server, messages=conversation).usage.input_tokens == tokenized["count"]
    assert_anthropic_error(http(server, "/v1/messages/count_tokens", {"model": MODEL, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {}}]}]}), 400, "invalid_request_error", "image")


def test_rate_limits_answer_429_in_anthropic_shape():
    settings = ServerSettings(requests_per_minute=1)
    engine = SplitEngine(build_tool_tokenizer())
    engine.text = "Fine."
    with LoopbackServer(engine, settings) as srv:
        client = anthropic.Anthropic(api_key="any", base_url=srv.base_url, max_retries=0)
        assert fine(client) == "Fine."
        with pytest.raises(anthropic.RateLimitError) as info:
            client.messages.create(model=MODEL, max_tokens=5, messages=USER)
        assert info.value.body["error"]["type"] == "rate_limit_error"
        assert int(info.value.response.headers["retry-after"]) >= 1


def test_the_openapi_schema_shows_the_typed_bodies(server):
    schema = httpx.get(server.base_url + "/openapi.json", headers={"x-api-key": "unused",
                                                                   "Authorization": f"Bearer {KEY}"}).json()
    body = schema["paths"]["/v1/messages"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body == {"$ref": "#/components/schemas/AnthropicMessagesRequest"}
    fields = schema["components"]["schemas"]["AnthropicMessagesRequest"]
    assert {"model", "messages", "max_tokens"} <= set(fields["required"])
    assert {"system", "tools", "tool_choice", "stop_sequences", "thinking", "stream"} <= set(fields["properties"])
    assert "/v1/messages/count_tokens" in schema["paths"]


SYSTEM_FIRST = ("{%- for m in messages %}{%- if m['role'] == 'system' and not loop.first %}"
                "{{ raise_exception('System message must be at the beginning.') }}{%- endif %}"
                "<|{{ m['role'] }}|>{{ m['content'] }}{%- endfor %}{%- if add_generation_prompt %}<|assistant|>{%- endif %}")


def test_the_template_probes(server):
    """vLLM's probes: the tool template takes a system turn anywhere and renders enable_thinking
    (so thinking disabled is "none"); a system-first template that ignores reasoning_effort
    merges inline system turns and gets "low"."""
    assert probe_template(server.state) == TemplateFacts(merge_inline_system=False, disabled_thinking_effort="none")
    with LoopbackServer(SplitEngine(build_tool_tokenizer()), ServerSettings(chat_template=SYSTEM_FIRST)) as strict:
        assert probe_template(strict.state) == TemplateFacts(merge_inline_system=True, disabled_thinking_effort="low")
        conversation = [*USER, {"role": "assistant", "content": "Hi."}, {"role": "system", "content": "Be brief."},
                        {"role": "user", "content": "Go on."}]
        merged = [{"role": "system", "content": "S.Be brief."}, *USER, {"role": "assistant", "content": "Hi."},
                  {"role": "user", "content": "Go on."}]
        tokenized = httpx.post(strict.base_url + "/tokenize", json={"model": MODEL, "messages": merged}).json()
        counted = httpx.post(strict.base_url + "/v1/messages/count_tokens",
                             json={"model": MODEL, "system": "S.", "messages": conversation}).json()
        assert counted["input_tokens"] == tokenized["count"]
        strict.engine.text = "Fine."
        reply = httpx.post(strict.base_url + "/v1/messages", json={"model": MODEL, "max_tokens": 5, "system": "S.",
                                                                   "messages": conversation}).json()
        assert reply["content"] == [{"type": "text", "text": "Fine."}]
        assert reply["usage"]["input_tokens"] == tokenized["count"]
