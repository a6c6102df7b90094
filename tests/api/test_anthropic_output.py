"""Chat results as Anthropic messages (kvserve.api.anthropic_output): vLLM 0.32's stop-reason
and usage rules, the whole message, and the event stream, whose events the ``anthropic``
client's own accumulator (``accumulate_event``) adds up to the whole message."""

from __future__ import annotations

import json

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from kvserve.api.anthropic_output import MessageStream, anthropic_usage, stop_reason, to_message
from kvserve.api.responses import (ChatCompletionChoice, ChatCompletionResponse, ChatCompletionStreamChoice,
                                   ChatCompletionStreamResponse, ChatResponseMessage, DeltaMessage, PromptTokensDetails,
                                   UsageInfo)


def usage(prompt: int, completion: int, cached: int = 0) -> UsageInfo:
    return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                     prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


@pytest.mark.parametrize("finish, matched, used, complete, expected", [
    ("length", None, True, True, ("max_tokens", None)),
    ("length", "END", False, False, ("max_tokens", None)),
    ("stop", None, False, False, ("end_turn", None)),
    ("stop", 2, False, False, ("end_turn", None)),  # a stop token id is no stop sequence
    ("stop", "END", False, False, ("stop_sequence", "END")),
    ("stop", "END", True, False, ("stop_sequence", "END")),  # a call cut by a stop string must not run
    ("stop", "END", True, True, ("tool_use", None)),
    ("stop", None, True, True, ("tool_use", None)),  # a named call: chat says "stop"
    ("tool_calls", None, True, True, ("tool_use", None)),
    ("tool_calls", None, True, False, ("tool_use", None)),
    ("abort", None, False, False, (None, None)),
])
def test_stop_reason_as_vllm(finish, matched, used, complete, expected):
    assert stop_reason(finish, matched, used, complete) == expected


def test_usage_moves_cache_hits_out_of_input_tokens():
    assert anthropic_usage(usage(100, 7, cached=64)).model_dump() == {
        "input_tokens": 36, "output_tokens": 7, "cache_read_input_tokens": 64}
    assert anthropic_usage(None).model_dump() == {"input_tokens": 0, "output_tokens": 0}


def response(content=None, reasoning=None, calls=(), finish="stop", matched=None) -> ChatCompletionResponse:
    message = ChatResponseMessage(content=content, reasoning=reasoning, tool_calls=list(calls))
    choice = ChatCompletionChoice(index=0, message=message, finish_reason=finish, stop_reason=matched)
    return ChatCompletionResponse(id="msg_1", model="m", choices=[choice], usage=usage(10, 5, cached=4))


def call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_the_whole_message():
    message = to_message(response("Sure.", "Think.", [call("c1", "f", '{"a": [1, 2]}'), call("c2", "g", "{}")],
                                  finish="tool_calls")).model_dump(mode="json")
    Message.model_validate(message)  # the client's own type takes it
    assert len(message["content"][0].pop("signature")) == 32
    assert message == {
        "id": "msg_1", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "thinking", "thinking": "Think."}, {"type": "text", "text": "Sure."},
                    {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": [1, 2]}},
                    {"type": "tool_use", "id": "c2", "name": "g", "input": {}}],
        "stop_reason": "tool_use", "stop_sequence": None,
        "usage": {"input_tokens": 6, "output_tokens": 5, "cache_read_input_tokens": 4}}


def test_an_empty_reply_is_one_empty_text_block_and_stop_strings_are_reported():
    message = to_message(response(None, finish="stop", matched="\n\n"))
    assert [block.model_dump() for block in message.content] == [{"type": "text", "text": ""}]
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "\n\n")


def test_arguments_that_are_no_json_object_are_text():
    message = to_message(response("A", calls=[call("c1", "f", "[1]"), call("c2", "g", '{"x": 1}')]))
    assert [block.model_dump() for block in message.content] == [
        {"type": "text", "text": "A[1]"}, {"type": "tool_use", "id": "c2", "name": "g", "input": {"x": 1}}]


def chunk(delta: DeltaMessage | None, finish=None, matched=None, used=(10, 0)) -> ChatCompletionStreamResponse:
    choices = [] if delta is None else [ChatCompletionStreamChoice(index=0, delta=delta, finish_reason=finish,
                                                                   stop_reason=matched)]
    return ChatCompletionStreamResponse(id="msg_1", model="m", choices=choices, usage=usage(*used, cached=4))


def tool_delta(index: int, call_id: str | None = None, name: str | None = None, arguments: str | None = None):
    function = {key: value for key, value in (("name", name), ("arguments", arguments)) if value is not None}
    entry = {"index": index, **({"id": call_id, "type": "function"} if call_id else {}), "function": function}
    return DeltaMessage(tool_calls=[entry])


CHUNKS = [chunk(DeltaMessage(role="assistant", content="")),
          chunk(DeltaMessage(reasoning="Thi", reasoning_content="Thi"), used=(10, 1)),
          chunk(DeltaMessage(reasoning="nk.", reasoning_content="nk."), used=(10, 2)),
          chunk(DeltaMessage(content="Sure"), used=(10, 3)),
          chunk(DeltaMessage(content="."), used=(10, 4)),
          chunk(tool_delta(0, "c1", "f", '{"a": '), used=(10, 5)),
          chunk(tool_delta(0, arguments="[1, 2]}"), used=(10, 6)),
          chunk(tool_delta(1, "c2", "g", ""), used=(10, 7)),
          chunk(tool_delta(1, arguments="{}"), finish="tool_calls", used=(10, 8)),
          chunk(None, used=(10, 8))]


def events(chunks) -> list[dict]:
    stream = MessageStream()
    out = [event for c in chunks for event in stream.events(c)] + stream.finish()
    return [json.loads(event.model_dump_json()) for event in out]


def test_the_event_stream():
    sent = events(CHUNKS)
    signatures = [e["delta"].pop("signature") for e in sent if e.get("delta", {}).get("type") == "signature_delta"]
    assert len(signatures) == 1 and len(signatures[0]) == 32
    assert sent == [
        {"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": "m", "stop_reason": None,
            "stop_sequence": None, "usage": {"input_tokens": 6, "output_tokens": 0, "cache_read_input_tokens": 4}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": "",
                                                                      "signature": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "Thi"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "nk."}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "signature_delta"}},
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "Sure"}},
        {"type": "content_block_delta", "index": 1, "delta": {"type": "text_delta", "text": "."}},
        {"type": "content_block_stop", "index": 1},
        {"type": "content_block_start", "index": 2, "content_block": {"type": "tool_use", "id": "c1", "name": "f",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": '{"a": '}},
        {"type": "content_block_delta", "index": 2, "delta": {"type": "input_json_delta", "partial_json": "[1, 2]}"}},
        {"type": "content_block_stop", "index": 2},
        {"type": "content_block_start", "index": 3, "content_block": {"type": "tool_use", "id": "c2", "name": "g",
                                                                      "input": {}}},
        {"type": "content_block_delta", "index": 3, "delta": {"type": "input_json_delta", "partial_json": "{}"}},
        {"type": "content_block_stop", "index": 3},
        {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
         "usage": {"input_tokens": 6, "output_tokens": 8, "cache_read_input_tokens": 4}},
        {"type": "message_stop"}]


def accumulated(sent: list[dict]) -> dict:
    """The message the ``anthropic`` client builds from the events (``MessageStream``'s own code)."""
    adapter = TypeAdapter(RawMessageStreamEvent)
    snapshot, buffers = None, {}
    for event in sent:
        snapshot = accumulate_event(event=adapter.validate_python(event), current_snapshot=snapshot, json_bufs=buffers)
    return snapshot.model_dump(mode="json", exclude_none=True)


def without_signatures(message: dict) -> dict:
    for block in message["content"]:
        block.pop("signature", None)
    return message


def test_the_client_adds_the_events_up_to_the_whole_message():
    streamed = accumulated(events(CHUNKS))
    whole = to_message(response("Sure.", "Think.", [call("c1", "f", '{"a": [1, 2]}'), call("c2", "g", "{}")],
                                finish="tool_calls")).model_dump(mode="json", exclude_none=True)
    whole["usage"]["input_tokens"] = 6
    whole["usage"]["output_tokens"] = 8
    assert without_signatures(streamed) == without_signatures(whole)


def test_an_empty_stream_is_one_empty_text_block_and_a_cut_call_is_no_tool_use():
    assert accumulated(events([chunk(DeltaMessage(role="assistant", content="")),
                               chunk(DeltaMessage(content=""), finish="stop"), chunk(None)]))["content"] == [
        {"type": "text", "text": ""}]
    cut = events([chunk(DeltaMessage(role="assistant", content="")), chunk(tool_delta(0, "c1", "f", '{"a": 1')),
                  chunk(DeltaMessage(), finish="stop", matched="}"), chunk(None)])
    assert cut[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "}"}
