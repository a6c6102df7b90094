"""Request bodies of vLLM's tokenizer routes, ``POST /tokenize`` and ``POST /detokenize``."""

from __future__ import annotations

from typing import Any

from kvserve.api.protocol import ChatCompletionTool, ChatMessage, OpenAIBaseModel


class TokenizeRequest(OpenAIBaseModel):
    """``POST /tokenize`` (vLLM): either ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None  # vLLM's defaults: true for a prompt, false for messages
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[ChatCompletionTool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    """``POST /detokenize`` (vLLM)."""

    model: str | None = None
    tokens: list[int]
