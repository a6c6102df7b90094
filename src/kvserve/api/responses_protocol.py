"""The request model of ``POST /v1/responses``: OpenAI's Responses API fields, as vLLM 0.32
accepts them (``entrypoints/openai/responses/protocol.py``), with vLLM's sampling extensions.

This module parses and refuses; the values are checked where chat checks them (the request is
translated to a chat completion, ``kvserve.api.responses_input``). A field kvserve does not
implement is refused by name (400 whose ``param`` names it) when it is set to anything but its
default (``REFUSED_FIELDS``, and ``kvserve.api.protocol.UNSUPPORTED_FIELDS``); fields neither
OpenAI nor vLLM define are ignored, as on the other endpoints. Nested objects (``reasoning``,
``text``, ``text.format``, ``stream_options``) refuse keys they do not know.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from kvserve.api.chat_protocol import REASONING_EFFORTS
from kvserve.api.protocol import OpenAIBaseModel, _is_default
from kvserve.errors import InvalidRequestError

LOGPROBS_INCLUDE = "message.output_text.logprobs"
METADATA_MAX_PAIRS, METADATA_MAX_KEY, METADATA_MAX_VALUE = 16, 64, 512  # OpenAI's limits

# Fields of OpenAI's or vLLM's Responses request that kvserve does not implement:
# name -> (accepted values, why).
REFUSED_FIELDS: dict[str, tuple[tuple, str]] = {
    "conversation": ((None,), "conversations are not supported; send previous_response_id or the whole input"),
    "prompt": ((None,), "prompt templates are not supported"),  # vLLM's words
    "context_management": ((None,), "context management (compaction) is not supported"),
    "prompt_cache_retention": ((None, "in_memory"), "the prefix cache is in memory only"),
    "prompt_cache_options": ((None,), "prompt cache options are not supported"),
    "kv_transfer_params": ((None,), "disaggregated prefill/decode (KV transfer) applies to /v1/completions and "
                                    "/v1/chat/completions"),
    "background_options": ((None,), "background options are not supported"),
    "moderation": ((None,), "moderation is not supported"),
    "image": ((None,), "image generation is not supported"),
    "access_programs": ((None,), "programs are not supported"),
    "request_id": ((None,), "the response id is chosen by the server"),
    "session_id": ((None,), "sessions are not supported"),
    "enable_response_messages": ((False, None), "raw input and output messages are not returned"),
    "previous_input_messages": ((None,), "send previous_response_id or the whole input"),
    "use_beam_search": ((False, None), "beam search applies to /v1/completions and /v1/chat/completions"),
    "n": ((1, None), "a response has one output"),
}
# Chat-completions fields a client moving to the Responses API may still send: refused with the
# Responses field to use (neither OpenAI's Responses API nor vLLM's take them).
CHAT_ONLY_FIELDS: dict[str, str] = {
    "messages": "send the conversation as input (a string or items)",
    "max_tokens": "use max_output_tokens",
    "max_completion_tokens": "use max_output_tokens",
    "response_format": "use text.format",
    "logprobs": f"use include: ['{LOGPROBS_INCLUDE}'] with top_logprobs",
    "best_of": "a response has one output",
    "functions": "give function tools in tools",
    "function_call": "use tool_choice",
}


class _Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ReasoningConfig(_Closed):
    """``reasoning``: ``effort`` becomes chat's ``reasoning_effort`` (a template variable, and
    ``enable_thinking = effort != "none"``); ``summary``/``generate_summary`` are accepted and no
    summary is written (as vLLM)."""

    effort: Literal[REASONING_EFFORTS] | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None
    generate_summary: Literal["auto", "concise", "detailed"] | None = None


class TextFormat(_Closed):
    """``text.format``: ``text``, ``json_object``, or ``json_schema`` with ``name``, ``schema``,
    ``strict``, ``description`` (flat, unlike chat's ``response_format``)."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(_Closed):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None


class ResponsesStreamOptions(_Closed):
    include_obfuscation: bool | None = None  # nothing is obfuscated: accepted and unused


class ResponsesRequest(OpenAIBaseModel):
    """``POST /v1/responses``. ``input`` items and ``tools`` are read (and refused by name) by
    ``kvserve.api.responses_input``."""

    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    max_tool_calls: int | None = None
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = True
    previous_response_id: str | None = None
    reasoning: ReasoningConfig | None = None
    service_tier: Literal["auto", "default"] | None = "auto"
    store: bool | None = True
    stream: bool | None = False
    stream_options: ResponsesStreamOptions | None = None
    background: bool | None = False
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_logprobs: int | None = None
    include: list[str] | None = None
    truncation: Literal["disabled", "auto"] | None = "disabled"
    user: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    # vLLM's extensions, passed on to the chat completion.
    include_reasoning: bool = True
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logit_bias: dict[str, float] | None = None
    priority: int = 0
    cache_salt: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value):
        items = value if isinstance(value, list) else []
        if not isinstance(value, (str, list)) or not all(isinstance(item, dict) for item in items):
            raise ValueError("input must be a string or a list of input items (objects)")
        return value

    @property
    def wants_logprobs(self) -> bool:
        """``include`` asks for the output text's logprobs (then ``top_logprobs`` counts)."""
        return LOGPROBS_INCLUDE in (self.include or ())

    def check_fields(self) -> None:
        """The Responses-only rules (values are chat's and the input processor's).

        Raises:
            InvalidRequestError: a refused field (``REFUSED_FIELDS``, ``CHAT_ONLY_FIELDS``, vLLM extensions kvserve
                lacks), an ``include`` value other than the logprobs, ``truncation: "auto"``,
                ``text.verbosity`` other than medium, ``background`` without ``store``, metadata
                over OpenAI's limits.
        """
        self.check_unsupported_fields()
        for name, value in (self.model_extra or {}).items():
            entry = REFUSED_FIELDS.get(name)
            if entry is not None and not _is_default(value, entry[0]):
                raise InvalidRequestError(f"{name} is not supported by this server: {entry[1]}", param=name)
            if name in CHAT_ONLY_FIELDS:
                raise InvalidRequestError(f"{name} is a chat completions field, not a Responses API one: "
                                          f"{CHAT_ONLY_FIELDS[name]}", param=name)
        for value in self.include or ():
            if value != LOGPROBS_INCLUDE:
                raise InvalidRequestError(f"include value '{value}' is not supported; only "
                                          f"'{LOGPROBS_INCLUDE}' is", param="include")
        if self.truncation == "auto":
            raise InvalidRequestError("truncation 'auto' is not supported; a prompt that does not fit the "
                                      "context is refused ('disabled')", param="truncation")
        if self.text is not None and self.text.verbosity not in (None, "medium"):
            raise InvalidRequestError("text.verbosity is not supported (the model's own length is 'medium')",
                                      param="text.verbosity")
        if self.background and self.store is False:
            raise InvalidRequestError("background can only be used when `store` is true", param="background")
        self._check_metadata()

    def _check_metadata(self) -> None:
        metadata = self.metadata or {}
        if len(metadata) > METADATA_MAX_PAIRS:
            raise InvalidRequestError(f"metadata has {len(metadata)} pairs; at most {METADATA_MAX_PAIRS} are allowed",
                                      param="metadata")
        for key, value in metadata.items():
            if len(key) > METADATA_MAX_KEY or len(value) > METADATA_MAX_VALUE:
                raise InvalidRequestError(f"metadata keys are at most {METADATA_MAX_KEY} characters and values at "
                                          f"most {METADATA_MAX_VALUE}; '{key[:80]}' is longer", param="metadata")
