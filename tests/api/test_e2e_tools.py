"""Tool calling through a live server and the official ``openai`` client, on a random-weight
Qwen2 checkpoint whose tokenizer has <tool_call>/<think> tokens and a Qwen2.5-style tool template
(kvserve.testing.tool_checkpoint). Facts from vLLM's chat protocol and serving: tools without
tool_choice mean "auto", which needs --enable-auto-tool-choice and --tool-call-parser (else a 400
with vLLM's words); required / a named function are constrained to valid calls; finish_reason is
"tool_calls" except for a named function ("stop"). Shapes from OpenAI's API reference."""

from __future__ import annotations

import json
import time
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from kvserve.structured_output.backend_auto import AutoBackend
from kvserve.structured_output.backend_guidance import GuidanceBackend
from kvserve.structured_output.backend_xgrammar import XgrammarBackend
from kvserve.testing.live_server import start_live_server
from kvserve.testing.tool_checkpoint import build_tool_checkpoint
from kvserve.tokenizer import apply_chat_template
from transformers import AutoTokenizer

pytestmark = pytest.mark.slow

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Tokyo"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 7},
    "metric": {"type": "boolean"}}, "required": ["city", "days"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"tz": {"type": "string", "pattern": "^[A-Z]{3}$"}},
        "required": ["tz"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
         {"type": "function", "function": {"name": "ping", "description": "No arguments"}}]
PARAMETERS = {"get_weather": WEATHER, "get_time": TIME, "ping": {"type": "object", "maxProperties": 0}}
MESSAGES = [{"role": "user", "content": "Weather in Paris?"}]
TOOL_ID = r"^chatcmpl-tool-[0-9a-f]{32}$"
SAMPLES = 50


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    return build_tool_checkpoint(tmp_path_factory.mktemp("tool-qwen2"))


def _start(model, **settings):
    return start_live_server(str(model), served_model_name="tiny", api_key="k", dtype="float32",
                             max_model_len=2048, num_gpu_blocks_override=1024, max_num_seqs=64,
                             structured_outputs_config={"disable_any_whitespace": True}, settings=settings)


@pytest.fixture(scope="module")
def server(tool_model):
    srv = _start(tool_model, enable_auto_tool_choice=True, tool_call_parser="hermes")
    srv.client = srv.make_client()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def plain_server(tool_model):
    """No tool flags (vLLM's defaults), tools excluded from the prompt with tool_choice none."""
    srv = _start(tool_model, exclude_tools_when_tool_choice_none=True)
    srv.client = srv.make_client()
    yield srv
    srv.stop()


def assert_valid_call(call, names=tuple(PARAMETERS)) -> dict:
    """An OpenAI tool call whose name is a tool and whose arguments validate (jsonschema)."""
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-") and len(call.id) == 46
    assert call.function.name in names
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, PARAMETERS[call.function.name])
    return arguments


def stream_choices(client, n: int, **body) -> dict[int, dict]:
    """A streamed response concatenated per choice as a client does: content, tool calls merged
    by index (first delta of an index has id, type and name), finish_reason."""
    choices: dict[int, dict] = {i: {"content": None, "calls": {}, "finish": None} for i in range(n)}
    for chunk in client.chat.completions.create(stream=True, n=n, **body):
        for choice in chunk.choices:
            got = choices[choice.index]
            if choice.delta.content:
                got["content"] = (got["content"] or "") + choice.delta.content
            for call in choice.delta.tool_calls or []:
                if call.index not in got["calls"]:
                    assert call.id and call.type == "function" and call.function.name
                    got["calls"][call.index] = {"id": call.id, "name": call.function.name, "arguments": ""}
                else:
                    assert call.id is None and call.function.name is None
                got["calls"][call.index]["arguments"] += call.function.arguments or ""
            got["finish"] = choice.finish_reason or got["finish"]
    return choices


def as_streamed(choice) -> tuple:
    calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
    return choice.message.content, calls, choice.finish_reason


def streamed_tuple(got: dict) -> tuple:
    calls = [(c["name"], c["arguments"]) for _, c in sorted(got["calls"].items())]
    return got["content"], calls, got["finish"]


# -- tool_choice none / auto without the flags (vLLM's defaults) -------------------------------------


def test_auto_needs_the_flags_as_in_vllm(plain_server):
    for extra in ({}, {"tool_choice": "auto"}):
        with pytest.raises(openai.BadRequestError) as info:
            plain_server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, **extra)
        error = info.value.body
        assert error["param"] == "tool_choice"
        assert error["message"].startswith(
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set')


def test_tool_choice_none_is_plain_text_and_the_flag_drops_the_tools(plain_server, server):
    tokenizer = server.tokenizer
    with_tools = apply_chat_template(tokenizer, MESSAGES, tools=TOOLS)
    without = apply_chat_template(tokenizer, MESSAGES)
    for srv, prompt in ((server, with_tools), (plain_server, without)):
        out = srv.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="none",
                                                 max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
        assert out.usage.prompt_tokens == len(prompt)
        assert out.choices[0].message.tool_calls is None and out.choices[0].finish_reason == "length"
        assert isinstance(out.choices[0].message.content, str)


def test_forced_calls_need_no_flags(plain_server):
    out = plain_server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "ping"}},
        max_tokens=32, seed=3)
    assert out.choices[0].finish_reason == "stop" and out.choices[0].message.content is None
    assert [json.loads(c.function.arguments) for c in out.choices[0].message.tool_calls] == [{}]


# -- required and named: constrained, always valid ---------------------------------------------------


@pytest.mark.parametrize("name", ["get_weather", "get_time", "ping"])
def test_named_function_always_gives_a_valid_call(server, name):
    out = server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice={"type": "function", "function": {"name": name}},
        n=SAMPLES, temperature=1.0, seed=7, max_tokens=96)
    finished = [c for c in out.choices if c.finish_reason == "stop"]
    assert len(finished) >= SAMPLES * 0.9, [c.finish_reason for c in out.choices]
    for choice in finished:  # vLLM: a named function finishes with "stop"
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        assert_valid_call(choice.message.tool_calls[0], names=(name,))
    assert len({c.message.tool_calls[0].id for c in finished}) == len(finished)


def test_required_gives_valid_calls_and_tool_calls_finish(server):
    out = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                                n=SAMPLES, temperature=1.0, seed=11, max_tokens=96)
    finished = [c for c in out.choices if c.finish_reason == "tool_calls"]
    assert len(finished) >= 10 and {c.finish_reason for c in out.choices} <= {"tool_calls", "length"}
    for choice in finished:
        assert choice.message.content is None and len(choice.message.tool_calls) >= 1
        for call in choice.message.tool_calls:
            assert_valid_call(call)
    for choice in out.choices:  # cut by max_tokens: an unfinished array is content (as vLLM)
        if choice.finish_reason == "length" and choice.message.tool_calls is None:
            assert choice.message.content.startswith('[{"name": "')
        elif choice.finish_reason == "length":  # the array closed on the last token allowed
            assert all(assert_valid_call(call) is not None for call in choice.message.tool_calls)


def test_required_without_parallel_calls_is_one_call(server):
    out = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, n=SAMPLES, temperature=1.0, seed=5,
                                                max_tokens=96)
    finished = [c for c in out.choices if c.finish_reason == "tool_calls"]
    assert len(finished) >= SAMPLES * 0.9
    for choice in finished:
        assert len(choice.message.tool_calls) == 1
        assert_valid_call(choice.message.tool_calls[0])


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_streamed_equal_the_whole_response(server, tool_choice):
    body = dict(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice, temperature=1.0, seed=21,
                max_tokens=256)
    whole = server.client.chat.completions.create(n=16, **body)
    streamed = stream_choices(server.client, 16, **body)
    compared = 0
    for choice in whole.choices:
        if choice.finish_reason == "length" and not choice.message.tool_calls:
            # The documented exception: cut inside a call, the whole response falls back to
            # content (as vLLM) while the stream has sent the call's beginning.
            assert streamed[choice.index]["calls"] and streamed[choice.index]["finish"] == "length"
            continue
        assert streamed_tuple(streamed[choice.index]) == as_streamed(choice)
        compared += 1
    assert compared >= 4


def test_forced_call_with_another_constraint_is_refused(server):
    for tool_choice in ("required", {"type": "function", "function": {"name": "get_time"}}):
        with pytest.raises(openai.BadRequestError) as info:
            server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice=tool_choice,
                                                  response_format={"type": "json_object"})
        assert info.value.body["param"] == "tool_choice"
        assert "either use constraints for structured outputs or tools, not both" in info.value.body["message"]


# -- auto: what the model writes, parsed (the text forced with a choice constraint) -------------------

CALL_TEXT = ('Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "days": 2}}\n'
             '</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>')


def test_auto_parses_the_calls_whole_and_streamed(server):
    """The constraint makes the model write CALL_TEXT; at temperature 1 each choice writes it in
    other tokens (e.g. <tool_call> as one added token or as pieces), so streams split it differently."""
    body = dict(model="tiny", messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=5, max_tokens=200,
                extra_body={"structured_outputs": {"choice": [CALL_TEXT]}})
    whole = server.client.chat.completions.create(n=8, **body)
    usage = whole.usage.completion_tokens
    assert len({len(c.message.tool_calls[0].function.arguments) for c in whole.choices}) == 1
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content == "Checking.\n"
        assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [
            ("get_weather", {"city": "Rome", "days": 2}), ("get_time", {"tz": "CET"})]
    streamed = stream_choices(server.client, 8, **body)
    for choice in whole.choices:
        assert streamed_tuple(streamed[choice.index]) == as_streamed(choice)
    assert usage > len(server.tokenizer.encode(CALL_TEXT, add_special_tokens=False))  # split differently


def test_auto_without_parallel_calls_keeps_the_first(server):
    body = dict(model="tiny", messages=MESSAGES, tools=TOOLS, temperature=1.0, seed=5, max_tokens=200,
                parallel_tool_calls=False, extra_body={"structured_outputs": {"choice": [CALL_TEXT]}})
    whole = server.client.chat.completions.create(**body)
    assert [c.function.name for c in whole.choices[0].message.tool_calls] == ["get_weather"]
    streamed = stream_choices(server.client, 1, **body)[0]
    assert streamed_tuple(streamed) == as_streamed(whole.choices[0])


def test_auto_plain_answer_is_content(server):
    out = server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=50,
        extra_body={"structured_outputs": {"choice": ["It is sunny in Paris."]}})
    choice = out.choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (
        "It is sunny in Paris.", None, "stop")
    raw = httpx.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer k"}, timeout=60,
                     json={"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 50,
                           "structured_outputs": {"choice": ["It is sunny in Paris."]}}).json()
    # no tool_calls: [], no reasoning; vLLM's null fields
    assert set(raw["choices"][0]["message"]) == {"role", "content", "refusal", "annotations", "audio", "function_call"}
    assert set(raw["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details"}


def test_stream_delta_shapes_follow_openai(server):
    body = {"model": "tiny", "messages": MESSAGES, "tools": TOOLS, "max_tokens": 200, "stream": True,
            "structured_outputs": {"choice": [CALL_TEXT]}}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": "Bearer k"}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [e["choices"][0]["delta"] for e in events]
    assert deltas[0] == {"role": "assistant", "content": ""}
    calls = [call for d in deltas for call in d.get("tool_calls", [])]
    firsts = [c for c in calls if "id" in c]
    assert [(c["index"], c["type"], c["function"]["name"]) for c in firsts] == [
        (0, "function", "get_weather"), (1, "function", "get_time")]
    assert all(set(c) == {"index", "function"} and set(c["function"]) == {"arguments"}
               for c in calls if "id" not in c)
    assert sum(len(c["function"].get("arguments", "")) > 0 for c in calls) > 2  # arguments in pieces
    for index, arguments in ((0, {"city": "Rome", "days": 2}), (1, {"tz": "CET"})):
        assert json.loads("".join(c["function"].get("arguments", "") for c in calls if c["index"] == index)) == \
            arguments
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"


# -- the official client's helpers, a tools round trip, LangChain's request bodies --------------------


class Forecast(BaseModel):
    city: Literal["Paris", "Rome", "Tokyo"]
    days: int = Field(ge=1, le=7)
    sunny: bool


def test_openai_parse_with_a_pydantic_model(server):
    for seed in range(5):
        out = server.client.chat.completions.parse(model="tiny", messages=MESSAGES, response_format=Forecast,
                                                   temperature=1.0, seed=seed, max_tokens=64)
        parsed = out.choices[0].message.parsed
        assert isinstance(parsed, Forecast) and parsed == Forecast.model_validate_json(out.choices[0].message.content)


def test_openai_parse_with_a_pydantic_function_tool(server):
    tool = openai.pydantic_function_tool(Forecast, name="forecast")
    out = server.client.chat.completions.parse(model="tiny", messages=MESSAGES, tools=[tool], seed=2,
                                               tool_choice={"type": "function", "function": {"name": "forecast"}},
                                               max_tokens=64)
    call = out.choices[0].message.tool_calls[0]
    assert isinstance(call.function.parsed_arguments, Forecast)


def test_tools_round_trip(server, tool_model):
    """The assistant's calls and the tool results go back through the template: the prompt is the
    template rendered by transformers with the calls' arguments as objects."""
    from transformers import AutoTokenizer

    client = server.client
    first = client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, seed=1, max_tokens=96)
    message = first.choices[0].message
    call = message.tool_calls[0]
    history = MESSAGES + [message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    second = client.chat.completions.create(model="tiny", messages=history, tools=TOOLS, tool_choice="none",
                                            max_tokens=4, temperature=0, extra_body={"ignore_eos": True})
    reference = AutoTokenizer.from_pretrained(tool_model)
    template_history = MESSAGES + [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": json.loads(call.function.arguments)}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "18 C and sunny"}]
    text = reference.apply_chat_template(template_history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert f'<tool_call>\n{{"name": "{call.function.name}", "arguments": ' in text
    assert "<tool_response>\n18 C and sunny\n</tool_response>" in text
    assert second.usage.prompt_tokens == len(reference.encode(text, add_special_tokens=False))


def post(server, body: dict) -> dict:
    response = httpx.post(server.base_url + "/v1/chat/completions", json={"model": "tiny", **body},
                          headers={"Authorization": "Bearer k"}, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


PERSON = {"description": "A person.", "properties": {
    "name": {"description": "Their name", "type": "string", "pattern": "^[A-Z][a-z]{1,8}$"},
    "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "type": "object"}


def test_langchain_with_structured_output_function_calling(server):
    # ChatOpenAI(...).with_structured_output(Person, method="function_calling"): the schema as a
    # tool, forced by name, one call.
    body = {"messages": [{"role": "user", "content": "Alice is 30."}], "n": 1, "stream": False, "temperature": 0.7,
            "tools": [{"type": "function", "function": {"name": "Person", "description": "A person.",
                                                        "parameters": PERSON}}],
            "tool_choice": {"type": "function", "function": {"name": "Person"}}, "parallel_tool_calls": False,
            "max_tokens": 64, "seed": 4}
    choice = post(server, body)["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["content"] is None
    jsonschema.validate(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]), PERSON)


def test_langchain_with_structured_output_json_schema_and_json_mode(server):
    # method="json_schema" (langchain-openai's default) and method="json_mode".
    schema_body = {"messages": [{"role": "user", "content": "Alice is 30."}], "n": 1, "stream": False,
                   "response_format": {"type": "json_schema", "json_schema": {
                       "name": "Person", "description": "A person.", "schema": PERSON, "strict": False}},
                   "max_tokens": 64, "seed": 4}
    jsonschema.validate(json.loads(post(server, schema_body)["choices"][0]["message"]["content"]), PERSON)
    json_body = {"messages": [{"role": "user", "content": "Answer in JSON."}], "stream": False,
                 "response_format": {"type": "json_object"}, "max_tokens": 64, "seed": 1, "temperature": 0}
    choice = post(server, json_body)["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)


def test_langchain_bind_tools(server):
    # llm.bind_tools([...], tool_choice="any") sends "required"; bind_tools without tool_choice
    # sends the tools only ("auto").
    tools = [{"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
                                               "parameters": TIME, "strict": True}}]
    body = {"messages": [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Time?"}],
            "tools": tools, "tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 64, "seed": 2}
    choice = post(server, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    jsonschema.validate(json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"]), TIME)
    del body["tool_choice"]
    body["structured_outputs"] = {"choice": ['<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n'
                                             '</tool_call>']}
    choice = post(server, body)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": '{"tz": "UTC"}'}


# -- mistakes: 400 naming the field, and the server keeps serving ---------------------------------------


def test_tool_mistakes_are_400_and_the_server_keeps_serving(server):
    cases = [
        ({"tools": []}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": ""}}}, "tool_choice.function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "no-such-type"}}}}}], "tool_choice": "required"},
         "tool_choice"),
        ({"tools": TOOLS, "reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"messages": MESSAGES + [{"role": "assistant", "tool_calls": [
            {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]},
         "messages.1.tool_calls.0.function.arguments"),
    ]
    for extra, param in cases:
        response = httpx.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer k"},
                              json={"model": "tiny", "messages": MESSAGES, **extra}, timeout=60)
        assert response.status_code == 400, (extra, response.text)
        assert response.json()["error"]["param"].startswith(param), response.json()
    huge = {"type": "object", "properties": {f"p{i}": {"type": "string", "enum": [f"v{i}-{j}" for j in range(40)]}
                                             for i in range(3000)}}
    for extra, param, words in (
            ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "big", "parameters": huge}}]},
             "messages", "maximum context length"),  # the template shows the tools: the prompt is too long
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "big", "schema": huge}}},
             "response_format", "the limit is 1048576")):
        response = httpx.post(server.base_url + "/v1/chat/completions", headers={"Authorization": "Bearer k"},
                              timeout=120, json={"model": "tiny", "messages": MESSAGES, **extra})
        assert response.status_code == 400 and response.json()["error"]["param"] == param, response.text
        assert words in response.json()["error"]["message"]
    assert_serving(server)


def assert_serving(server):
    out = server.client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=32,
                                                tool_choice={"type": "function", "function": {"name": "ping"}})
    assert out.choices[0].message.tool_calls[0].function.arguments == "{}"
    assert httpx.get(server.base_url + "/health").status_code == 200


def _slowed(compile_method):
    def compile_slowly(self, params):
        time.sleep(0.5)
        return compile_method(self, params)
    return compile_slowly


def test_a_grammar_that_never_compiles_in_time_is_400(tool_model, monkeypatch):
    # Every compile takes at least 0.5 s against a 0.05 s limit, so the deadline fires first on any
    # host (a bare 1e-6 s limit raced a fast host's sub-millisecond compile).
    for backend in (AutoBackend, XgrammarBackend, GuidanceBackend):
        monkeypatch.setattr(backend, "compile", _slowed(backend.compile))
    srv = start_live_server(str(tool_model), served_model_name="tiny", api_key="k", dtype="float32",
                            max_model_len=2048, num_gpu_blocks_override=256,
                            structured_outputs_config={"compile_timeout_s": 0.05},
                            settings={"enable_auto_tool_choice": True, "tool_call_parser": "hermes"})
    try:
        client = srv.make_client()
        for name in ("get_weather", "get_time"):  # a new schema each time (a late compile is cached)
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(model="tiny", messages=MESSAGES, tools=TOOLS,
                                               tool_choice={"type": "function", "function": {"name": name}})
            assert info.value.body["param"] == "tool_choice"
            assert "took longer than the 0.05 s limit" in info.value.body["message"]
        out = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3)
        assert out.choices[0].finish_reason in ("stop", "length")
    finally:
        srv.stop()


def test_mistral_parser_on_a_tekken_model(tiny_mistral_tekken):
    """--tool-call-parser mistral: [TOOL_CALLS]name[ARGS]{...} (the v11+ format mistral_common
    encodes), with Mistral's 9-character ids."""
    srv = start_live_server(str(tiny_mistral_tekken), served_model_name="tiny", api_key="k", dtype="float32",
                            max_model_len=1024, num_gpu_blocks_override=128,
                            settings={"enable_auto_tool_choice": True, "tool_call_parser": "mistral"})
    try:
        text = '[TOOL_CALLS]get_time[ARGS]{"tz": "CET"}'
        out = srv.make_client().chat.completions.create(
            model="tiny", messages=MESSAGES, tools=TOOLS, max_tokens=64,
            extra_body={"structured_outputs": {"choice": [text]}})
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert (call.function.name, call.function.arguments) == ("get_time", '{"tz": "CET"}')
        assert len(call.id) == 9 and call.id.isalnum()
    finally:
        srv.stop()


def test_a_model_row_beyond_the_tokenizer_is_empty_text(server, tool_model):
    """The checkpoint has 968 vocabulary rows and its tokenizer 964 tokens (padding, as many real
    checkpoints); a token sampled from a padding row (forced here by logit_bias) is "" in the text
    and in the logprobs (vLLM's rule), never a 500."""
    padding_row = server.engine.vocab_size - 2
    assert padding_row >= len(AutoTokenizer.from_pretrained(str(tool_model)))
    response = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=2, temperature=0,
                                                     logprobs=True, top_logprobs=2,
                                                     logit_bias={str(padding_row): 100})
    choice = response.choices[0]
    assert choice.message.content == ""
    assert [(t.token, t.bytes) for t in choice.logprobs.content] == [("", []), ("", [])]
