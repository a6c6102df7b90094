"""Reasoning output (--reasoning-parser qwen3 / deepseek_r1) in /v1/chat/completions.

First over loopback with a scripted engine that writes a given text in random token pieces
(exact expected values: the <think> block as ``reasoning`` and ``reasoning_content``, the rest as
content or tool calls, whole and streamed); then on a random-weight model through the official
client: a JSON-schema constraint starts only after ``</think>`` (a logit bias makes the model
close its reasoning after a few random tokens), with the think tags as special tokens so the
text must keep them. Facts from vLLM: the message field is ``reasoning`` (``reasoning_content``
its older name), ``include_reasoning: false`` drops it and constrains from the first token,
``reasoning_effort`` sets ``enable_thinking`` to ``effort != "none"`` unless the request sets it."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from kvserve.api.settings import ServerSettings
from kvserve.testing.live_server import start_live_server
from kvserve.testing.tool_checkpoint import build_tool_checkpoint, build_tool_tokenizer
from kvserve.tokenizer import apply_chat_template
from loopback import LoopbackServer
from scripted_engine import ScriptedEngine, TextEngine

THINK = "\nThe user asks for 2+2. 2+2 is 4. Café 😀.\n"
ANSWER = "\n\nThe answer is **4**."
MESSAGES = [{"role": "user", "content": "What is 2+2?"}]
NULLS = {"annotations": None, "audio": None, "function_call": None}  # vLLM sends them as null


def serve(text: str, **settings) -> LoopbackServer:
    settings.setdefault("reasoning_parser", "qwen3")
    return LoopbackServer(TextEngine(build_tool_tokenizer(), text), ServerSettings(**settings))


def post(srv, **body) -> httpx.Response:
    return httpx.post(srv.base_url + "/v1/chat/completions", timeout=30,
                      json={"model": "scripted-model", "messages": MESSAGES, **body})


def stream(srv, **body) -> list[dict]:
    """The chunks' choices of a streamed response."""
    events = []
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", timeout=30,
                      json={"model": "scripted-model", "messages": MESSAGES, "stream": True, **body}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                events += json.loads(line[6:])["choices"]
    return events


def usage_chunk(srv, **body) -> dict:
    with httpx.stream("POST", srv.base_url + "/v1/chat/completions", timeout=30,
                      json={"model": "scripted-model", "messages": MESSAGES, "stream": True, **body}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks[-1]["choices"] == []
    return chunks[-1]["usage"]


def joined(events: list[dict], index: int, key: str) -> str | None:
    parts = [e["delta"][key] for e in events if e["index"] == index and e["delta"].get(key)]
    return "".join(parts) if parts else None


def test_reasoning_split_whole_and_streamed():
    with serve(f"<think>{THINK}</think>{ANSWER}") as srv:
        body = post(srv, n=3).json()
        for choice in body["choices"]:
            assert choice["message"] == {"role": "assistant", "content": ANSWER, "refusal": None, **NULLS,
                                         "reasoning": THINK, "reasoning_content": THINK}
            assert choice["finish_reason"] == "stop"
        # vLLM's count: the tokens between the tags (the tags are added tokens: THINK alone)
        thought = len(build_tool_tokenizer().encode(THINK, add_special_tokens=False))
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3 * thought}
        assert usage_chunk(srv, n=3, stream_options={"include_usage": True}) == body["usage"]
        events = stream(srv, n=3)
        for index in range(3):
            assert joined(events, index, "reasoning") == THINK and joined(events, index, "content") == ANSWER
        deltas = [e["delta"] for e in events]
        assert all(d.get("reasoning") == d.get("reasoning_content") for d in deltas)
        assert not any("reasoning" in d and "content" in d for d in deltas if "role" not in d)
        pieces = {len([e for e in events if e["index"] == i]) for i in range(3)}
        assert len(pieces) > 1  # the choices were cut differently


def test_include_reasoning_false_drops_it_and_its_logprobs():
    with serve(f"<think>{THINK}</think>{ANSWER}") as srv:
        body = post(srv, include_reasoning=False, logprobs=True).json()
        choice = body["choices"][0]
        assert choice["message"] == {"role": "assistant", "content": ANSWER, "refusal": None, **NULLS}
        assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0  # counted anyway (vLLM)
        assert choice["logprobs"] is None
        events = stream(srv, include_reasoning=False)
        assert joined(events, 0, "content") == ANSWER and joined(events, 0, "reasoning") is None


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}}, {"reasoning_effort": "none"},
                                   {"reasoning_effort": "low", "chat_template_kwargs": {"enable_thinking": False}}])
def test_thinking_off_is_all_content_and_closes_the_block_in_the_prompt(extra):
    text = "<think>not a tag now</think> answer"
    with serve(text) as srv:
        body = post(srv, **extra).json()
        assert body["choices"][0]["message"]["content"] == text
        assert body["choices"][0]["message"]["reasoning"] is None
        expected = apply_chat_template(build_tool_tokenizer(), MESSAGES, chat_template_kwargs={"enable_thinking": False})
        assert body["usage"]["prompt_tokens"] == len(expected)
        assert joined(stream(srv, **extra), 0, "content") == text


def test_reasoning_effort_turns_thinking_on_and_server_defaults_apply_under_the_request():
    with serve(f"{THINK}</think>{ANSWER}", default_chat_template_kwargs={"enable_thinking": False}) as srv:
        assert post(srv).json()["choices"][0]["message"]["reasoning"] is None
        for extra in ({"reasoning_effort": "high"}, {"chat_template_kwargs": {"enable_thinking": True}}):
            message = post(srv, **extra).json()["choices"][0]["message"]
            assert (message["reasoning"], message["content"]) == (THINK, ANSWER)


def test_deepseek_r1_output_without_the_opening_tag():
    with serve(f"{THINK}</think>{ANSWER}", reasoning_parser="deepseek_r1") as srv:
        body = post(srv).json()
        message = body["choices"][0]["message"]
        assert (message["reasoning"], message["content"]) == (THINK, ANSWER)
        thought = len(build_tool_tokenizer().encode(THINK, add_special_tokens=False))
        assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": thought}
        final = usage_chunk(srv, stream_options={"include_usage": True})
        assert final["completion_tokens_details"] == {"reasoning_tokens": thought}


def test_tool_calls_after_the_reasoning():
    call = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>'
    tools = [{"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}]
    with serve(f"<think>{THINK}</think>\n\n{call}", enable_auto_tool_choice=True, tool_call_parser="hermes") as srv:
        choice = post(srv, tools=tools, n=2).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["reasoning"] == THINK
        assert choice["message"]["content"] == "\n\n"
        assert [c["function"] for c in choice["message"]["tool_calls"]] == [
            {"name": "get_time", "arguments": '{"tz": "UTC"}'}]
        events = stream(srv, tools=tools, n=2)
        for index in range(2):
            assert joined(events, index, "reasoning") == THINK and joined(events, index, "content") == "\n\n"
            calls = [c for e in events if e["index"] == index for c in e["delta"].get("tool_calls", [])]
            assert calls[0]["function"]["name"] == "get_time"
            assert "".join(c["function"].get("arguments", "") for c in calls) == '{"tz": "UTC"}'
            assert [e["finish_reason"] for e in events if e["index"] == index][-1] == "tool_calls"


def test_a_model_without_think_tokens_cannot_start_with_a_reasoning_parser():
    from kvserve.testing import build_tokenizer

    with pytest.raises(ValueError, match="needs <think> and </think>"):
        LoopbackServer(ScriptedEngine(build_tokenizer("bpe")), ServerSettings(reasoning_parser="qwen3"))


# -- a real model: the constraint starts after </think> -------------------------------------------------

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]},
                                           "n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["city", "n"], "additionalProperties": False}
END_THINK = "963"  # </think> in build_tool_tokenizer's vocabulary


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model = build_tool_checkpoint(tmp_path_factory.mktemp("think-qwen2"), special_tags=True)
    srv = start_live_server(str(model), served_model_name="tiny", api_key="k", dtype="float32", max_model_len=2048,
                            num_gpu_blocks_override=1024, max_num_seqs=64,
                            structured_outputs_config={"disable_any_whitespace": True},
                            settings={"enable_auto_tool_choice": True, "tool_call_parser": "hermes",
                                      "reasoning_parser": "qwen3"})
    srv.client = srv.make_client()
    yield srv
    srv.stop()


def test_json_schema_starts_after_the_reasoning(server):
    """</think> is not allowed by the JSON grammar, so every choice that closed its reasoning
    shows the grammar waited; its answer validates; the stream with the same seed is equal."""
    assert server.tokenizer.convert_ids_to_tokens(int(END_THINK)) == "</think>"
    body = dict(model="tiny", messages=MESSAGES, n=16, temperature=1.0, seed=3, max_tokens=64,
                logit_bias={END_THINK: 4}, response_format={"type": "json_schema",
                                                            "json_schema": {"name": "answer", "schema": SCHEMA}})
    whole = server.client.chat.completions.create(**body)
    answered = [c for c in whole.choices if c.finish_reason == "stop" and c.message.content is not None]
    assert len(answered) >= 12
    for choice in answered:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
        assert choice.message.reasoning_content == choice.message.reasoning
        assert "</think>" not in (choice.message.reasoning or "")  # None: </think> came first
    events = {i: {"reasoning": "", "content": "", "finish": None} for i in range(16)}
    for chunk in server.client.chat.completions.create(stream=True, **body):
        for choice in chunk.choices:
            events[choice.index]["reasoning"] += getattr(choice.delta, "reasoning", None) or ""
            events[choice.index]["content"] += choice.delta.content or ""
            events[choice.index]["finish"] = choice.finish_reason or events[choice.index]["finish"]
    for choice in whole.choices:
        got = events[choice.index]
        assert (got["reasoning"] or None, got["content"] or None, got["finish"]) == (
            choice.message.reasoning, choice.message.content, choice.finish_reason)


@pytest.mark.parametrize("extra", [{"chat_template_kwargs": {"enable_thinking": False}}, {"include_reasoning": False}])
def test_without_reasoning_the_constraint_starts_at_once(server, extra):
    out = server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, n=8, temperature=1.0, seed=5, max_tokens=64,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}, extra_body=extra)
    for choice in out.choices:
        assert choice.finish_reason == "stop" and getattr(choice.message, "reasoning", None) is None
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_forced_tool_call_after_the_reasoning(server):
    tools = [{"type": "function", "function": {"name": "answer", "parameters": SCHEMA}}]
    out = server.client.chat.completions.create(
        model="tiny", messages=MESSAGES, n=8, temperature=1.0, seed=9, max_tokens=64, tools=tools,
        tool_choice={"type": "function", "function": {"name": "answer"}}, logit_bias={END_THINK: 4})
    called = [c for c in out.choices if c.finish_reason == "stop" and c.message.tool_calls]
    assert len(called) >= 6
    for choice in called:
        assert choice.message.reasoning and choice.message.content is None
        jsonschema.validate(json.loads(choice.message.tool_calls[0].function.arguments), SCHEMA)
