"""A chat completion's result as Anthropic's message: the whole response (vLLM 0.32's
``messages_full_converter``) and the stream of events (its ``message_stream_converter``).

Content blocks, in the order the model wrote them: ``thinking`` (the reasoning, with
``--reasoning-parser``), ``text`` (the content), one ``tool_use`` per call. A reply with none of
them is one empty text block (Anthropic's shape for an empty completion; vLLM's non-streamed
rule, kept in streams too so that both agree).

Stream, one SSE event per line (``event: <type>`` then ``data: <json>``)::

    message_start        the message with no content, usage: input tokens, 0 output tokens
    content_block_start  {"index": 0, "content_block": {"type": "thinking", "thinking": "", ...}}
    content_block_delta  {"index": 0, "delta": {"type": "thinking_delta", "thinking": "Hm"}} ...
    content_block_delta  {"index": 0, "delta": {"type": "signature_delta", ...}}   (thinking only)
    content_block_stop   {"index": 0}
    content_block_start  {"index": 1, "content_block": {"type": "text", "text": ""}} ... text_delta
    content_block_start  {"index": 2, "content_block": {"type": "tool_use", "id", "name", "input": {}}}
    content_block_delta  {"index": 2, "delta": {"type": "input_json_delta", "partial_json": "{\\"a"}} ...
    message_delta        {"delta": {"stop_reason", "stop_sequence"}, "usage": the final totals}
    message_stop

The deltas concatenate to the non-streamed message for every split of the text into tokens
(the chat parsers are split-invariant, ``kvserve.api.chat_output``), with chat's one exception:
a call cut short (``max_tokens``) was streamed as a ``tool_use`` while the whole text reads as
content. A call whose arguments are not a JSON object (the ``openai`` parser returns them as the
model wrote them) cannot be a ``tool_use`` block: non-streamed, its arguments become text.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from kvserve.api.anthropic_protocol import (AnthropicMessage, AnthropicUsage, ContentBlockDeltaEvent,
                                            ContentBlockStartEvent, ContentBlockStopEvent, InputJSONDelta,
                                            MessageDelta, MessageDeltaEvent, MessageStartEvent, MessageStopEvent,
                                            SignatureDelta, StopReason, StreamEvent, TextBlock, TextDelta,
                                            ThinkingBlock, ThinkingDelta, ToolUseBlock)
from kvserve.api.responses import ChatCompletionResponse, ChatCompletionStreamResponse, UsageInfo


def anthropic_usage(usage: UsageInfo | None) -> AnthropicUsage:
    """Anthropic's usage of a chat usage: prefix-cache hits are ``cache_read_input_tokens`` and
    not ``input_tokens`` (vLLM's ``_build_anthropic_usage``)."""
    if usage is None:
        return AnthropicUsage(input_tokens=0, output_tokens=0)
    details = usage.prompt_tokens_details
    cached = details.cached_tokens if details is not None else None
    return AnthropicUsage(input_tokens=max(0, usage.prompt_tokens - (cached or 0)),
                          output_tokens=usage.completion_tokens or 0, cache_read_input_tokens=cached)


def stop_reason(finish_reason: str | None, matched: int | str | None, tool_used: bool,
                tool_complete: bool) -> tuple[StopReason | None, str | None]:
    """``(stop_reason, stop_sequence)`` of a chat finish (vLLM's ``_to_anthropic_stop_reason``):
    ``length`` is ``max_tokens``; complete tool calls are ``tool_use`` (also after a named call,
    which chat finishes with ``stop``); a matched stop string (``matched`` a str; an int is a stop
    token id) is ``stop_sequence``; a call cut by a stop string is ``stop_sequence``."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason not in ("stop", "tool_calls"):
        return None, None
    if tool_complete:
        return "tool_use", None
    if isinstance(matched, str):
        return "stop_sequence", matched
    if finish_reason == "tool_calls" or tool_used:
        return "tool_use", None
    return "end_turn", None


def signature() -> str:
    """A thinking block's signature: opaque random hex (vLLM's; nothing verifies it here)."""
    return uuid.uuid4().hex


def _tool_input(arguments: str) -> dict[str, Any] | None:
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def to_message(response: ChatCompletionResponse) -> AnthropicMessage:
    """The non-streamed message of a one-choice chat completion (module docstring)."""
    choice = response.choices[0]
    message = choice.message
    content: list = []
    if message.reasoning:
        content.append(ThinkingBlock(thinking=message.reasoning, signature=signature()))
    text = message.content or ""
    calls = []
    for call in message.tool_calls:
        arguments = call["function"]["arguments"]
        value = _tool_input(arguments)
        if value is None:
            text += arguments
        else:
            calls.append(ToolUseBlock(id=call["id"], name=call["function"]["name"], input=value))
    if text:
        content.append(TextBlock(text=text))
    content += calls
    reason, sequence = stop_reason(choice.finish_reason, choice.stop_reason, bool(calls), bool(calls))
    return AnthropicMessage(id=response.id, content=content or [TextBlock(text="")], model=response.model,
                            stop_reason=reason, stop_sequence=sequence, usage=anthropic_usage(response.usage))


class MessageStream:
    """The Anthropic events of one streamed chat call (module docstring). Feed it the call's
    chunks (:meth:`events`), each with its running usage (``continuous_usage_stats``), then take
    the closing events (:meth:`finish`)."""

    def __init__(self) -> None:
        self.started = False
        self.next_index = 0
        self.block: str | None = None  # the open block's type
        self.tool_id: str | None = None  # the open tool_use block's call id
        self.tool_ids: dict[int, str] = {}  # chat call index -> id
        self.tool_args: list[str] = []  # the last call's arguments so far
        self.finish_reason: str | None = None
        self.matched: int | str | None = None
        self.usage: UsageInfo | None = None

    def events(self, chunk: ChatCompletionStreamResponse) -> list[StreamEvent]:
        """The events one chat chunk adds (``message_start`` before the first)."""
        out: list[StreamEvent] = []
        if chunk.usage is not None:
            self.usage = chunk.usage
        if not self.started:
            self.started = True
            start = AnthropicMessage(id=chunk.id, content=[], model=chunk.model, usage=anthropic_usage(chunk.usage))
            out.append(MessageStartEvent(message=start))
        if not chunk.choices:
            return out
        choice = chunk.choices[0]
        if choice.finish_reason is not None:
            self.finish_reason, self.matched = choice.finish_reason, choice.stop_reason
        delta = choice.delta
        if delta.reasoning:
            out += self._open("thinking", ThinkingBlock(thinking="", signature=""))
            out.append(self._delta(ThinkingDelta(thinking=delta.reasoning)))
        if delta.content:
            out += self._open("text", TextBlock(text=""))
            out.append(self._delta(TextDelta(text=delta.content)))
        for call in delta.tool_calls or []:
            out += self._tool_call(call)
        return out

    def _tool_call(self, call: dict) -> list[StreamEvent]:
        out: list[StreamEvent] = []
        function = call.get("function") or {}
        if call.get("id") is not None and function.get("name") is not None:
            self.tool_ids[call["index"]] = call["id"]
            out += self._close()
            out.append(self._start("tool_use", ToolUseBlock(id=call["id"], name=function["name"], input={})))
            self.tool_id, self.tool_args = call["id"], []
        arguments = function.get("arguments")
        if arguments and self.block == "tool_use" and self.tool_ids.get(call["index"]) == self.tool_id:
            self.tool_args.append(arguments)
            out.append(self._delta(InputJSONDelta(partial_json=arguments)))
        return out

    def finish(self) -> list[StreamEvent]:
        """The closing events: the open block's stop, ``message_delta``, ``message_stop``."""
        out: list[StreamEvent] = []
        if self.next_index == 0 and self.block is None:  # nothing written: one empty text block, as non-streamed
            out.append(self._start("text", TextBlock(text="")))
        out += self._close()
        tool_used = bool(self.tool_ids)
        complete = tool_used and _tool_input("".join(self.tool_args)) is not None
        reason, sequence = stop_reason(self.finish_reason or "stop", self.matched, tool_used, complete)
        out.append(MessageDeltaEvent(delta=MessageDelta(stop_reason=reason, stop_sequence=sequence),
                                     usage=anthropic_usage(self.usage)))
        out.append(MessageStopEvent())
        return out

    def _open(self, kind: str, block) -> list[StreamEvent]:
        """Start a block of ``kind`` unless it is the open one."""
        if self.block == kind:
            return []
        return [*self._close(), self._start(kind, block)]

    def _start(self, kind: str, block) -> ContentBlockStartEvent:
        self.block = kind
        return ContentBlockStartEvent(index=self.next_index, content_block=block)

    def _delta(self, delta) -> ContentBlockDeltaEvent:
        return ContentBlockDeltaEvent(index=self.next_index, delta=delta)

    def _close(self) -> list[StreamEvent]:
        if self.block is None:
            return []
        out: list[StreamEvent] = []
        if self.block == "thinking":
            out.append(self._delta(SignatureDelta(signature=signature())))
        out.append(ContentBlockStopEvent(index=self.next_index))
        self.block, self.tool_id = None, None
        self.next_index += 1
        return out
