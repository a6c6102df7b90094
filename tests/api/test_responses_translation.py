"""The pieces of /v1/responses without a server: input items as chat messages (vLLM 0.32's
``construct_input_messages`` rules, written out by hand below), the chat request a Responses
request stands for, field names in errors, the LRU store, and the stream events of hand-made chat
chunks, every event and response checked against the official client's own types
(``openai.types.responses``, strict pydantic validation)."""

from __future__ import annotations

import argparse
import asyncio

import openai.types.responses as oai
import pytest
from pydantic import TypeAdapter

from kvserve.api.errors import APIError
from kvserve.api.responses import (ChatChoiceLogprobs, ChatCompletionStreamChoice, ChatCompletionStreamResponse,
                                   ChatLogprobToken, ChatResponseMessage, ChatTopLogprob, CompletionTokensDetails,
                                   DeltaMessage, PromptTokensDetails, UsageInfo)
from kvserve.api.responses_events import ResponseEventStream
from kvserve.api.responses_input import (chat_request, continues_final_message, input_messages, output_messages,
                                         renamed, responses_param)
from kvserve.api.responses_objects import ResponsesResponse, sse_event
from kvserve.api.responses_output import output_items, response_skeleton
from kvserve.api.responses_protocol import ResponsesRequest
from kvserve.api.responses_store import EventLog, ResponsesStore, StoredResponse
from kvserve.api.server_args import add_server_args
from kvserve.api.settings import settings_from_args
from kvserve.errors import InvalidRequestError
from kvserve.sampling_params import SamplingParams

EVENTS = TypeAdapter(oai.ResponseStreamEvent)
CALL = {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": '{"tz": "UTC"}'}


def request(**body) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "m", "input": "hi", **body})


# -- input items -> chat messages ----------------------------------------------------------------


def test_a_string_input_is_one_user_message():
    assert input_messages("Hello") == [{"role": "user", "content": "Hello"}]


def test_items_become_messages_and_assistant_parts_join_one_turn():
    items = [
        {"role": "developer", "content": "Be brief."},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                        {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me see.",
                                                              "annotations": []}]},
        CALL,
        {**CALL, "call_id": "call_2", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"},
        {"type": "function_call_output", "call_id": "call_2",
         "output": [{"type": "input_text", "text": "x"}, {"type": "input_text", "text": "y"}]},
        {"role": "assistant", "content": "Noon."},
    ]
    call = {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}
    assert input_messages(items) == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "a\nb"},
        {"role": "assistant", "content": "Let me see.", "reasoning": "think",
         "tool_calls": [call, {**call, "id": "call_2", "function": {"name": "get_time", "arguments": "{}"}}]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_1"},
        {"role": "tool", "content": "x\ny", "tool_call_id": "call_2"},
        {"role": "assistant", "content": "Noon."},
    ]


def test_a_second_text_or_reasoning_opens_a_new_assistant_turn():
    items = [{"role": "assistant", "content": "one"}, {"role": "assistant", "content": "two"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
             {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "r"}]}]
    assert input_messages(items) == [{"role": "assistant", "content": "one"},
                                     {"role": "assistant", "content": "two", "reasoning": "s"},
                                     {"role": "assistant", "content": None, "reasoning": "r"}]


@pytest.mark.parametrize("items, param", [
    ([{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}], "input.0.content.0.type"),
    ([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}],
     "input.1.content.0.type"),
    ([{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}], "input.0.content.0.type"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "input.0.content.0.type"),
    ([{"role": "tool", "content": "x"}], "input.0.role"),
    ([{"type": "item_reference", "id": "msg_1"}], "input.0.type"),
    ([{"type": "web_search_call", "id": "ws_1"}], "input.0.type"),
    ([{"type": "reasoning", "summary": [], "encrypted_content": "gAAA"}], "input.0.encrypted_content"),
    ([{"type": "function_call", "name": "f", "arguments": "{}"}], "input.0.call_id"),
    ([{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_image"}]}],
     "input.0.output.0.type"),
    ([{"role": "user", "content": 3}], "input.0.content"),
    (["text"], "input.0"),
])
def test_what_is_not_implemented_is_refused_by_name(items, param):
    with pytest.raises(InvalidRequestError) as info:
        input_messages(items)
    assert info.value.param == param


def test_a_previous_output_drops_its_reasoning_as_vllm():
    output = [{"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "t"}]},
              {"type": "message", "id": "m", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "ok", "annotations": [], "logprobs": []}]},
              {**CALL, "id": "fc", "status": "completed"}]
    assert output_messages(output) == [{"role": "assistant", "content": "ok", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'}}]}]


def test_a_partial_last_assistant_message_is_continued():
    partial = {"type": "message", "role": "assistant", "status": "incomplete", "content": "Once upon"}
    assert continues_final_message([{"role": "user", "content": "x"}, partial])
    assert not continues_final_message([partial, {"role": "user", "content": "x"}])
    assert not continues_final_message([{"role": "user", "content": "x", "status": "incomplete"}])
    assert not continues_final_message("text")
    chat = chat_request(request(input=[partial]), input_messages([partial]))
    assert chat.continue_final_message and not chat.add_generation_prompt


# -- the chat request ----------------------------------------------------------------------------


def test_the_chat_request_a_responses_request_stands_for():
    tool = {"type": "function", "name": "get_time", "description": "Time", "strict": True,
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}
    body = request(instructions="Be brief.", max_output_tokens=7, temperature=0.5, top_p=0.9, tools=[tool],
                   tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False,
                   reasoning={"effort": "low", "summary": "auto"}, include=["message.output_text.logprobs"],
                   top_logprobs=3, user="u", top_k=5, seed=1, stop=["\n"], metadata={"a": "b"},
                   text={"format": {"type": "json_schema", "name": "t", "schema": {"type": "object"},
                                    "strict": True}})
    chat = chat_request(body, input_messages(body.input))
    assert [m.model_dump(exclude_none=True) for m in chat.messages] == [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert [t.model_dump(exclude_none=True) for t in chat.tools] == [{"type": "function", "function": {
        "name": "get_time", "description": "Time", "parameters": tool["parameters"], "strict": True}}]
    assert chat.tool_choice.model_dump() == {"type": "function", "function": {"name": "get_time"}}
    assert (chat.max_completion_tokens, chat.temperature, chat.top_p, chat.parallel_tool_calls) == (7, 0.5, 0.9, False)
    assert (chat.reasoning_effort, chat.logprobs, chat.top_logprobs, chat.user) == ("low", True, 3, "u")
    assert (chat.top_k, chat.seed, chat.stop, chat.n, chat.stream) == (5, 1, ["\n"], 1, False)
    assert chat.response_format.model_dump() == {"type": "json_schema", "json_schema": {
        "name": "t", "schema": {"type": "object"}, "strict": True}}
    assert chat.add_generation_prompt and not chat.continue_final_message


def test_defaults_no_tools_no_logprobs_and_auto_without_tools_means_none():
    for extra in ({}, {"tool_choice": "auto"}, {"tool_choice": "none"}, {"tools": []},
                  {"top_logprobs": 5}, {"text": {"format": {"type": "text"}}}):
        chat = chat_request(request(**extra), [{"role": "user", "content": "hi"}])
        assert chat.tools is None and chat.tool_choice is None and chat.response_format is None
        assert not chat.logprobs and chat.top_logprobs is None and chat.max_completion_tokens is None
    chat = chat_request(request(text={"format": {"type": "json_object"}}), [{"role": "user", "content": "hi"}])
    assert chat.response_format.model_dump() == {"type": "json_object"}


@pytest.mark.parametrize("body, param", [
    ({"tools": [{"type": "web_search_preview"}]}, "tools.0.type"),
    ({"tools": [{"type": "function", "name": "f"}, {"type": "file_search", "vector_store_ids": []}]}, "tools.1.type"),
    ({"tools": [{"type": "mcp", "server_label": "x"}]}, "tools.0.type"),
    ({"tools": [{"type": "function"}]}, "tools.0.name"),
    ({"tools": [{"type": "function", "name": "f"}], "tool_choice": {"type": "allowed_tools", "tools": []}},
     "tool_choice"),
    ({"tool_choice": "sometimes", "tools": [{"type": "function", "name": "f"}]}, "tool_choice"),
])
def test_tools_and_tool_choices_kvserve_lacks_are_refused_by_name(body, param):
    with pytest.raises(InvalidRequestError) as info:
        chat_request(request(**body), [{"role": "user", "content": "hi"}])
    assert info.value.param == param


@pytest.mark.parametrize("body, param", [
    ({"conversation": "conv_1"}, "conversation"), ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["reasoning.encrypted_content"]}, "include"), ({"include": ["file_search_call.results"]}, "include"),
    ({"truncation": "auto"}, "truncation"), ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"background": True, "store": False}, "background"), ({"request_id": "resp_mine"}, "request_id"),
    ({"vllm_xargs": {"a": 1}}, "vllm_xargs"), ({"use_beam_search": True}, "use_beam_search"),
    ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"), ({"metadata": {"k": "v" * 513}}, "metadata"),
    ({"n": 2}, "n"), ({"context_management": [{"type": "compaction"}]}, "context_management"),
])
def test_fields_kvserve_lacks_are_refused_by_name(body, param):
    with pytest.raises(InvalidRequestError) as info:
        request(**body).check_fields()
    assert info.value.param == param


def test_accepted_defaults_and_unknown_fields_pass():
    request(include=["message.output_text.logprobs"], truncation="disabled", n=1, use_beam_search=False,
            prompt_cache_retention="in_memory", reasoning={"summary": "detailed"}, stream_options={
                "include_obfuscation": False}, not_a_field_anywhere=3, text={"verbosity": "medium"}).check_fields()


def test_chat_field_names_in_errors_become_the_responses_names():
    assert responses_param("max_completion_tokens") == "max_output_tokens"
    assert responses_param("messages.3.content.0.type") == "input"
    assert responses_param("response_format.json_schema.schema") == "text.format.schema"
    assert responses_param("reasoning_effort") == "reasoning.effort"
    assert responses_param("tools.2.function.parameters") == "tools.2.parameters"
    assert responses_param("temperature") == "temperature" and responses_param(None) is None
    error = renamed(InvalidRequestError("max_completion_tokens must be >= 1, got 0", param="max_completion_tokens"))
    assert (error.message, error.param) == ("max_output_tokens must be >= 1, got 0", "max_output_tokens")
    error = renamed(InvalidRequestError("response_format.json_schema.schema must be an object",
                                        param="response_format.json_schema.schema"))
    assert (error.message, error.param) == ("text.format.schema must be an object", "text.format.schema")


# -- the store -----------------------------------------------------------------------------------


def stored(response_id: str, owner: str = "k") -> StoredResponse:
    return StoredResponse(ResponsesResponse(id=response_id, status="completed", model="m"), [], owner)


def test_the_store_drops_the_least_recently_used_and_scopes_by_key():
    store = ResponsesStore(2)
    store.put(stored("a"))
    store.put(stored("b"))
    assert store.get("a", "k") is not None  # a is now the most recent
    store.put(stored("c"))
    assert store.get("b", "k") is None and store.get("a", "k") and store.get("c", "k") and len(store) == 2
    assert store.get("a", "other-key") is None and store.pop("a", "other-key") is None
    assert store.pop("a", "k").response.id == "a" and store.get("a", "k") is None
    off = ResponsesStore(0)
    off.put(stored("a"))
    assert not off.enabled and off.get("a", "k") is None and len(off) == 0


def test_the_store_size_flag():
    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert settings_from_args(parser.parse_args([])).responses_store_max == 1000
    assert settings_from_args(parser.parse_args(["--responses-store-max", "0"])).responses_store_max == 0
    with pytest.raises(SystemExit):
        parser.parse_args(["--responses-store-max", "-1"])


def test_a_dropped_running_background_response_is_cancelled():
    async def scenario():
        store = ResponsesStore(1)
        entry = stored("a")
        entry.task = asyncio.create_task(asyncio.sleep(60))
        await asyncio.sleep(0)
        store.put(entry)
        store.put(stored("b"))
        await asyncio.gather(entry.task, return_exceptions=True)
        return entry.task.cancelled()

    assert asyncio.run(scenario())


def test_the_event_log_replays_after_a_sequence_number_and_follows():
    async def scenario():
        log = EventLog()
        stream = ResponseEventStream(ResponsesResponse(id="resp_1", status="queued", model="m"))
        for kind in ("created", "in_progress", "in_progress"):
            log.append(stream.lifecycle(kind))
        got = []

        async def follow():
            async for event in log.follow(starting_after=0):
                got.append(event.sequence_number)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0)
        log.append(stream.lifecycle("completed"))
        log.close()
        await task
        return got

    assert asyncio.run(scenario()) == [1, 2, 3]


# -- output items and stream events --------------------------------------------------------------


def chunk(content=None, reasoning=None, calls=None, finish=None, logprobs=None, usage=None, role=None):
    choices = [] if usage is not None else [ChatCompletionStreamChoice(
        index=0, delta=DeltaMessage(role=role, content=content, reasoning=reasoning, tool_calls=calls),
        finish_reason=finish, logprobs=ChatChoiceLogprobs(content=logprobs) if logprobs else None)]
    return ChatCompletionStreamResponse(id="resp_1", model="m", choices=choices, usage=usage)


def logprob(token: str, value: float) -> ChatLogprobToken:
    return ChatLogprobToken(token=token, logprob=value, bytes=list(token.encode()),
                            top_logprobs=[ChatTopLogprob(token=token, logprob=value, bytes=list(token.encode()))])


USAGE = UsageInfo(prompt_tokens=5, completion_tokens=9, total_tokens=14,
                  prompt_tokens_details=PromptTokensDetails(cached_tokens=2),
                  completion_tokens_details=CompletionTokensDetails(reasoning_tokens=3))


def skeleton() -> ResponsesResponse:
    params = SamplingParams(temperature=0.7, top_p=1.0, max_tokens=9)
    return response_skeleton(request(tools=[{"type": "function", "name": "get_time"}], tool_choice="auto"),
                             "resp_1", "m", params, True)


def test_stream_events_for_reasoning_text_and_two_calls():
    stream = ResponseEventStream(skeleton())
    events = [stream.lifecycle("created"), stream.lifecycle("in_progress")]
    for piece in [chunk(role="assistant", content=""), chunk(reasoning="Think"), chunk(reasoning=" more"),
                  chunk(content="Hi", logprobs=[logprob("H", -0.5), logprob("i", -0.25)]),
                  chunk(logprobs=[logprob("<", -1.0)]),
                  chunk(calls=[{"index": 0, "id": "call_a", "type": "function",
                                "function": {"name": "get_time", "arguments": ""}}]),
                  chunk(calls=[{"index": 0, "function": {"arguments": '{"tz": '}}]),
                  chunk(calls=[{"index": 0, "function": {"arguments": '"UTC"}'}},
                               {"index": 1, "id": "call_b", "type": "function",
                                "function": {"name": "get_time", "arguments": "{}"}}], finish="tool_calls"),
                  chunk(usage=USAGE)]:
        events += stream.feed(piece)
    events += stream.finish()
    for event in events:  # the official client's types, strictly
        EVENTS.validate_json(sse_event(event).split("data: ", 1)[1])
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert [e.type for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    final = events[-1].response
    oai.Response.model_validate(final.model_dump(mode="json"))
    dumped = [item.model_dump(exclude={"id"}) for item in final.output]
    assert dumped == [
        {"type": "reasoning", "summary": [], "content": [{"type": "reasoning_text", "text": "Think more"}],
         "encrypted_content": None, "status": "completed"},
        {"type": "message", "role": "assistant", "status": "completed", "content": [
            {"type": "output_text", "text": "Hi", "annotations": [], "logprobs": [
                {"token": t, "logprob": v, "bytes": list(t.encode()),
                 "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}]}
                for t, v in (("H", -0.5), ("i", -0.25))]}]},
        {"type": "function_call", "call_id": "call_a", "name": "get_time", "arguments": '{"tz": "UTC"}',
         "status": "completed"},
        {"type": "function_call", "call_id": "call_b", "name": "get_time", "arguments": "{}",
         "status": "completed"}]
    assert [e.item.id for e in events if e.type == "response.output_item.done"] == [i.id for i in final.output]
    assert final.status == "completed" and final.incomplete_details is None
    assert final.usage.model_dump() == {"input_tokens": 5, "input_tokens_details": {
        "cached_tokens": 2, "cache_write_tokens": 0}, "output_tokens": 9, "output_tokens_details": {
        "reasoning_tokens": 3}, "total_tokens": 14}
    assert (final.temperature, final.top_p, final.max_output_tokens, final.tool_choice) == (0.7, 1.0, 9, "auto")


def test_a_stream_cut_by_max_output_tokens_is_incomplete_and_held_logprobs_are_sent():
    stream = ResponseEventStream(skeleton())
    events = stream.feed(chunk(content="Caf", logprobs=[logprob("Caf", -1.0)]))
    events += stream.feed(chunk(content="", logprobs=[logprob("\\xc3", -2.0)], finish="length"))
    events += stream.feed(chunk(usage=USAGE)) + stream.finish()
    assert [e.type for e in events][-5:] == ["response.output_text.delta", "response.output_text.done",
                                             "response.content_part.done", "response.output_item.done",
                                             "response.incomplete"]
    assert events[-5].delta == "" and [lp.token for lp in events[-5].logprobs] == ["\\xc3"]
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output[0].status == "incomplete" and len(final.output[0].content[0].logprobs) == 2


def test_a_failure_after_the_start_is_an_error_event_then_response_failed():
    stream = ResponseEventStream(skeleton())
    events = stream.feed(chunk(content="Hel"))
    events += stream.fail(APIError(500, "The server failed while processing this request: boom"))
    assert [e.type for e in events][-3:] == ["response.output_item.done", "error", "response.failed"]
    for event in events:
        EVENTS.validate_json(sse_event(event).split("data: ", 1)[1])
    assert events[-2].code == "server_error" and events[-1].response.status == "failed"
    assert events[-1].response.error.model_dump() == {
        "code": "server_error", "message": "The server failed while processing this request: boom"}
    assert events[-1].response.output[0].status == "incomplete"


def test_whole_output_items_in_vllms_order():
    message = ChatResponseMessage(content="Hi", reasoning="Think", tool_calls=[
        {"id": "call_a", "type": "function", "function": {"name": "f", "arguments": "{}"}}])
    items = output_items(message, "length", [logprob("Hi", -0.5)])
    assert [(i.type, i.status) for i in items] == [("reasoning", "completed"), ("message", "completed"),
                                                   ("function_call", "incomplete")]
    assert [i.id[:i.id.index("_")] for i in items] == ["rs", "msg", "fc"] and all(len(i.id) > 32 for i in items)
    assert items[1].content[0].logprobs[0].token == "Hi" and items[2].call_id == "call_a"
    assert output_items(ChatResponseMessage(content=None), "stop", None) == []


def test_the_skeleton_echoes_the_request_as_openai():
    body = skeleton().model_dump(mode="json")
    oai.Response.model_validate(body)
    assert {k: body[k] for k in ("status", "store", "background", "truncation", "text", "reasoning", "tools",
                                 "top_logprobs", "metadata", "parallel_tool_calls", "service_tier", "output")} == {
        "status": "in_progress", "store": True, "background": False, "truncation": "disabled",
        "text": {"format": {"type": "text"}}, "reasoning": {"effort": None, "summary": None},
        "tools": [{"type": "function", "name": "get_time"}], "top_logprobs": 0, "metadata": {},
        "parallel_tool_calls": True, "service_tier": "auto", "output": []}
    plain = response_skeleton(request(), "resp_2", "m", SamplingParams(), False)
    assert plain.tool_choice == "none" and plain.store is False
