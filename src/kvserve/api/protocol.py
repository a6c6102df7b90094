"""Request models of the OpenAI-compatible API, field for field as in the OpenAI API reference
(``/v1/completions``, ``/v1/chat/completions``) plus vLLM's sampling extensions, and their
conversion to :class:`kvserve.sampling_params.SamplingParams`.

Unknown fields are ignored, as OpenAI's server tolerates them. Range checks live in
``SamplingParams`` (one place); this module checks what only the HTTP layer knows: ``logit_bias``
keys are token-id strings, ``response_format`` is text, ``stream_options`` needs ``stream``
(and ``continuous_usage_stats`` needs ``include_usage``), ``tool_choice`` asks for no tool
calls (this server has no tool-call parser).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kvserve.errors import InvalidRequestError
from kvserve.sampling_params import SamplingParams, check_truncate_prompt_tokens


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(OpenAIBaseModel):
    """``include_usage``: a last chunk with the usage. ``continuous_usage_stats`` (vLLM): every
    chunk also carries the running usage (needs ``include_usage``)."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ResponseFormat(OpenAIBaseModel):
    type: str = "text"


class SamplingRequest(OpenAIBaseModel):
    """Fields shared by completions and chat completions (OpenAI's, then vLLM's extensions)."""

    model: str | None = None
    n: int = 1
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    response_format: ResponseFormat | None = None
    # vLLM extensions.
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    priority: int = 0
    cache_salt: str | None = None
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    return_tokens_as_token_ids: bool = False

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every streamed chunk carries the running usage (vLLM's
        ``continuous_usage_stats``)."""
        return self.include_usage and bool(self.stream_options.continuous_usage_stats)

    def check_http_fields(self) -> None:
        """Checks only the HTTP layer can make.

        Raises:
            InvalidRequestError: ``response_format`` other than text, ``stream_options`` without
                ``stream``, ``continuous_usage_stats`` without ``include_usage``,
                ``prompt_logprobs`` above 0 with ``stream``,
                ``truncate_prompt_tokens`` below 1, a seed beyond 64 bits, or ``cache_salt``
                empty.
        """
        if self.response_format is not None and self.response_format.type != "text":
            raise InvalidRequestError(
                f"response_format type '{self.response_format.type}' is not supported; "
                "only 'text' is allowed", param="response_format")
        if self.stream_options is not None and not self.stream:
            raise InvalidRequestError("stream_options is only allowed when stream is true",
                                      param="stream_options")
        if self.stream_options is not None and self.stream_options.continuous_usage_stats \
                and not self.stream_options.include_usage:
            raise InvalidRequestError(
                "stream_options.continuous_usage_stats needs stream_options.include_usage to be true",
                param="stream_options.continuous_usage_stats")
        if self.stream and self.prompt_logprobs is not None and self.prompt_logprobs > 0:
            # A chunk has no field for them (vLLM refuses the same), so they would be dropped.
            raise InvalidRequestError("prompt_logprobs are not available when stream is true; "
                                      "send the request without stream", param="prompt_logprobs")
        check_truncate_prompt_tokens(self.truncate_prompt_tokens)
        if self.seed is not None and not -(2**63) <= self.seed < 2**64:
            raise InvalidRequestError(f"seed must fit in 64 bits, got {self.seed}", param="seed")
        if self.cache_salt is not None and not self.cache_salt:
            raise InvalidRequestError("cache_salt must be a non-empty string", param="cache_salt")

    def build_sampling_params(self, *, max_tokens: int | None, logprobs: int | None,
                              vocab_size: int) -> SamplingParams:
        """The engine's ``SamplingParams`` for this request.

        Args:
            max_tokens: resolved output cap in tokens (each API names it differently).
            logprobs: top alternatives per generated token, or None for no logprobs.
            vocab_size: the model's vocabulary size, for ``logit_bias``/``stop_token_ids``.

        Raises:
            InvalidRequestError: any out-of-range value (``param`` names the field).
        """
        params = SamplingParams(
            n=self.n,
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=self.top_k or 0,
            min_p=self.min_p or 0.0,
            presence_penalty=self.presence_penalty or 0.0,
            frequency_penalty=self.frequency_penalty or 0.0,
            repetition_penalty=1.0 if self.repetition_penalty is None else self.repetition_penalty,
            logit_bias=parse_logit_bias(self.logit_bias),
            seed=self.seed,
            max_tokens=max_tokens,
            min_tokens=self.min_tokens,
            stop=[self.stop] if isinstance(self.stop, str) else list(self.stop or []),
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            include_stop_str_in_output=self.include_stop_str_in_output,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs,
            skip_special_tokens=self.skip_special_tokens,
            allowed_token_ids=self.allowed_token_ids,
            bad_words=list(self.bad_words or []),
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )
        params.validate_for_vocab(vocab_size)
        return params


def parse_logit_bias(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI sends ``logit_bias`` with token-id *strings* as keys; turn them into ints.

    Raises:
        InvalidRequestError: a key that is not a non-negative integer.
    """
    if not logit_bias:
        return None
    parsed: dict[int, float] = {}
    for key, bias in logit_bias.items():
        text = key.strip()
        if not text.isdigit():
            raise InvalidRequestError(
                f"logit_bias keys must be token ids (non-negative integers as strings), got {key!r}",
                param="logit_bias")
        parsed[int(text)] = float(bias)
    return parsed


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``. ``prompt`` is a string, strings, token ids, or lists of ids;
    each prompt gets ``n`` choices (choice index = prompt index * n + sample index)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    # OpenAI's default is 16; when omitted it is cut to what the context leaves (see serving).
    max_tokens: int | None = None
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None

    def check_http_fields(self) -> None:
        super().check_http_fields()
        if self.suffix:
            raise InvalidRequestError("suffix is not supported", param="suffix")
        if self.best_of is not None and self.best_of not in (1, self.n):
            # As vLLM V1: generating extra candidates and ranking them is not supported.
            raise InvalidRequestError(
                f"best_of={self.best_of} is not supported (only 1 or n={self.n}); ask for n completions "
                "with logprobs and choose among them", param="best_of")
        if isinstance(self.prompt, list) and not self.prompt:
            raise InvalidRequestError("prompt must not be an empty list", param="prompt")


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

    def to_template_dict(self, index: int) -> dict:
        """The message as chat templates expect it: list content is joined into one string.

        Raises:
            InvalidRequestError: a content part that is not text.
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
        for key in ("name", "tool_call_id", "tool_calls"):
            if getattr(self, key) is not None:
                message[key] = getattr(self, key)
        return message


class ChatCompletionRequest(SamplingRequest):
    """``POST /v1/chat/completions``; ``max_completion_tokens`` wins over ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    tools: list[ChatCompletionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None

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
        if self.top_logprobs is not None and not 0 <= self.top_logprobs <= SamplingParams.MAX_LOGPROBS:
            raise InvalidRequestError(
                f"top_logprobs must be in [0, {SamplingParams.MAX_LOGPROBS}], got {self.top_logprobs}",
                param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise InvalidRequestError(
                "continue_final_message and add_generation_prompt cannot both be true",
                param="continue_final_message")
        self._check_tool_choice()

    def _check_tool_choice(self) -> None:
        """``tools`` are rendered into the chat template; returning tool calls needs a parser of
        the model's tool-call format, which this server does not have (vLLM likewise refuses
        ``"auto"`` without ``--enable-auto-tool-choice``).

        Raises:
            InvalidRequestError: ``tool_choice`` other than ``"none"`` (or omitted).
        """
        if self.tool_choice is None or self.tool_choice == "none":
            return
        if isinstance(self.tool_choice, NamedToolChoice):
            shown = f"a named function ({self.tool_choice.function.name!r})"
        else:
            shown = repr(self.tool_choice)
        raise InvalidRequestError(
            f"tool_choice {shown} is not supported: tool calling (parsing tool calls out of the "
            "model's output) is not supported by this server. Use tool_choice 'none' or omit it; "
            "tools are then passed to the chat template and the reply is plain text.",
            param="tool_choice")


class TokenizeRequest(OpenAIBaseModel):
    """``POST /tokenize`` (vLLM): either ``prompt`` or chat ``messages``."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    return_token_strs: bool = False
    tools: list[ChatCompletionTool] | None = None


class DetokenizeRequest(OpenAIBaseModel):
    """``POST /detokenize`` (vLLM)."""

    model: str | None = None
    tokens: list[int]
