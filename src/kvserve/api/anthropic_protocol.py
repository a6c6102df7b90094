"""Request, response and stream-event models of Anthropic's Messages API (``POST /v1/messages``,
``POST /v1/messages/count_tokens``), field for field as the ``anthropic`` Python client's
``anthropic.types`` and vLLM 0.32's ``vllm/entrypoints/anthropic/protocol.py`` define them.

This module only parses. What kvserve does not implement (image blocks, server tools,
``container``, ...) parses here and is refused by name when the request is translated to a chat
completion (``kvserve.api.anthropic_request``); values are validated by the engine's input
processor, as for chat. Fields neither Anthropic's nor vLLM's are ignored, as vLLM does.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_serializer

from kvserve.api.protocol import OpenAIBaseModel


class AnthropicBaseModel(BaseModel):
    # Extra fields are kept (``cache_control``, ``citations``, ...): accepted and ignored.
    model_config = ConfigDict(extra="allow")


# -- content blocks of a request ---------------------------------------------------------------


class TextBlockParam(AnthropicBaseModel):
    type: Literal["text"]
    text: str


class ThinkingBlockParam(AnthropicBaseModel):
    """An earlier turn's reasoning; passed to the chat template as the turn's reasoning."""

    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlockParam(AnthropicBaseModel):
    """Opaque reasoning of an earlier turn: accepted and dropped (vLLM)."""

    type: Literal["redacted_thinking"]
    data: str | None = None


class ToolUseBlockParam(AnthropicBaseModel):
    """An earlier assistant turn's call: becomes the turn's ``tool_calls`` entry."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class OtherBlockParam(AnthropicBaseModel):
    """A block of any other ``type`` (``image``, ``document``, ``server_tool_use``, ...): parsed
    so that the translation can refuse it by name."""

    type: str


def _block_tag(known: tuple[str, ...]):
    def tag(value: Any) -> str | None:
        kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        if not isinstance(kind, str):
            return None  # pydantic then says the block is not an object with a type
        return kind if kind in known else "other"

    return tag


ToolResultContent = Annotated[Union[Annotated[TextBlockParam, Tag("text")], Annotated[OtherBlockParam, Tag("other")]],
                              Discriminator(_block_tag(("text",)))]


class ToolResultBlockParam(AnthropicBaseModel):
    """A tool's answer, in a user turn: becomes a ``tool`` message. ``is_error`` is accepted and
    not shown to the model (vLLM)."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ToolResultContent] | None = None
    is_error: bool | None = None


ContentBlockParam = Annotated[
    Union[Annotated[TextBlockParam, Tag("text")], Annotated[ThinkingBlockParam, Tag("thinking")],
          Annotated[RedactedThinkingBlockParam, Tag("redacted_thinking")],
          Annotated[ToolUseBlockParam, Tag("tool_use")], Annotated[ToolResultBlockParam, Tag("tool_result")],
          Annotated[OtherBlockParam, Tag("other")]],
    Discriminator(_block_tag(("text", "thinking", "redacted_thinking", "tool_use", "tool_result")))]


class MessageParam(AnthropicBaseModel):
    """One turn. ``system`` turns inside ``messages`` are the newer API's (and vLLM's)."""

    role: Literal["user", "assistant", "system"]
    content: str | list[ContentBlockParam]


# -- tools, tool choice, thinking, output ---------------------------------------------------------


class ToolParam(AnthropicBaseModel):
    """A client tool. ``type`` is absent or ``"custom"``; any other ``type`` is a server tool
    (``web_search_20250305``, ``bash_20250124``, ...), refused by the translation, which is why
    ``input_schema`` is optional here."""

    name: str
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    strict: bool | None = None
    defer_loading: bool | None = None


class ToolChoiceAuto(AnthropicBaseModel):
    type: Literal["auto"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceAny(AnthropicBaseModel):
    type: Literal["any"]
    disable_parallel_tool_use: bool | None = None


class ToolChoiceTool(AnthropicBaseModel):
    type: Literal["tool"]
    name: str
    disable_parallel_tool_use: bool | None = None


class ToolChoiceNone(AnthropicBaseModel):
    type: Literal["none"]


ToolChoice = Annotated[Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone],
                       Field(discriminator="type")]


class ThinkingEnabled(AnthropicBaseModel):
    """Manual extended thinking with a token budget (refused: no budget is enforced)."""

    type: Literal["enabled"]
    budget_tokens: int
    display: Literal["summarized", "omitted"] | None = None


class ThinkingDisabled(AnthropicBaseModel):
    type: Literal["disabled"]


class ThinkingAdaptive(AnthropicBaseModel):
    """The model decides how much to think (``display`` is accepted and ignored, as vLLM)."""

    type: Literal["adaptive"]
    display: Literal["summarized", "omitted"] | None = None


ThinkingConfig = Annotated[Union[ThinkingEnabled, ThinkingDisabled, ThinkingAdaptive], Field(discriminator="type")]

Effort = Literal["low", "medium", "high", "xhigh", "max"]


class JsonOutputFormat(AnthropicBaseModel):
    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")


class OutputConfig(AnthropicBaseModel):
    effort: Effort | None = None
    format: JsonOutputFormat | None = None


class Metadata(AnthropicBaseModel):
    user_id: str | None = None


# -- requests --------------------------------------------------------------------------------------


class AnthropicPromptRequest(OpenAIBaseModel):
    """What ``/v1/messages`` and ``/v1/messages/count_tokens`` share: the conversation and what
    shapes its prompt. ``chat_template_kwargs`` is vLLM's. Extra fields are kept so that vLLM
    extensions kvserve does not implement (``kvserve.api.protocol.UNSUPPORTED_FIELDS``) and
    Anthropic features it does not (``container``, ``mcp_servers``, ...) are refused by name."""

    model: str
    messages: list[MessageParam] = Field(min_length=1)
    system: str | list[ContentBlockParam] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    output_config: OutputConfig | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class AnthropicMessagesRequest(AnthropicPromptRequest):
    """``POST /v1/messages`` (``max_tokens`` required, as Anthropic; ``cache_salt`` is vLLM's)."""

    max_tokens: int
    stop_sequences: list[str] | None = None
    stream: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: Metadata | None = None
    service_tier: Literal["auto", "standard_only"] | None = None
    cache_salt: str | None = None


class AnthropicCountTokensRequest(AnthropicPromptRequest):
    """``POST /v1/messages/count_tokens``."""


# -- responses -------------------------------------------------------------------------------------

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class AnthropicUsage(BaseModel):
    """``input_tokens`` excludes the prefix-cache hits, which are ``cache_read_input_tokens``
    (Anthropic: total input = input + cache read + cache creation; kvserve creates no cache
    entries on request, so ``cache_creation_input_tokens`` is left out)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int | None = None
    cache_read_input_tokens: int | None = None

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        return {key: value for key, value in handler(self).items() if value is not None}


class TextBlock(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingBlock(BaseModel):
    """``signature`` is an opaque random hex string (vLLM's; Anthropic's verifies the block)."""

    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str


class ToolUseBlock(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = Annotated[Union[TextBlock, ThinkingBlock, ToolUseBlock], Field(discriminator="type")]


class AnthropicMessage(BaseModel):
    """The response of ``POST /v1/messages`` (``anthropic.types.Message``)."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    content: list[ContentBlock]
    model: str
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None
    usage: AnthropicUsage


class ContextManagement(BaseModel):
    original_input_tokens: int


class AnthropicCountTokensResponse(BaseModel):
    """The response of ``POST /v1/messages/count_tokens`` (``context_management`` is vLLM's)."""

    input_tokens: int
    context_management: ContextManagement | None = None


class AnthropicError(BaseModel):
    type: str
    message: str


class AnthropicErrorResponse(BaseModel):
    """``{"type": "error", "error": {"type", "message"}}``, Anthropic's error shape."""

    type: Literal["error"] = "error"
    error: AnthropicError


# -- stream events (the ``data`` of each SSE event; the event name is ``type``) -------------------


class TextDelta(BaseModel):
    type: Literal["text_delta"] = "text_delta"
    text: str


class InputJSONDelta(BaseModel):
    type: Literal["input_json_delta"] = "input_json_delta"
    partial_json: str


class ThinkingDelta(BaseModel):
    type: Literal["thinking_delta"] = "thinking_delta"
    thinking: str


class SignatureDelta(BaseModel):
    type: Literal["signature_delta"] = "signature_delta"
    signature: str


class MessageStartEvent(BaseModel):
    type: Literal["message_start"] = "message_start"
    message: AnthropicMessage


class ContentBlockStartEvent(BaseModel):
    type: Literal["content_block_start"] = "content_block_start"
    index: int
    content_block: ContentBlock


class ContentBlockDeltaEvent(BaseModel):
    type: Literal["content_block_delta"] = "content_block_delta"
    index: int
    delta: Union[TextDelta, InputJSONDelta, ThinkingDelta, SignatureDelta]


class ContentBlockStopEvent(BaseModel):
    type: Literal["content_block_stop"] = "content_block_stop"
    index: int


class MessageDelta(BaseModel):
    stop_reason: StopReason | None = None
    stop_sequence: str | None = None


class MessageDeltaEvent(BaseModel):
    """``usage`` holds the final totals (the client overwrites its snapshot with them)."""

    type: Literal["message_delta"] = "message_delta"
    delta: MessageDelta
    usage: AnthropicUsage


class MessageStopEvent(BaseModel):
    type: Literal["message_stop"] = "message_stop"


class ErrorEvent(AnthropicErrorResponse):
    """An error after the stream began (its status was 200 already)."""


StreamEvent = Union[MessageStartEvent, ContentBlockStartEvent, ContentBlockDeltaEvent, ContentBlockStopEvent,
                    MessageDeltaEvent, MessageStopEvent, ErrorEvent]
