"""GPT-OSS's harmony output through the HTTP server and the official ``openai`` client, served
as vLLM serves it (``--reasoning-parser openai_gptoss --enable-auto-tool-choice
--tool-call-parser openai``). A scripted engine writes a given harmony text in random token
pieces through the engine's detokenizer, with a tokenizer whose harmony markers are special
tokens (kvserve.testing.harmony_tokenizer), so the markers reach the parsers only because the
server keeps special tokens, whatever the request's ``skip_special_tokens``. The engine leaves a
finishing EOS (``<|call|>``, ``<|return|>``) out of the text, so the scripts end without one.
Expected values are the written ones: the analysis as ``reasoning_content`` (and ``reasoning``),
the preamble or final message as ``content``, the call to ``functions.get_weather`` with the
body as its arguments, ``finish_reason`` ``tool_calls`` (a call) or ``stop``."""

from __future__ import annotations

import json

import openai
import pytest
from loopback import LoopbackServer
from scripted_engine import TextEngine

from kvserve.api.settings import ServerSettings
from kvserve.testing.harmony_tokenizer import build_harmony_tokenizer

THINK = "The user asks for the weather in Paris. I should call get_weather. Café 😀"
PREAMBLE = "Let me check the forecast."
ARGUMENTS = '{"location":"Paris, France","unit":"celsius"}'
CALL_TEXT = (f"<|channel|>analysis<|message|>{THINK}<|end|>"
             f"<|start|>assistant<|channel|>commentary<|message|>{PREAMBLE}<|end|>"
             "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
             f"<|message|>{ARGUMENTS}")
ANSWER = "It is **sunny** in Paris, 21 °C."
FINAL_TEXT = (f"<|channel|>analysis<|message|>{THINK}<|end|>"
              f"<|start|>assistant<|channel|>final<|message|>{ANSWER}")
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"]}}}]
MESSAGES = [{"role": "user", "content": "What's the weather in Paris?"}]
SETTINGS = {"reasoning_parser": "openai_gptoss", "enable_auto_tool_choice": True, "tool_call_parser": "openai"}


@pytest.fixture(scope="module")
def tokenizer():
    return build_harmony_tokenizer()


def serve(tokenizer, text: str) -> LoopbackServer:
    return LoopbackServer(TextEngine(tokenizer, text), ServerSettings(**SETTINGS))


def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none", max_retries=0)


def streamed(chat, n: int, **body) -> dict[int, dict]:
    """A stream merged per choice as a client does (tool calls by index)."""
    choices = {i: {"reasoning_content": "", "content": "", "calls": {}, "finish": None} for i in range(n)}
    for chunk in chat.chat.completions.create(stream=True, n=n, **body):
        for choice in chunk.choices:
            got, delta = choices[choice.index], choice.delta
            got["reasoning_content"] += getattr(delta, "reasoning_content", None) or ""
            got["content"] += delta.content or ""
            for call in delta.tool_calls or []:
                if call.index not in got["calls"]:
                    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
                    got["calls"][call.index] = {"name": call.function.name, "arguments": ""}
                else:
                    assert call.id is None and call.function.name is None
                got["calls"][call.index]["arguments"] += call.function.arguments or ""
            got["finish"] = choice.finish_reason or got["finish"]
    return choices


def test_a_tool_call_whole_and_streamed(tokenizer):
    reasoning_tokens = len(tokenizer.encode(THINK, add_special_tokens=False))
    with serve(tokenizer, CALL_TEXT) as srv:
        chat = client(srv)
        reply = chat.chat.completions.create(model="scripted-model", messages=MESSAGES, tools=TOOLS, n=2)
        for choice in reply.choices:
            message = choice.message
            assert (message.reasoning_content, message.reasoning) == (THINK, THINK)
            assert message.content == PREAMBLE
            [call] = message.tool_calls
            assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
            assert (call.function.name, call.function.arguments) == ("get_weather", ARGUMENTS)
            assert json.loads(call.function.arguments) == {"location": "Paris, France", "unit": "celsius"}
            assert choice.finish_reason == "tool_calls"
        assert reply.usage.completion_tokens_details.reasoning_tokens == 2 * reasoning_tokens
        assert srv.engine.calls[-1][2].skip_special_tokens is False
        for got in streamed(chat, 2, model="scripted-model", messages=MESSAGES, tools=TOOLS).values():
            assert got == {"reasoning_content": THINK, "content": PREAMBLE, "finish": "tool_calls",
                           "calls": {0: {"name": "get_weather", "arguments": ARGUMENTS}}}


@pytest.mark.parametrize("skip_special_tokens", [None, True, False])
def test_a_final_answer_whatever_skip_special_tokens_says(tokenizer, skip_special_tokens):
    extra = {} if skip_special_tokens is None else {"extra_body": {"skip_special_tokens": skip_special_tokens}}
    with serve(tokenizer, FINAL_TEXT) as srv:
        chat = client(srv)
        for tools in ({}, {"tools": TOOLS}):  # the reasoning parser alone, or both parsers
            reply = chat.chat.completions.create(model="scripted-model", messages=MESSAGES, **tools, **extra)
            choice = reply.choices[0]
            assert (choice.message.reasoning_content, choice.message.content) == (THINK, ANSWER)
            assert not choice.message.tool_calls and choice.finish_reason == "stop"
            got = streamed(chat, 1, model="scripted-model", messages=MESSAGES, **tools, **extra)[0]
            assert got == {"reasoning_content": THINK, "content": ANSWER, "calls": {}, "finish": "stop"}
