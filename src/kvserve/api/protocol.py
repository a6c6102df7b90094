"""Request models of the OpenAI-compatible API, field for field as in the OpenAI API reference
(``/v1/completions``, ``/tokenize``, ``/detokenize``; the sampling fields every generation
endpoint shares and the chat messages and tools; the chat request itself is in
``kvserve.api.chat_protocol``) plus vLLM's extensions, and their conversion to
:class:`kvserve.sampling_params.SamplingParams`.

This module only parses. Values are validated once, by the engine's input processor
(``kvserve.engine.input_processor``); here are only the rules of the HTTP shapes themselves:
``logit_bias`` keys are token-id strings, ``stream_options`` needs ``stream``, ``max_tokens=0``
needs ``echo``, and so on. A vLLM extension kvserve does not implement is refused by name when a
request sets it to anything but vLLM's default (``UNSUPPORTED_FIELDS``); fields neither OpenAI's
nor vLLM's are ignored, as both servers do.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, field_validator

from kvserve.beam_search import BeamSearchParams
from kvserve.errors import InvalidRequestError
from kvserve.generation_config import SamplingDefaults
from kvserve.sampling_params import SamplingParams
from kvserve.structured_output.params import StructuredOutputsParams
from kvserve.structured_output.request_fields import structured_outputs_from_request

SAMPLING_DEFAULT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# Fields beam search does not apply (vLLM's BeamSearchParams has no place for them, and vLLM
# ignores them): with use_beam_search, a request that sets one gets a 400 naming it.
BEAM_SEARCH_IGNORED = ("top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty",
                       "logit_bias", "seed", "stop", "stop_token_ids", "min_tokens", "bad_words", "allowed_token_ids",
                       "prompt_logprobs", "response_format", "structured_outputs", "guided_json", "guided_regex",
                       "guided_choice", "guided_grammar")

# vLLM request fields kvserve does not implement: name -> (vLLM's default values, why). A request
# that sets one to another value gets a 400 naming it.
UNSUPPORTED_FIELDS: dict[str, tuple[tuple, str]] = {
    "watermarking": ((False, None), "watermarking is not supported"),
    "spaces_between_special_tokens": ((True, None), "detokenization always puts spaces between special tokens"),
    "truncation_side": ((None, "left"), "prompts are truncated from the left only"),
    "logprob_token_ids": ((None,), "logprobs of chosen token ids are not supported; use logprobs/top_logprobs"),
    "chat_template": ((None,), "a per-request chat template is not accepted; start the server with "
                               "--chat-template"),
    "media_io_kwargs": ((None,), "multimodal inputs are not supported"),
    "mm_processor_kwargs": ((None,), "multimodal inputs are not supported"),
    "prompt_embeds": ((None,), "prompt embeddings are not supported"),
    "reasoning_effort": ((None,), "reasoning_effort applies to chat completions (/v1/chat/completions)"),
    "thinking_token_budget": ((None,), "a budget of reasoning tokens is not supported; use max_tokens"),
    "include_reasoning": ((True, None), "include_reasoning applies to chat completions (/v1/chat/completions)"),
    "return_token_offsets": ((False, None), "token offsets are not supported"),
    "return_prompt_text": ((False, None), "the rendered prompt is not returned; use POST /tokenize"),
    "return_mm_kwargs": ((True, None), "multimodal inputs are not supported"),
    "routed_experts_prompt_start": ((0, None), "mixture-of-experts routing data is not supported"),
    "ec_transfer_params": ((None,), "disaggregated serving (encoder-cache transfer) is not supported"),
    "vllm_xargs": ((None,), "custom request extensions are not supported"),
    "repetition_detection": ((None,), "repetition detection is not supported"),
    "stream_interval": ((None, 1), "streamed chunks carry every new token (stream_interval 1)"),
}


class OpenAIBaseModel(BaseModel):
    # Extra fields are kept (not validated) so that check_unsupported_fields can name them.
    model_config = ConfigDict(extra="allow")

    def check_unsupported_fields(self) -> None:
        """Raises InvalidRequestError when the request sets a vLLM extension kvserve does not
        implement (``UNSUPPORTED_FIELDS``) to anything but vLLM's default."""
        for name, value in (self.model_extra or {}).items():
            entry = UNSUPPORTED_FIELDS.get(name)
            if entry is not None and not _is_default(value, entry[0]):
                raise InvalidRequestError(f"{name} is not supported by this server: {entry[1]}", param=name)


def _is_default(value: Any, defaults: tuple) -> bool:
    return any(value is d or (type(value) is type(d) and value == d) for d in defaults)


class StreamOptions(OpenAIBaseModel):
    """``include_usage``: a last chunk with the usage. ``continuous_usage_stats`` (vLLM): every
    chunk also carries the running usage (needs ``include_usage``)."""

    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ResponseFormat(OpenAIBaseModel):
    """OpenAI's ``response_format``: ``text``, ``json_object``, or ``json_schema`` with its
    ``json_schema`` object (``name``, ``schema``, ``strict``, ``description``); vLLM's
    ``structural_tag`` too. Read by ``kvserve.structured_output.request_fields``."""

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
    kv_transfer_params: dict[str, Any] | None = None  # disaggregated prefill/decode (kvserve.kv_transfer.params)
    prompt_logprobs: int | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    return_tokens_as_token_ids: bool = False
    return_token_ids: bool | None = None  # vLLM's: prompt_token_ids and each choice's token_ids in the response
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    use_beam_search: bool = False
    length_penalty: float = 1.0
    # kvserve's: latency targets {"ttft_ms", "tpot_ms", "on_miss"} (kvserve.slo.targets)
    slo: dict[str, Any] | None = None

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
        """The rules of the HTTP shapes (values are the input processor's).

        Raises:
            InvalidRequestError: an unsupported vLLM extension, ``stream_options`` without
                ``stream``, ``continuous_usage_stats`` without ``include_usage``, or
                ``prompt_logprobs`` above 0 with ``stream``.
        """
        self.check_unsupported_fields()
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

    def to_sampling_params(self, *, max_tokens: int | None, logprobs: int | None,
                           defaults: SamplingDefaults | None = None) -> SamplingParams:
        """The engine's ``SamplingParams`` for this request, unvalidated (the input processor
        validates). A sampling field the request omits takes the model's default
        (``generation_config.json``, see ``kvserve.generation_config``), else OpenAI's; the
        model's ``max_new_tokens`` caps ``max_tokens`` (vLLM's rule).

        Args:
            max_tokens: the requested output cap (None: as much as the context leaves).
            logprobs: top alternatives per generated token, or None for no logprobs.
            defaults: the model's default sampling values.

        Raises:
            InvalidRequestError: a ``logit_bias`` key that is not a token id, or a malformed
                structured-output field (``StructuredOutputError``).
        """
        defaults = defaults or SamplingDefaults()

        def pick(name: str, openai_default: Any) -> Any:
            value = getattr(self, name)
            if value is None and name in SAMPLING_DEFAULT_FIELDS:
                value = defaults.value(name, None)
            return openai_default if value is None else value

        return SamplingParams(
            n=self.n,
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0),
            presence_penalty=pick("presence_penalty", 0.0),
            frequency_penalty=pick("frequency_penalty", 0.0),
            repetition_penalty=pick("repetition_penalty", 1.0),
            logit_bias=parse_logit_bias(self.logit_bias),
            seed=self.seed,
            max_tokens=defaults.cap_max_tokens(max_tokens),
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
            structured_outputs=self.structured_outputs_params(),
        )

    def beam_search_params(self, max_tokens: int | None, defaults: SamplingDefaults | None = None
                           ) -> BeamSearchParams | None:
        """vLLM's ``to_beam_search_params`` (beam width = ``n``), or None without
        ``use_beam_search``. ``max_tokens``: as for ``to_sampling_params`` (None: the rest of
        the context).

        Raises:
            InvalidRequestError: a field beam search does not apply set by the request
                (``BEAM_SEARCH_IGNORED``, named), ``n`` above 10, or ``max_tokens`` 0.
        """
        if not self.use_beam_search:
            return None
        for name in BEAM_SEARCH_IGNORED:
            value = getattr(self, name)
            unset = value in (None, [], {}) or value == type(self).model_fields[name].default
            if not unset and not (name == "response_format" and value.type == "text"):
                raise InvalidRequestError(
                    f"{name} is not supported with use_beam_search: beam search ranks sequences by the model's "
                    "raw logprobs alone; send the request without it", param=name)
        if max_tokens == 0:
            raise InvalidRequestError("max_tokens must be >= 1 with use_beam_search", param="max_tokens")
        if not isinstance(self.n, int) or self.n < 1:
            raise InvalidRequestError(f"n must be an integer >= 1, got {self.n}", param="n")
        defaults = defaults or SamplingDefaults()
        temperature = defaults.value("temperature", self.temperature)
        params = BeamSearchParams(beam_width=self.n, max_tokens=defaults.cap_max_tokens(max_tokens),
                                  ignore_eos=self.ignore_eos, temperature=1.0 if temperature is None else temperature,
                                  length_penalty=self.length_penalty,
                                  include_stop_str_in_output=self.include_stop_str_in_output,
                                  skip_special_tokens=self.skip_special_tokens)
        params.check()
        return params

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The request's structured-output constraint from ``response_format``,
        ``structured_outputs`` or the older ``guided_*`` fields (at most one), or None."""
        return structured_outputs_from_request(
            response_format=self.response_format, structured_outputs=self.structured_outputs,
            guided_json=self.guided_json, guided_regex=self.guided_regex, guided_choice=self.guided_choice,
            guided_grammar=self.guided_grammar, guided_whitespace_pattern=self.guided_whitespace_pattern,
            guided_decoding_backend=self.guided_decoding_backend)


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


def _prompt_shape(value: Any) -> str:
    """Which of the prompt's shapes ``value`` is, from its first element: pydantic then validates
    that shape alone (a smart union validated a 5M-id list as strings first, collecting an error
    per element: 2 s on the event loop)."""
    if isinstance(value, str):
        return "text"
    if isinstance(value, list) and value and isinstance(value[0], str):
        return "texts"
    if isinstance(value, list) and value and isinstance(value[0], list):
        return "id_lists"
    return "ids"


Prompt = Annotated[Union[Annotated[str, Tag("text")], Annotated[list[str], Tag("texts")],
                         Annotated[list[int], Tag("ids")], Annotated[list[list[int]], Tag("id_lists")]],
                   Discriminator(_prompt_shape)]


class CompletionRequest(SamplingRequest):
    """``POST /v1/completions``. ``prompt`` is a string, strings, token ids, or lists of ids;
    each prompt gets ``n`` choices (choice index = prompt index * n + sample index)."""

    prompt: Prompt
    # OpenAI's default, and vLLM's for an explicit null; prompt + max_tokens must fit the context.
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None
    suffix: str | None = None
    best_of: int | None = None
    add_special_tokens: bool = True

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_max_tokens_is_the_default(cls, value):
        return 16 if value is None else value  # vLLM's normalize_null_max_tokens

    def check_http_fields(self) -> None:
        super().check_http_fields()
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequestError(
                "max_tokens must be >= 1, got 0; max_tokens=0 is allowed only with echo=true (the prompt "
                "is returned, with its logprobs when logprobs is set)", param="max_tokens")
        if self.suffix:
            raise InvalidRequestError("suffix is not supported", param="suffix")
        if self.use_beam_search and self.stream:  # vLLM's rule and words
            raise InvalidRequestError("Streaming is not currently supported with beam search", param="stream")
        if self.use_beam_search and self.echo and self.logprobs is not None:
            raise InvalidRequestError("`echo` with `logprobs` is not supported with beam search because beam "
                                      "search does not compute prompt logprobs.", param="echo")
        if self.best_of is not None and self.best_of not in (1, self.n):
            # As vLLM V1: generating extra candidates and ranking them is not supported.
            raise InvalidRequestError(
                f"best_of={self.best_of} is not supported (only 1 or n={self.n}); ask for n completions "
                "with logprobs and choose among them", param="best_of")


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
                if part.type != "text":
                    raise InvalidRequestError(
                        f"content part type '{part.type}' is not supported; only 'text' parts are",
                        param=f"messages.{index}.content.{part_index}.type")
                if part.text is None:
                    raise InvalidRequestError("a 'text' content part needs its 'text' (a string)",
                                              param=f"messages.{index}.content.{part_index}.text")
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


class LoadLoRAAdapterRequest(BaseModel):
    """``POST /v1/load_lora_adapter`` (vLLM): register the PEFT folder ``lora_path`` as ``lora_name``."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str
    load_inplace: bool = False


class UnloadLoRAAdapterRequest(BaseModel):
    """``POST /v1/unload_lora_adapter`` (vLLM): forget ``lora_name`` (``lora_int_id``, when given,
    must be its id)."""

    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None
