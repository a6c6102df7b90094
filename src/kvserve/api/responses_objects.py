"""The objects ``/v1/responses`` answers with: the ``Response``, its output items, its usage and
the stream events, field for field as in OpenAI's API reference (``openai.types.responses``)
and vLLM 0.32's ``entrypoints/openai/responses`` (what it fills in and how).

    Response ─┬─ output: [ReasoningItem?, OutputMessage?, FunctionCallItem*]   (vLLM's order)
              ├─ usage: input_tokens (+ cached_tokens), output_tokens (+ reasoning_tokens)
              └─ the request's settings echoed (instructions, tools, tool_choice, text, ...)

Ids: ``resp_``, ``msg_``, ``rs_``, ``fc_`` and 32 hex digits (vLLM's ``random_uuid``); a
function call's ``call_id`` is the chat tool call's id.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, Field

ItemStatus = Literal["in_progress", "completed", "incomplete"]
ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "cancelled", "failed"]


def new_item_id(prefix: str) -> str:
    """``<prefix>_<32 hex>``: ``resp``, ``msg``, ``rs``, ``fc``."""
    return f"{prefix}_{uuid.uuid4().hex}"


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class OutputLogprob(TopLogprob):
    """One output token's logprob (``include: ["message.output_text.logprobs"]``)."""

    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[OutputLogprob] = Field(default_factory=list)


class OutputMessage(BaseModel):
    """The assistant's text; ``status`` is ``incomplete`` when ``max_output_tokens`` cut it."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus = "completed"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(BaseModel):
    """The model's reasoning (``--reasoning-parser``) as ``content`` text, as vLLM; ``summary``
    is always empty (no summaries are written)."""

    id: str
    type: Literal["reasoning"] = "reasoning"
    summary: list[Any] = Field(default_factory=list)
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = "completed"


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus = "completed"


OutputItem = Annotated[Union[OutputMessage, ReasoningItem, FunctionCallItem], Field(discriminator="type")]


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0  # prefix-cache hits
    cache_write_tokens: int = 0  # not counted by kvserve


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class ResponsesResponse(BaseModel):
    """A Response object: the answer of ``POST /v1/responses`` and ``GET /v1/responses/{id}``,
    and the ``response`` of the lifecycle stream events."""

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: ResponseStatus
    background: bool = False
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] = Field(default_factory=dict)
    model: str
    output: list[OutputItem] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    prompt_cache_key: str | None = None
    reasoning: dict[str, Any] = Field(default_factory=lambda: {"effort": None, "summary": None})
    safety_identifier: str | None = None
    service_tier: str = "auto"
    store: bool = True
    temperature: float | None = None
    text: dict[str, Any] = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[dict[str, Any]] = Field(default_factory=list)
    top_logprobs: int = 0
    top_p: float | None = None
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None

    @property
    def finished(self) -> bool:
        return self.status not in ("queued", "in_progress")


class ResponseDeleted(BaseModel):
    """``DELETE /v1/responses/{id}``."""

    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


# -- stream events (the SSE ``event:`` line is ``type``) -----------------------------------------


class ResponseEvent(BaseModel):
    """A stream event; ``sequence_number`` counts from 0 in one stream."""

    type: str
    sequence_number: int = 0


class LifecycleEvent(ResponseEvent):
    """``response.created``, ``.queued``, ``.in_progress``, ``.completed``, ``.incomplete``,
    ``.failed``: the whole response as it stands."""

    response: ResponsesResponse


class OutputItemEvent(ResponseEvent):
    """``response.output_item.added`` / ``.done``."""

    output_index: int
    item: OutputItem


class ContentPartEvent(ResponseEvent):
    """``response.content_part.added`` / ``.done``."""

    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText | ReasoningText


class DeltaTopLogprob(BaseModel):
    token: str
    logprob: float


class DeltaLogprob(DeltaTopLogprob):
    top_logprobs: list[DeltaTopLogprob] = Field(default_factory=list)


class TextDeltaEvent(ResponseEvent):
    """``response.output_text.delta`` (with this piece's logprobs) and
    ``response.reasoning_text.delta`` (no ``logprobs``)."""

    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[DeltaLogprob] | None = None


class TextDoneEvent(ResponseEvent):
    """``response.output_text.done`` and ``response.reasoning_text.done``."""

    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[DeltaLogprob] | None = None


class ArgumentsDeltaEvent(ResponseEvent):
    """``response.function_call_arguments.delta``."""

    item_id: str
    output_index: int
    delta: str


class ArgumentsDoneEvent(ResponseEvent):
    """``response.function_call_arguments.done``."""

    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(ResponseEvent):
    """``error``: the generation failed after the stream began (then ``response.failed``)."""

    type: Literal["error"] = "error"
    code: str | None = None
    message: str
    param: str | None = None


def sse_event(event: ResponseEvent) -> str:
    """One SSE event as OpenAI and vLLM send it: ``event: <type>`` and ``data: <json>``."""
    return f"event: {event.type}\ndata: {event.model_dump_json(exclude_none=_drops_none(event))}\n\n"


def _drops_none(event: ResponseEvent) -> bool:
    """Reasoning text events carry no ``logprobs`` key; every other event sends its nulls."""
    return isinstance(event, (TextDeltaEvent, TextDoneEvent)) and event.logprobs is None
