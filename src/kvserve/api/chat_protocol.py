"""The request model of ``POST /v1/chat/completions`` (OpenAI's fields plus vLLM's extensions):
messages, tools and ``tool_choice``, and the chat-only options; the shared sampling fields are
``kvserve.api.protocol.SamplingRequest``'s. Parsing only, as in ``protocol``."""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import Field

from kvserve.api.protocol import OpenAIBaseModel, SamplingRequest
from kvserve.errors import InvalidRequestError


class FunctionDefinition(OpenAIBaseModel):
    name: str
    description: str | None = None
    parameters: dict | None = None


class ChatCompletionTool(OpenAIBaseModel):
    """A tool the model may be told about (OpenAI's function tool)."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


def tools_for_template(tools: list[ChatCompletionTool] | None) -> list[dict] | None:
    """``tools`` as a chat template receives them (OpenAI's JSON), or None when there are none."""
    if not tools:
        return None
    return [tool.model_dump(exclude_none=True) for tool in tools]


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    """``tool_choice`` naming one function: ``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


class TextContentPart(OpenAIBaseModel):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBaseModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[dict] | None = None  # an assistant turn's earlier calls, for the template
    # An assistant turn's reasoning (vLLM's ``reasoning``; ``reasoning_content`` is its older name).
    reasoning: str | None = None
    reasoning_content: str | None = None

    def to_template_dict(self, index: int) -> dict:
        """The message as chat templates expect it: list content is joined into one string;
        earlier tool calls get their ``arguments`` as an object, not JSON text (what tool-use
        templates such as Qwen2.5's and Llama 3.1's expect; vLLM's ``_postprocess_messages``);
        reasoning is passed as both ``reasoning_content`` (Qwen3's and DeepSeek's templates)
        and ``reasoning``.

        Raises:
            InvalidRequestError: a content part that is not text, or a tool call that is not
                ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``.
        """
        content = self.content
        if isinstance(content, list):
            texts = []
            for part_index, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise InvalidRequestError(
                        f"content part type '{part.type}' is not supported; only 'text' parts are",
                        param=f"messages.{index}.content.{part_index}.type")
                texts.append(part.text)
            content = "\n".join(texts)
        message = {"role": self.role, "content": content or ""}
        for key in ("name", "tool_call_id"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        if self.tool_calls is not None:
            message["tool_calls"] = [_template_tool_call(call, f"messages.{index}.tool_calls.{i}")
                                     for i, call in enumerate(self.tool_calls)]
        reasoning = self.reasoning if self.reasoning is not None else self.reasoning_content
        if reasoning is not None:
            message["reasoning_content"] = message["reasoning"] = reasoning
        return message


def _template_tool_call(call: dict, param: str) -> dict:
    """One earlier tool call for the template, ``arguments`` parsed (empty or null: ``{}``)."""
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise InvalidRequestError('a tool call must be {"id": ..., "type": "function", "function": '
                                  '{"name": ..., "arguments": "<JSON text>"}}', param=f"{param}.function")
    arguments = function.get("arguments")
    if arguments is None or (isinstance(arguments, str) and not arguments.strip()):
        arguments = {}
    elif isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise InvalidRequestError(f"function.arguments is not valid JSON ({exc.msg} at character "
                                      f"{exc.pos})", param=f"{param}.function.arguments") from None
    elif not isinstance(arguments, dict):
        raise InvalidRequestError("function.arguments must be JSON text (or an object)",
                                  param=f"{param}.function.arguments")
    return {**call, "function": {**function, "arguments": arguments}}


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # vLLM's values


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``.
    ``tools``/``tool_choice``/``include_reasoning``/``reasoning_effort``: see
    ``kvserve.api.chat_parsers``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ChatCompletionTool] | None = None
    # Resolved (defaults, errors, the flags it needs) by kvserve.api.chat_parsers.
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    # vLLM: with --reasoning-parser, false leaves the reasoning out of the reply.
    include_reasoning: bool = True
    # OpenAI's; vLLM passes it to the chat template and derives enable_thinking from it.
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, str]] | None = None
    add_special_tokens: bool = False
    echo: bool = False

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def num_logprobs(self) -> int | None:
        """Top alternatives per generated token, or None when ``logprobs`` is false."""
        return (self.top_logprobs or 0) if self.logprobs else None

    def check_http_fields(self) -> None:
        super().check_http_fields()
        if self.top_logprobs is not None and not self.logprobs:
            raise InvalidRequestError("top_logprobs requires logprobs to be true", param="top_logprobs")
        requested = self.requested_max_tokens
        if requested is not None and requested < 1:  # chat has no prompt-only (echo) mode
            param = "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"
            raise InvalidRequestError(f"{param} must be >= 1, got {requested}", param=param)
        if self.add_special_tokens:
            raise InvalidRequestError("add_special_tokens is not supported for chat: the chat template "
                                      "writes the special tokens", param="add_special_tokens")
        if self.echo:
            raise InvalidRequestError("echo is not supported for chat completions", param="echo")
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message")
