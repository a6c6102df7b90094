"""What a chat request's tools and reasoning fields turn into (kvserve.api.chat_parsers): vLLM's
tool_choice defaults and errors, the forcing constraint, special tokens kept for parsers that
read them, template variables (vLLM's build_chat_params: reasoning_effort -> enable_thinking
unless the request sets it; server defaults under the request's)."""

from __future__ import annotations

import pytest

from kvserve.api.chat_parsers import AUTO_NEEDS_FLAGS, ChatParsers
from kvserve.api.chat_protocol import ChatCompletionRequest
from kvserve.api.settings import ServerSettings
from kvserve.errors import InvalidRequestError
from kvserve.sampling_params import SamplingParams
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.testing.tool_checkpoint import build_tool_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}},
    {"type": "function", "function": {"name": "now"}}]
MESSAGES = [{"role": "user", "content": "x"}]


def parsers(special_tags: bool = False, **settings) -> ChatParsers:
    return ChatParsers.from_settings(ServerSettings(**settings), build_tool_tokenizer(special_tags=special_tags))


def request(**fields) -> ChatCompletionRequest:
    return ChatCompletionRequest(messages=MESSAGES, **fields)


def test_tool_choice_defaults_and_the_auto_flags():
    plain, auto = parsers(), parsers(enable_auto_tool_choice=True, tool_call_parser="hermes")
    assert plain.plan(request()).tool_choice == "none"
    assert auto.plan(request(tools=TOOLS)).tool_choice == "auto"
    for fields in ({"tools": TOOLS}, {"tools": TOOLS, "tool_choice": "auto"}):
        with pytest.raises(InvalidRequestError) as info:
            plain.plan(request(**fields))
        assert info.value.param == "tool_choice" and info.value.message.startswith(AUTO_NEEDS_FLAGS)
    with pytest.raises(InvalidRequestError, match=AUTO_NEEDS_FLAGS):  # a parser without the switch
        parsers(tool_call_parser="hermes").plan(request(tools=TOOLS))
    assert plain.plan(request(tools=TOOLS, tool_choice="required")).forced
    with pytest.raises(ValueError, match="requires --tool-call-parser"):
        parsers(enable_auto_tool_choice=True)
    with pytest.raises(ValueError, match="allowed: hermes, llama3_json, mistral, openai, pythonic"):
        parsers(tool_call_parser="qwen3_xml")


def test_forcing_constraint_on_the_sampling_params():
    base = SamplingParams(max_tokens=8)
    named = parsers().plan(request(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "add"}}))
    spec = named.sampling_params(base).structured_outputs
    assert spec.source == "tool_choice" and spec.json == TOOLS[0]["function"]["parameters"]
    assert named.finish_reason("stop", True) == "stop" and named.finish_reason("length", True) == "length"
    required = parsers().plan(request(tools=TOOLS, tool_choice="required", parallel_tool_calls=False))
    schema = required.sampling_params(base).structured_outputs.json
    assert (schema["type"], schema["minItems"], schema["maxItems"]) == ("array", 1, 1)
    assert [item["properties"]["name"]["enum"] for item in schema["items"]["anyOf"]] == [["add"], ["now"]]
    assert required.finish_reason("stop", True) == "tool_calls" and required.finish_reason("stop", False) == "stop"
    assert "maxItems" not in parsers().plan(request(tools=TOOLS, tool_choice="required")).sampling_params(
        base).structured_outputs.json
    with pytest.raises(InvalidRequestError) as info:
        required.sampling_params(SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True)))
    assert info.value.param == "tool_choice" and "not both" in info.value.message


def test_special_tokens_are_kept_for_parsers_that_read_them():
    base = SamplingParams()
    auto = parsers(enable_auto_tool_choice=True, tool_call_parser="hermes")
    assert auto.plan(request(tools=TOOLS)).sampling_params(base).skip_special_tokens is False
    assert auto.plan(request(tools=TOOLS, tool_choice="none")).sampling_params(base) is base
    assert auto.plan(request(tools=TOOLS, tool_choice="required")).sampling_params(base).skip_special_tokens
    assert parsers(reasoning_parser="qwen3").plan(request()).sampling_params(base) is base  # tags not special
    special = parsers(special_tags=True, reasoning_parser="qwen3")
    assert special.reasoning_tags_special
    assert special.plan(request()).sampling_params(base).skip_special_tokens is False


def test_harmony_markers_are_kept_whatever_the_request_says():
    from kvserve.testing.harmony_tokenizer import build_harmony_tokenizer

    tokenizer = build_harmony_tokenizer()
    gpt_oss = ChatParsers.from_settings(ServerSettings(reasoning_parser="openai_gptoss"), tokenizer)
    assert gpt_oss.reasoning_tags_special
    both = ChatParsers.from_settings(ServerSettings(reasoning_parser="openai_gptoss", enable_auto_tool_choice=True,
                                                    tool_call_parser="openai"), tokenizer)
    for skip in (True, False):
        params = SamplingParams(skip_special_tokens=skip)
        assert gpt_oss.plan(request()).sampling_params(params).skip_special_tokens is False
        assert both.plan(request(tools=TOOLS)).sampling_params(params).skip_special_tokens is False
    with pytest.raises(ValueError, match="needs harmony's markers"):
        parsers(reasoning_parser="openai_gptoss")


def test_template_variables_and_tools_shown():
    defaults = parsers(default_chat_template_kwargs={"enable_thinking": False, "x": 1},
                       exclude_tools_when_tool_choice_none=True, reasoning_parser="qwen3")
    assert defaults.plan(request()).template_kwargs == {"enable_thinking": False, "x": 1}
    assert defaults.plan(request(reasoning_effort="low")).template_kwargs == {
        "enable_thinking": True, "x": 1, "reasoning_effort": "low"}
    assert defaults.plan(request(reasoning_effort="none", chat_template_kwargs={"x": 2})).template_kwargs == {
        "enable_thinking": False, "x": 2, "reasoning_effort": "none"}
    assert defaults.plan(request(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})) \
        .template_kwargs["enable_thinking"] is False
    assert defaults.plan(request(tools=TOOLS, tool_choice="none")).template_tools is None
    assert parsers().plan(request(tools=TOOLS, tool_choice="none")).template_tools == TOOLS


def test_the_grammar_waits_for_the_reasoning_unless_it_is_left_out():
    reasoning = parsers(reasoning_parser="qwen3")
    constrained = SamplingParams(structured_outputs=StructuredOutputsParams(json_object=True))
    plan = reasoning.plan(request())
    assert plan.grammar_reasoning(constrained).name == "qwen3"
    assert plan.grammar_reasoning(SamplingParams()) is None
    hidden = reasoning.plan(request(include_reasoning=False))
    assert hidden.grammar_reasoning(constrained) is None
    assert hidden.choice_output(constrained).reasoning is None  # the reply is all answer
    assert hidden.choice_output(SamplingParams()).reasoning is not None  # free reasoning, dropped
    assert parsers().plan(request()).grammar_reasoning(constrained) is None
