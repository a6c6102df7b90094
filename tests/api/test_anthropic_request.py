"""The Anthropic request translated to a chat completion (kvserve.api.anthropic_request), checked
against the chat requests vLLM 0.32's ``AnthropicServingMessages.to_chat_completion_request``
writes for the same input (its rules, written out here by hand), and the refusals by name."""

from __future__ import annotations

import pytest

from kvserve.api.anthropic_protocol import AnthropicCountTokensRequest, AnthropicMessagesRequest
from kvserve.api.anthropic_request import TemplateFacts, anthropic_param, to_chat_request
from kvserve.errors import InvalidRequestError

USER = {"role": "user", "content": "Weather in Paris?"}
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def chat(facts: TemplateFacts = TemplateFacts(), **body) -> dict:
    """The translated chat request as JSON, defaults left out."""
    request = AnthropicMessagesRequest.model_validate({"model": "m", "max_tokens": 7, **body})
    translated = to_chat_request(request, facts)
    got = translated.model_dump(exclude_defaults=True)
    if translated.tools is not None:  # the tools whole, "type": "function" included
        got["tools"] = [tool.model_dump(exclude_none=True) for tool in translated.tools]
    if hasattr(translated.tool_choice, "model_dump"):
        got["tool_choice"] = translated.tool_choice.model_dump()
    return got


def refused(**body) -> InvalidRequestError:
    with pytest.raises(InvalidRequestError) as info:
        chat(**body)
    return info.value


def test_a_plain_request():
    assert chat(messages=[USER], system="Be brief.", temperature=0.5, top_p=0.9, top_k=3, stop_sequences=["\n\n"],
                metadata={"user_id": "u-1"}, cache_salt="salt") == {
        "model": "m", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 3, "stop": ["\n\n"], "user": "u-1",
        "cache_salt": "salt",
        "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]}


def test_a_tool_round_trip_conversation():
    messages = [USER,
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I need ", "signature": "sig"},
                    {"type": "thinking", "thinking": "the tool.", "signature": "sig"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "text", "text": "Let me look."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
                     "content": [{"type": "text", "text": "Rome is"}, {"type": "text", "text": "unknown"}]},
                    {"type": "text", "text": "And tomorrow?", "cache_control": {"type": "ephemeral"}}]}]
    got = chat(messages=messages, tools=[{"name": "get_weather", "description": "Forecast",
                                          "input_schema": {"properties": WEATHER["properties"]}}])
    assert got["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Let me look.", "reasoning": "I need the tool.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                        {"id": "toolu_2", "type": "function",
                         "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "Rome is\nunknown"},
        {"role": "user", "content": "And tomorrow?"}]
    assert got["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "Forecast",
        "parameters": {"properties": {"city": {"type": "string"}}, "type": "object"}}}]
    assert "tool_choice" not in got  # chat's default with tools: "auto"


def test_a_user_turn_of_tool_results_only_adds_no_user_message():
    got = chat(messages=[USER, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                   "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t"}]}],
               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    assert got["messages"][1:] == [
        {"role": "assistant", "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f",
                                                                                         "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t", "content": ""}]


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, {"tool_choice": "auto"}),
    ({"type": "any"}, {"tool_choice": "required"}),
    ({"type": "any", "disable_parallel_tool_use": True}, {"tool_choice": "required", "parallel_tool_calls": False}),
    ({"type": "tool", "name": "f"}, {"tool_choice": {"type": "function", "function": {"name": "f"}}}),
    ({"type": "none"}, {"tool_choice": "none"}),
])
def test_tool_choice(choice, expected):
    got = chat(messages=[USER], tools=[{"name": "f", "input_schema": WEATHER}], tool_choice=choice)
    assert {key: got[key] for key in got if key in ("tool_choice", "parallel_tool_calls")} == expected


def test_system_blocks_join_and_the_billing_header_is_dropped():
    system = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=1; cch=abc;"},
              {"type": "text", "text": "You are "}, {"type": "text", "text": "helpful."}]
    assert chat(messages=[USER], system=system)["messages"][0] == {"role": "system", "content": "You are helpful."}


def test_inline_system_turns_kept_or_merged():
    messages = [USER, {"role": "assistant", "content": "Hi"}, {"role": "system", "content": "Reminder."}, USER]
    kept = chat(messages=messages, system="S.")["messages"]
    assert [m["role"] for m in kept] == ["system", "user", "assistant", "system", "user"]
    assert kept[3] == {"role": "system", "content": "Reminder."}
    merged = chat(TemplateFacts(merge_inline_system=True), messages=messages, system="S.")["messages"]
    assert merged[0] == {"role": "system", "content": "S.Reminder."}
    assert [m["role"] for m in merged] == ["system", "user", "assistant", "user"]


def test_a_last_assistant_turn_is_continued():
    got = chat(messages=[USER, {"role": "assistant", "content": "The answer is"}])
    assert got["add_generation_prompt"] is False and got["continue_final_message"] is True
    assert "continue_final_message" not in chat(messages=[USER])


def test_thinking_effort_and_format():
    assert "reasoning_effort" not in chat(messages=[USER], thinking={"type": "adaptive", "display": "omitted"})
    assert chat(messages=[USER], thinking={"type": "disabled"})["reasoning_effort"] == "none"
    low = TemplateFacts(disabled_thinking_effort="low")
    assert chat(low, messages=[USER], thinking={"type": "disabled"},
                output_config={"effort": "high"})["reasoning_effort"] == "low"  # disabled wins, as vLLM
    got = chat(messages=[USER], output_config={"effort": "xhigh", "format": {"type": "json_schema",
                                                                            "schema": WEATHER}})
    assert got["reasoning_effort"] == "xhigh"
    assert got["response_format"] == {"type": "json_schema", "json_schema": {"name": "json_schema", "schema": WEATHER}}


def test_stream_asks_for_the_running_usage():
    got = chat(messages=[USER], stream=True)
    assert got["stream"] is True
    assert got["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}


def test_count_tokens_requests_have_no_sampling_fields():
    request = AnthropicCountTokensRequest.model_validate({"model": "m", "messages": [USER]})
    assert to_chat_request(request).model_dump(exclude_defaults=True) == {"model": "m", "messages": [USER]}


@pytest.mark.parametrize("body, param, words", [
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"},
                                                {"type": "image", "source": {"type": "url", "url": "u"}}]}]},
     "messages.0.content.1.type", "'image' blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     "messages.0.content.0.type", "'document' blocks are not supported"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "server_tool_use", "id": "s", "name": "web_search",
                                                            "input": {}}]}]},
     "messages.1.content.0.type", "server tools are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t",
                                                 "content": [{"type": "image", "source": {}}]}]}]},
     "messages.0.content.0.content.0.type", "'image' blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}]},
     "messages.0.content.0.type", "tool_use blocks belong to assistant turns"),
    ({"messages": [USER, {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]}]},
     "messages.1.content.0.type", "tool_result blocks belong to user turns"),
    ({"messages": [USER], "system": [{"type": "image", "source": {}}]}, "system.0.type", "text blocks only"),
    ({"messages": [USER], "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools.0.type", "server tool 'web_search_20250305' is not supported"),
    ({"messages": [USER], "tools": [{"name": "f"}]}, "tools.0.input_schema", "needs input_schema"),
    ({"messages": [USER], "tools": [{"name": "f", "input_schema": {}, "defer_loading": True}]},
     "tools.0.defer_loading", "defer_loading"),
    ({"messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking.type", "budget_tokens"),
    ({"messages": [USER], "container": "c-1"}, "container", "not supported"),
    ({"messages": [USER], "mcp_servers": [{"type": "url", "url": "u", "name": "n"}]}, "mcp_servers", "MCP"),
    ({"messages": [USER], "speed": "fast"}, "speed", "one speed"),
    ({"messages": [USER], "kv_transfer_params": {"do_remote_decode": True}}, "kv_transfer_params", "KV transfer"),
    ({"messages": [{"role": "user", "content": []}]}, "messages", "no content"),
])
def test_what_is_not_implemented_is_refused_by_name(body, param, words):
    error = refused(**body)
    assert error.param == param and words in error.message


def test_accepted_and_ignored():
    base = chat(messages=[USER])
    assert chat(messages=[USER], service_tier="standard_only", speed="standard", cache_control={"type": "ephemeral"},
                mm_payload="none", tools=[]) == base
    with pytest.raises(ValueError):  # a tier that does not exist is pydantic's 400
        chat(messages=[USER], service_tier="priority")


@pytest.mark.parametrize("chat_param, expected", [
    ("stop", "stop_sequences"), ("max_completion_tokens", "max_tokens"), ("max_tokens", "max_tokens"),
    ("response_format.json_schema", "output_config.format"), ("reasoning_effort", "output_config.effort"),
    ("user", "metadata.user_id"), ("tool_choice.function.name", "tool_choice.name"),
    ("tools.2.function.parameters.properties", "tools.2.input_schema.properties"), ("tools.1.function.name",
                                                                                   "tools.1.name"),
    ("messages.3.tool_calls.0.function.arguments", "messages"), ("temperature", "temperature"), (None, None),
    ("stop_token_ids", "stop_token_ids"),
])
def test_chat_field_names_in_errors_become_anthropic_names(chat_param, expected):
    assert anthropic_param(chat_param) == expected
