"""A streamed chat call as Responses stream events (vLLM 0.32's ``SimpleStreamingEventProcessor``,
OpenAI's event names and shapes).

    response.created, response.in_progress                    (start; background: created is queued)
    for each output item, in the order the model writes them:
      response.output_item.added          {item, status "in_progress"}
      message:   response.content_part.added, response.output_text.delta*, .output_text.done,
                 response.content_part.done
      reasoning: response.content_part.added, response.reasoning_text.delta*,
                 .reasoning_text.done, response.content_part.done
      call:      response.function_call_arguments.delta*, .function_call_arguments.done
      response.output_item.done           {the whole item}
    response.completed | response.incomplete (max_output_tokens) {the whole response, usage}
    on a failure after the start: error, then response.failed

Each chat delta is split into its reasoning, text and tool-call parts (in that order); a part of
another kind than the open item closes it and opens the next, so the items of a stream add up to
the chat answer's reasoning, text and calls at every split of the text into pieces. The final
response's output is the streamed items themselves (same ids).

Logprobs go with the text: an ``output_text.delta`` carries the logprobs of every token since the
previous one (tokens held back, or read as reasoning or a call, included); those after the last
text are dropped unless the message is still open (then an empty delta carries them). Without
reasoning and calls they are exactly the non-streamed text's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvserve.api.errors import APIError
from kvserve.api.responses import ChatCompletionStreamResponse, UsageInfo
from kvserve.api.responses_objects import (ArgumentsDeltaEvent, ArgumentsDoneEvent, ContentPartEvent, ErrorEvent,
                                           FunctionCallItem, LifecycleEvent, OutputItem, OutputItemEvent,
                                           OutputLogprob, OutputMessage, OutputText, ReasoningItem, ReasoningText,
                                           ResponseError, ResponseEvent, ResponsesResponse, TextDeltaEvent,
                                           TextDoneEvent, new_item_id)
from kvserve.api.responses_output import delta_logprobs, finished_response, output_logprobs


@dataclass
class _OpenItem:
    """The output item being streamed."""

    kind: str  # "message", "reasoning" or "function_call"
    id: str
    index: int
    text: str = ""  # the text, reasoning or arguments so far
    logprobs: list[OutputLogprob] = field(default_factory=list)
    call_id: str = ""
    name: str = ""


class ResponseEventStream:
    """One response's stream events, fed with its chat call's chunks (see the module docstring).

    Args:
        skeleton: the response as it starts (``response_skeleton``).
    """

    def __init__(self, skeleton: ResponsesResponse):
        self.response = skeleton
        self.items: list[OutputItem] = []
        self.open: _OpenItem | None = None
        self.sequence_number = 0
        self.finish_reason: str | None = None
        self.usage: UsageInfo | None = None
        self.pending_logprobs: list[OutputLogprob] = []

    def _event(self, event: ResponseEvent) -> ResponseEvent:
        event.sequence_number = self.sequence_number
        self.sequence_number += 1
        return event

    def lifecycle(self, kind: str, status: str | None = None) -> ResponseEvent:
        """``response.<kind>`` with the response as it stands (``status`` set first if given)."""
        if status is not None:
            self.response = self.response.model_copy(update={"status": status})
        return self._event(LifecycleEvent(type=f"response.{kind}", response=self.response))

    def feed(self, chunk: ChatCompletionStreamResponse) -> list[ResponseEvent]:
        """The events of one chat chunk (``choices`` holds one choice; the usage chunk none)."""
        if chunk.usage is not None:
            self.usage = chunk.usage
        events: list[ResponseEvent] = []
        for choice in chunk.choices:
            if choice.logprobs is not None and choice.logprobs.content:
                self.pending_logprobs += output_logprobs(choice.logprobs.content)
            delta = choice.delta
            if delta.reasoning:
                events += self._piece("reasoning", delta.reasoning)
            if delta.content:
                events += self._piece("message", delta.content)
            for call in delta.tool_calls or []:
                events += self._call(call)
            self.finish_reason = choice.finish_reason or self.finish_reason
        return events

    def finish(self) -> list[ResponseEvent]:
        """The last events: the open item closed, then ``response.completed`` (or
        ``response.incomplete`` when ``max_output_tokens`` ended it) with the usage."""
        events = []
        if self.open is not None and self.open.kind == "message" and self.pending_logprobs:
            events += self._piece("message", "")
        events += self._close("incomplete" if self.finish_reason == "length" else "completed")
        self.response = finished_response(self.response, self.items, self.finish_reason, self.usage)
        events.append(self.lifecycle("completed" if self.response.status == "completed" else "incomplete"))
        return events

    def fail(self, error: APIError) -> list[ResponseEvent]:
        """The events of a failure after the start: the open item closed as incomplete, an
        ``error`` event, then ``response.failed`` with ``error`` set."""
        events = self._close("incomplete")
        code = {400: "invalid_prompt", 429: "rate_limit_exceeded"}.get(error.status_code, "server_error")
        events.append(self._event(ErrorEvent(code=error.code or code, message=error.message, param=error.param)))
        self.response = self.response.model_copy(update={
            "status": "failed", "output": list(self.items), "error": ResponseError(code=code, message=error.message)})
        events.append(self.lifecycle("failed"))
        return events

    def _piece(self, kind: str, text: str) -> list[ResponseEvent]:
        events = self._switch_to(kind) if self.open is None or self.open.kind != kind else []
        item = self.open
        item.text += text
        if kind == "reasoning":
            events.append(self._event(TextDeltaEvent(type="response.reasoning_text.delta", item_id=item.id,
                                                     output_index=item.index, delta=text)))
            return events
        logprobs, self.pending_logprobs = self.pending_logprobs, []
        item.logprobs += logprobs
        events.append(self._event(TextDeltaEvent(type="response.output_text.delta", item_id=item.id,
                                                 output_index=item.index, delta=text,
                                                 logprobs=delta_logprobs(logprobs))))
        return events

    def _call(self, call: dict) -> list[ResponseEvent]:
        function = call.get("function") or {}
        events = []
        if "name" in function or self.open is None or self.open.kind != "function_call":
            events += self._switch_to("function_call", call_id=call.get("id") or new_item_id("call"),
                                      name=function.get("name") or "")
        arguments = function.get("arguments")
        if arguments:
            self.open.text += arguments
            events.append(self._event(ArgumentsDeltaEvent(type="response.function_call_arguments.delta",
                                                          item_id=self.open.id, output_index=self.open.index,
                                                          delta=arguments)))
        return events

    def _switch_to(self, kind: str, call_id: str = "", name: str = "") -> list[ResponseEvent]:
        """Close the open item and open one of ``kind``: its ``output_item.added`` (and
        ``content_part.added``)."""
        events = self._close("completed")
        prefix = {"message": "msg", "reasoning": "rs", "function_call": "fc"}[kind]
        item = self.open = _OpenItem(kind, new_item_id(prefix), len(self.items), call_id=call_id, name=name)
        events.append(self._event(OutputItemEvent(type="response.output_item.added", output_index=item.index,
                                                  item=self._item(item, "in_progress", opening=True))))
        if kind != "function_call":
            part = OutputText(text="") if kind == "message" else ReasoningText(text="")
            events.append(self._event(ContentPartEvent(type="response.content_part.added", item_id=item.id,
                                                       output_index=item.index, part=part)))
        return events

    def _close(self, status: str) -> list[ResponseEvent]:
        item, self.open = self.open, None
        if item is None:
            return []
        where = {"item_id": item.id, "output_index": item.index}
        if item.kind == "function_call":
            events = [self._event(ArgumentsDoneEvent(type="response.function_call_arguments.done", name=item.name,
                                                     arguments=item.text, **where))]
        else:
            kind = "output_text" if item.kind == "message" else "reasoning_text"
            part = self._item(item, status).content[0]
            events = [self._event(TextDoneEvent(type=f"response.{kind}.done", text=item.text,
                                                logprobs=[] if item.kind == "message" else None, **where)),
                      self._event(ContentPartEvent(type="response.content_part.done", part=part, **where))]
        done = self._item(item, status)
        self.items.append(done)
        events.append(self._event(OutputItemEvent(type="response.output_item.done", output_index=item.index,
                                                  item=done)))
        return events

    @staticmethod
    def _item(item: _OpenItem, status: str, opening: bool = False) -> OutputItem:
        if item.kind == "function_call":
            return FunctionCallItem(id=item.id, call_id=item.call_id, name=item.name, arguments=item.text,
                                    status=status)
        if item.kind == "reasoning":
            content = None if opening else [ReasoningText(text=item.text)]
            return ReasoningItem(id=item.id, content=content, status=status)
        content = [] if opening else [OutputText(text=item.text, logprobs=list(item.logprobs))]
        return OutputMessage(id=item.id, status=status, content=content)
