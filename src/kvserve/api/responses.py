"""Response, stream-chunk, model-list and tokenizer models of the OpenAI-compatible API, field for
field as in the OpenAI API reference (and vLLM's ``stop_reason``/``prompt_logprobs`` extras)."""

from __future__ import annotations

import time
import uuid
from typing import Literal

from pydantic import BaseModel, Field, model_serializer

from kvserve.api.protocol import OpenAIBaseModel


def _now() -> int:
    return int(time.time())


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class UsageInfo(BaseModel):
    """Token counts; ``prompt_tokens_details.cached_tokens`` = prefix-cache hits;
    ``completion_tokens_details.reasoning_tokens`` (chat with ``--reasoning-parser`` only, as
    vLLM; left out otherwise) = output tokens inside the think block; ``slo_missed`` (kvserve's,
    only for a request with latency targets, once a choice finished) = whether a choice missed
    them."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None
    slo_missed: bool | None = None  # kvserve's: a choice missed the request's latency targets

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        data = handler(self)
        for name in ("completion_tokens_details", "slo_missed"):
            if data.get(name) is None:
                data.pop(name, None)
        return data


class PromptLogprob(BaseModel):
    """vLLM's per-token prompt logprob entry (keyed by token id)."""

    logprob: float
    rank: int
    decoded_token: str


PromptLogprobsJSON = list[dict[int, PromptLogprob] | None]


class CompletionLogProbs(BaseModel):
    """Legacy completions logprobs: parallel lists, one entry per token."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    """A choice; ``token_ids`` (the generated ids, a chunk's new ones when streamed) and
    ``prompt_token_ids`` (streamed: on a choice's first chunk) with ``return_token_ids``, else null."""

    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: PromptLogprobsJSON | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(BaseModel):
    """One streamed chunk; the whole response has its shape too (OpenAI reuses it)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None


class CompletionResponse(CompletionStreamResponse):
    """The non-streamed response: a chunk's fields and those vLLM sends as null in the whole
    response only."""

    service_tier: str | None = None
    kv_transfer_params: dict | None = None  # a P/D prefill instance's: where its KV is (else null)


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatLogprobToken(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatChoiceLogprobs(BaseModel):
    content: list[ChatLogprobToken] | None = None
    refusal: list[ChatLogprobToken] | None = None


class ChatResponseMessage(BaseModel):
    """The reply message. ``tool_calls`` is left out when empty (as OpenAI and vLLM);
    ``reasoning`` (vLLM's name) and ``reasoning_content`` (its older name, DeepSeek's API) carry
    the same text and are present only when the server splits reasoning (null: none)."""

    role: str = "assistant"
    content: str | None = None
    refusal: str | None = None
    annotations: list | None = None  # null, as vLLM sends them
    audio: dict | None = None
    function_call: dict | None = None
    tool_calls: list[dict] = Field(default_factory=list)
    reasoning: str | None = None
    reasoning_content: str | None = None
    show_reasoning: bool = Field(default=False, exclude=True)

    @model_serializer(mode="wrap")
    def _drop_absent(self, handler):
        data = handler(self)
        if not data.get("tool_calls"):
            data.pop("tool_calls", None)
        if not self.show_reasoning:
            data.pop("reasoning", None)
            data.pop("reasoning_content", None)
        return data


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: the generated ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionChoice]
    service_tier: str | None = None  # null, as vLLM sends it
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None
    prompt_logprobs: PromptLogprobsJSON | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids
    kv_transfer_params: dict | None = None  # a P/D prefill instance's: where its KV is (else null)


class DeltaMessage(BaseModel):
    """A chat stream delta; fields that are None are left out, as OpenAI sends them.
    ``reasoning`` and ``reasoning_content`` carry the same text (see ``ChatResponseMessage``);
    ``tool_calls`` entries are ``{"index", "id"?, "type"?, "function": {"name"?, "arguments"?}}``."""

    role: str | None = None
    content: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict] | None = None

    @model_serializer(mode="wrap")
    def _drop_none(self, handler):
        return {key: value for key, value in handler(self).items() if value is not None}


class ChatCompletionStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatChoiceLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None  # return_token_ids: this chunk's new ids


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatCompletionStreamChoice]
    system_fingerprint: str | None = None
    usage: UsageInfo | None = None
    prompt_token_ids: list[int] | None = None  # return_token_ids: on the first (role) chunks


class ModelPermission(OpenAIBaseModel):
    """vLLM's permission entry of a model card (OpenAI's legacy shape, vLLM's values)."""

    id: str = Field(default_factory=lambda: f"modelperm-{uuid.uuid4().hex}")
    object: Literal["model_permission"] = "model_permission"
    created: int = Field(default_factory=_now)
    allow_create_engine: bool = False
    allow_sampling: bool = True
    allow_logprobs: bool = True
    allow_search_indices: bool = False
    allow_view: bool = True
    allow_fine_tuning: bool = False
    organization: str = "*"
    group: str | None = None
    is_blocking: bool = False


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "kvserve"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None
    permission: list[ModelPermission] = Field(default_factory=lambda: [ModelPermission()])
    quantization: str | None = None  # kvserve's: the weights' quantization (QuantizationConfig.label), None = float


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str
