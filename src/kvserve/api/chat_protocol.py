"""The request model of ``POST /v1/chat/completions`` (OpenAI's fields plus vLLM's extensions):
``tool_choice`` and the chat-only options; the messages, tools and shared sampling fields are
``kvserve.api.protocol``'s. Parsing only, as in ``protocol``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from kvserve.api.protocol import ChatCompletionTool, ChatMessage, OpenAIBaseModel, SamplingRequest
from kvserve.errors import InvalidRequestError


class NamedFunction(OpenAIBaseModel):
    name: str


class NamedToolChoice(OpenAIBaseModel):
    """``tool_choice`` naming one function: ``{"type": "function", "function": {"name": ...}}``."""

    type: Literal["function"] = "function"
    function: NamedFunction


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
        check_generation_prompt(self)


def check_generation_prompt(request) -> None:
    """A chat or ``/tokenize`` request cannot both continue its last message and open a new one.

    Raises:
        InvalidRequestError: both ``continue_final_message`` and ``add_generation_prompt``.
    """
    if request.continue_final_message and request.add_generation_prompt:
        raise InvalidRequestError("continue_final_message and add_generation_prompt cannot both be true",
                                  param="continue_final_message")
